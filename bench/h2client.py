"""A lean gRPC client for load generation: many streams on one HTTP/2 connection,
driven by callbacks instead of a task and a grpc.aio call per stream.

The fan-out and connect benchmarks measure the server. With grpc.aio's client, one
Python process spends ~80 us per xDS message (read, decode, ACK write through the
completion queue), so 5,000 streams cost the *client* ~400 ms and the figure says
more about the client than about meshbridge; Envoys and proxies are separate
processes, most in C++ or Rust. This client does the same protocol work per message
(every response decoded by the caller, every xDS response ACKed) for a fraction of
that. It speaks HTTP/2 frames directly (RFC 9113), with windows so large that it
never holds the server back, and decodes the server's header blocks with `hpack`.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import cast

import hpack

from h2grpc import frames as f

# Our receive windows: as large as HTTP/2 allows, so the server is never held back.
_WINDOW = f.MAX_WINDOW
_REFILL = 1 << 30
# Any frame length HTTP/2 can express (we never hold the server to the default).
_MAX_FRAME = 2**24 - 1
# A frame header: length (24 bits, as 8 + 16), type, flags, stream id (RFC 9113, section 4.1).
_FRAME_HEADER = struct.Struct(">BHBBI")
# A DATA frame's header and the gRPC prefix (compressed flag, length) of its message.
_DATA_HEADER = struct.Struct(">BHBBIBI")
_MESSAGE_LENGTH = struct.Struct(">I")

OnMessage = Callable[[int, bytes], None]
OnEnd = Callable[[int, str], None]


class LeanConnection(asyncio.Protocol):
    """One HTTP/2 connection to a gRPC server; `open` starts a stream on it."""

    def __init__(self, authority: str, on_message: OnMessage, on_end: OnEnd) -> None:
        self.authority = authority.encode()
        self.on_message = on_message
        self.on_end = on_end
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self.ready = self._loop.create_future()
        self._next_id = 1
        self._buf = bytearray()
        self._partial: dict[int, bytearray] = {}
        self._status: dict[int, str] = {}
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self._decoder = hpack.Decoder()
        self._received = 0
        self.send_window = f.DEFAULT_WINDOW
        self.stream_window = f.DEFAULT_WINDOW  # the server's initial window per stream
        self._stream_windows: dict[int, int] = {}
        # Messages waiting for the server's window: (stream, message, end of stream).
        self._held: list[tuple[int, bytes, bool]] = []

    @classmethod
    async def connect(cls, host: str, port: int, on_message: OnMessage,
                      on_end: OnEnd) -> LeanConnection:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(
            lambda: cls(f"{host}:{port}", on_message, on_end), host, port)
        await conn.ready
        return conn

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = transport = cast(asyncio.Transport, transport)
        transport.write(f.PREFACE + f.settings_frame({
            f.INITIAL_WINDOW_SIZE: _WINDOW, f.ENABLE_PUSH: 0})
            + f.window_update(0, _WINDOW - f.DEFAULT_WINDOW))

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if not self.ready.done():
            self.ready.set_exception(ConnectionError("connection lost before SETTINGS"))
        for sid in list(self._stream_windows):
            self.on_end(sid, "UNAVAILABLE: connection lost")
        self._stream_windows.clear()

    def data_received(self, data: bytes) -> None:
        # The frame loop is written out (not h2grpc.frames.frames_in) because it runs
        # once per message of every stream: the load client's CPU per change shares
        # the cores with the server it measures. A DATA frame that holds one whole
        # gRPC message (the usual case) is handed on from the buffer without a
        # further copy of its payload.
        buf = self._buf
        buf += data
        offset, size = 0, len(buf)
        header = _FRAME_HEADER.unpack_from
        while size - offset >= 9:
            high, low, kind, flags, sid = header(buf, offset)
            length = high << 16 | low
            if length > _MAX_FRAME:
                raise ValueError(f"frame of {length} bytes")
            end = offset + 9 + length
            if end > size:
                break
            if kind == f.DATA:
                self._received += length
                if not flags & f.PADDED and length >= 5 and sid not in self._partial \
                        and _MESSAGE_LENGTH.unpack_from(buf, offset + 10)[0] + 5 == length:
                    self.on_message(sid, bytes(buf[offset + 14:end]))
                    if flags & f.END_STREAM:
                        self._ended(sid, self._status.pop(sid, "OK"))
                else:
                    self._on_data(sid, flags, bytes(buf[offset + 9:end]))
            else:
                sid &= 0x7FFFFFFF
                payload = bytes(buf[offset + 9:end])
                if kind == f.HEADERS:
                    self._on_headers(sid, flags, payload)
                elif kind == f.SETTINGS and not flags & f.ACK:
                    self._on_settings(payload)
                elif kind == f.PING and not flags & f.ACK:
                    self._emit(f.frame(f.PING, f.ACK, 0, payload))
                elif kind == f.WINDOW_UPDATE:
                    self._on_window_update(sid, payload)
                elif kind == f.RST_STREAM:
                    self._ended(sid, "RST_STREAM")
                # GOAWAY: open streams run to their end; nothing new is opened here.
            offset = end
        del buf[:offset]
        if self._received >= _REFILL:
            self._emit(f.window_update(0, self._received))
            self._received = 0

    # ------------------------------------------------------------ streams

    def open(self, path: str, request: bytes, end_stream: bool = False) -> int:
        """Start a stream with its first request; returns the stream id."""
        sid = self._next_id
        self._next_id += 2
        block = b"".join((
            f.literal(b":method", b"POST"), f.literal(b":scheme", b"http"),
            f.literal(b":path", path.encode()), f.literal(b":authority", self.authority),
            f.literal(b"content-type", b"application/grpc"), f.literal(b"te", b"trailers")))
        self._out.append(f.frame(f.HEADERS, f.END_HEADERS, sid, block))
        self._stream_windows[sid] = self.stream_window
        self.send(sid, request, end_stream)
        return sid

    def send(self, sid: int, message: bytes, end_stream: bool = False) -> None:
        size = len(message) + 5
        window = self._stream_windows.get(sid)
        if window is None:
            return  # the stream is over
        if self._held or size > window or size > self.send_window:
            self._held.append((sid, message, end_stream))
            return
        self._stream_windows[sid] = window - size
        self.send_window -= size
        # The frame header and the gRPC message prefix in one pack (RFC 9113, section 4.1).
        self._out.append(_DATA_HEADER.pack(size >> 16, size & 0xFFFF, f.DATA,
                                           f.END_STREAM if end_stream else 0, sid, 0,
                                           size - 5) + message)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def close(self) -> None:
        if self.transport is not None:
            self._flush()
            self.transport.close()

    # ------------------------------------------------------------ frames

    def _on_data(self, sid: int, flags: int, payload: bytes) -> None:
        if flags & f.PADDED:
            payload = payload[1:len(payload) - payload[0]]
        partial = self._partial.get(sid)
        if partial is None and len(payload) >= 5:
            n = struct.unpack_from(">I", payload, 1)[0]
            if n + 5 == len(payload):  # one whole message: the usual case
                self.on_message(sid, payload[5:])
                if flags & f.END_STREAM:
                    self._ended(sid, self._status.pop(sid, "OK"))
                return
        if partial is None:
            partial = self._partial[sid] = bytearray()
        partial += payload
        while len(partial) >= 5:
            n = struct.unpack_from(">I", partial, 1)[0]
            if len(partial) < n + 5:
                break
            message = bytes(partial[5:n + 5])
            del partial[:n + 5]
            self.on_message(sid, message)
        if not partial:
            del self._partial[sid]

    def _on_headers(self, sid: int, flags: int, payload: bytes) -> None:
        headers = dict(self._decoder.decode(payload, raw=True))
        status = headers.get(b"grpc-status")
        if status is not None and flags & f.END_STREAM:
            message = headers.get(b"grpc-message", b"").decode(errors="replace")
            self._ended(sid, "OK" if status == b"0" else f"{status.decode()}: {message}")

    def _on_settings(self, payload: bytes) -> None:
        for i in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, i)
            if key == f.INITIAL_WINDOW_SIZE:
                delta = value - self.stream_window
                self.stream_window = value
                for sid in self._stream_windows:
                    self._stream_windows[sid] += delta
        self._emit(f.frame(f.SETTINGS, f.ACK, 0))
        if not self.ready.done():
            self.ready.set_result(None)

    def _on_window_update(self, sid: int, payload: bytes) -> None:
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if sid == 0:
            self.send_window += increment
        elif sid in self._stream_windows:
            self._stream_windows[sid] += increment
        held, self._held = self._held, []
        for held_sid, message, end_stream in held:
            self.send(held_sid, message, end_stream)

    def _ended(self, sid: int, status: str) -> None:
        if self._stream_windows.pop(sid, None) is not None:
            self._partial.pop(sid, None)
            self.on_end(sid, status)

    def _emit(self, data: bytes) -> None:
        self._out.append(data)
        self._schedule()

    def _schedule(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._out and self.transport is not None:
            self.transport.write(b"".join(self._out))
        self._out.clear()
