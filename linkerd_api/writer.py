"""Writing destination API streams: each from its queue until it ends, listed on
/debug/streams and counted in `meshbridge_destination_streams`. One per process that
serves them: the one process, or each worker for its Get streams while the watcher
keeps GetProfile (docs/workers.md)."""

from __future__ import annotations

from typing import Any

import grpc
import prometheus_client
from google.protobuf.message import DecodeError

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
        info = self.registry.add(StreamInfo(
            "linkerd-get" if method == "Get" else "linkerd-profile", context.peer(),
            client=request.context_token.strip()[:500]))
        info.state(target).subscribed = (request.path,)
        stream.info = info
        self.live.add(stream)
        gauge = self.open_streams.labels(method)
        gauge.inc()
        try:
            while (item := await stream.next()) is not None:
                version, message = item
                await context.write(message)
                info.sent(target, version, "", len(message))
                if not len(stream):
                    info.converged()  # Linkerd has no ACK: caught up once all is written
        finally:
            gauge.dec()
            self.live.discard(stream)
            self.registry.remove(info)
