"""The server side of an HTTP/2 connection (RFC 9113) with no I/O: bytes in, events
and bytes out.

`H2Connection.feed` takes what the socket read and `process` handles it in bounded
slices (the caller yields between them, so one connection's flood cannot hold the
event loop); what the peer must be told accumulates in `out`, which the caller writes
in one go. Events reach the caller as calls on a `ConnectionEvents` object rather
than as a list of event objects: the fan-out's busiest input is one small DATA frame
per stream (an xDS ACK), and a method call is all it needs.

Every protocol rule and every budget lives here, so each can be tested by feeding
bytes, without a socket (tests/unit/test_h2core.py). Stream lifecycles are
`h2grpc.streams`' state machine, flow control is `h2grpc.flow`, the floods' limits
are `h2grpc.budgets`, header validation is `h2grpc.headers`.
"""

from __future__ import annotations

import struct
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

import hpack

from h2grpc import frames as f
from h2grpc.budgets import PingStrikes, RateBudget
from h2grpc.flow import SendWindows
from h2grpc.headers import MalformedHeaders, Request, check_trailers, parse_request
from h2grpc.limits import H2Limits
from h2grpc.streams import (
    ENDED,
    RECEIVES,
    RESET_BY_PEER,
    RESET_BY_US,
    SENDS,
    H2Stream,
    Input,
    State,
)

DATA = f.DATA
# Closed streams remembered, so that a late frame on one is judged by how it closed.
CLOSED_MEMORY = 1024


class ConnectionEvents(Protocol):
    """What the connection tells the layer above it (h2grpc.connection)."""

    def request_received(self, stream: H2Stream, request: Request, end_stream: bool) -> None:
        ...

    def stream_data(self, stream: H2Stream, data: bytes) -> None: ...

    def stream_ended(self, stream: H2Stream) -> None:
        """The client sent END_STREAM: it will send nothing more on the stream."""

    def stream_reset(self, stream: H2Stream, code: int) -> None:
        """The stream is gone: the client reset it, or it broke a rule."""

    def stream_drained(self, stream: H2Stream) -> None:
        """Some of the stream's held-back data went out: its writer may go on."""

    def handshake_done(self) -> None: ...

    def ping_acked(self, payload: bytes) -> None: ...

    def terminated(self, code: int, reason: str) -> None:
        """We sent GOAWAY for a connection error: flush `out`, then close."""


