"""Server-side byte counts for protocol layers that do not register `StreamInfo`s.

The xDS layer records every response in `app.streams` (`StreamInfo.sent`); a layer
that does not gets its handlers wrapped at registration: the wrapper hands the
handler a context whose `write` counts what it writes (or counts what an async
generator yields), per stream. `compare` prefers the layer's own `StreamInfo`s
when there are any, so nothing is counted twice.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc


@dataclass(slots=True)
class WireStream:
    method: str
    peer: str
    messages: int = 0
    bytes: int = 0
    open: bool = True


@dataclass(slots=True)
class WireCounter:
    """Streams of the counted methods, open and ended, with what was written."""

    methods: frozenset[str]
    streams: list[WireStream] = field(default_factory=list)

    def start(self, method: str, peer: str) -> WireStream:
        s = WireStream(method, peer)
        self.streams.append(s)
        return s


def _size(message: Any) -> int:
    if isinstance(message, bytes | bytearray | memoryview):
        return len(message)
    return int(message.ByteSize())


class _CountingContext:
    """A ServicerContext whose writes are counted; everything else is the real one."""

    def __init__(self, context: Any, stream: WireStream) -> None:
        self._context = context
        self._stream = stream

    async def write(self, message: Any) -> None:
        await self._context.write(message)
        self._stream.messages += 1
        self._stream.bytes += _size(message)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


def _wrap_unary_stream(inner: Callable[..., Any], method: str,
                       counter: WireCounter) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(inner):
        async def gen(request: Any, context: Any) -> AsyncIterator[Any]:
            stream = counter.start(method, context.peer())
            try:
                async for message in inner(request, context):
                    stream.messages += 1
                    stream.bytes += _size(message)
                    yield message
            finally:
                stream.open = False

        return gen

    async def behaviour(request: Any, context: Any) -> Any:
        stream = counter.start(method, context.peer())
        try:
            return await inner(request, _CountingContext(context, stream))
        finally:
            stream.open = False

    return behaviour


class _CountingHandler(grpc.GenericRpcHandler):  # type: ignore[misc]
    def __init__(self, inner: grpc.GenericRpcHandler, counter: WireCounter) -> None:
        self._inner = inner
        self._counter = counter

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self._inner.service(details)
        method = details.method
        if handler is None or method not in self._counter.methods:
            return handler
        if handler.unary_stream is None:
            return handler
        return grpc.unary_stream_rpc_method_handler(
            _wrap_unary_stream(handler.unary_stream, method, self._counter),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer)


class CountingServer:
    """What a protocol layer is given instead of the gRPC server at registration."""

    def __init__(self, server: Any, counter: WireCounter) -> None:
        self._server = server
        self._counter = counter

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._server.add_generic_rpc_handlers(
            tuple(_CountingHandler(h, self._counter) for h in handlers))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)
