"""What is wrong with an object: a field path and the rule it breaks, in one line.

Every validator returns `Problem`s; the webhook refuses an object with the first one,
as `kubectl apply` prints it: `<Kind> <namespace>/<name>: <path>: <rule>`. The serving
decoders raise errors whose text starts with the field path (`spec.port must be ...`);
`from_reason` splits such a text back into path and rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A field path as the decoders write it: spec.routes[0].condition, metadata.name, ...
_PATH = re.compile(r"^((?:spec|metadata|status)(?:\.[A-Za-z0-9_/-]+|\[[0-9]+\])*)[:]?\s+(.*)$",
                   re.DOTALL)


@dataclass(frozen=True, slots=True)
class Problem:
    path: str  # the field, as kubectl names it ("" for the object as a whole)
    rule: str  # what the field must be, or what is wrong with it
    # A short word for the counters (meshbridge_admission_reviews_total{reason=...}).
    reason: str = "invalid"

    def __str__(self) -> str:
        return f"{self.path}: {self.rule}" if self.path else self.rule


def from_reason(text: str, reason: str = "invalid") -> Problem:
    """A decoder's one-line error as a Problem: a leading field path is the path."""
    line = " ".join(text.split())
    match = _PATH.match(line)
    if match is None:
        return Problem("", line, reason)
    return Problem(match.group(1), match.group(2), reason)


def refusal(kind: str, namespace: str, name: str, problem: Problem) -> str:
    """The one line a refused object gets."""
    where = f"{namespace}/{name}" if namespace else name
    return f"{kind} {where}: {problem}"
