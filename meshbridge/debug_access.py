"""Who may read meshbridge's debug answers: the admin port's debug pages and the
gRPC port's debug types (`istio.io/debug/*`, what istioctl asks istiod for).

Both reveal configuration (every client, what each was sent), so they are served
under one setting, `--debug-access`:

    local  (default) to clients on the loopback network only: `kubectl port-forward`
           and `kubectl exec` arrive there, other pods do not
    any    to every client that reaches the port
    off    to nobody

and, on the gRPC port, when `--client-ca` is set, only to a client that presented a
certificate that CA signed (mTLS).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Final

ACCESS_MODES: Final = ("local", "any", "off")
DEFAULT_ACCESS: Final = "local"


def peer_address(peer: str) -> str:
    """The IP address in a peer as grpc spells it (`ipv4:1.2.3.4:5`, `ipv6:[::1]:5`)
    or as a socket names it (`1.2.3.4`); "" for anything else (a Unix socket)."""
    text = peer
    for prefix in ("ipv4:", "ipv6:"):
        if text.startswith(prefix):
            text = text[len(prefix):]
            # [v6]:port or v4:port
            text = text[1:].split("]", 1)[0] if text.startswith("[") else \
                text.rsplit(":", 1)[0]
            break
    try:
        return str(ipaddress.ip_address(text.split("%", 1)[0]))
    except ValueError:
        return ""


def _loopback(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


@dataclass(frozen=True, slots=True)
class DebugAccess:
    """The `--debug-access` setting, and whether the gRPC port asks for client
    certificates (`--client-ca`)."""

    mode: str = DEFAULT_ACCESS
    client_ca: bool = False

    def __post_init__(self) -> None:
        if self.mode not in ACCESS_MODES:
            raise ValueError(f"debug access must be one of {', '.join(ACCESS_MODES)}, "
                             f"not {self.mode!r}")

    def refusal(self, address: str) -> str | None:
        """Why a client at `address` may not read debug answers, or None if it may."""
        if self.mode == "off":
            return "debug answers are off (--debug-access off)"
        if self.mode == "local" and not _loopback(address):
            return (f"debug answers are served to loopback clients only (--debug-access "
                    f"local), not to {address or 'this client'}")
        return None

    def grpc_refusal(self, peer: str, certified: bool) -> str | None:
        """`refusal` for a gRPC client at `peer` (grpc's spelling); `certified`: it
        presented a certificate the port verified."""
        if self.client_ca and not certified:
            return "debug answers need a client certificate (--client-ca is set)"
        return self.refusal(peer_address(peer))
