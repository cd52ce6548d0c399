"""The collector settings `meshbridge serve` applies once synced (that a stopped App can
be collected is tests/integration/test_app.py's)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from meshbridge import gctune


@pytest.fixture
def collector() -> Iterator[None]:
    """Put the collector back as it was: its settings are the whole process's."""
    thresholds, before = gc.get_threshold(), list(gctune._before)
    gctune._before.clear()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)
    gctune._before[:] = before


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


def test_the_collector_runs_rarely_until_synced_then_as_settled(collector: None) -> None:
    gc.set_threshold(700, 10, 10)
    gctune.before_sync()  # the watches opened: the initial state is coming
    assert gc.get_threshold() == gctune.SYNC_THRESHOLDS
    assert gctune.SYNC_THRESHOLDS[0] > gctune.THRESHOLDS[0]
    gctune.settle_heap()  # synced
    assert gc.get_threshold() == gctune.THRESHOLDS
    gctune.release_heap()
    assert gc.get_threshold() == (700, 10, 10)
