"""One worker process: client connections on the shared gRPC port, served from what
the watcher sends (docs/workers.md).

A worker holds no Cluster and no View and watches no API server. It binds its own
socket to the port the watcher holds (SO_REUSEPORT: the kernel spreads connections
over the workers), mounts each layer's worker side (`Layer.worker`) and, behind
them, the relay for every other method the watcher serves, and says `listening` (or
`failed`, with why) on its link. It stops as the one process does (GOAWAY, every
stream ended with OK) when the watcher says `stop`, on SIGTERM, or when its link
closes: a worker never serves on without its watcher, whose state it would only
follow further out of date.
"""

from __future__ import annotations

import asyncio
import contextlib
import copyreg
import ctypes
import dataclasses
import importlib
import os
import signal
import socket
import sys
import time
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import prometheus_client
import structlog

from bridge.model import MeshConfig
from h2grpc.server import Server as NativeServer
from meshbridge import eventloop, gctune, h2metrics
from meshbridge.debug_access import DebugAccess
from meshbridge.host import Layer
from meshbridge.limits import Limits
from meshbridge.log import configure_logging
from meshbridge.rpcguard import GrpcMetrics, RpcGuard
from meshbridge.stream_registry import StreamRegistry
from meshbridge.workers.counts import CONNECTIONS, STREAMS, SharedCounts
from meshbridge.workers.link import Link
from meshbridge.workers.relay import MethodTable, RelayHandler

log = structlog.get_logger("meshbridge.workers")

T = TypeVar("T")
# Each worker numbers its streams from index * this (the watcher's from 1).
STREAM_IDS = 1_000_000_000
_PR_SET_PDEATHSIG = 1


def read_only(mapping: dict[Any, Any]) -> Mapping[Any, Any]:
    return types.MappingProxyType(mapping)


def _mapping_proxy(proxy: Mapping[Any, Any]) -> tuple[Any, tuple[dict[Any, Any]]]:
    return read_only, (dict(proxy),)


# The configuration holds read-only mappings (MeshConfig's defaults): a worker gets
# its own, equal.
copyreg.pickle(types.MappingProxyType, _mapping_proxy)


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What a worker is started with (pickled once, at its start)."""

    index: int
    workers: int
    listen: str  # host:port, the port the watcher holds
    config: MeshConfig
    limits: Limits
    tls: Any  # meshbridge.app.TlsFiles | None
    layers: tuple[str, ...]  # the layer modules, in mount order
    layer_options: tuple[object, ...]
    relayed: MethodTable
    event_loop: str
    logging: tuple[str, str] | None
    debug_access: DebugAccess


class WorkerHost:
    """meshbridge.host.WorkerHost: what a layer's worker side is given."""

    def __init__(self, spec: WorkerSpec, link: Link) -> None:
        self._spec = spec
        self.config = spec.config
        self.metrics = prometheus_client.CollectorRegistry()
        prometheus_client.ProcessCollector(registry=self.metrics)
        prometheus_client.PlatformCollector(registry=self.metrics)
        self.streams = StreamRegistry(self.metrics, first_id=(spec.index + 1) * STREAM_IDS,
                                      worker=spec.index)
        self.link = link
        self.stop_hooks: list[Callable[[], None]] = []
        self._services: dict[str, object] = {}

    @property
    def limits(self) -> Limits:
        return self._spec.limits

    @property
    def debug_access(self) -> DebugAccess:
        return self._spec.debug_access

    def options_for(self, kind: type[T]) -> T:
        for value in self._spec.layer_options:
            if isinstance(value, kind):
                return value
        return kind()

    def on_stop(self, hook: Callable[[], None]) -> None:
        self.stop_hooks.append(hook)

    def keep(self, name: str, service: object) -> None:
        self._services[name] = service

    def service(self, name: str) -> Any:
        return self._services[name]


def run(spec: WorkerSpec, sock: socket.socket) -> None:
    """The worker process's entry (multiprocessing's target)."""
    with contextlib.suppress(OSError, AttributeError):
        # If the process that started us goes, so do we (its link closing says so too).
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    # Ctrl-C reaches the whole process group: the watcher stops the workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if spec.logging is not None:
        configure_logging(*spec.logging)
    # As the one process does once synced (meshbridge.gctune): what the imports built
    # is frozen and the collector's thresholds raised, so that thousands of streams'
    # objects are not traversed again and again as they come and change. A worker has
    # no initial sync of its own: it is settled from its start.
    gctune.settle_heap()
    _, fds, _, _ = socket.recv_fds(sock, 16, 1)
    counts = SharedCounts(spec.workers, fds[0])
    code = eventloop.run(_serve(spec, sock, counts), spec.event_loop)
    sys.stderr.flush()
    os._exit(code)


async def _serve(spec: WorkerSpec, sock: socket.socket, counts: SharedCounts) -> int:
    loop = asyncio.get_running_loop()
    link = await Link.over(sock, f"worker-{spec.index}")
    host = WorkerHost(spec, link)
    done = asyncio.Event()
    grace: list[float] = [1.0]

    def stop(seconds: float) -> None:
        grace[0] = seconds
        done.set()

    link.on("stop", stop)
    link.on_closed(lambda: stop(0.5))
    loop.add_signal_handler(signal.SIGTERM, lambda: stop(1.0))
    link.on_call("metrics", lambda: list(host.metrics.collect()))
    link.on_call("streams", host.streams.detached)
    link.on_call("streams.synced", host.streams.synced)
    link.on_call("stats", lambda: {"cpu": time.process_time(), "pid": os.getpid()})

    limits = spec.limits
    guard = RpcGuard(limits.max_streams_per_client, GrpcMetrics(host.metrics),
                     counts=counts.table(STREAMS, spec.index))
    server = NativeServer(interceptors=[guard], limits=dataclasses.replace(
        limits.h2, max_concurrent_streams=limits.max_streams_per_connection,
        max_message_bytes=limits.max_message_bytes),
        address_counts=counts.table(CONNECTIONS, spec.index), reuse_port=True)
    h2metrics.register(server, host.metrics)
    for module in spec.layers:
        layer: Layer = importlib.import_module(module).LAYER
        if layer.worker is not None:
            layer.worker(host, server)
    relay = RelayHandler(link, spec.relayed)
    server.add_generic_rpc_handlers((relay,))
    if spec.tls is not None:
        port = server.add_secure_port(spec.listen, spec.tls.context())
    else:
        port = server.add_insecure_port(spec.listen)
    if not port:
        link.send("failed", f"cannot listen on {spec.listen}: {server.bind_error}")
        link.flush()
        return 1
    await server.start()
    link.send("listening", os.getpid())
    await done.wait()
    # As the one process stops (App.stop): GOAWAY first, then every stream ended
    # with OK so that its client reconnects to another worker or replica.
    stopping = asyncio.ensure_future(server.stop(grace[0]))
    await asyncio.sleep(0)
    for hook in host.stop_hooks:
        hook()
    relay.end_all()
    await stopping
    link.close()
    return 0
