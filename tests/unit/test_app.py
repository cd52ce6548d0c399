"""The App's admin surface, independent of any protocol layer."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

from bridge.cluster import Cluster
from meshbridge.app import App, ServeOptions


class NeverSyncingSource:
    """A stand-in source (nothing real can be made to hang its initial list on demand)."""

    name = "never"
    stale = False

    async def run(self, cluster: Cluster, synced: asyncio.Event) -> None:
        await asyncio.Event().wait()


def status(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


async def test_ready_waits_for_the_initial_sync_while_live_answers_at_once() -> None:
    source = NeverSyncingSource()
    app = App(source, options=ServeOptions("127.0.0.1:0", "127.0.0.1:0"))
    await app.start(wait_synced=False)
    try:
        assert await asyncio.to_thread(status, app.admin_port, "/ready") == 503
        assert await asyncio.to_thread(status, app.admin_port, "/live") == 200
        app.synced.set()
        assert await asyncio.to_thread(status, app.admin_port, "/ready") == 200
        source.stale = True
        assert await asyncio.to_thread(status, app.admin_port, "/ready") == 503
    finally:
        await app.stop(0.1)
