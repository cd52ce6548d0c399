"""One HTTP/2 connection of the gRPC server: the asyncio shell around the sans-IO core.

The protocol is `h2grpc.core.H2Connection`'s; this class moves bytes between it and
the socket, turns its events into gRPC calls, and keeps the clocks:

* Input is handled in slices (`H2Limits.read_slice`) with a loop turn between them,
  and reading stops while the peer is not taking what we write, so one connection's
  flood can neither hold the loop nor make us buffer replies without end.
* Output: everything one loop turn queues, on every stream of the connection, leaves
  in one socket write (a change fanned out to a thousand streams costs one syscall),
  or earlier once `EAGER_FLUSH` bytes are queued so the client starts reading, or
  when a layer that has finished writing one change says so (`send_queued`).
* A watchdog per connection enforces the handshake and idle timeouts and sends
  keepalive PINGs, closing a peer that stops answering them.
"""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
from typing import TYPE_CHECKING, Any, cast

import grpc
import structlog

from h2grpc import frames as f
from h2grpc.call import INBOX_SLACK, ServerCall
from h2grpc.core import H2Connection
from h2grpc.headers import Request
from h2grpc.streams import H2Stream

if TYPE_CHECKING:
    from h2grpc.server import Server

log = structlog.get_logger("meshbridge.grpc")

# Closing in stages (RFC 9113 §6.8): after our last frames, how long the client's input
# is read and dropped at most, and how long it must have been quiet before the socket
# is closed (with TLS, that is when close_notify goes: input after it is an error).
LINGER = 2.0
QUIET = 0.2
# Frames queued for one connection beyond this go to the socket at once rather than
# at the end of the loop turn: the client starts reading while a fan-out goes on.
EAGER_FLUSH = 64 * 1024
# How long a non-gRPC request's answer waits for the end of its request.
NOT_GRPC_WAIT = 1.0
NOT_GRPC_BODY = b"meshbridge serves gRPC here (POST, content-type application/grpc)\n"
NOT_GRPC_HEADERS = f.literal(b":status", b"415") + f.literal(b"content-type",
                                                            b"text/plain; charset=utf-8")

# Why reading is paused (a bit each).
_PUMPING = 1  # a slice is done and the rest waits for the next loop turn
_WRITES_BACKED_UP = 2  # the peer is not reading what we write

_ReadRequest = tuple[str, tuple[tuple[str, str | bytes], ...], bytes, bytes, str | None]

_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
# Status codes that do not count against the failed-request budget: a client's own
# doing (cancel, its deadline), or counted when the request came (UNIMPLEMENTED).
_NOT_FAILURES = frozenset({grpc.StatusCode.OK, grpc.StatusCode.CANCELLED,
                           grpc.StatusCode.DEADLINE_EXCEEDED,
                           grpc.StatusCode.UNIMPLEMENTED})


