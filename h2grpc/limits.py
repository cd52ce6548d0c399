"""What one HTTP/2 connection of the server may do, and how long it may take.

Every field is a `meshbridge serve` flag (`--h2-...`, h2grpc's own names); the
defaults leave any well-behaved gRPC client (grpc-go, grpc C-core, Envoy, a
linkerd2-proxy) far below every limit, and end a flood within a fraction of a
second. docs/reliability.md has the table of what each one answers.
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True, slots=True)
class H2Limits:
    # Streams and sizes.
    max_concurrent_streams: int = 10_000  # SETTINGS_MAX_CONCURRENT_STREAMS
    max_message_bytes: int = 4 * 1024 * 1024  # one gRPC request message
    stream_window: int = 256 * 1024  # what a client may send on a stream unread
    connection_window: int = 16 << 20  # ... and on the whole connection
    max_header_list: int = 64 * 1024  # a request's header list (RFC 7541 §4.1 sizes)
    max_header_fields: int = 128  # fields in one header block
    max_continuations: int = 16  # CONTINUATION frames in one header block

    # Rate budgets: events per `window` seconds on one connection (0: no limit).
    window: float = 10.0
    max_resets: int = 2_000  # streams the client resets (rapid reset)
    max_settings: int = 100  # SETTINGS frames
    max_window_updates: int = 10_000  # WINDOW_UPDATEs beyond one per DATA frame we send
    max_priority: int = 1_000  # PRIORITY frames
    max_empty_frames: int = 1_000  # DATA/HEADERS/CONTINUATION frames carrying nothing
    max_failed_requests: int = 1_000  # streams that end in an error status or reset
    # Control frames we owe a peer that does not read (PING/SETTINGS ACKs, RST_STREAMs).
    max_control_replies: int = 10_000

    # PING policy (gRPC keepalive enforcement).
    ping_min_interval: float = 5.0
    max_ping_strikes: int = 2

    # Connection lifecycle, seconds (0: off).
    handshake_timeout: float = 20.0  # preface and the ACK of our SETTINGS
    idle_timeout: float = 300.0  # no open stream
    keepalive_time: float = 30.0  # silence before we PING
    keepalive_timeout: float = 10.0  # how long that PING may go unanswered
    max_connections_per_client: int = 1_000  # from one IP address (0: no limit)

    # Fairness between connections.
    read_slice: int = 64 * 1024  # bytes of input handled per loop turn per connection
    write_high_water: int = 4 << 20  # unsent bytes above which we stop reading the peer


def limit_names() -> list[str]:
    return [f.name for f in fields(H2Limits)]
