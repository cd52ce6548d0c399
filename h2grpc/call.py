"""One gRPC call on a connection: the handler's context and its messages.

A `ServerCall` is the `grpc.aio.ServicerContext` its handler is given (`peer`, `read`,
`write`, `abort`, `code`, ...) and the gRPC framing of its stream's bytes; the HTTP/2
stream itself (state, windows, held-back data) is the `h2grpc.streams.H2Stream` it
serves, so that an idle stream costs two small objects and one task. Handlers are the
ones grpc's generic handlers and interceptors hand out, driven the way grpc.aio
drives them (by the handler's kind and function type).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import grpc
import structlog

from h2grpc.frames import GRPC_PREFIX
from h2grpc.streams import H2Stream

if TYPE_CHECKING:
    from h2grpc.connection import Connection

log = structlog.get_logger("meshbridge.grpc")

EOF = grpc.aio.EOF
# Bytes a writer may have queued beyond the peer's flow-control window before its
# `write` waits: one large message goes out at once, a reader that stopped reading
# holds back the writer (as grpc.aio's write does), and nothing grows unbounded.
WRITE_BUFFER = 64 * 1024
# How long an unknown method's status waits for the client's first message.
UNIMPLEMENTED_WAIT = 1.0
# Messages a handler may leave unread before its stream's window stops being given
# back on receipt.
INBOX_SLACK = 16
DoneCallbacks = Callable[[Any], None] | list[Callable[[Any], None]] | None
# The last message framed, and its frame: one message object written to many streams
# (a response a fan-out shares, xds_api.shared_responses) is framed once.
_LAST_FRAMED: list[bytes] = [b"", GRPC_PREFIX.pack(0, 0)]


class DetachedHandler(Protocol):
    """What a detached call's messages and end go to (ServerCall.detach)."""

    def __call__(self, message: Any) -> bool:
        """One request message; True when the handler reads no more."""

    def on_done(self) -> None:
        """The call ended from outside (or the handler said it reads no more)."""


class _Details:
    """grpc.HandlerCallDetails for generic handlers and interceptors."""

    __slots__ = ("invocation_metadata", "method")

    def __init__(self, method: str, metadata: tuple[tuple[str, str | bytes], ...]) -> None:
        self.method = method
        self.invocation_metadata = metadata


class _Readable(Protocol):
    async def read(self) -> Any: ...


class RequestIterator:
    """The request iterator a client-streaming handler is given: the messages of any
    call whose `read()` ends with `EOF` (this server's calls, and the calls a worker
    relays to the watcher, meshbridge/workers/relay.py)."""

    __slots__ = ("_call",)

    def __init__(self, call: _Readable) -> None:
        self._call = call

    def __aiter__(self) -> RequestIterator:
        return self

    async def __anext__(self) -> Any:
        message = await self._call.read()
        if message is EOF:
            raise StopAsyncIteration
        return message


