"""One server interceptor for every RPC on the shared port: the per-client stream
limit and the `grpc_server_*` metrics (go-grpc-prometheus names and labels, as
Linkerd's controller exports them, Linkerd §4.9).

Handlers are wrapped without changing their shape (grpc.aio drives a handler by its
function type): an async-generator handler is counted per yielded message; a
coroutine handler gets a context whose `write`/`read` are counted, and a counted
request iterator.
"""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import prometheus_client
import structlog

from h2grpc.server import AddressCounts, LocalCounts
from meshbridge.limits import peer_address
from meshbridge.loopmetrics import LoopCounter

log = structlog.get_logger("meshbridge.rpc")

_LABELS = ("grpc_service", "grpc_method", "grpc_type")


class GrpcMetrics:
    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self.started = prometheus_client.Counter(
            "grpc_server_started", "RPCs started on the server", _LABELS, registry=registry)
        self.handled = prometheus_client.Counter(
            "grpc_server_handled", "RPCs completed on the server, by status",
            (*_LABELS, "grpc_code"), registry=registry)
        # Per message, on the loop thread: lock-free (meshbridge/loopmetrics.py).
        self.msg_sent = LoopCounter(
            "grpc_server_msg_sent", "Stream messages sent by the server", _LABELS,
            registry=registry)
        self.msg_received = LoopCounter(
            "grpc_server_msg_received", "Stream messages received by the server", _LABELS,
            registry=registry)
        self.handling = prometheus_client.Histogram(
            "grpc_server_handling_seconds", "Time from RPC start to its end", _LABELS,
            buckets=(0.1, 1, 300, 3600), registry=registry)


class _Method:
    """The metric children of one method, bound once for all its calls."""

    __slots__ = ("handled", "labels", "msg_received", "msg_sent", "started")

    def __init__(self, metrics: GrpcMetrics, method: str, rpc_type: str) -> None:
        service, _, name = method.lstrip("/").rpartition("/")
        self.labels = (service, name, rpc_type)
        self.started = metrics.started.labels(*self.labels)
        self.msg_sent = metrics.msg_sent.labels(*self.labels)
        self.msg_received = metrics.msg_received.labels(*self.labels)
        self.handled = metrics.handled


class _CountingContext:
    """A ServicerContext whose reads and writes are counted; everything else passes.
    One per open stream, so it holds two references and nothing else."""

    __slots__ = ("_inner", "_method")

    def __init__(self, inner: grpc.aio.ServicerContext, method: _Method) -> None:
        self._inner = inner
        self._method = method

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._inner, name)  # AttributeError if the server has none
        # The native server's calls without a task switch, counted as write and read.
        if name == "write_nowait":
            return self._write_nowait
        if name == "read_into":
            return self._read_into
        if name == "detach":
            return self._detach
        return found

    def _write_nowait(self, message: bytes) -> bool:
        written: bool = self._inner.write_nowait(message)
        if written:
            # A loop-thread counter (meshbridge.loopmetrics), added to in place: once
            # per stream per change.
            self._method.msg_sent.value += 1
        return written

    def _read_into(self, on_message: Callable[[Any], bool]) -> Awaitable[None]:
        # The server's own coroutine, not one of ours around it: one frame less
        # held by every open stream.
        read_into: Callable[[Callable[[Any], bool]], Awaitable[None]] = self._inner.read_into
        return read_into(_CountedReader(on_message, self._method.msg_received))

    def _detach(self, handler: Any) -> None:
        self._inner.detach(_CountedReader(handler, self._method.msg_received))

    async def write(self, message: Any) -> None:
        await self._inner.write(message)
        self._method.msg_sent.inc()

    async def read(self) -> Any:
        message = await self._inner.read()
        if message is not grpc.aio.EOF:
            self._method.msg_received.inc()
        return message


class _CountedReader:
    """A read_into callback that counts each message on its way to the handler's."""

    __slots__ = ("_counter", "_on_message")

    def __init__(self, on_message: Callable[[Any], bool], counter: Any) -> None:
        self._on_message = on_message
        self._counter = counter

    def __call__(self, message: Any) -> bool:
        self._counter.value += 1  # a loop-thread counter: in place, a call less per ACK
        return self._on_message(message)

    def on_done(self) -> None:
        """A detached call's end (h2grpc's ServerCall.detach), passed on."""
        self._on_message.on_done()  # type: ignore[attr-defined]


async def _count_requests(requests: AsyncIterator[Any], method: _Method) -> AsyncIterator[Any]:
    async for request in requests:
        method.msg_received.inc()
        yield request


class _Leave:
    """RpcGuard._leave for a detached call, once it ends."""

    __slots__ = ("_addr", "_counted", "_guard", "_start")

    def __init__(self, guard: RpcGuard, addr: str, counted: _Method | None,
                 start: float) -> None:
        self._guard = guard
        self._addr = addr
        self._counted = counted
        self._start = start

    def __call__(self, context: grpc.aio.ServicerContext) -> None:
        self._guard._leave(self._addr, self._counted, self._start, context, None)


