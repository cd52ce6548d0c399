"""One HTTP/2 connection of the gRPC server (RFC 9113), as an asyncio protocol.

The connection reads frames, keeps both flow-control directions, turns HEADERS into
calls and DATA into their messages, and writes what the calls send. Everything one
loop turn writes, on every stream of the connection, leaves in one socket write: a
change fanned out to a thousand streams of one connection costs one syscall.
"""

from __future__ import annotations

import asyncio
import struct
from typing import TYPE_CHECKING, Any

import grpc
import hpack
import structlog

from h2grpc import frames as f
from h2grpc.call import ServerCall

if TYPE_CHECKING:
    from h2grpc.server import Server

log = structlog.get_logger("meshbridge.grpc")

# What we let a client send before it must wait for a WINDOW_UPDATE: per stream, and
# for the whole connection (every stream together). A stream's window is given back
# as its handler reads (or at once while it keeps up), so what one stream can make
# the server hold is bounded by its window, whatever the client sends.
STREAM_WINDOW = 256 * 1024
CONNECTION_WINDOW = 16 << 20
# Messages a handler may leave unread before its stream's window stops being given
# back on receipt.
INBOX_SLACK = 16
MAX_HEADER_LIST = 64 * 1024
# A client resetting more streams than this within RESET_WINDOW seconds is flooding
# the server with work it throws away ("rapid reset", CVE-2023-44487): its connection
# is closed with ENHANCE_YOUR_CALM. Proxies cancel a handful of streams a minute.
RESET_BUDGET = 2000
RESET_WINDOW = 10.0
# How long a closed connection waits for the client to close its side.
LINGER = 2.0
# Frames queued for one connection beyond this go to the socket at once rather than
# at the end of the loop turn: the client starts reading while a fan-out goes on.
EAGER_FLUSH = 64 * 1024
# The socket buffer above which writers wait (asyncio's pause_writing).
WRITE_HIGH_WATER = 4 << 20

_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}


