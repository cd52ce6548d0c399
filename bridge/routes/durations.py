"""The two duration spellings routes use, read to whole milliseconds."""

from __future__ import annotations

import re

# Gateway API durations (GEP-2257): one to four <digits><unit> parts, units h, m, s,
# ms, at most five digits each: `1h30m`, `500ms`, `0s` (Routes §2.4).
_GATEWAY = re.compile(r"^(?:[0-9]{1,5}(?:h|ms|m|s)){1,4}$")
_GATEWAY_PART = re.compile(r"([0-9]{1,5})(h|ms|m|s)")
# Linkerd's annotations: a whole number and one unit (Routes §2.6).
_LINKERD = re.compile(r"^([0-9]+)(ms|s|m|h|d)$")
_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_gateway_duration(text: str) -> int:
    """Milliseconds; ValueError when `text` is not a Gateway API duration."""
    if not _GATEWAY.match(text):
        raise ValueError(f"{text!r} is not a duration like 10s, 500ms or 1h30m")
    return sum(int(n) * _MS[unit] for n, unit in _GATEWAY_PART.findall(text))


def parse_linkerd_duration(text: str) -> int:
    """Milliseconds; ValueError when `text` is not one of Linkerd's (`300ms`, `5s`)."""
    m = _LINKERD.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not a duration like 300ms, 5s or 1m")
    return int(m.group(1)) * _MS[m.group(2)]


def format_ms(ms: int) -> str:
    """A duration for people: `250ms`, `5s`, `1500ms`."""
    return f"{ms // 1000}s" if ms % 1000 == 0 and ms else f"{ms}ms"