class ServerCall:
    __slots__ = (
        "_code",
        "_deadline",
        "_deserializer",
        "_detach_over",
        "_details",
        "_done_callbacks",
        "_drained",
        "_encoding",
        "_inbox",
        "_metadata",
        "_on_done",
        "_on_message",
        "_one_request",
        "_rbuf",
        "_reader",
        "_requests_seen",
        "_serializer",
        "conn",
        "detached",
        "ended",
        "expired",
        "headers_sent",
        "lost",
        "method",
        "plain",
        "remote_closed",
        "stream",
        "task",
    )

    def __init__(self, conn: Connection, stream: H2Stream, method: str,
                 metadata: tuple[tuple[str, str | bytes], ...], encoding: str | None) -> None:
        self.conn = conn
        self.stream = stream
        stream.owner = self
        self.method = method
        self._metadata = metadata
        self._encoding = encoding
        self.headers_sent = False
        self.remote_closed = False
        self.ended = False  # trailers queued or sent, or the stream was reset
        self.lost = False  # reset, or the connection is gone: nothing more goes out
        self.expired = False  # the deadline passed
        self.plain = False  # not a gRPC request: its body is read and dropped
        self.task: asyncio.Task[None] | None = None
        self._drained: asyncio.Future[None] | None = None
        self._inbox: list[bytes] | None = None
        # read_into's callback: messages go to it as they arrive, not to the inbox.
        self._on_message: Callable[[Any], bool] | None = None
        self._reader: asyncio.Future[None] | None = None
        self._rbuf: bytearray | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._code: grpc.StatusCode | None = None
        self._details = ""
        self._serializer: Callable[[Any], bytes] | None = None
        self._deserializer: Callable[[bytes], Any] | None = None
        self._one_request = False  # known once the handler is: a unary request
        self._requests_seen = 0
        # A handler that went on in callbacks (`detach`): its task is over, the call
        # is not; `_on_done` is told once when the call ends from outside.
        self.detached = False
        self._detach_over = False
        self._on_done: DetachedHandler | None = None
        self._done_callbacks: DoneCallbacks = None

    # ------------------------------------------------------------ ServicerContext

    def peer(self) -> str:
        return self.conn.peer

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._metadata

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str:
        return self._details

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def done(self) -> bool:
        return self.ended

    def cancelled(self) -> bool:
        return self.lost  # reset by either side (a call that ended with a status was not)

    def auth_context(self) -> dict[str, list[bytes]]:
        return self.conn.auth_context

    def set_trailing_metadata(self, _metadata: Any) -> None:
        return None  # meshbridge's handlers send none

    async def send_initial_metadata(self, _metadata: Any) -> None:
        if not self.headers_sent and not self.ended:
            self.conn.send_headers(self)

    async def read(self) -> Any:
        while not self._inbox:
            if self.remote_closed or self.ended:
                return EOF
            self._reader = asyncio.get_running_loop().create_future()
            try:
                await self._reader
            finally:
                self._reader = None
        message = self._inbox.pop(0)
        if self.stream.recv_unacked:
            self.conn.maybe_refill(self)
        return message if self._deserializer is None else self._deserializer(message)

    async def read_into(self, on_message: Callable[[Any], bool]) -> None:
        """Hand every request message to `on_message` as it arrives, in the callback
        that received it: no task switch per message (h2grpc's own; grpc.aio has no
        such call). Returns when the client has sent its last message or the call is
        over, or when `on_message` returns True (the handler reads no more); what
        `on_message` raises is raised here, and later messages are dropped."""
        inbox, self._inbox = self._inbox or [], None
        for message in inbox:  # what came before the handler started reading
            if self._take(on_message, message):
                return
        if self.remote_closed or self.ended:
            return
        self._on_message = on_message
        self._reader = done = asyncio.get_running_loop().create_future()
        try:
            await done
        finally:
            self._reader = None
            self._on_message = None

    def detach(self, handler: DetachedHandler) -> None:
        """Go on without a task (h2grpc's own; grpc.aio has no such call): once the
        handler returns, the call stays open. Every request message goes to
        `handler(message)` in the callback that received it (as `read_into`'s), and
        `handler.on_done()` is called once when the call ends from outside: the
        client of a request stream sent its last message (or `handler` returned
        True), the stream was reset or the connection is gone, or the deadline
        passed. The handler ends
        the call with `end` (or `cancel`). An idle stream then holds no task, no
        coroutine frames and no future: a few hundred bytes, not a few thousand."""
        self.detached = True
        self._on_done = handler
        self.conn.call_detached(self)
        inbox, self._inbox = self._inbox or [], None
        self._on_message = handler
        for message in inbox:  # what came before the handler started reading
            self._deliver_to(handler, message)
        if self.ended or (self.remote_closed and not self._one_request):
            self._call_on_done()

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        """`callback(self)` once a detached call has ended (as grpc.aio's context has)."""
        known = self._done_callbacks
        # One is the usual (the interceptor's): no list for it.
        self._done_callbacks = callback if known is None else [
            *(known if isinstance(known, list) else [known]), callback]

    def end(self, code: grpc.StatusCode = grpc.StatusCode.OK, details: str = "") -> None:
        """End a detached call with this status (trailers after its unsent data)."""
        if not self.ended:
            self._code = code
            self._details = details
            self.conn.finish(self, code, details)
        if self.detached:
            self._detached_over()

    def cancel(self) -> None:
        """Abandon a detached call: RST_STREAM(CANCEL)."""
        if not self.ended:
            self.conn.reset(self)
        if self.detached:
            self._detached_over()

    def _call_on_done(self) -> None:
        handler, self._on_done = self._on_done, None
        self._on_message = _drop
        if handler is not None:
            handler.on_done()
        if not self.ended:  # the handler's on_done did not say: the call is over, OK
            self.end()
        self._detached_over()

    def _detached_over(self) -> None:
        if self._detach_over:
            return
        self._detach_over = True
        self._on_done = None
        self._on_message = None  # the handler's callbacks: no cycle back to the call
        self.stop_deadline()
        callbacks, self._done_callbacks = self._done_callbacks, None
        for callback in callbacks if isinstance(callbacks, list) else (callbacks,):
            if callback is not None:
                callback(self)
        self.conn.detached_done(self)

    @property
    def detached_open(self) -> bool:
        """Detached, and not over yet: the handler's callbacks still serve the call."""
        return self.detached and not self._detach_over

    def _take(self, on_message: Callable[[Any], bool], message: bytes) -> bool:
        return on_message(message if self._deserializer is None
                          else self._deserializer(message))

    def _deliver_to(self, on_message: Callable[[Any], bool], message: bytes) -> None:
        done = self._reader
        try:
            finished = on_message(message if self._deserializer is None
                                  else self._deserializer(message))
        except Exception as e:  # the handler's to report: it is raised in read_into
            self._on_message = _drop
            if self.detached:
                log.exception("grpc handler failed", method=self.method, peer=self.conn.peer)
                self.end(grpc.StatusCode.UNKNOWN, f"Unexpected {type(e)}: {e}")
            elif done is not None and not done.done():
                done.set_exception(e)
            return
        if finished:
            self._on_message = _drop
            if self.detached:
                self._call_on_done()
            self._wake_reader()

    async def write(self, message: Any) -> None:
        self._send(message if self._serializer is None else self._serializer(message))
        if self._held_back():
            await self._wait_drained()

    def write_nowait(self, message: bytes) -> bool:
        """Queue a serialized message now, without a task switch, if the stream can take
        it without waiting; False (nothing queued) when the caller must `await write`."""
        # _held_back, spelled out: once per stream per change.
        if (self.stream.pending_bytes > WRITE_BUFFER or self.conn.paused) and not self.ended:
            return False
        self._send(message)
        return True

    def send_now(self) -> None:
        """Write what this call's connection has queued now rather than at the end of
        the loop turn: a layer that has written one change to many streams calls it
        so that those clients start reading while the turn's other work goes on."""
        self.conn.send_queued()

    def _send(self, data: bytes) -> None:
        if self.ended:
            raise grpc.aio.UsageError("write on an RPC that has ended")
        last = _LAST_FRAMED
        if data is last[0]:
            framed = last[1]
        else:
            framed = last[1] = GRPC_PREFIX.pack(0, len(data)) + data
            last[0] = data
        self.conn.send_message(self, framed)

    def _held_back(self) -> bool:
        """A writer must wait: too much is unsent, or the socket is paused."""
        return self.stream.pending_bytes > WRITE_BUFFER or self.conn.paused

    async def abort(self, code: grpc.StatusCode, details: str = "",
                    trailing_metadata: Any = ()) -> None:
        if self.ended:
            raise grpc.aio.UsageError("abort on an RPC that has ended")
        self._code = code
        self._details = details
        self.conn.finish(self, code, details)
        await self._wait_trailers_sent()  # it may be queued behind unsent data
        raise grpc.aio.AbortError(f"aborted with {code.name}")

    # ------------------------------------------------------------ from the connection

    def received(self, payload: bytes, max_message: int) -> None:
        """DATA for this stream: split it into gRPC messages."""
        if self.ended or self.plain:
            self.conn.refill(self)
            return
        rbuf = self._rbuf
        if rbuf is None:
            if len(payload) >= 5:
                flag, n = GRPC_PREFIX.unpack_from(payload)
                if n + 5 == len(payload) and n <= max_message:  # the usual case
                    on_message = self._on_message
                    if on_message is not None and not flag and not self._one_request:
                        # A request stream read in callbacks (xDS ACKs): what _deliver
                        # would decide, decided.
                        self._requests_seen += 1
                        self._deliver_to(on_message, payload[5:])
                    else:
                        self._deliver(flag, payload[5:])
                    return
            rbuf = self._rbuf = bytearray(payload)
        else:
            rbuf += payload
        while len(rbuf) >= 5:
            flag, n = GRPC_PREFIX.unpack_from(rbuf)
            if n > max_message:
                self.fail(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"Received message larger than max ({n} vs. {max_message})")
                return
            if len(rbuf) < n + 5:
                break
            message = bytes(rbuf[5:n + 5])
            del rbuf[:n + 5]
            self._deliver(flag, message)
            if self.ended:
                return
        if not rbuf:
            self._rbuf = None

    def unread(self) -> int:
        """Messages received and not yet read by the handler."""
        return len(self._inbox) if self._inbox else 0

    def _deliver(self, flag: int, message: bytes) -> None:
        if self._one_request and self._requests_seen:
            # A unary request has one message: more are dropped, never held (the
            # window they took is given back at once).
            self.conn.refill(self)
            return
        self._requests_seen += 1
        if flag:
            try:
                message = _decompress(self._encoding, message)
            except ValueError as e:
                self.fail(grpc.StatusCode.INTERNAL, str(e))
                return
        if self._on_message is not None:
            self._deliver_to(self._on_message, message)
            return
        if self._inbox is None:
            self._inbox = [message]
        else:
            self._inbox.append(message)
        self._wake_reader()

    def remote_end(self) -> None:
        self.remote_closed = True
        self._wake_reader()
        # A client-streaming call is over once its client is; a unary request's
        # client is done sending from the start.
        if self._on_done is not None and not self._one_request:
            self._call_on_done()

    def fail(self, code: grpc.StatusCode, details: str) -> None:
        """End the call from the transport side (bad request data): status, then stop."""
        if self.ended:
            return
        self._code = code
        self._details = details
        log.info("grpc call failed", method=self.method, peer=self.conn.peer, code=code.name,
                 details=details)
        self.conn.finish(self, code, details)
        self._stop_task()

    def reset(self) -> None:
        """The stream was reset (by either side), or the connection is gone."""
        self.ended = True
        self.lost = True
        self._wake_reader()
        self.drained()
        self._stop_task()

    def drained(self) -> None:
        waiter = self._drained
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def start_deadline(self, seconds: float) -> None:
        self._deadline = asyncio.get_running_loop().call_later(seconds, self._expire)

    def stop_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()

    def _expire(self) -> None:
        if not self.ended:
            self.expired = True
            if self._on_done is not None:
                self.conn.finish(self, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            self._stop_task()

    def _stop_task(self) -> None:
        task = self.task
        if task is not None and not task.done() and task is not asyncio.current_task():
            task.cancel()
        elif self._on_done is not None:
            self._call_on_done()

    def _wake_reader(self) -> None:
        waiter = self._reader
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait_drained(self) -> None:
        """Until the writer may go on: little enough unsent, the socket not paused."""
        while not self.lost and self._held_back():
            await self._sleep()

    async def _wait_trailers_sent(self) -> None:
        while not self.lost and self.stream.trailers is not None:
            await self._sleep()

    async def _sleep(self) -> None:
        self._drained = asyncio.get_running_loop().create_future()
        try:
            await self._drained
        finally:
            self._drained = None

    # ------------------------------------------------------------ running the handler

    async def answer_not_grpc(self) -> None:
        """A request that is not gRPC gets a plain HTTP answer once it has been sent
        whole (or a moment passed), so that a rule it breaks on the way (say, trailers
        without END_STREAM) is still reported as the stream error it is."""
        self.plain = True
        try:
            if not self.remote_closed:
                self._reader = asyncio.get_running_loop().create_future()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._reader, UNIMPLEMENTED_WAIT)
        finally:
            self._reader = None
        self.conn.answer_plain(self)

    async def run(self, handlers: tuple[grpc.GenericRpcHandler, ...],
                  interceptors: tuple[Any, ...]) -> None:
        try:
            handler = await _resolve(handlers, interceptors,
                                     _Details(self.method, self._metadata))
            if handler is None:
                # Counted now, not when answered: a flood of them must not hold a task
                # each for the wait below before its budget notices.
                self.conn.junk_request()
                # Answered once the client has sent something (or a moment passed): a
                # grpc.aio client whose first write races a status that is already in
                # reports INTERNAL instead of the status.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.read(), UNIMPLEMENTED_WAIT)
                self.conn.finish(self, grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
                return
            self._serializer = handler.response_serializer
            self._deserializer = handler.request_deserializer
            self._one_request = not handler.request_streaming
            await self._drive(handler)
            if not self.ended and not self.detached:
                self.conn.finish(self, self._code or grpc.StatusCode.OK, self._details)
        except grpc.aio.AbortError:
            pass  # the status went out with the abort
        except asyncio.CancelledError:
            if self.expired and not self.ended:
                self.conn.finish(self, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            elif not self.ended:
                self.conn.reset(self)  # cancelled by the server (shutdown grace is over)
        except Exception as e:  # the handler broke: tell the client, keep serving
            log.exception("grpc handler failed", method=self.method, peer=self.conn.peer)
            if not self.ended:
                self.conn.finish(self, grpc.StatusCode.UNKNOWN,
                                 f"Unexpected {type(e)}: {e}")
        finally:
            if self._deadline is not None and not self.detached_open:
                self._deadline.cancel()

    def task_finished(self, _task: asyncio.Task[None]) -> None:
        """The handler's task is over, however it ended: a task cancelled before it
        first ran never reaches `run`'s finally, so this is a done-callback."""
        if not self.detached_open:
            self.stop_deadline()
        self.conn.call_done(self)

    async def _drive(self, handler: grpc.RpcMethodHandler) -> None:
        if handler.request_streaming:
            request: Any = RequestIterator(self)
        else:
            request = await self.read()
            if request is EOF:
                self.conn.finish(self, grpc.StatusCode.INTERNAL, "Missing request message")
                return
        if not handler.response_streaming:
            fn = handler.unary_unary or handler.stream_unary
            response = await fn(request, self)
            if not self.ended and response is not None:
                await self.write(response)
            return
        fn = handler.unary_stream or handler.stream_stream
        result = fn(request, self)
        if inspect.isasyncgen(result):  # an async-generator handler yields its messages
            async for item in result:
                await self.write(item)
        else:
            await result


async def _resolve(handlers: tuple[grpc.GenericRpcHandler, ...], interceptors: tuple[Any, ...],
                   details: _Details) -> grpc.RpcMethodHandler | None:
    async def lookup(d: Any) -> grpc.RpcMethodHandler | None:
        for generic in handlers:
            found = generic.service(d)
            if found is not None:
                return found
        return None

    continuation: Callable[[Any], Any] = lookup
    for interceptor in reversed(interceptors):
        continuation = _chain(interceptor, continuation)
    result: grpc.RpcMethodHandler | None = await continuation(details)
    return result


def _chain(interceptor: Any, inner: Callable[[Any], Any]) -> Callable[[Any], Any]:
    async def step(d: Any) -> Any:
        return await interceptor.intercept_service(inner, d)
    return step


def _drop(_message: Any) -> bool:
    """What read_into's messages go to once its reader is done."""
    return False


def _decompress(encoding: str | None, message: bytes) -> bytes:
    if encoding == "gzip":
        return zlib.decompress(message, wbits=31)
    if encoding == "deflate":
        return zlib.decompress(message)
    raise ValueError(f"compressed message with grpc-encoding {encoding or 'identity'}")

