"""The App as a process runs it: its admin surface independent of any protocol layer, and
a stopped App with both layers freed (a process running Apps in turn must not keep
them all)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from pathlib import Path

from bridge.cluster import Cluster
from bridge.sources.files import FilesSource
from meshbridge.app import App, ServeOptions
from meshbridge.layers import protocol_layers
from testkit.net import http_get


class NeverSyncingSource:
    """A stand-in source (nothing real can be made to hang its initial list on demand)."""

    name = "never"
    stale = False

    async def run(self, cluster: Cluster, synced: asyncio.Event) -> None:
        await asyncio.Event().wait()


def status(port: int, path: str) -> int:
    return http_get(f"http://127.0.0.1:{port}{path}", timeout=2)[0]


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


async def test_a_stopped_app_with_both_protocol_layers_is_freed(demo_dir: Path) -> None:
    app = App(FilesSource(demo_dir, poll_interval=0.05),
              options=ServeOptions("127.0.0.1:0", "127.0.0.1:0"), layers=protocol_layers())
    await app.start()
    await app.stop(grace=0.1)
    ref = weakref.ref(app)
    del app
    gc.collect()
    assert ref() is None
