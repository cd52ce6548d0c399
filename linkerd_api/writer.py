"""Writing destination API streams: each from its queue until it ends, listed on
/debug/streams and counted in `meshbridge_destination_streams`. One per process that
serves them: the one process, or each worker for its Get streams while the watcher
keeps GetProfile (docs/workers.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import prometheus_client
from google.protobuf.message import DecodeError

from linkerd_api.detached import DetachedWriter
from linkerd_api.errors import BadRequest
from linkerd_api.proto import destination_pb2 as dst
from linkerd_api.queue import UpdateQueue
from meshbridge.host import StreamInfo, StreamRegistry


def decode_request(raw: bytes) -> dst.GetDestination:
    """A Get or GetProfile request; BadRequest if it does not decode as one."""
    try:
        return dst.GetDestination.FromString(raw)
    except DecodeError:
        raise BadRequest("request is not a GetDestination message") from None


def endpoint_overflow_counter(registry: prometheus_client.CollectorRegistry
                              ) -> prometheus_client.Counter:
    """Linkerd's counter of Get streams ended for a full queue (§3.1)."""
    return prometheus_client.Counter(
        "endpoint_updates_queue_overflow",
        "Get streams ended because their update queue was full", ["service"],
        registry=registry)


class DestinationWriter:
    def __init__(self, metrics: prometheus_client.CollectorRegistry,
                 registry: StreamRegistry) -> None:
        self.registry = registry
        self.open_streams = prometheus_client.Gauge(
            "meshbridge_destination_streams", "Open destination API streams", ["method"],
            registry=metrics)
        self.live: set[UpdateQueue] = set()
        self.stopping = False

    def stop(self) -> None:
        """End every stream with status OK; proxies reconnect elsewhere."""
        self.stopping = True
        for stream in list(self.live):
            stream.end()

    async def pump(self, method: str, stream: UpdateQueue, target: str,
                   request: dst.GetDestination,
                   context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """Write the stream's queue until it ends; returning ends the RPC with OK."""
        if self.stopping:
            return
        info = self._open(method, stream, target, request, context)
        try:
            while (item := await stream.next()) is not None:
                version, message = item
                await context.write(message)
                info.sent(target, version, "", len(message))
                if not len(stream):
                    info.converged()  # Linkerd has no ACK: caught up once all is written
        finally:
            self._close(method, stream, info)

    def detach(self, stream: UpdateQueue, target: str, request: dst.GetDestination,
               context: grpc.aio.ServicerContext[Any, Any],
               released: Callable[[UpdateQueue], None]) -> bool:
        """A Get on the native server: written in the server's callbacks from now on
        (linkerd_api.detached), with no task; `released(stream)` once it is over.
        False where the server has no callbacks (grpc.aio), or when stopping: then
        the caller `pump`s."""
        if self.stopping or getattr(context, "detach", None) is None:
            return False
        info = self._open("Get", stream, target, request, context)
        DetachedWriter(stream, context, info, target, self._detached_over, released).start()
        return True

    def _detached_over(self, writer: DetachedWriter) -> None:
        self._close("Get", writer.queue, writer.info)
        writer.released(writer.queue)

    def _open(self, method: str, stream: UpdateQueue, target: str,
              request: dst.GetDestination,
              context: grpc.aio.ServicerContext[Any, Any]) -> StreamInfo:
        """A stream starts: listed on /debug/streams, counted, ended by `stop`."""
        info = self.registry.add(StreamInfo(
            "linkerd-get" if method == "Get" else "linkerd-profile", context.peer(),
            client=request.context_token.strip()[:500]))
        info.subscribe(target, (request.path,))
        stream.info = info
        self.live.add(stream)
        self.open_streams.labels(method).inc()
        return info

    def _close(self, method: str, stream: UpdateQueue, info: StreamInfo) -> None:
        self.open_streams.labels(method).dec()
        self.live.discard(stream)
        self.registry.remove(info)
