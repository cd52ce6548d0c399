"""What every source is to the process: the `Source` protocol, and the error a
source's command-line form or configuration raises."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the kube source's credentials load before the cache is imported
    import asyncio

    from bridge.cluster import Cluster


class Source(Protocol):
    """Runs until cancelled, applying batches of events to the cluster.

    `synced` is set once the initial state has been applied in full; `stale` tells
    readiness whether the last-known state may be out of date (e.g. the API is down).
    A source may also have a `stale_reason` (str | None) that /ready shows with it.
    """

    name: str

    async def run(self, cluster: Cluster, synced: asyncio.Event) -> None: ...

    @property
    def stale(self) -> bool: ...


class SourceSpecError(ValueError):
    pass
