"""The App's side of `--workers N`: the watcher (docs/workers.md).

The watcher mounts every protocol layer as the one process does, on a server that
only collects their handlers (it listens on no port): the layers' services follow
the Cluster and the Views here, once. Each layer's `register_feeds` then hooks what
it sends the workers onto every worker's link; the relay runs, for the workers,
whatever method has no worker side. The workers (`WorkerPool`) listen on the port.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
from typing import TYPE_CHECKING, Any

import grpc
from prometheus_client.metrics_core import Metric

from meshbridge import log as logs
from meshbridge.stream_registry import StreamInfo
from meshbridge.workers.gather import merge_families
from meshbridge.workers.pool import WorkerPool
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

    async def start(self) -> int:
        """Mount the layers, start the workers; the gRPC port they listen on."""
        app = self.app
        if app.options.grpc_transport != "native":
            raise ValueError("--workers above 1 needs --grpc-transport native")
        sink = HandlerSink()
        for layer in app.layers:
            layer(app, sink)
        if app.port_tls() is not None:
            raise ValueError("--tls-from-identity is not served by workers yet: "
                             "use --workers 1, or --tls-cert/--tls-key")
        self.relay = relay = RelayServer(sink.handlers)
        modules = tuple(_module_of(layer) for layer in app.layers)
        loop = "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") \
            else "asyncio"
        options = app.options

        def spec(index: int, listen: str) -> WorkerSpec:
            return WorkerSpec(index, options.workers, listen, app.config, options.limits,
                              options.tls, modules, options.layer_options, relay.table,
                              loop, logs.configured)

        self.pool = pool = WorkerPool(options.workers, options.listen, spec, app.metrics)
        pool.on_link(relay.attach)
        for module in modules:
            register = getattr(sys.modules[module], "register_feeds", None)
            if register is not None:
                register(app, pool)
        return await pool.start()

    async def stop(self, grace: float) -> None:
        if self.pool is not None:
            await self.pool.stop(grace)
            self.pool.counts.close()

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


def _module_of(layer: Any) -> str:
    module = getattr(layer, "__module__", None)
    if not module or module not in sys.modules:
        raise ValueError(f"layer {layer!r} is not a module's register function: workers "
                         "mount layers by module")
    importlib.import_module(module)
    return str(module)
