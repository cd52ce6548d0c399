"""Giving memory back to the system after a burst of closed connections and ended
streams (an attack, a reconnect storm).

Reference counting frees a closed connection and its streams at once (h2grpc keeps
no cycles among them), but the memory does not go back to the system by itself:
CPython keeps freed objects on its free lists, and each of those can pin a whole
256 KiB arena of its small-object allocator that is otherwise empty; glibc keeps the
pages of freed large buffers in its heap. Measured on `meshbridge serve` after one
connection with 5,000 streams ended: 25 MiB above the start; a full collection
(the only thing that empties the free lists) gave back 16 MiB of it, `malloc_trim`
4 more. So, after a burst, the trimmer does both, once the burst is over: when
nothing has been released for SETTLE seconds (never in the middle of an attack,
when the collection would only look at what the attack still holds). The trim gives
back only what the C library's malloc holds; what CPython's own small-object
allocator keeps (an arena with one live object in it) it cannot, which is why
`meshbridge serve` runs on malloc (meshbridge/allocator.py).

It is throttled: a full collection pauses the loop for as long as it takes to look
at every object not frozen by `gc.freeze` (meshbridge freezes its start-up state),
so trims are at least MIN_INTERVAL apart, and further apart when one takes long (at
most about 2% of the process's CPU time goes to trimming).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import time
from collections.abc import Callable

# How much one closed connection counts, against one ended stream: its buffers and
# HPACK decoder are several times a stream's few KiB.
CONNECTION_WEIGHT = 8
# Ended streams (or the connection equivalent) that make a burst worth a trim.
BURST = 1_000
SETTLE = 0.5  # seconds without a release: the burst is over
MIN_INTERVAL = 2.0  # seconds between trims at least
COST_FACTOR = 50  # ... and at least this many times the last trim's duration


def _libc_trim() -> Callable[[], None]:
    """glibc's malloc_trim(0), or nothing where the C library has none."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        trim = None
    if trim is None:
        return lambda: None
    trim.argtypes = [ctypes.c_size_t]

    def run() -> None:
        trim(0)
    return run


class HeapTrimmer:
    __slots__ = ("_handle", "_last_release", "_loop", "_trim", "cost", "last", "pending",
                 "seconds", "trims")

    def __init__(self, loop: asyncio.AbstractEventLoop,
                 trim: Callable[[], None] | None = None) -> None:
        self._loop = loop
        self._trim = trim or _libc_trim()
        self._handle: asyncio.TimerHandle | None = None
        self.pending = 0  # released since the last trim, in ended-stream units
        self._last_release = 0.0
        self.last = -MIN_INTERVAL  # when the last trim ran (loop time)
        self.cost = 0.0  # the CPU time it took
        self.trims = 0
        self.seconds = 0.0  # spent trimming in all

    def streams_ended(self, n: int = 1) -> None:
        self._add(n)

    def connection_closed(self, streams: int = 0) -> None:
        """A connection is gone, with `streams` still open when it ended (what is freed
        only now, with the connection's own state)."""
        self._add(CONNECTION_WEIGHT + streams)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _add(self, n: int) -> None:
        self.pending += n
        self._last_release = self._loop.time()
        if self.pending >= BURST and self._handle is None:
            self._handle = self._loop.call_later(SETTLE, self._check)

    def _check(self) -> None:
        """Trim, once the burst is over and the last trim is far enough behind."""
        self._handle = None
        now = self._loop.time()
        due = max(self._last_release + SETTLE,
                  self.last + max(MIN_INTERVAL, COST_FACTOR * self.cost))
        if due > now:
            self._handle = self._loop.call_later(due - now, self._check)
            return
        self.pending = 0
        started = time.process_time()
        gc.collect()  # a full collection: it also empties the free lists
        self._trim()
        self.cost = time.process_time() - started
        self.seconds += self.cost
        self.trims += 1
        self.last = self._loop.time()
