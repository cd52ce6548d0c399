"""Limits on the shared gRPC port, so that no one client can hurt the others.

Set with `meshbridge serve` flags; each gives a clear status when exceeded:

    --max-streams-per-connection  HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: the client's
                                  transport queues further streams (no error, no harm)
    --max-message-bytes           a larger request fails with RESOURCE_EXHAUSTED
    --max-streams-per-client      open streams from one client address; the next one
                                  fails with RESOURCE_EXHAUSTED naming the limit

Authority length (253 + port) and resource names per xDS request are enforced by the
protocol layers, which know what a name is.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

log = structlog.get_logger("meshbridge.limits")


@dataclass(frozen=True, slots=True)
class Limits:
    max_streams_per_connection: int = 10000
    max_message_bytes: int = 4 * 1024 * 1024
    max_streams_per_client: int = 20000
    max_resource_names: int = 10000  # per xDS request, read by xds_api

    def server_options(self) -> list[tuple[str, Any]]:
        return [
            ("grpc.max_concurrent_streams", self.max_streams_per_connection),
            ("grpc.max_receive_message_length", self.max_message_bytes),
        ]


def peer_address(peer: str) -> str:
    """`ipv4:127.0.0.1:5555` / `ipv6:[::1]:5555` -> the address without the port."""
    _, _, rest = peer.partition(":")
    host, _, _ = rest.rpartition(":")
    return host.strip("[]") or peer


class PeerStreamLimiter(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Counts open streaming RPCs per client address and refuses those over the limit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
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
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap(handler.unary_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._wrap(handler.stream_stream),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)
        return handler

    def _wrap(self, inner: Callable[..., Any]) -> Callable[..., Any]:
        # grpc.aio picks how to drive a handler by its function type, so the wrapper
        # must be of the same type as what it wraps.
        if inspect.isasyncgenfunction(inner):
            async def gen(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                addr = await self._enter(context)
                try:
                    async for item in inner(request, context):
                        yield item
                finally:
                    self._leave(addr)
            return gen

        async def coro(request: Any, context: grpc.aio.ServicerContext) -> Any:
            addr = await self._enter(context)
            try:
                return await inner(request, context)
            finally:
                self._leave(addr)
        return coro

    async def _enter(self, context: grpc.aio.ServicerContext) -> str:
        addr = peer_address(context.peer())
        if self.open.get(addr, 0) >= self.limit:
            self.refused += 1
            log.warning("stream refused: too many streams from one client", peer=addr,
                        limit=self.limit)
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                f"more than {self.limit} concurrent streams from {addr} "
                                "(--max-streams-per-client)")
        self.open[addr] = self.open.get(addr, 0) + 1
        return addr

    def _leave(self, addr: str) -> None:
        n = self.open[addr] - 1
        if n:
            self.open[addr] = n
        else:
            del self.open[addr]
