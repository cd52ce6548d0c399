"""The per-address counts every worker shares (meshbridge.workers.counts): a client's
connections counted on the whole port, a dead worker's forgotten, the segment closed
once however often the App is stopped."""

from __future__ import annotations

from meshbridge.workers.counts import CONNECTIONS, STREAMS, SharedCounts


def test_an_address_counts_over_every_worker_and_a_dead_workers_share_is_forgotten() -> None:
    counts = SharedCounts(2)
    try:
        first, second = counts.table(CONNECTIONS, 0), counts.table(CONNECTIONS, 1)
        assert first.add("10.0.0.1") == 1
        assert second.add("10.0.0.1") == 2
        assert first.count("10.0.0.2") == 0
        assert counts.table(STREAMS, 0).count("10.0.0.1") == 0  # kinds are apart
        counts.clear(1)
        assert first.count("10.0.0.1") == 1
        first.remove("10.0.0.1")
        first.remove("10.0.0.1")  # never below zero
        assert second.count("10.0.0.1") == 0
    finally:
        counts.close()


def test_closing_twice_is_closing_once() -> None:
    counts = SharedCounts(2)
    counts.close()
    counts.close()