class ConnectionError_(Exception):
    """A connection error (§5.4.1): GOAWAY with this code, then close."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class Connection(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.peer = "unknown"
        self.auth_context: dict[str, list[bytes]] = {}
        self.calls: dict[int, ServerCall] = {}
        self.blocked: dict[int, ServerCall] = {}  # calls with data the windows hold back
        self.last_stream_id = 0
        self.paused = False
        self.going_away = False
        self.closed = False
        self._buf = bytearray()
        self._preface = False
        self._out: list[bytes] = []
        self._out_bytes = 0  # DATA bytes in _out (control frames are not counted)
        self._flush_scheduled = False
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = MAX_HEADER_LIST
        self._continuation: tuple[int, int, bytearray] | None = None
        self.send_window = f.DEFAULT_WINDOW  # the connection's, as the peer granted it
        self.peer_stream_window = f.DEFAULT_WINDOW  # the peer's SETTINGS_INITIAL_WINDOW_SIZE
        self.max_frame = f.DEFAULT_MAX_FRAME
        self._recv_unacked = 0
        self._resets = 0
        self._resets_since = 0.0

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.peer = _peer_text(transport.get_extra_info("peername"))
        cert = transport.get_extra_info("peercert")
        if cert:
            self.auth_context = {"transport_security_type": [b"ssl"]}
        self.server.connections.add(self)
        self._emit(f.settings_frame({
            f.MAX_CONCURRENT_STREAMS: self.server.max_concurrent_streams,
            f.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            f.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
            f.ENABLE_PUSH: 0,
        }))
        self._emit(f.window_update(0, CONNECTION_WINDOW - f.DEFAULT_WINDOW))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None
        self._out.clear()
        calls = list(self.calls.values())
        self.calls.clear()
        self.blocked.clear()
        for call in calls:
            call.reset()
        self.server.connection_gone(self)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        for call in list(self.calls.values()):
            call.drained()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return  # lingering after our close: the client's last frames are dropped
        buf = self._buf
        buf += data
        try:
            if not self._preface:
                if len(buf) < len(f.PREFACE):
                    if not f.PREFACE.startswith(bytes(buf)):
                        raise ConnectionError_(f.PROTOCOL_ERROR, "not an HTTP/2 client")
                    return
                if buf[:len(f.PREFACE)] != f.PREFACE:
                    raise ConnectionError_(f.PROTOCOL_ERROR, "not an HTTP/2 client")
                del buf[:len(f.PREFACE)]
                self._preface = True
            self._read_frames(buf)
        except ConnectionError_ as e:
            log.info("http2 connection error", peer=self.peer, reason=str(e))
            self._emit(f.goaway(self.last_stream_id, e.code, str(e).encode()[:200]))
            self._close()
            return
        if self._recv_unacked >= CONNECTION_WINDOW // 2:
            self._emit(f.window_update(0, self._recv_unacked))
            self._recv_unacked = 0

    # ------------------------------------------------------------ reading frames

    def _read_frames(self, buf: bytearray) -> None:
        consumed = 0
        try:
            # What we accept is the default frame size: we never raise it.
            for frame in f.frames_in(buf, f.DEFAULT_MAX_FRAME):
                kind, flags, stream_id, payload, consumed = frame
                self._on_frame(kind, flags, stream_id, payload)
                if self.closed:
                    break
        except f.FrameSizeError as e:
            raise ConnectionError_(f.FRAME_SIZE_ERROR, str(e)) from None
        del buf[:consumed]

    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuation is not None and kind != f.CONTINUATION:
            raise ConnectionError_(f.PROTOCOL_ERROR, "expected CONTINUATION")
        if kind == f.DATA:
            self._on_data(flags, stream_id, payload)
        elif kind == f.HEADERS:
            self._on_headers(flags, stream_id, payload)
        elif kind == f.WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif kind == f.CONTINUATION:
            self._on_continuation(flags, stream_id, payload)
        elif kind == f.RST_STREAM:
            self._on_rst_stream(stream_id, payload)
        elif kind == f.SETTINGS:
            self._on_settings(flags, stream_id, payload)
        elif kind == f.PING:
            self._on_ping(flags, stream_id, payload)
        elif kind == f.GOAWAY:
            self.going_away = True
        elif kind == f.PUSH_PROMISE:
            raise ConnectionError_(f.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # PRIORITY and unknown frame types are ignored (§5.5, §6.3).

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ConnectionError_(f.PROTOCOL_ERROR, "DATA on stream 0")
        self._recv_unacked += len(payload)
        call = self.calls.get(stream_id)
        if call is None:
            if stream_id > self.last_stream_id:
                raise ConnectionError_(f.PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream we have closed: counted for the connection, dropped
        if flags & f.PADDED:
            payload = _unpad(payload)
        call.recv_unacked += len(payload)
        if payload:
            call.received(payload, self.server.max_message_bytes)
        if flags & f.END_STREAM:
            call.remote_end()
        elif not call.ended:
            self.maybe_refill(call)

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise ConnectionError_(f.PROTOCOL_ERROR, "HEADERS on stream 0")
        if flags & f.PADDED:
            payload = _unpad(payload)
        if flags & f.PRIORITY_FLAG:
            payload = payload[5:]
        if not flags & f.END_HEADERS:
            self._continuation = (stream_id, flags, bytearray(payload))
            return
        self._headers_complete(flags, stream_id, payload)

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        pending = self._continuation
        if pending is None or pending[0] != stream_id:
            raise ConnectionError_(f.PROTOCOL_ERROR, "unexpected CONTINUATION")
        pending[2].extend(payload)
        if len(pending[2]) > 4 * MAX_HEADER_LIST:
            raise ConnectionError_(f.ENHANCE_YOUR_CALM, "header block too large")
        if flags & f.END_HEADERS:
            self._continuation = None
            self._headers_complete(pending[1], stream_id, bytes(pending[2]))

    def _headers_complete(self, flags: int, stream_id: int, block: bytes) -> None:
        headers: list[tuple[bytes, bytes]] | None
        try:
            # Decoded even for a stream that is refused: the table must stay in step.
            headers = [(bytes(k), bytes(v)) for k, v in self._decoder.decode(block, raw=True)]
        except hpack.OversizedHeaderListError:
            headers = None
        except hpack.HPACKError as e:
            raise ConnectionError_(f.COMPRESSION_ERROR, f"bad header block: {e}") from None
        call = self.calls.get(stream_id)
        if call is not None:  # trailers from the client end its side of the stream
            if flags & f.END_STREAM:
                call.remote_end()
            return
        if stream_id % 2 == 0:
            raise ConnectionError_(f.PROTOCOL_ERROR, "even stream id from a client")
        if stream_id <= self.last_stream_id:
            self._emit(f.rst_stream(stream_id, f.STREAM_CLOSED))
            return
        self.last_stream_id = stream_id
        if self.going_away or self.server.stopping:
            self._emit(f.rst_stream(stream_id, f.REFUSED_STREAM))
            return
        if len(self.calls) >= self.server.max_concurrent_streams:
            self._emit(f.rst_stream(stream_id, f.REFUSED_STREAM))
            return
        self._start_call(flags, stream_id, headers)

    def _start_call(self, flags: int, stream_id: int,
                    headers: list[tuple[bytes, bytes]] | None) -> None:
        method = path = b""
        content_type = b""
        timeout: bytes | None = None
        encoding: str | None = None
        metadata: list[tuple[str, str | bytes]] = []
        for name, value in headers or ():
            if name[:1] == b":":
                if name == b":path":
                    path = value
                elif name == b":method":
                    method = value
            elif name == b"content-type":
                content_type = value
            elif name == b"grpc-timeout":
                timeout = value
            elif name == b"grpc-encoding":
                encoding = value.decode("latin-1")
            elif name in (b"te", b"user-agent", b"grpc-accept-encoding"):
                metadata.append((name.decode("latin-1"), value.decode("latin-1")))
            else:
                key = name.decode("latin-1")
                metadata.append((key, _binary(value) if key.endswith("-bin")
                                 else value.decode("latin-1")))
        call = ServerCall(self, stream_id, path.decode("latin-1"), tuple(metadata),
                          encoding, self.peer_stream_window)
        self.calls[stream_id] = call
        if flags & f.END_STREAM:
            call.remote_closed = True
        if headers is None:
            self.finish(call, grpc.StatusCode.RESOURCE_EXHAUSTED, "request headers too large")
            return
        if method != b"POST" or not content_type.startswith(b"application/grpc"):
            self.finish(call, grpc.StatusCode.UNIMPLEMENTED,
                        "not a gRPC request (POST with content-type application/grpc)")
            return
        if timeout is not None:
            seconds = _timeout_seconds(timeout)
            if seconds is None:
                self.finish(call, grpc.StatusCode.INTERNAL, "malformed grpc-timeout")
                return
            call.start_deadline(seconds)
        call.task = self.loop.create_task(call.run(self.server.handlers,
                                                   self.server.interceptors))
        self.server.call_started(call)

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(f.FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if stream_id == 0:
            if increment == 0:
                raise ConnectionError_(f.PROTOCOL_ERROR, "zero WINDOW_UPDATE")
            self.send_window += increment
            if self.send_window > f.MAX_WINDOW:
                raise ConnectionError_(f.FLOW_CONTROL_ERROR, "connection window overflow")
            for blocked in list(self.blocked.values()):
                self._drain(blocked)
                if self.send_window <= 0:
                    break
            self._schedule()
            return
        call = self.calls.get(stream_id)
        if call is None:
            return
        call.send_window += increment
        if call.send_window > f.MAX_WINDOW:
            self._emit(f.rst_stream(stream_id, f.FLOW_CONTROL_ERROR))
            self._forget(call)
            call.reset()
            return
        if call.pending is not None or call.trailers is not None:
            self._drain(call)
            self._schedule()

    def _on_rst_stream(self, stream_id: int, payload: bytes) -> None:
        call = self.calls.pop(stream_id, None)
        if call is not None:
            self.blocked.pop(stream_id, None)
            call.reset()
            now = self.loop.time()
            if now - self._resets_since > RESET_WINDOW:
                self._resets, self._resets_since = 0, now
            self._resets += 1
            if self._resets > RESET_BUDGET:
                raise ConnectionError_(f.ENHANCE_YOUR_CALM,
                                       f"more than {RESET_BUDGET} streams reset in "
                                       f"{RESET_WINDOW:g} s")

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0:
            raise ConnectionError_(f.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & f.ACK:
            return
        if len(payload) % 6:
            raise ConnectionError_(f.FRAME_SIZE_ERROR, "SETTINGS of the wrong size")
        for i in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, i)
            if key == f.INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise ConnectionError_(f.FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self.peer_stream_window
                self.peer_stream_window = value
                for call in self.calls.values():
                    call.send_window += delta
                if delta > 0:
                    for call in list(self.blocked.values()):
                        self._drain(call)
            elif key == f.MAX_FRAME_SIZE:
                if not f.DEFAULT_MAX_FRAME <= value <= 2**24 - 1:
                    raise ConnectionError_(f.PROTOCOL_ERROR, "bad MAX_FRAME_SIZE")
                self.max_frame = value
        self._emit(f.frame(f.SETTINGS, f.ACK, 0))

    def _on_ping(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0 or len(payload) != 8:
            raise ConnectionError_(f.PROTOCOL_ERROR, "bad PING")
        if not flags & f.ACK:
            self._emit(f.frame(f.PING, f.ACK, 0, payload))

    # ------------------------------------------------------------ writing, for calls

    def send_headers(self, call: ServerCall) -> None:
        call.headers_sent = True
        self._out.append(f.frame_header(f.HEADERS, f.END_HEADERS, call.stream_id,
                                        len(f.RESPONSE_HEADERS)))
        self._out.append(f.RESPONSE_HEADERS)
        self._schedule()

    def send_message(self, call: ServerCall, data: bytes) -> None:
        """Queue one framed gRPC message; it goes out as far as the windows allow."""
        if not call.headers_sent:
            self.send_headers(call)
        n = len(data)
        if call.pending is None:
            if n <= call.send_window and n <= self.send_window and n <= self.max_frame:
                self._out.append(f.frame_header(f.DATA, 0, call.stream_id, n))
                self._out.append(data)
                call.send_window -= n
                self.send_window -= n
                self._out_bytes += n
                if self._out_bytes > EAGER_FLUSH:
                    self._flush()
                else:
                    self._schedule()
                return
            call.pending = [data]
        else:
            call.pending.append(data)
        call.pending_bytes += n
        self.blocked[call.stream_id] = call
        self._drain(call)
        self._schedule()

    def finish(self, call: ServerCall, code: grpc.StatusCode, details: str) -> None:
        """End the call with this status: trailers now, or after its unsent data."""
        if call.ended:
            return
        call.ended = True
        block = f.trailers_block(code.value[0], details[:4096], call.headers_sent)
        call.headers_sent = True
        if call.pending is not None:
            call.trailers = block
            return
        self._send_trailers(call, block)
        self._schedule()

    def reset(self, call: ServerCall) -> None:
        """Abandon the call: RST_STREAM(CANCEL), drop what it had not sent."""
        if call.stream_id in self.calls:
            self._emit(f.rst_stream(call.stream_id, f.CANCEL))
            self._forget(call)
        call.reset()

    def maybe_refill(self, call: ServerCall) -> None:
        """Give a stream's window back once half of it is used, unless its handler is
        behind: then only as it reads."""
        if call.recv_unacked >= STREAM_WINDOW // 2 and call.unread() <= INBOX_SLACK:
            self.refill(call)

    def refill(self, call: ServerCall) -> None:
        """The handler consumed what the client sent: let it send as much again."""
        if call.recv_unacked and not call.remote_closed:
            self._emit(f.window_update(call.stream_id, call.recv_unacked))
        call.recv_unacked = 0

    def call_done(self, call: ServerCall) -> None:
        """The handler's task is over (the stream may still be flushing its end)."""
        if call.stream_id in self.calls and not call.ended:
            self.reset(call)
        self.server.call_done(call)
        if self.going_away and not self.calls:
            self._close()

    # ------------------------------------------------------------ internals

    def _drain(self, call: ServerCall) -> None:
        pending = call.pending
        while pending:
            allowed = min(call.send_window, self.send_window, self.max_frame)
            if allowed <= 0:
                break
            chunk = pending[0]
            if len(chunk) <= allowed:
                pending.pop(0)
            else:
                pending[0] = chunk[allowed:]
                chunk = chunk[:allowed]
            n = len(chunk)
            self._out.append(f.frame_header(f.DATA, 0, call.stream_id, n))
            self._out.append(chunk)
            call.send_window -= n
            self.send_window -= n
            call.pending_bytes -= n
        if not pending:
            call.pending = None
            self.blocked.pop(call.stream_id, None)
            if call.trailers is not None:
                block, call.trailers = call.trailers, None
                self._send_trailers(call, block)
        call.drained()

    def _send_trailers(self, call: ServerCall, block: bytes) -> None:
        sid = call.stream_id
        if len(block) <= self.max_frame:
            self._out.append(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, sid, block))
        else:
            first, rest = block[:self.max_frame], block[self.max_frame:]
            self._out.append(f.frame(f.HEADERS, f.END_STREAM, sid, first))
            while rest:
                piece, rest = rest[:self.max_frame], rest[self.max_frame:]
                self._out.append(f.frame(f.CONTINUATION, 0 if rest else f.END_HEADERS,
                                         sid, piece))
        if not call.remote_closed:
            # The client may still be sending. Close its side too (§8.1, as gRPC's own
            # servers do): a gRPC client reports the status only once both are closed.
            self._out.append(f.rst_stream(sid, f.NO_ERROR))
        self._forget(call)

    def _forget(self, call: ServerCall) -> None:
        self.calls.pop(call.stream_id, None)
        self.blocked.pop(call.stream_id, None)
        if self.going_away and not self.calls:
            self._close()

    def _emit(self, data: bytes) -> None:
        self._out.append(data)
        self._schedule()

    def _schedule(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._out_bytes = 0
        # Nothing is written once closed: _close flushed what was queued before it.
        if self._out and self.transport is not None and not self.closed:
            self.transport.write(b"".join(self._out))
        self._out.clear()

    def go_away(self) -> None:
        """No new streams (GOAWAY, NO_ERROR); close once the open ones are done."""
        if self.closed:
            return
        self.going_away = True
        self._emit(f.goaway(self.last_stream_id, f.NO_ERROR))
        if not self.calls:
            self._close()

    def abandon(self) -> None:
        """Shutdown is over: reset what is left (a stream whose client never read its
        end, say) and close."""
        self.going_away = True
        for call in list(self.calls.values()):
            self.reset(call)
        self._close()

    def _close(self) -> None:
        """Close after what is queued is written. Without TLS our side is shut first
        and the client's last frames are read and dropped until it closes: closing a
        socket with unread data in it resets the connection, and a reset can discard
        the final statuses before the client has read them."""
        if self.closed:
            return
        self._flush()
        self.closed = True
        transport = self.transport
        if transport is None:
            return
        if transport.can_write_eof():
            try:
                transport.write_eof()
            except OSError:  # the client is gone already
                transport.close()
                return
            self.loop.call_later(LINGER, transport.close)
        else:
            transport.close()

    def eof_received(self) -> bool:
        return False  # the client closed its side: close ours (after what is queued)


def _unpad(payload: bytes) -> bytes:
    if not payload:
        raise ConnectionError_(f.PROTOCOL_ERROR, "padded frame without a pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise ConnectionError_(f.PROTOCOL_ERROR, "padding longer than the frame")
    return payload[1:len(payload) - pad]


def _timeout_seconds(value: bytes) -> float | None:
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in _TIMEOUT_UNITS:
        return None
    return int(digits) * _TIMEOUT_UNITS[unit]


def _binary(value: bytes) -> bytes:
    import base64

    return base64.b64decode(value + b"=" * (-len(value) % 4))


def _peer_text(peername: Any) -> str:
    """grpc's spelling of a peer: ipv4:1.2.3.4:5 or ipv6:[::1]:5."""
    if isinstance(peername, tuple) and len(peername) >= 2:
        host, port = peername[0], peername[1]
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
    return f"unix:{peername}" if peername else "unknown"
