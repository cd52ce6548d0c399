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
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import prometheus_client
import structlog

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


class _Call:
    """The metric children of one RPC, bound once."""

    __slots__ = ("handled", "labels", "msg_received", "msg_sent", "start")

    def __init__(self, metrics: GrpcMetrics, method: str, rpc_type: str) -> None:
        service, _, name = method.lstrip("/").rpartition("/")
        self.labels = (service, name, rpc_type)
        metrics.started.labels(*self.labels).inc()
        self.msg_sent = metrics.msg_sent.labels(*self.labels)
        self.msg_received = metrics.msg_received.labels(*self.labels)
        self.handled = metrics.handled
        self.start = time.perf_counter()


class _CountingContext:
    """A ServicerContext whose reads and writes are counted; everything else passes."""

    __slots__ = ("_call", "_inner")  # one per open stream: keep it small

    def __init__(self, inner: grpc.aio.ServicerContext, call: _Call) -> None:
        self._inner = inner
        self._call = call

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._inner, name)
        if name == "write_nowait":  # the native server's: counted like write
            def write_nowait(message: bytes) -> bool:
                written: bool = found(message)
                if written:
                    self._call.msg_sent.inc()
                return written
            return write_nowait
        if name == "read_into":  # the native server's callback reads: counted like read
            async def read_into(on_message: Any) -> None:
                received = self._call.msg_received

                def counted(message: Any) -> bool:
                    received.inc()
                    done: bool = on_message(message)
                    return done
                await found(counted)
            return read_into
        return found

    async def write(self, message: Any) -> None:
        await self._inner.write(message)
        self._call.msg_sent.inc()

    async def read(self) -> Any:
        message = await self._inner.read()
        if message is not grpc.aio.EOF:
            self._call.msg_received.inc()
        return message


async def _count_requests(requests: AsyncIterator[Any], call: _Call) -> AsyncIterator[Any]:
    async for request in requests:
        call.msg_received.inc()
        yield request


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
    def __init__(self, max_streams_per_client: int, metrics: GrpcMetrics | None = None) -> None:
        self.limit = max_streams_per_client
        self.metrics = metrics
        self.open: dict[str, int] = {}
        self.refused = 0

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None:
            return handler
        method = details.method
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

        if inspect.isasyncgenfunction(inner):
            async def gen(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                call, addr = await self._enter(context, method, rpc_type, streaming)
                if call is not None and client_streaming:
                    request = _count_requests(request, call)
                error: BaseException | None = None
                try:
                    async for item in inner(request, _CountingContext(context, call)
                                            if call else context):
                        yield item
                        if call is not None:
                            call.msg_sent.inc()
                except BaseException as e:
                    error = e
                    raise
                finally:
                    self._leave(addr, call, context, error)
            return gen

        async def coro(request: Any, context: grpc.aio.ServicerContext) -> Any:
            call, addr = await self._enter(context, method, rpc_type, streaming)
            if call is not None and client_streaming and request is not None:
                request = _count_requests(request, call)
            error: BaseException | None = None
            try:
                return await inner(request, _CountingContext(context, call) if call else context)
            except BaseException as e:
                error = e
                raise
            finally:
                self._leave(addr, call, context, error)
        return coro

    async def _enter(self, context: grpc.aio.ServicerContext, method: str, rpc_type: str,
                     streaming: bool) -> tuple[_Call | None, str]:
        call = _Call(self.metrics, method, rpc_type) if self.metrics is not None else None
        if not streaming:
            return call, ""
        addr = peer_address(context.peer())
        if self.open.get(addr, 0) >= self.limit:
            self.refused += 1
            log.warning("stream refused: too many streams from one client", peer=addr,
                        limit=self.limit)
            if call is not None:
                call.handled.labels(*call.labels, "ResourceExhausted").inc()
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"more than {self.limit} concurrent streams from {addr} "
                                "(--max-streams-per-client)")
        self.open[addr] = self.open.get(addr, 0) + 1
        return call, addr

    def _leave(self, addr: str, call: _Call | None, context: grpc.aio.ServicerContext,
               error: BaseException | None) -> None:
        if addr:
            n = self.open[addr] - 1
            if n:
                self.open[addr] = n
            else:
                del self.open[addr]
        if call is not None and self.metrics is not None:
            call.handled.labels(*call.labels, _code_of(context, error)).inc()
            self.metrics.handling.labels(*call.labels).observe(time.perf_counter() - call.start)
