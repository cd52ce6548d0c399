"""What one HTTP/2 connection of the server may do, and how long it may take.

Every field is a `meshbridge serve` flag (`--h2-...`, h2grpc's own names); the
defaults leave any well-behaved gRPC client (grpc-go, grpc C-core, Envoy, a
linkerd2-proxy) far below every limit, and end a flood within a fraction of a
second. docs/reliability.md has the table of what each one answers.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


def _knob(default: float, help_text: str, flag: str | None = None) -> Any:
    return field(default=default, metadata={"help": help_text, "flag": flag})


@dataclass(frozen=True, slots=True)
class H2Limits:
    # Streams and sizes.
    max_concurrent_streams: int = _knob(
        10_000, "SETTINGS_MAX_CONCURRENT_STREAMS", "--max-streams-per-connection")
    max_message_bytes: int = _knob(4 * 1024 * 1024, "largest gRPC request message",
                                   "--max-message-bytes")
    stream_window: int = _knob(256 * 1024, "bytes a client may send on a stream unread")
    connection_window: int = _knob(16 << 20, "bytes a client may send on a connection unread")
    max_header_list: int = _knob(64 * 1024, "a request's header list, bytes (RFC 7541 sizes); "
                                 "above it: GOAWAY COMPRESSION_ERROR")
    max_header_fields: int = _knob(128, "fields in one header block")
    max_continuations: int = _knob(16, "CONTINUATION frames in one header block")

    # Rate budgets: events per `window` seconds on one connection (0: no limit).
    window: float = _knob(10.0, "seconds over which the --h2-max-* rates are counted")
    max_resets: int = _knob(2_000, "streams a client may reset per window (rapid reset)")
    max_settings: int = _knob(100, "SETTINGS frames per window")
    max_window_updates: int = _knob(
        10_000, "WINDOW_UPDATE frames per window beyond one per DATA frame sent")
    max_priority: int = _knob(1_000, "PRIORITY frames per window")
    max_empty_frames: int = _knob(1_000, "DATA/HEADERS/CONTINUATION frames carrying nothing, "
                                  "per window")
    max_failed_requests: int = _knob(1_000, "requests per window that end in an error status, "
                                     "beyond --max-streams-per-connection")
    max_malformed_requests: int = _knob(1_000, "malformed requests per window (each reset "
                                        "with PROTOCOL_ERROR)")
    max_refused_streams: int = _knob(2_000, "streams per window refused for opening beyond "
                                     "--max-streams-per-connection")
    max_control_replies: int = _knob(10_000, "control frames (PING/SETTINGS ACKs, RST_STREAM) "
                                     "owed to a peer that is not reading")

    # PING policy (gRPC keepalive enforcement).
    ping_min_interval: float = _knob(5.0, "a client PING sooner than this after the last "
                                     "one, with no data sent between, is a strike")
    max_ping_strikes: int = _knob(2, "strikes before GOAWAY ENHANCE_YOUR_CALM too_many_pings")

    # Connection lifecycle, seconds (0: off).
    handshake_timeout: float = _knob(20.0, "seconds for the preface and the ACK of our "
                                     "SETTINGS (0: none)")
    idle_timeout: float = _knob(300.0, "seconds a connection may have no stream (0: forever)")
    keepalive_time: float = _knob(30.0, "seconds of silence before the server PINGs (0: never)")
    keepalive_timeout: float = _knob(10.0, "seconds that PING may go unanswered before the "
                                     "connection is closed")
    max_connections_per_client: int = _knob(
        1_000, "connections from one IP address (0: no limit)", "--max-connections-per-client")

    # Fairness between connections.
    read_slice: int = _knob(64 * 1024, "bytes of input handled per loop turn per connection")
    slice_requests: int = _knob(100, "header blocks (requests) handled per loop turn per "
                                "connection")
    write_high_water: int = _knob(4 << 20, "unsent bytes above which the server stops reading "
                                  "that peer")


    @property
    def failed_request_budget(self) -> int:
        """Failed requests a connection may have per window (0: no limit). Every stream
        the client may have open at once may fail without spending `max_failed_requests`:
        a client within the advertised concurrency cannot exhaust the budget in one
        burst (h2spec's §5.1.2 case holds that many failing requests open, then opens
        one more to see it refused)."""
        if self.max_failed_requests <= 0:
            return 0
        return self.max_failed_requests + self.max_concurrent_streams


def flag_of(name: str) -> str:
    """The `meshbridge serve` flag that sets field `name`."""
    for f in fields(H2Limits):
        if f.name == name:
            return str(f.metadata["flag"] or "--h2-" + name.replace("_", "-"))
    raise KeyError(name)


def knobs() -> list[tuple[str, str, type, object, str]]:
    """(field, flag, type, default, help) for every field."""
    defaults = H2Limits()
    return [(f.name, flag_of(f.name), type(getattr(defaults, f.name)),
             getattr(defaults, f.name), str(f.metadata["help"])) for f in fields(H2Limits)]
