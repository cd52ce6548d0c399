"""The collector settings `meshbridge serve` applies once synced, and that a stopped
App can be collected (a process running Apps in turn must not keep them all)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from bridge.sources.files import FilesSource
from meshbridge import gctune
from meshbridge.app import App, ServeOptions
from meshbridge.layers import protocol_layers


@pytest.fixture
def collector() -> Iterator[None]:
    """Put the collector back as it was: its settings are the whole process's."""
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_settle_heap_freezes_what_is_alive_and_raises_the_thresholds(
        collector: None) -> None:
    class Held:
        pass

    held = Held()
    assert gc.is_tracked(held)
    gctune.settle_heap()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == gctune.THRESHOLDS
    assert not any(o is held for o in gc.get_objects())  # frozen: out of every generation
    gctune.release_heap()
    assert gc.get_freeze_count() == 0
    assert any(o is held for o in gc.get_objects())


def test_release_heap_puts_the_thresholds_back(collector: None) -> None:
    gc.set_threshold(700, 10, 10)
    gctune.settle_heap()
    gctune.settle_heap()  # a second settle (the compare worker settles per model)
    gctune.release_heap()
    assert gc.get_threshold() == (700, 10, 10)


def test_frozen_objects_are_still_freed_when_dropped(collector: None) -> None:
    class Held:
        pass

    held = Held()
    ref = weakref.ref(held)
    gctune.settle_heap()
    del held  # reference counting, not the collector, frees it
    assert ref() is None


async def test_a_stopped_app_with_both_protocol_layers_is_freed(demo_dir: Path) -> None:
    app = App(FilesSource(demo_dir, poll_interval=0.05),
              options=ServeOptions("127.0.0.1:0", "127.0.0.1:0"), layers=protocol_layers())
    await app.start()
    await app.stop(grace=0.1)
    ref = weakref.ref(app)
    del app
    gc.collect()
    assert ref() is None