class Connection(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.limits = limits = server.limits
        # Read per DATA frame: kept as plain attributes.
        self._max_message = limits.max_message_bytes
        self._refill_at = limits.stream_window // 2  # a stream's window is given back
        self.loop = asyncio.get_running_loop()
        self.core = H2Connection(self, self.limits, self.loop.time)
        self.transport: asyncio.Transport | None = None
        self.peer = "unknown"
        self.address = ""
        self.auth_context: dict[str, list[bytes]] = {}
        self.paused = False  # the transport asked us to stop writing
        self.closed = False
        self._read_blocked = 0
        self._pump_scheduled = False
        self._flush_scheduled = False
        self._queued = 0  # DATA bytes queued since the last flush
        self._watchdog: asyncio.TimerHandle | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._closing_since = 0.0  # when _close began: the linger's bound counts from it
        self._last_input = 0.0  # while lingering: when the client last sent something
        self.streams_at_end = 0  # streams still open when the connection ended
        self._ping: bytes | None = None  # our keepalive PING, unanswered
        self._ping_sent_at = 0.0
        # Calls whose handler starts once the slice that opened them is handled: a
        # stream opened and reset in one slice (rapid reset) never costs a task.
        self._starting: list[tuple[ServerCall, bool]] = []

    @property
    def calls(self) -> dict[int, ServerCall]:
        """The open streams' calls, by stream id."""
        return {sid: s.owner for sid, s in self.core.streams.items() if s.owner is not None}

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = transport = cast(asyncio.Transport, transport)
        transport.set_write_buffer_limits(high=self.limits.write_high_water)
        peername = transport.get_extra_info("peername")
        self.peer = _peer_text(peername)
        self.address = str(peername[0]) if isinstance(peername, tuple) else self.peer
        if transport.get_extra_info("peercert"):
            # A verified client certificate, under the keys grpc's own server uses.
            der = transport.get_extra_info("ssl_object").getpeercert(binary_form=True)
            self.auth_context = {"transport_security_type": [b"ssl"],
                                 "x509_pem_cert": [ssl.DER_cert_to_PEM_cert(der).encode()]}
        self.core.initiate()
        if not self.server.connection_made(self):
            self.core.close_with(f.ENHANCE_YOUR_CALM, "too_many_connections",
                                 "too many connections from this address")
            return
        self._flush()
        self._arm_watchdog()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None
        for timer in (self._watchdog, self._linger):
            if timer is not None:
                timer.cancel()
        self._watchdog = self._linger = None
        self._reset_calls()
        # What refers back to this connection goes, so that reference counting frees
        # it and all it held at once (a cycle would wait for a full collection).
        self.core.detach()
        self.server.connection_gone(self)

    def pause_writing(self) -> None:
        self.paused = True
        self._block_reading(_WRITES_BACKED_UP, True)

    def resume_writing(self) -> None:
        self.paused = False
        self.core.peer_reading()
        self._block_reading(_WRITES_BACKED_UP, False)
        for stream in list(self.core.streams.values()):
            if stream.owner is not None:
                stream.owner.drained()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            # Lingering after our close: the client's last frames are dropped, and
            # noted, so that the socket is not closed on them (see _close).
            self._last_input = self.loop.time()
            return
        self.core.feed(data)
        if not self._read_blocked & _PUMPING:
            self._pump()

    def eof_received(self) -> bool:
        return False  # the client closed its side: close ours (after what is queued)

    # ------------------------------------------------------------ input, in slices

    def _pump(self) -> None:
        self._pump_scheduled = False
        if self.closed:
            return
        more = self.core.process(self.limits.read_slice)
        if self._starting:
            self._start_calls()
        self._schedule()
        if more:
            # The rest waits a loop turn: other connections, the admin port and
            # signals get theirs in between.
            self._block_reading(_PUMPING, True)
            if not self._pump_scheduled:
                self._pump_scheduled = True
                self.loop.call_soon(self._pump)
        else:
            self._block_reading(_PUMPING, False)

    def _block_reading(self, why: int, on: bool) -> None:
        before = self._read_blocked
        self._read_blocked = before | why if on else before & ~why
        transport = self.transport
        if transport is None or self.closed or bool(before) == bool(self._read_blocked):
            return
        if self._read_blocked:
            transport.pause_reading()
        else:
            transport.resume_reading()

    # ------------------------------------------------------------ core events

    def request_received(self, stream: H2Stream, request: Request, end_stream: bool) -> None:
        key: _RequestKey = (request.path, *request.fields)
        known = _REQUESTS.get(key)
        if known is None:
            known = _read_request(request)
            if sum(len(value) for _, value in request.fields) <= MAX_REQUEST_BYTES_KEPT:
                if len(_REQUESTS) >= MAX_REQUESTS_KEPT:
                    _REQUESTS.clear()
                _REQUESTS[key] = known
        path, metadata, content_type, timeout, encoding = known
        call = ServerCall(self, stream, path, metadata, encoding)
        call.remote_closed = end_stream
        if request.method != b"POST" or not content_type.startswith(b"application/grpc"):
            self.junk_request()
            self._starting.append((call, False))
            return
        if timeout:
            seconds = _timeout_seconds(timeout)
            if seconds is None:
                self.finish(call, grpc.StatusCode.INTERNAL, "malformed grpc-timeout")
                return
            call.start_deadline(seconds)
        self._starting.append((call, True))

    def stream_data(self, stream: H2Stream, data: bytes) -> None:
        call: ServerCall | None = stream.owner
        if call is not None:
            call.received(data, self._max_message)
            if not call.ended and stream.recv_unacked >= self._refill_at:
                self.maybe_refill(call)

    def stream_ended(self, stream: H2Stream) -> None:
        call: ServerCall | None = stream.owner
        if call is not None:
            call.remote_end()
            _unlink(stream)

    def stream_reset(self, stream: H2Stream, code: int) -> None:
        call: ServerCall | None = stream.owner
        if call is not None:
            call.reset()
            _unlink(stream)

    def stream_drained(self, stream: H2Stream) -> None:
        call: ServerCall | None = stream.owner
        if call is not None:
            call.drained()
            _unlink(stream)

    def handshake_done(self) -> None:
        pass  # the watchdog reads core.handshake_complete

    def ping_acked(self, payload: bytes) -> None:
        if payload == self._ping:
            self._ping = None

    def terminated(self, code: int, reason: str) -> None:
        error = self.core.terminated
        self.server.stats.closed(reason, self.peer, str(error) if error else "",
                                 self.loop.time())
        self._reset_calls()
        self._close()

    # ------------------------------------------------------------ output, for calls

    def send_headers(self, call: ServerCall) -> None:
        call.headers_sent = True
        self.core.send_headers(call.stream)
        self._schedule()

    def send_message(self, call: ServerCall, data: bytes) -> None:
        """Queue one framed gRPC message; it goes out as far as the windows allow."""
        if not call.headers_sent:
            self.send_headers(call)
        self.core.send_data(call.stream, data)
        self._queued += len(data)
        if self._queued > EAGER_FLUSH:
            self._flush()
        elif not self._flush_scheduled:  # (once per turn: no call for the rest)
            self._schedule()

    def finish(self, call: ServerCall, code: grpc.StatusCode, details: str) -> None:
        """End the call with this status: trailers now, or after its unsent data."""
        if call.ended:
            return
        call.ended = True
        block = f.trailers_block(code.value[0], details[:4096], call.headers_sent)
        call.headers_sent = True
        self.core.send_trailers(call.stream, block)
        _unlink(call.stream)
        if code not in _NOT_FAILURES:
            self.core.failed_request()
        self._schedule()

    def junk_request(self) -> None:
        """A request for nothing this server serves: counted against the connection's
        failed-request budget at once (its answer is counted no more)."""
        self.core.failed_request()
        self._schedule()

    def answer_plain(self, call: ServerCall) -> None:
        """What a non-gRPC request gets: HTTP 415 and a line saying what this port is."""
        if call.ended:
            return
        call.ended = True
        call.headers_sent = True
        self.core.send_headers(call.stream, NOT_GRPC_HEADERS)
        self.core.send_data(call.stream, NOT_GRPC_BODY)
        self.core.send_trailers(call.stream, b"")
        _unlink(call.stream)
        self._schedule()

    def reset(self, call: ServerCall) -> None:
        """Abandon the call: RST_STREAM(CANCEL), drop what it had not sent."""
        self.core.reset_stream(call.stream)
        self._schedule()
        call.reset()
        _unlink(call.stream)

    def maybe_refill(self, call: ServerCall) -> None:
        """Give a stream's window back once half of it is used, unless its handler is
        behind: then only as it reads."""
        if call.stream.recv_unacked >= self._refill_at and call.unread() <= INBOX_SLACK:
            self.refill(call)

    def refill(self, call: ServerCall) -> None:
        """The handler consumed what the client sent: let it send as much again."""
        if call.stream.recv_unacked:
            self.core.acknowledge(call.stream)
            self._schedule()

    def call_done(self, call: ServerCall) -> None:
        """The handler's task is over (the stream may still be flushing its end); a
        detached call goes on in its handler's callbacks (ServerCall.detach)."""
        if not call.ended and not call.detached_open:
            self.reset(call)
        self.server.call_done(call)
        call.task = None  # a task that ended in an exception refers back to the call
        if self.core.going_away and not self.core.streams:
            self._close()

    def call_detached(self, call: ServerCall) -> None:
        self.server.call_detached(call)

    def detached_done(self, call: ServerCall) -> None:
        """A detached call is over."""
        self.server.detached_done(call)
        if self.core.going_away and not self.core.streams:
            self._close()

    # ------------------------------------------------------------ internals

    def _start_calls(self) -> None:
        starting, self._starting = self._starting, []
        server = self.server
        for call, grpc_call in starting:
            if call.lost:
                call.stop_deadline()
                continue  # reset in the slice that opened it
            work = (call.run(server.handlers, server.interceptors) if grpc_call
                    else call.answer_not_grpc())
            call.task = task = self.loop.create_task(work)
            task.add_done_callback(call.task_finished)
            server.call_started(call)

    def _reset_calls(self) -> None:
        streams = self.core.drop_streams()
        self.streams_at_end += len(streams)
        for stream in streams:
            call: ServerCall | None = stream.owner
            if call is not None:
                call.reset()
                _unlink(stream)

    def _schedule(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def send_queued(self) -> None:
        """Write what is queued now (nothing if nothing is): the end of the loop turn
        would send the same bytes in the same one write, only later."""
        if self._flush_scheduled:
            self._flush()

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._queued = 0
        out = self.core.out
        # Nothing is written once closed: _close flushed what was queued before it.
        if out and self.transport is not None and not self.closed:
            self.transport.write(b"".join(out))
            if not self.paused:
                self.core.peer_reading()
        out.clear()

    def go_away(self) -> None:
        """No new streams (GOAWAY, NO_ERROR); close once the open ones are done."""
        if self.closed:
            return
        self.core.go_away()
        self._schedule()
        if not self.core.streams:
            self._close()

    def abandon(self) -> None:
        """Shutdown is over: reset what is left (a stream whose client never read its
        end, say) and close."""
        self.core.go_away()
        for stream in list(self.core.streams.values()):
            if stream.owner is not None:
                self.reset(stream.owner)
        self._close()

    def _close(self) -> None:
        """Close in stages, so that the client reads our last frames (a GOAWAY, final
        statuses) rather than a reset (RFC 9113 §6.8). Closing a socket with unread
        input in it resets the connection, and a reset can discard what we sent before
        the client has read it. So: write what is queued, shut our side (without TLS;
        with TLS, close_notify would make any later input an error), then read and drop
        the client's input until it closes or has been quiet for QUIET seconds, and only
        then close; LINGER bounds it all for a client that never stops sending or never
        reads."""
        if self.closed:
            return
        self._flush()
        self.closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        transport = self.transport
        if transport is None:
            return
        now = self.loop.time()
        self._closing_since = self._last_input = now
        if self._read_blocked:
            transport.resume_reading()  # read (and drop) until the client is done
        if transport.can_write_eof():
            try:
                transport.write_eof()
            except OSError:  # the client is gone already
                transport.abort()
                return
        self._linger = self.loop.call_later(QUIET, self._linger_over)

    def _linger_over(self) -> None:
        """One look at a closing connection: close once the client has been quiet (and
        has taken what we wrote), abort once the linger is over."""
        self._linger = None
        transport = self.transport
        if transport is None:
            return
        now = self.loop.time()
        left = self._closing_since + LINGER - now
        if left <= 0:
            transport.abort()  # a client that never stops sending, or never reads
            return
        quiet_for = now - self._last_input
        if quiet_for >= QUIET and not transport.get_write_buffer_size():
            transport.close()
            # With TLS, close() waits for the client's close_notify: bounded too.
            self._linger = self.loop.call_later(left, transport.abort)
            return
        self._linger = self.loop.call_later(min(left, max(0.01, QUIET - quiet_for)),
                                            self._linger_over)

    # ------------------------------------------------------------ the watchdog

    def _arm_watchdog(self) -> None:
        lim = self.limits
        periods = [t for t in (lim.handshake_timeout, lim.idle_timeout, lim.keepalive_time,
                               lim.keepalive_timeout) if t > 0]
        if periods:
            self._watchdog = self.loop.call_later(max(0.05, min(periods) / 4), self._watch)

    def _watch(self) -> None:
        """Handshake, idle and keepalive deadlines, checked a few times per period."""
        self._watchdog = None
        if self.closed:
            return
        lim, core, now = self.limits, self.core, self.loop.time()
        if not core.handshake_complete:
            if lim.handshake_timeout and now - core.created_at > lim.handshake_timeout:
                self._expire("handshake_timeout", "no HTTP/2 preface and SETTINGS ACK "
                             f"within {lim.handshake_timeout:g} s")
                return
        elif self._read_blocked & _PUMPING:
            # Frames read and not yet handled (we handle input in slices): the client is
            # neither idle nor silent, we are behind, and its PING ACK may be in there.
            self._arm_watchdog()
            return
        elif lim.idle_timeout and core.idle_since is not None \
                and now - core.idle_since > lim.idle_timeout:
            self.server.stats.closed("idle_timeout", self.peer, "no stream for "
                                     f"{lim.idle_timeout:g} s", now)
            self.go_away()
            return
        if self._ping is not None and core.last_read_at > self._ping_sent_at:
            # Anything the client sent since our PING shows it is there (its ACK may
            # wait behind what it sent before), as gRPC's servers count activity.
            self._ping = None
        if self._ping is not None:
            if lim.keepalive_timeout and now - self._ping_sent_at > lim.keepalive_timeout:
                self._expire("keepalive_timeout",
                             f"keepalive PING unanswered for {lim.keepalive_timeout:g} s")
                return
        elif (lim.keepalive_time and core.handshake_complete
              and now - core.last_read_at > lim.keepalive_time):
            self._ping = os.urandom(8)
            self._ping_sent_at = now
            core.ping(self._ping)
            self._schedule()
        self._arm_watchdog()

    def _expire(self, reason: str, detail: str) -> None:
        self.core.close_with(f.NO_ERROR, reason, detail)


# A request's method and metadata as calls keep them, by its header fields: the
# clients of a fleet open thousands of streams with the same few header sets, and
# each call then keeps the one decoded copy (bounded: cleared when full).
_RequestKey = tuple[bytes | tuple[bytes, bytes], ...]
_REQUESTS: dict[_RequestKey, _ReadRequest] = {}
MAX_REQUESTS_KEPT = 1024
MAX_REQUEST_BYTES_KEPT = 2048  # header values of a request kept, at most


def _read_request(request: Request) -> _ReadRequest:
    """(path, metadata, content-type, grpc-timeout, grpc-encoding) of a request."""
    content_type = timeout = b""
    encoding: str | None = None
    metadata: list[tuple[str, str | bytes]] = []
    for name, value in request.fields:
        if name == b"content-type":
            content_type = value
        elif name == b"grpc-timeout":
            timeout = value
        elif name == b"grpc-encoding":
            encoding = value.decode("latin-1")
        elif name.endswith(b"-bin"):
            metadata.append((name.decode("latin-1"), _binary(value)))
        else:
            metadata.append((name.decode("latin-1"), value.decode("latin-1")))
    return request.path.decode("latin-1"), tuple(metadata), content_type, timeout, encoding


def _unlink(stream: H2Stream) -> None:
    """A closed stream lets go of its call (the call keeps the stream): no cycle is
    left for the collector, so a call's memory goes with its last reference."""
    if stream.closed:
        stream.owner = None


def _timeout_seconds(value: bytes) -> float | None:
    digits, unit = value[:-1], value[-1:]
    if not digits.isdigit() or len(digits) > 8 or unit not in _TIMEOUT_UNITS:
        return None
    return int(digits) * _TIMEOUT_UNITS[unit]


def _binary(value: bytes) -> bytes:
    return base64.b64decode(value + b"=" * (-len(value) % 4))


def _peer_text(peername: Any) -> str:
    """grpc's spelling of a peer: ipv4:1.2.3.4:5 or ipv6:[::1]:5."""
    if isinstance(peername, tuple) and len(peername) >= 2:
        host, port = peername[0], peername[1]
        return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
    return f"unix:{peername}" if peername else "unknown"