class ConnectionError_(Exception):
    """A connection error (§5.4.1): GOAWAY with `code`, then close. `reason` is the
    budget or rule's short name, for metrics; `detail` goes into the GOAWAY."""

    def __init__(self, code: int, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.reason = reason


def _calm(budget: RateBudget | str, detail: str = "") -> ConnectionError_:
    if isinstance(budget, RateBudget):
        return ConnectionError_(f.ENHANCE_YOUR_CALM, budget.name.replace(" ", "_"),
                                budget.describe())
    return ConnectionError_(f.ENHANCE_YOUR_CALM, budget, detail)


def _protocol(detail: str) -> ConnectionError_:
    return ConnectionError_(f.PROTOCOL_ERROR, "protocol_error", detail)


class H2Connection:
    def __init__(self, events: ConnectionEvents, limits: H2Limits,
                 clock: Callable[[], float]) -> None:
        self.events = events
        self.limits = limits
        self.clock = clock
        self.out: list[bytes] = []
        self.streams: dict[int, H2Stream] = {}
        self.windows = SendWindows(self.out, self._drained)
        self.last_stream_id = 0
        self.going_away = False  # we sent GOAWAY: no new streams
        self.peer_going_away = False
        self.terminated: ConnectionError_ | None = None
        self.handshake_complete = False
        self.created_at = clock()
        self.idle_since: float | None = self.created_at
        self.last_read_at = self.created_at
        self._buf = bytearray()
        self._preface = False
        self._peer_settings = False
        self._settings_acked = False
        self._closed: OrderedDict[int, int] = OrderedDict()
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = limits.max_header_list
        self._block: tuple[int, int, bytearray, bool] | None = None  # HEADERS awaiting
        self._continuations = 0  # ... its CONTINUATION frames so far
        self._recv_window = limits.connection_window  # what the client may still send
        self._recv_unacked = 0
        self._replies = 0  # control frames owed to a peer that is not reading
        self._blocks_in_slice = 0  # header blocks handled in this call of process()
        now = clock()
        w = limits.window
        self._resets = RateBudget("resets", limits.max_resets, w)
        self._settings = RateBudget("settings", limits.max_settings, w)
        self._window_updates = RateBudget("window updates", limits.max_window_updates, w)
        self._priority = RateBudget("priority frames", limits.max_priority, w)
        self._empty = RateBudget("empty frames", limits.max_empty_frames, w)
        self._failed = RateBudget("failed requests", limits.failed_request_budget, w)
        self._malformed_requests = RateBudget("malformed requests",
                                              limits.max_malformed_requests, w)
        self._refused = RateBudget("refused streams", limits.max_refused_streams, w)
        for budget in (self._resets, self._settings, self._window_updates, self._priority,
                       self._empty, self._failed, self._malformed_requests, self._refused):
            budget.since = now
        self._pings = PingStrikes(limits.ping_min_interval, limits.max_ping_strikes)
        self._data_frames_seen = 0  # windows.frames_sent when last looked at
        self._ping_frames_seen = 0

    # ------------------------------------------------------------ input

    def initiate(self) -> None:
        """Our side of the preface: SETTINGS, and the connection window we grant."""
        lim = self.limits
        self.out.append(f.settings_frame({
            f.MAX_CONCURRENT_STREAMS: lim.max_concurrent_streams,
            f.INITIAL_WINDOW_SIZE: lim.stream_window,
            f.MAX_HEADER_LIST_SIZE: lim.max_header_list,
            f.ENABLE_PUSH: 0,
        }))
        if lim.connection_window > f.DEFAULT_WINDOW:
            self.out.append(f.window_update(0, lim.connection_window - f.DEFAULT_WINDOW))

    def feed(self, data: bytes) -> None:
        if self.terminated is None:
            self._buf += data
            self.last_read_at = self.clock()

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def process(self, max_bytes: int) -> bool:
        """Handle the complete frames in the buffer, about `max_bytes` of them at most
        and at most `H2Limits.slice_requests` header blocks (a request costs far more
        per byte than any other frame: a slice of nothing but requests would be
        thousands); True when complete frames are left for another call."""
        buf = self._buf
        if self.terminated is not None:
            buf.clear()
            return False
        consumed = 0
        more = False
        self._blocks_in_slice = 0
        try:
            if not self._preface and not self._read_preface(buf):
                return False
            # What we accept is the default frame size: we never announce a larger one.
            for kind, flags, sid, payload, end in f.frames_in(buf, f.DEFAULT_MAX_FRAME):
                consumed = end
                if kind == DATA and self._block is None and self._peer_settings:
                    # The busiest frame (an ACK per stream per change): what _on_frame
                    # would check first holds, straight to its handler.
                    self._on_data(flags, sid, payload)
                else:
                    self._on_frame(kind, flags, sid, payload)
                if self.terminated is not None:
                    break
                if consumed >= max_bytes or self._blocks_in_slice >= self.limits.slice_requests:
                    more = len(buf) - consumed >= 9
                    break
        except f.FrameSizeError as e:
            self._terminate(ConnectionError_(f.FRAME_SIZE_ERROR, "frame_size_error", str(e)))
        except ConnectionError_ as e:
            self._terminate(e)
        if self.terminated is not None:
            buf.clear()
            return False
        del buf[:consumed]
        if self._recv_unacked >= self.limits.connection_window // 2:
            self.out.append(f.window_update(0, self._recv_unacked))
            self._recv_window += self._recv_unacked
            self._recv_unacked = 0
        return more

    def _read_preface(self, buf: bytearray) -> bool:
        n = len(f.PREFACE)
        if buf[:n] != f.PREFACE[:len(buf)]:
            raise _protocol("not an HTTP/2 client (bad connection preface)")
        if len(buf) < n:
            return False
        del buf[:n]
        self._preface = True
        return True

    def _on_frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if self._block is not None and kind != f.CONTINUATION:
            raise _protocol("a header block interrupted before END_HEADERS")
        if not self._peer_settings and (kind != f.SETTINGS or flags & f.ACK):
            raise _protocol("the client preface must be followed by SETTINGS")
        if kind == f.DATA:
            self._on_data(flags, sid, payload)
        elif kind == f.HEADERS:
            self._on_headers(flags, sid, payload)
        elif kind == f.WINDOW_UPDATE:
            self._on_window_update(sid, payload)
        elif kind == f.CONTINUATION:
            self._on_continuation(flags, sid, payload)
        elif kind == f.RST_STREAM:
            self._on_rst_stream(sid, payload)
        elif kind == f.SETTINGS:
            self._on_settings(flags, sid, payload)
        elif kind == f.PING:
            self._on_ping(flags, sid, payload)
        elif kind == f.PRIORITY:
            self._on_priority(sid, payload)
        elif kind == f.GOAWAY:
            if sid != 0:
                raise _protocol("GOAWAY on a stream")
            self.peer_going_away = True
        elif kind == f.PUSH_PROMISE:
            raise _protocol("PUSH_PROMISE from a client")
        # Unknown frame types are ignored (§5.5).

    # ------------------------------------------------------------ frames, §6

    def _on_data(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise _protocol("DATA on stream 0")
        n = len(payload)  # padding included: it is flow-controlled too (§6.1)
        if n > self._recv_window:
            raise ConnectionError_(f.FLOW_CONTROL_ERROR, "flow_control_error",
                                   "DATA beyond the connection window")
        self._recv_window -= n
        self._recv_unacked += n
        stream = self.streams.get(sid)
        if stream is None:
            self._late_frame(sid, "DATA")
            return
        if flags & f.PADDED:
            payload = _unpad(payload)
        if stream.state not in RECEIVES:
            self._stream_error(stream, f.STREAM_CLOSED)
            return
        if n > stream.recv_window:
            self._stream_error(stream, f.FLOW_CONTROL_ERROR)
            return
        stream.recv_window -= n
        stream.recv_unacked += n
        end = flags & f.END_STREAM
        if not payload and not end and not self._empty.spend(self.clock()):
            raise _calm(self._empty)
        if stream.content_length is not None:
            stream.received_bytes += len(payload)
            if stream.received_bytes > stream.content_length or (
                    end and stream.received_bytes != stream.content_length):
                self._malformed(stream, "DATA does not match content-length")
                return
        if payload:
            self.events.stream_data(stream, payload)
        if end and not stream.closed:
            self._remote_end(stream)

    def _on_headers(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise _protocol("HEADERS on stream 0")
        if flags & f.PADDED:
            payload = _unpad(payload)
        self_dependent = False
        if flags & f.PRIORITY_FLAG:
            if len(payload) < 5:
                raise ConnectionError_(f.FRAME_SIZE_ERROR, "frame_size_error",
                                       "HEADERS too short for its priority")
            self_dependent = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF == sid
            payload = payload[5:]
        if not payload and not flags & (f.END_STREAM | f.END_HEADERS) \
                and not self._empty.spend(self.clock()):
            raise _calm(self._empty)
        if not flags & f.END_HEADERS:
            self._block = (sid, flags, bytearray(payload), self_dependent)
            self._continuations = 0
            self._check_block_size(len(payload))
            return
        self._header_block(sid, flags, payload, self_dependent)

    def _on_continuation(self, flags: int, sid: int, payload: bytes) -> None:
        block = self._block
        if block is None or block[0] != sid:
            raise _protocol("CONTINUATION without a header block to continue")
        self._continuations += 1
        if self._continuations > self.limits.max_continuations:
            raise _calm("continuations", f"more than {self.limits.max_continuations} "
                                         "CONTINUATION frames in one header block")
        if not payload and not flags & f.END_HEADERS and not self._empty.spend(self.clock()):
            raise _calm(self._empty)
        block[2].extend(payload)
        self._check_block_size(len(block[2]))
        if flags & f.END_HEADERS:
            self._block = None
            self._header_block(sid, block[1], bytes(block[2]), block[3])

    def _check_block_size(self, size: int) -> None:
        if size > self.limits.max_header_list:
            raise ConnectionError_(f.COMPRESSION_ERROR, "compression_error",
                                   f"header block above {self.limits.max_header_list} bytes")

    def _header_block(self, sid: int, flags: int, block: bytes, self_dependent: bool) -> None:
        self._blocks_in_slice += 1
        try:
            # Decoded whatever becomes of the stream: HPACK's table must stay in step
            # with the client's (RFC 7541 §2.3.2); a block we cannot decode leaves it
            # out of step, so that is a connection error (§4.3).
            headers = [(bytes(k), bytes(v)) for k, v in self._decoder.decode(block, raw=True)]
        except hpack.OversizedHeaderListError:
            raise ConnectionError_(f.COMPRESSION_ERROR, "compression_error",
                                   f"header list above {self.limits.max_header_list} bytes") \
                from None
        except (hpack.HPACKError, IndexError, ValueError) as e:
            raise ConnectionError_(f.COMPRESSION_ERROR, "compression_error",
                                   f"bad header block: {e}") from None
        if len(headers) > self.limits.max_header_fields:
            raise _calm("header_fields",
                        f"more than {self.limits.max_header_fields} fields in a header block")
        end = bool(flags & f.END_STREAM)
        stream = self.streams.get(sid)
        if stream is not None:
            self._trailers(stream, headers, end)
            return
        if sid % 2 == 0:
            raise _protocol("a stream id a client may not open (even)")
        if sid <= self.last_stream_id:
            self._late_frame(sid, "HEADERS")
            return
        self.last_stream_id = sid
        if self_dependent:
            # §5.3.1: a stream cannot depend on itself
            self._refuse(sid, f.PROTOCOL_ERROR, self._malformed_requests)
            return
        if self.going_away:
            self._refuse(sid, f.REFUSED_STREAM, None)  # §6.8: nothing new after our GOAWAY
            return
        if len(self.streams) >= self.limits.max_concurrent_streams:
            # §5.1.2, answered before the request is looked at: refused, not failed. A
            # client within the advertised limit is never refused, so refusals have a
            # budget of their own, and spending it cannot end a conforming client.
            self._refuse(sid, f.REFUSED_STREAM, self._refused)
            return
        try:
            request = parse_request(headers)
        except MalformedHeaders:
            self._refuse(sid, f.PROTOCOL_ERROR, self._malformed_requests)
            return
        stream = H2Stream(sid, self.limits.stream_window)
        stream.move(Input.RECV_HEADERS)
        stream.content_length = request.content_length
        if end and request.content_length:
            # A body promised and none sent.
            self._refuse(sid, f.PROTOCOL_ERROR, self._malformed_requests)
            return
        self.streams[sid] = stream
        self.idle_since = None
        if end:
            stream.move(Input.RECV_END_STREAM)
        self.events.request_received(stream, request, end)

    def _trailers(self, stream: H2Stream, headers: list[tuple[bytes, bytes]],
                  end: bool) -> None:
        if stream.state not in RECEIVES:
            self._stream_error(stream, f.STREAM_CLOSED)
            return
        try:
            if not end:
                raise MalformedHeaders("trailers without END_STREAM")  # §8.1
            check_trailers(headers)
        except MalformedHeaders as e:
            self._malformed(stream, str(e))
            return
        if stream.content_length is not None and stream.received_bytes != stream.content_length:
            self._malformed(stream, "DATA does not match content-length")
            return
        self._remote_end(stream)

    def _on_priority(self, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise _protocol("PRIORITY on stream 0")
        if not self._priority.spend(self.clock()):
            raise _calm(self._priority)
        if len(payload) != 5:
            self._reset_id(sid, f.FRAME_SIZE_ERROR)  # §6.3: a stream error
            return
        if int.from_bytes(payload[:4], "big") & 0x7FFFFFFF == sid:
            self._reset_id(sid, f.PROTOCOL_ERROR)  # §5.3.1
        # Otherwise ignored: RFC 9113 deprecates the priority scheme, and a gRPC
        # server has no use for it.

    def _on_rst_stream(self, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise _protocol("RST_STREAM on stream 0")
        if len(payload) != 4:
            raise ConnectionError_(f.FRAME_SIZE_ERROR, "frame_size_error",
                                   "RST_STREAM of the wrong size")
        if self._idle(sid):
            raise _protocol("RST_STREAM on an idle stream")
        stream = self.streams.get(sid)
        if stream is None:
            return  # closed already
        if not self._resets.spend(self.clock()):
            raise _calm(self._resets)  # CVE-2023-44487, "rapid reset"
        code = int.from_bytes(payload, "big")
        stream.move(Input.RESET)
        self._forget(stream, RESET_BY_PEER)
        self.events.stream_reset(stream, code)

    def _on_settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise _protocol("SETTINGS on a stream")
        if flags & f.ACK:
            if payload:
                raise ConnectionError_(f.FRAME_SIZE_ERROR, "frame_size_error",
                                       "SETTINGS ACK with a payload")
            if not self._settings_acked:
                self._settings_acked = True
                self._check_handshake()
            return
        if len(payload) % 6:
            raise ConnectionError_(f.FRAME_SIZE_ERROR, "frame_size_error",
                                   "SETTINGS of the wrong size")
        if not self._settings.spend(self.clock()):
            raise _calm(self._settings)
        initial: int | None = None
        for i in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, i)
            if key == f.ENABLE_PUSH and value > 1:
                raise _protocol("ENABLE_PUSH other than 0 or 1")
            if key == f.INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise ConnectionError_(f.FLOW_CONTROL_ERROR, "flow_control_error",
                                           "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1")
                initial = value  # only the last value of a frame matters
            elif key == f.MAX_FRAME_SIZE:
                if not f.DEFAULT_MAX_FRAME <= value <= 2**24 - 1:
                    raise _protocol("SETTINGS_MAX_FRAME_SIZE out of range")
                self.windows.max_frame = value
            # HEADER_TABLE_SIZE needs nothing: our header blocks never use the dynamic
            # table. Unknown settings are ignored (§6.5.2).
        self._reply(f.frame(f.SETTINGS, f.ACK, 0))
        if initial is not None:
            self.windows.initial_changed(initial)
        if not self._peer_settings:
            self._peer_settings = True
            self._check_handshake()

    def _on_ping(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0:
            raise _protocol("PING on a stream")
        if len(payload) != 8:
            raise ConnectionError_(f.FRAME_SIZE_ERROR, "frame_size_error",
                                   "PING of the wrong size")
        if flags & f.ACK:
            self.events.ping_acked(payload)
            return
        sent = self.windows.frames_sent
        if sent != self._ping_frames_seen:  # we sent DATA since the last PING
            self._ping_frames_seen = sent
            self._pings.forgive()
        if not self._pings.ping(self.clock()):
            raise _calm("pings", "too_many_pings")
        self._reply(f.frame(f.PING, f.ACK, 0, payload))

    def _on_window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(f.FRAME_SIZE_ERROR, "frame_size_error",
                                   "WINDOW_UPDATE of the wrong size")
        budget = self._window_updates
        if not budget.spend(self.clock()):
            # Each DATA frame we sent earns the client one WINDOW_UPDATE.
            sent = self.windows.frames_sent
            budget.earn(sent - self._data_frames_seen)
            self._data_frames_seen = sent
            if budget.count > budget.limit:
                raise _calm(budget)
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if sid == 0:
            if increment == 0:
                raise _protocol("WINDOW_UPDATE of 0 on the connection")
            if self.windows.connection + increment > f.MAX_WINDOW:
                raise ConnectionError_(f.FLOW_CONTROL_ERROR, "flow_control_error",
                                       "connection window above 2^31-1")
            self.windows.connection_opened(increment)
            return
        stream = self.streams.get(sid)
        if stream is None:
            if self._idle(sid):
                raise _protocol("WINDOW_UPDATE on an idle stream")
            return  # closed: ignored (§6.9)
        if increment == 0:
            self._stream_error(stream, f.PROTOCOL_ERROR)
            return
        if self.windows.window(stream) + increment > f.MAX_WINDOW:
            self._stream_error(stream, f.FLOW_CONTROL_ERROR)
            return
        self.windows.stream_opened(stream, increment)

    # ------------------------------------------------------------ output, for the call

    def send_headers(self, stream: H2Stream, block: bytes = f.RESPONSE_HEADERS) -> None:
        self.out.append(f.frame_header(f.HEADERS, f.END_HEADERS, stream.id, len(block)))
        self.out.append(block)
        self._pings.forgive()

    def send_data(self, stream: H2Stream, data: bytes) -> None:
        """Queue DATA; it goes out as far as the windows allow."""
        if not self.windows.try_send(stream, data):
            self.windows.queue(stream, data)

    def send_trailers(self, stream: H2Stream, block: bytes) -> None:
        """End our side with this header block (empty: with no trailers), after the
        stream's held-back data."""
        if stream.state not in SENDS:
            return
        if stream.pending is not None:
            stream.trailers = block
            return
        self._write_trailers(stream, block)

    def reset_stream(self, stream: H2Stream, code: int = f.CANCEL) -> None:
        """Abandon a stream (RST_STREAM), dropping what it had not sent."""
        if not stream.closed:
            self.out.append(f.rst_stream(stream.id, code))
            stream.move(Input.RESET)
            self._forget(stream, RESET_BY_US)

    def acknowledge(self, stream: H2Stream) -> None:
        """The handler consumed what the client sent: let it send as much again."""
        n = stream.recv_unacked
        if n and stream.state in RECEIVES:
            self.out.append(f.window_update(stream.id, n))
            stream.recv_window += n
        stream.recv_unacked = 0

    def failed_request(self) -> None:
        """A request ended in an error status: a flood of them is a connection error."""
        if self.terminated is None and not self._failed.spend(self.clock()):
            self._terminate(_calm(self._failed))

    def ping(self, payload: bytes) -> None:
        self.out.append(f.frame(f.PING, 0, 0, payload))

    def go_away(self) -> None:
        """Graceful: GOAWAY(NO_ERROR) naming the last stream we will serve."""
        if not self.going_away and self.terminated is None:
            self.going_away = True
            self.out.append(f.goaway(self.last_stream_id, f.NO_ERROR))

    def close_with(self, code: int, reason: str, detail: str) -> None:
        """End the connection for a reason found outside the frames (a timeout)."""
        if self.terminated is None:
            self._terminate(ConnectionError_(code, reason, detail))

    def drop_streams(self) -> list[H2Stream]:
        """The connection is gone: every stream is closed where it stands."""
        streams = list(self.streams.values())
        for stream in streams:
            stream.move(Input.RESET)
            self._forget(stream, RESET_BY_US)
        return streams

    def detach(self) -> None:
        """The connection is gone: drop what refers back to the layer above, and the
        buffers (reference counting then frees the rest)."""
        self.events = _DETACHED
        self.windows.detach()
        self._buf = bytearray()
        self._closed.clear()
        self.out.clear()

    def data_to_send(self) -> bytes:
        data = b"".join(self.out)
        self.out.clear()
        return data

    def peer_reading(self) -> None:
        """What we sent reached the socket: the control replies owed are paid."""
        self._replies = 0

    # ------------------------------------------------------------ internals

    def _drained(self, stream: H2Stream) -> None:
        if stream.pending is None and stream.trailers is not None:
            block, stream.trailers = stream.trailers, None
            self._write_trailers(stream, block)
        self.events.stream_drained(stream)

    def _write_trailers(self, stream: H2Stream, block: bytes) -> None:
        sid = stream.id
        limit = self.windows.max_frame
        if not block:  # no trailers: the end is an empty DATA frame (a plain HTTP answer)
            self.out.append(f.frame(f.DATA, f.END_STREAM, sid))
        elif len(block) <= limit:
            self.out.append(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, sid, block))
        else:
            first, rest = block[:limit], block[limit:]
            self.out.append(f.frame(f.HEADERS, f.END_STREAM, sid, first))
            while rest:
                piece, rest = rest[:limit], rest[limit:]
                self.out.append(f.frame(f.CONTINUATION, 0 if rest else f.END_HEADERS,
                                        sid, piece))
        if stream.move(Input.SEND_END_STREAM) is not State.CLOSED:
            # The client may still be sending. Close its side too (§8.1, as gRPC's own
            # servers do): a gRPC client reports the status only once both are closed.
            self.out.append(f.rst_stream(sid, f.NO_ERROR))
            stream.move(Input.RESET)
            self._forget(stream, RESET_BY_US)
        else:
            self._forget(stream, ENDED)

    def _remote_end(self, stream: H2Stream) -> None:
        if stream.move(Input.RECV_END_STREAM) is State.CLOSED:
            self._forget(stream, ENDED)
        self.events.stream_ended(stream)

    def _stream_error(self, stream: H2Stream, code: int) -> None:
        """§5.4.2: reset this stream, keep the connection."""
        self._reply(f.rst_stream(stream.id, code))
        stream.move(Input.RESET)
        self._forget(stream, RESET_BY_US)
        self.events.stream_reset(stream, code)

    def _malformed(self, stream: H2Stream, _why: str) -> None:
        self._stream_error(stream, f.PROTOCOL_ERROR)
        if not self._malformed_requests.spend(self.clock()):
            raise _calm(self._malformed_requests)

    def _refuse(self, sid: int, code: int, budget: RateBudget | None) -> None:
        """A stream reset before it started (refused, or its request malformed), spending
        `budget`."""
        self._reply(f.rst_stream(sid, code))
        self._remember(sid, RESET_BY_US)
        if budget is not None and not budget.spend(self.clock()):
            raise _calm(budget)

    def _reset_id(self, sid: int, code: int) -> None:
        stream = self.streams.get(sid)
        if stream is not None:
            self._stream_error(stream, code)
        else:
            self._reply(f.rst_stream(sid, code))

    def _late_frame(self, sid: int, kind: str) -> None:
        """DATA or HEADERS on a stream that is not open (§5.1)."""
        if self._idle(sid):
            raise _protocol(f"{kind} on an idle stream")
        how = self._closed.get(sid)
        if how == RESET_BY_US:
            return  # sent before the client saw our RST_STREAM: ignored (§5.4.2)
        if kind == "HEADERS":
            if how is None:
                raise _protocol("a new stream id not above the last one")  # §5.1.1
            if how == ENDED:  # both sides ended it: a new request on it is a connection error
                raise ConnectionError_(f.STREAM_CLOSED, "protocol_error",
                                       "HEADERS on a closed stream")
        self._reply(f.rst_stream(sid, f.STREAM_CLOSED))

    def _idle(self, sid: int) -> bool:
        return sid > self.last_stream_id or (sid % 2 == 0 and sid not in self.streams)

    def _forget(self, stream: H2Stream, how: int) -> None:
        self.windows.forget(stream)
        stream.trailers = None
        if self.streams.pop(stream.id, None) is not None:
            self._remember(stream.id, how)
            if not self.streams:
                self.idle_since = self.clock()

    def _remember(self, sid: int, how: int) -> None:
        closed = self._closed
        closed[sid] = how
        if len(closed) > CLOSED_MEMORY:
            closed.popitem(last=False)

    def _reply(self, frame: bytes) -> None:
        """A control frame the peer's frame asked for. A peer that does not read them
        would have us queue them without end (CVE-2019-9512/9515)."""
        self.out.append(frame)
        self._replies += 1
        if self._replies > self.limits.max_control_replies > 0:
            raise _calm("control_replies", f"more than {self.limits.max_control_replies} "
                                           "control frames owed to a peer that does not read")

    def _check_handshake(self) -> None:
        if self._peer_settings and self._settings_acked and not self.handshake_complete:
            self.handshake_complete = True
            self.events.handshake_done()

    def _terminate(self, error: ConnectionError_) -> None:
        # Kept without its traceback: the frames in it refer back to this connection.
        error.__traceback__ = error.__context__ = error.__cause__ = None
        self.terminated = error
        self.going_away = True
        self._block = None
        self.out.append(f.goaway(self.last_stream_id, error.code, str(error).encode()[:200]))
        self.events.terminated(error.code, error.reason)


class _Detached:
    """The events of a connection that is gone: nobody listens."""

    def request_received(self, stream: H2Stream, request: Request, end_stream: bool) -> None:
        pass

    def stream_data(self, stream: H2Stream, data: bytes) -> None:
        pass

    def stream_ended(self, stream: H2Stream) -> None:
        pass

    def stream_reset(self, stream: H2Stream, code: int) -> None:
        pass

    def stream_drained(self, stream: H2Stream) -> None:
        pass

    def handshake_done(self) -> None:
        pass

    def ping_acked(self, payload: bytes) -> None:
        pass

    def terminated(self, code: int, reason: str) -> None:
        pass


_DETACHED = _Detached()


def _unpad(payload: bytes) -> bytes:
    if not payload:
        raise _protocol("padded frame without a pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise _protocol("padding longer than the frame")
    return payload[1:len(payload) - pad]
