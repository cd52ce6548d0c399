"""h2grpc.heap: memory is given back once a burst of closes is over, and not too often.

A fake loop (its clock and its timers) drives the trimmer; the trim itself is counted,
not run against the C library."""

from __future__ import annotations

import pytest

from h2grpc import heap
from h2grpc.heap import BURST, CONNECTION_WEIGHT, MIN_INTERVAL, SETTLE, HeapTrimmer
from tests.unit.fake_loop import FakeLoop


@pytest.fixture
def trimmer(monkeypatch: pytest.MonkeyPatch) -> tuple[HeapTrimmer, FakeLoop, list[float]]:
    loop = FakeLoop()
    trims: list[float] = []
    monkeypatch.setattr("h2grpc.heap.gc.collect", lambda: 0)  # its cost is not the test's
    return HeapTrimmer(loop, trim=lambda: trims.append(loop.now)), loop, trims  # type: ignore[arg-type]


def test_a_burst_is_trimmed_once_it_is_over(
        trimmer: tuple[HeapTrimmer, FakeLoop, list[float]]) -> None:
    t, loop, trims = trimmer
    for _ in range(BURST * 3):  # still going: no trim in the middle of it
        t.streams_ended()
        loop.advance(SETTLE / 10)
    assert trims == []
    loop.advance(SETTLE * 1.01)
    assert len(trims) == 1 and t.pending == 0


def test_fewer_releases_than_a_burst_trim_nothing(
        trimmer: tuple[HeapTrimmer, FakeLoop, list[float]]) -> None:
    t, loop, trims = trimmer
    for _ in range(BURST // CONNECTION_WEIGHT - 1):
        t.connection_closed()
    loop.advance(60)
    assert trims == []
    t.connection_closed()  # this one makes it a burst
    loop.advance(60)
    assert len(trims) == 1


def test_trims_are_at_least_min_interval_apart_and_further_when_one_is_costly(
        trimmer: tuple[HeapTrimmer, FakeLoop, list[float]]) -> None:
    t, loop, trims = trimmer
    t.streams_ended(BURST)
    loop.advance(SETTLE * 1.01)
    t.streams_ended(BURST)  # a second burst at once: waits for the interval
    loop.advance(SETTLE * 1.01)
    assert len(trims) == 1
    loop.advance(MIN_INTERVAL)
    assert len(trims) == 2 and trims[1] - trims[0] >= MIN_INTERVAL
    t.cost = 1.0  # as if the last trim took a second of CPU: 50 s until the next
    t.streams_ended(BURST)
    loop.advance(MIN_INTERVAL * 2)
    assert len(trims) == 2
    loop.advance(heap.COST_FACTOR * t.cost)
    assert len(trims) == 3


def test_close_cancels_a_pending_trim(
        trimmer: tuple[HeapTrimmer, FakeLoop, list[float]]) -> None:
    t, loop, trims = trimmer
    t.streams_ended(BURST)
    t.close()
    loop.advance(60)
    assert trims == []
