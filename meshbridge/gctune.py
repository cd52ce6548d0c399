"""Cyclic garbage collector settings for a process that holds a big, long-lived heap.

Why: CPython's cyclic collector stops the event loop while it traverses every
tracked object of the generation it collects. Once the source has synced, a server
for 1,000 services x 20 endpoints holds ~540,000 tracked objects of cluster cache,
and thousands of streams add more; with the default thresholds each full (gen-2)
collection then paused the loop for 0.2-1.2 s (measured with `gc.callbacks`, see
docs/performance.md), which showed as the p99 of change-to-client latency and
lengthened connect storms. The measuring clients of the benchmarks, many thousand
streams in one Python process, paused the same way.

What:

* `settle_heap()`, once the long-lived state is built (the initial sync; the
  clients' set-up), collects once and then freezes what is alive: the collector
  never traverses frozen objects again. They are still freed by reference counting
  when dropped (a replaced endpoint, a removed service); only a garbage *cycle*
  among them would stay, and the cluster cache's objects are frozen dataclasses
  that form none.
* `before_sync()` does the same for what the imports built, without a collection,
  before the source starts, so that the initial sync does not traverse it again and
  again while it builds the cache (the cache is frozen once synced).
* It also raises the thresholds, so that while many long-lived objects are created
  at once (a connect storm) young collections are rarer and full ones much rarer.
* `release_heap()` undoes it (unfreezes, puts the thresholds back): for a process
  that runs several servers in turn (a benchmark, a test session), so that a
  stopped one can be collected.
"""

from __future__ import annotations

import gc

# (gen 0, gen 1, gen 2); CPython's defaults are (700, 10, 10). Gen 0 counts
# allocations minus deallocations of tracked objects; gens 1 and 2 count
# collections of the generation below. Measured: under steady churn no gen-0 pass
# over up to 50,000 young objects took 10 ms; during a connect storm the longest
# took ~50 ms of CPU (full collections there had taken 0.2-1.2 s).
THRESHOLDS = (50_000, 20, 10)
# Until synced: the initial sync makes hundreds of thousands of long-lived objects
# (10,000 pods: ~40 young collections even at THRESHOLDS, 0.15-0.2 s of CPU on the
# start-up's critical path, all of it finding nothing to free). Rare, not off: a
# source that never syncs must not grow without bound.
SYNC_THRESHOLDS = (1_000_000, 50, 100)


_before: list[tuple[int, ...]] = []  # the thresholds settle_heap replaced, if it did


def before_sync() -> None:
    """Freeze what the imports and the App built (it lives as long as the process) and
    raise the thresholds while the source fills the cluster cache: with the defaults
    the initial sync of a 10,000-pod cluster ran full collections that traversed the
    imports' objects and every object decoded so far, over and over (GC time showed
    up in sampled profiles on whatever line allocated). `settle_heap` follows once
    synced."""
    gc.freeze()
    if not _before:
        _before.append(gc.get_threshold())
    gc.set_threshold(*SYNC_THRESHOLDS)


def settle_heap() -> None:
    """Freeze the objects alive now out of the collector's reach; raise its thresholds."""
    gc.collect()
    gc.freeze()
    if not _before:
        _before.append(gc.get_threshold())
    gc.set_threshold(*THRESHOLDS)


def release_heap() -> None:
    """Give the frozen objects back to the collector (they are collected as usual) and
    put back the thresholds `settle_heap` replaced."""
    gc.unfreeze()
    if _before:
        gc.set_threshold(*_before.pop())
