"""The App's side of `--workers N`: the watcher (docs/workers.md).

The watcher mounts every protocol layer as the one process does, on a server that
only collects their handlers (it listens on no port): the layers' services follow
the Cluster and the Views here, once. Each layer's `Layer.feeds` then hooks what
it sends the workers onto every worker's link; the relay runs, for the workers,
whatever method has no worker side. The workers (`WorkerPool`) listen on the port.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
from prometheus_client.metrics_core import Metric

from meshbridge import log as logs
from meshbridge.host import Layer
from meshbridge.stream_registry import StreamInfo
from meshbridge.workers.gather import merge_families
from meshbridge.workers.pool import WorkerFailed, WorkerPool
from meshbridge.workers.process import WorkerSpec
from meshbridge.workers.relay import RelayServer

if TYPE_CHECKING:
    from meshbridge.app import App


class HandlerSink:
    """A gRPC server that only keeps the handlers added to it (the watcher serves
    no port itself: its workers do)."""

    def __init__(self) -> None:
        self.handlers: tuple[grpc.GenericRpcHandler, ...] = ()

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.handlers = (*self.handlers, *handlers)


class Watcher:
    def __init__(self, app: App) -> None:
        self.app = app
        self.pool: WorkerPool | None = None
        self.relay: RelayServer | None = None

    async def start(self, start_source: Callable[[], None]) -> int:
        """Mount the layers, start the source (`start_source`) and the workers; the
        gRPC port they listen on."""
        app = self.app
        if app.options.grpc_transport != "native":
            raise WorkerFailed("needs --grpc-transport native")
        sink = HandlerSink()
        app._mount(sink)
        start_source()
        if app.port_tls() is not None:
            raise WorkerFailed("--tls-from-identity is not served by workers yet: "
                           "use --workers 1, or --tls-cert/--tls-key")
        self.relay = relay = RelayServer(sink.handlers)
        modules = tuple(_module_of(layer) for layer in app.layers)
        loop = "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") \
            else "asyncio"
        options = app.options

        def spec(index: int, listen: str) -> WorkerSpec:
            return WorkerSpec(index, options.workers, listen, app.config, options.limits,
                              options.tls, modules, options.layer_options, relay.table,
                              loop, logs.configured, options.debug_access)

        self.pool = pool = WorkerPool(options.workers, options.listen, spec, app.metrics)
        pool.on_link(relay.attach)
        for layer in app.layers:
            if layer.feeds is not None:
                layer.feeds(app.host_for(layer), pool)
        return await pool.start()

    async def stop(self, grace: float) -> None:
        """Stop the workers and free what they shared; once (an App may be stopped
        again, by a test and its fixture, say: the second stop finds nothing to do)."""
        pool, self.pool = self.pool, None
        if pool is not None:
            await pool.stop(grace)
            pool.counts.close()

    async def stream_infos(self) -> list[StreamInfo]:
        """Every worker's client streams (the watcher's own are the relayed ones)."""
        if self.pool is None:
            return []
        return [info for answer in await self.pool.ask("streams") for info in answer]

    async def metric_families(self, own: list[Metric]) -> list[Metric]:
        """The watcher's families merged with every worker's."""
        if self.pool is None:
            return own
        return merge_families([own, *await self.pool.ask("metrics")])


def _module_of(layer: Layer) -> str:
    """The module a worker imports to find `layer` (its `LAYER`): workers mount
    layers by module, as the name of a layer is."""
    module = sys.modules.get(layer.name)
    if module is None or getattr(module, "LAYER", None) is not layer:
        raise ValueError(f"layer {layer.name} is not its module's LAYER: workers mount "
                         "layers by module")
    return str(layer.name)
