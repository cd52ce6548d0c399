"""Port lists as Linkerd's annotations and flags write them: `25,587,4000-4010,http`."""

from __future__ import annotations

import re
from collections.abc import Callable

_RANGE = re.compile(r"^[0-9]+-[0-9]+$")


class PortSpecError(ValueError):
    pass


def parse_port_set(
    text: str, resolve_name: Callable[[str], int | None] | None = None
) -> frozenset[int]:
    """Parse comma-separated ports, `lo-hi` ranges and (with `resolve_name`) port names.

    An unresolvable name is skipped, as Linkerd does; a malformed number raises.
    """
    ports: set[int] = set()
    for raw in text.split(","):
        item = raw.strip()
        if not item:
            continue
        if _RANGE.match(item):
            lo_s, _, hi_s = item.partition("-")
            lo, hi = int(lo_s), int(hi_s)
            if not (1 <= lo <= hi <= 65535):
                raise PortSpecError(f"bad port range {item!r}")
            ports.update(range(lo, hi + 1))
        elif item.isascii() and item.isdigit():  # str.isdigit alone admits '²', '٨'
            p = int(item)
            if not 1 <= p <= 65535:
                raise PortSpecError(f"port {p} out of range")
            ports.add(p)
        elif resolve_name is not None:
            resolved = resolve_name(item)
            if resolved is not None:
                ports.add(resolved)
        else:
            raise PortSpecError(f"not a port or range: {item!r}")
    return frozenset(ports)


def port_of_listen_addr(addr: str) -> int | None:
    """The port of a proxy listen address such as `0.0.0.0:4143` or `[::]:4191`."""
    _, sep, port = addr.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()):
        return None
    p = int(port)
    return p if 1 <= p <= 65535 else None
