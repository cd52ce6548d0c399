"""The kind registry: for each Kubernetes kind meshbridge decodes, how to decode it and
how to make its tombstone (a key-only object, enough for the cache to delete what it
holds under that key when the real object can no longer be decoded).

Each module that defines kinds lists them as `Kind` values (`bridge.objects`,
`bridge.policy_objects`); `bridge.objects` builds the one registry from those lists,
so no module of kinds needs to know of another, and none is imported for its side
effects. A new kind is a decoder, a tombstone and one `Kind` in its module's list.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from bridge.decoding import Meta


@dataclass(frozen=True, slots=True)
class Kind:
    name: str  # the cache's kind (an object's `kind`)
    decode: Callable[[Mapping[str, Any]], Any]
    tombstone: Callable[[Meta], Any]


class KindRegistry:
    """Kinds by name; a name listed twice is a mistake, refused at import."""

    def __init__(self, *groups: Iterable[Kind]) -> None:
        self._kinds: dict[str, Kind] = {}
        for group in groups:
            for kind in group:
                if kind.name in self._kinds:
                    raise ValueError(f"kind {kind.name} is registered twice")
                self._kinds[kind.name] = kind

    def get(self, name: str) -> Kind | None:
        return self._kinds.get(name)

    def names(self) -> frozenset[str]:
        return frozenset(self._kinds)
