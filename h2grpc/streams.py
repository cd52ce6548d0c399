"""An HTTP/2 stream's lifecycle as a state machine (RFC 9113 §5.1), server side.

A server never pushes, so its streams are the client's odd ids and start when their
HEADERS arrive; "reserved" states never occur. The transitions are a table, and every
state change in the package goes through `H2Stream.move`, so the rules of §5.1 —
what may be received or sent in which state — are read off one place.

`H2Stream` also carries the stream's flow-control and buffered-output state, owned by
`h2grpc.flow` and `h2grpc.core`; the gRPC call that serves the stream hangs off
`owner`.
"""

from __future__ import annotations

import enum
from typing import Any


class State(enum.Enum):
    IDLE = "idle"
    OPEN = "open"
    HALF_CLOSED_REMOTE = "half-closed (remote)"  # the client has sent END_STREAM
    HALF_CLOSED_LOCAL = "half-closed (local)"  # we have sent END_STREAM
    CLOSED = "closed"

    # Members are singletons compared by identity: hashed by it too, in C (Enum's own
    # __hash__ is a Python call, and every DATA frame's state is looked up in a set).
    __hash__ = object.__hash__


class Input(enum.Enum):
    RECV_HEADERS = "recv HEADERS"
    RECV_END_STREAM = "recv END_STREAM"
    SEND_END_STREAM = "send END_STREAM"
    RESET = "send or recv RST_STREAM"

    __hash__ = object.__hash__


_TRANSITIONS: dict[tuple[State, Input], State] = {
    (State.IDLE, Input.RECV_HEADERS): State.OPEN,
    (State.OPEN, Input.RECV_END_STREAM): State.HALF_CLOSED_REMOTE,
    (State.OPEN, Input.SEND_END_STREAM): State.HALF_CLOSED_LOCAL,
    (State.HALF_CLOSED_LOCAL, Input.RECV_END_STREAM): State.CLOSED,
    (State.HALF_CLOSED_REMOTE, Input.SEND_END_STREAM): State.CLOSED,
    (State.IDLE, Input.RESET): State.CLOSED,
    (State.OPEN, Input.RESET): State.CLOSED,
    (State.HALF_CLOSED_REMOTE, Input.RESET): State.CLOSED,
    (State.HALF_CLOSED_LOCAL, Input.RESET): State.CLOSED,
    (State.CLOSED, Input.RESET): State.CLOSED,
}

# §5.1: DATA and trailers may arrive while the client's side is open; after its
# END_STREAM they are a stream error STREAM_CLOSED.
RECEIVES = frozenset({State.OPEN, State.HALF_CLOSED_LOCAL})
# Looked up once: an enum member read off its class costs a Python-level lookup.
_CLOSED = State.CLOSED
# We may send DATA and trailers while our side is open.
SENDS = frozenset({State.OPEN, State.HALF_CLOSED_REMOTE})


class StreamStateError(Exception):
    """An input the state does not allow (a bug in the caller, not the peer's fault:
    peer frames are checked against RECEIVES before they are applied)."""


# How a closed stream ended, remembered for a while so that late frames are judged
# right (§5.1 "closed"; §6.4: frames after our RST_STREAM are ignored).
RESET_BY_US = 1
RESET_BY_PEER = 2
ENDED = 3

# Where a stream's unsent data waits (h2grpc.flow).
NOT_WAITING = 0
WAITING_CONNECTION = 1  # its own window is open; the connection's is not
WAITING_STREAM = 2  # its own window is shut


class H2Stream:
    __slots__ = (
        "content_length",
        "heap_token",
        "id",
        "owner",
        "pending",
        "pending_bytes",
        "received_bytes",
        "recv_unacked",
        "recv_window",
        "state",
        "trailers",
        "waiting",
        "window_delta",
    )

    def __init__(self, stream_id: int, recv_window: int) -> None:
        self.id = stream_id
        self.state = State.IDLE
        self.owner: Any = None  # the call serving it
        # Send side. Our window on this stream is the peer's current initial window
        # plus window_delta (its WINDOW_UPDATEs minus what we sent), so a change of
        # SETTINGS_INITIAL_WINDOW_SIZE costs nothing per stream (§6.9.2).
        self.window_delta = 0
        self.pending: list[bytes] | None = None  # framed messages the windows hold back
        self.pending_bytes = 0
        self.trailers: bytes | None = None  # the closing header block, behind `pending`
        self.waiting = NOT_WAITING
        self.heap_token = 0  # invalidates this stream's older entries in flow's heap
        # Receive side: what the client may still send before we grant more, and what
        # it sent that we have not given back yet.
        self.recv_window = recv_window
        self.recv_unacked = 0
        # §8.1.1: a request's content-length must match the DATA it sends.
        self.content_length: int | None = None
        self.received_bytes = 0

    def move(self, what: Input) -> State:
        try:
            self.state = _TRANSITIONS[(self.state, what)]
        except KeyError:
            raise StreamStateError(f"stream {self.id}: {what.value} in {self.state.value}") \
                from None
        return self.state

    @property
    def closed(self) -> bool:
        return self.state is _CLOSED

    def __repr__(self) -> str:
        return f"<H2Stream {self.id} {self.state.value}>"
