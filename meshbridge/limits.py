"""Limits on the shared gRPC port, so that no one client can hurt the others.

Set with `meshbridge serve` flags; each gives a clear status when exceeded:

    --max-streams-per-connection  HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: the client's
                                  transport queues further streams (no error, no harm)
    --max-message-bytes           a larger request fails with RESOURCE_EXHAUSTED
    --max-streams-per-client      open streams from one client address; the next one
                                  fails with RESOURCE_EXHAUSTED naming the limit

The per-client limit is enforced by `meshbridge.rpcguard.RpcGuard`. Authority length (253
+ port) and resource names per xDS request are enforced by the protocol layers, which
know what a name is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from h2grpc.limits import H2Limits


@dataclass(frozen=True, slots=True)
class Limits:
    max_streams_per_connection: int = 10000
    max_message_bytes: int = 4 * 1024 * 1024
    max_streams_per_client: int = 20000
    max_resource_names: int = 10000  # per xDS request, read by xds_api
    # Calls gRPC has accepted but grpc.aio has not yet handed to a handler. C-core's
    # default hard limit (3000) silently stalls a burst of new streams (thousands of
    # proxies reconnecting at once) well below the stream limits above.
    max_pending_calls: int = 100_000
    # The native server's HTTP/2 budgets and timeouts (`--h2-*` flags).
    h2: H2Limits = field(default_factory=H2Limits)

    def server_options(self) -> list[tuple[str, Any]]:
        return [
            ("grpc.max_concurrent_streams", self.max_streams_per_connection),
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.server.max_pending_requests", self.max_pending_calls),
            ("grpc.server.max_pending_requests_hard_limit", self.max_pending_calls),
        ]


# For load tests and harnesses: every one of their clients comes from 127.0.0.1, so the
# per-address connection limit (a defence against one pod opening thousands) is off.
LOOPBACK_CROWD = H2Limits(max_connections_per_client=0)


def peer_address(peer: str) -> str:
    """`ipv4:127.0.0.1:5555` / `ipv6:[::1]:5555` -> the address without the port."""
    _, _, rest = peer.partition(":")
    host, _, _ = rest.rpartition(":")
    return host.strip("[]") or peer
