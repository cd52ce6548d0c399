"""Route regular expressions are RE2's in every client (Envoy's `safe_regex`, gRPC's
and linkerd2-proxy's `regex` crate accept RE2 syntax, not Perl's): a pattern is
checked with RE2 itself, so that what Python's `re` would accept (look-arounds,
back-references) is refused here as every client would refuse it (Routes §2.3)."""

from __future__ import annotations

from functools import lru_cache

import re2

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # the error is reported by the caller, with the route's name


@lru_cache(maxsize=4096)
def re2_error(pattern: str) -> str:
    """Why RE2 refuses `pattern`, or "" when it compiles."""
    try:
        re2.compile(pattern, _OPTIONS)
    except re2.error as e:
        detail = e.args[0] if e.args else ""
        return detail.decode(errors="replace") if isinstance(detail, bytes) else str(detail)
    return ""


def re2_full_match(pattern: str, text: str) -> bool:
    """Whether `pattern` matches all of `text` (how every client applies a route regex)."""
    return re2.compile(pattern, _OPTIONS).fullmatch(text) is not None