def _code_of(context: grpc.aio.ServicerContext, error: BaseException | None) -> str:
    if isinstance(error, Exception) and not isinstance(error, grpc.aio.AbortError):
        return "Unknown"
    code = context.code() if hasattr(context, "code") else None
    if code is None:
        return "Canceled" if error is not None else "OK"
    if isinstance(code, int):
        code = grpc.StatusCode(code) if not isinstance(code, grpc.StatusCode) else code
    # go-grpc-prometheus spells codes in CamelCase (OK, NotFound, InvalidArgument, ...).
    name = code.name
    return "OK" if name == "OK" else "".join(p.capitalize() for p in name.split("_")).replace(
        "Cancelled", "Canceled")


class RpcGuard(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, max_streams_per_client: int, metrics: GrpcMetrics | None = None,
                 counts: AddressCounts | None = None) -> None:
        self.limit = max_streams_per_client
        self.metrics = metrics
        # Open streams per client address: this process's, or shared by the workers
        # serving one port (meshbridge.workers.counts), so the limit is the port's.
        self.open: AddressCounts = counts or LocalCounts()
        self.refused = 0
        # The wrapped handler of each (method, handler): built once, not per call, so
        # that an open stream holds none of it.
        self._wrapped: dict[tuple[str, int], tuple[grpc.RpcMethodHandler,
                                                   grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        key = (details.method, id(handler))
        known = self._wrapped.get(key)
        if known is not None and known[0] is handler:
            return known[1]
        wrapped = self._wrap_handler(handler, details.method)
        # Generic handlers hand out one handler per method: the table stays that size.
        self._wrapped[key] = (handler, wrapped)
        return wrapped

    def _wrap_handler(self, handler: grpc.RpcMethodHandler,
                      method: str) -> grpc.RpcMethodHandler:
        for attr, rpc_type, make in (
            ("unary_unary", "unary", grpc.unary_unary_rpc_method_handler),
            ("unary_stream", "server_stream", grpc.unary_stream_rpc_method_handler),
            ("stream_unary", "client_stream", grpc.stream_unary_rpc_method_handler),
            ("stream_stream", "bidi_stream", grpc.stream_stream_rpc_method_handler),
        ):
            inner = getattr(handler, attr)
            if inner is not None:
                return make(self._wrap(inner, method, rpc_type),
                            request_deserializer=handler.request_deserializer,
                            response_serializer=handler.response_serializer)
        return handler

    def _wrap(self, inner: Callable[..., Any], method: str, rpc_type: str) -> Callable[..., Any]:
        streaming = rpc_type != "unary"
        client_streaming = rpc_type in ("client_stream", "bidi_stream")
        counted = _Method(self.metrics, method, rpc_type) if self.metrics is not None else None

        if inspect.isasyncgenfunction(inner):
            async def gen(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                addr = await self._enter(context, counted, streaming)
                start = time.perf_counter()
                if counted is not None and client_streaming:
                    request = _count_requests(request, counted)
                error: BaseException | None = None
                try:
                    async for item in inner(request, _CountingContext(context, counted)
                                            if counted else context):
                        yield item
                        if counted is not None:
                            counted.msg_sent.inc()
                except BaseException as e:
                    error = e
                    raise
                finally:
                    self._leave(addr, counted, start, context, error)
                    error = None  # its traceback holds this frame: no cycle left behind
            return gen

        async def coro(request: Any, context: grpc.aio.ServicerContext) -> Any:
            addr = await self._enter(context, counted, streaming)
            start = time.perf_counter()
            if counted is not None and client_streaming and request is not None:
                request = _count_requests(request, counted)
            error: BaseException | None = None
            try:
                return await inner(request, _CountingContext(context, counted)
                                   if counted else context)
            except BaseException as e:
                error = e
                raise
            finally:
                if error is None and getattr(context, "detached_open", False):
                    # The call goes on in callbacks (h2grpc's detach): it is left
                    # when it ends.
                    context.add_done_callback(_Leave(self, addr, counted, start))
                else:
                    self._leave(addr, counted, start, context, error)
                error = None  # its traceback holds this frame: no cycle left behind
        return coro

    async def _enter(self, context: grpc.aio.ServicerContext, counted: _Method | None,
                     streaming: bool) -> str:
        if counted is not None:
            counted.started.inc()
        if not streaming:
            return ""
        # One string per client address, however many streams it holds open.
        addr = sys.intern(peer_address(context.peer()))
        if self.open.add(addr) > self.limit:
            self.open.remove(addr)
            self.refused += 1
            log.warning("stream refused: too many streams from one client", peer=addr,
                        limit=self.limit)
            if counted is not None:
                counted.handled.labels(*counted.labels, "ResourceExhausted").inc()
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"more than {self.limit} concurrent streams from {addr} "
                                "(--max-streams-per-client)")
        return addr

    def _leave(self, addr: str, counted: _Method | None, start: float,
               context: grpc.aio.ServicerContext, error: BaseException | None) -> None:
        if addr:
            self.open.remove(addr)
        if counted is not None and self.metrics is not None:
            counted.handled.labels(*counted.labels, _code_of(context, error)).inc()
            self.metrics.handling.labels(*counted.labels).observe(time.perf_counter() - start)
