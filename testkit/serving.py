"""meshbridge in this process on a fixed set of objects, both protocol layers mounted as
`meshbridge serve` mounts them: what the benchmarks and the fault and soak tests serve."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from bridge.cluster import Cluster, Event, EventType
from meshbridge.app import App, ServeOptions
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


async def serve_objects(objects: Iterable[Any], streams_per_client: int = 50_000,
                        listen: str = "127.0.0.1:0") -> App:
    """A started App serving `objects` on `listen` (admin on any free port), with the
    HTTP/2 budgets of a crowd of clients on loopback (`LOOPBACK_CROWD`)."""
    limits = Limits(max_streams_per_client=streams_per_client, h2=LOOPBACK_CROWD)
    app = App(StaticSource(objects), None, ServeOptions(listen, "127.0.0.1:0", limits=limits),
              protocol_layers())
    await app.start()
    return app
