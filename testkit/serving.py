"""meshbridge in this process, on loopback: Apps a test starts and stops (`Apps`), and an
App on a fixed set of objects (`serve_objects`, what the benchmarks and the fault and
soak tests serve). Both mount every protocol layer unless told otherwise, as
`meshbridge serve` does.

`MESHBRIDGE_TEST_WORKERS=N` serves every App started here with N worker processes
(docs/workers.md) unless a test says how many; `make test` runs the protocol and
reliability tiers so as well as with the default, one process."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from typing import Any

from bridge.cluster import Cluster, Event, EventType
from bridge.model import MeshConfig
from bridge.sources.base import Source
from meshbridge.app import App, ServeOptions
from meshbridge.host import Layer
from meshbridge.layers import protocol_layers
from meshbridge.limits import LOOPBACK_CROWD, Limits


class StaticSource:
    """A source that applies a fixed set of objects and then only what the caller
    applies to the cluster itself (so each measured change has a precise start)."""

    name = "static"
    stale = False

    def __init__(self, objects: Iterable[Any]) -> None:
        self.objects = list(objects)

    async def run(self, cluster: Cluster, synced: asyncio.Event) -> None:
        cluster.apply(Event(EventType.ADDED, o) for o in self.objects)
        synced.set()
        await asyncio.Event().wait()  # until cancelled by App.stop


def serving_workers(grpc_transport: str = "native") -> int:
    """How many processes serve a test's gRPC port (MESHBRIDGE_TEST_WORKERS; grpc.aio's
    server is served by one process only)."""
    if grpc_transport != "native":
        return 1
    return int(os.environ.get("MESHBRIDGE_TEST_WORKERS", "1"))


def workers_flag(grpc_transport: str = "native") -> list[str]:
    """`meshbridge serve`'s arguments for `serving_workers()` processes, for a test
    that runs serve as a process (none for one: the default)."""
    workers = serving_workers(grpc_transport)
    return ["--workers", str(workers)] if workers > 1 else []


def loopback_app(source: Source, config: MeshConfig | None = None,
                 layers: Iterable[Layer] | None = None, **options: Any) -> App:
    """An App (not started) on 127.0.0.1 with its gRPC and admin ports free ones unless
    `options` (ServeOptions' fields) say otherwise; every protocol layer by default,
    served by `serving_workers()` processes unless `workers` is given."""
    workers = serving_workers(str(options.get("grpc_transport", "native")))
    serve = ServeOptions(**{"listen": "127.0.0.1:0", "admin": "127.0.0.1:0",
                            "workers": workers, **options})
    return App(source, config, serve, protocol_layers() if layers is None else list(layers))


def worker_pids(app: App) -> list[int]:
    """The live worker processes serving `app`'s gRPC port (none with one process)."""
    pool = app.watcher.pool if app.watcher is not None else None
    return pool.pids() if pool is not None else []


class Apps:
    """The Apps a test starts (`start`), all stopped by `stop_all` at its end."""

    def __init__(self) -> None:
        self.started: list[App] = []

    async def start(self, source: Source, config: MeshConfig | None = None,
                    layers: Iterable[Layer] | None = None, **options: Any) -> App:
        app = loopback_app(source, config, layers, **options)
        self.started.append(app)
        await app.start()
        return app

    async def stop_all(self, grace: float = 0.5) -> None:
        for app in self.started:
            await app.stop(grace)
        self.started.clear()


async def serve_objects(objects: Iterable[Any], streams_per_client: int = 50_000,
                        listen: str = "127.0.0.1:0", workers: int | None = None) -> App:
    """A started App serving `objects` on `listen` (admin on any free port), with the
    HTTP/2 budgets of a crowd of clients on loopback (`LOOPBACK_CROWD`); served by
    `workers` processes (`serving_workers()` unless given)."""
    app = loopback_app(StaticSource(objects), listen=listen, limits=Limits(
        max_streams_per_client=streams_per_client, h2=LOOPBACK_CROWD),
        workers=serving_workers() if workers is None else workers)
    await app.start()
    return app
