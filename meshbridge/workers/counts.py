"""Per-client-address counts shared by every worker, so that `--max-connections-per-
client` and `--max-streams-per-client` limit a client on the whole port, wherever the
kernel put its connections (docs/workers.md, "Limits across workers").

One shared memory segment (a memfd the watcher creates and hands to each worker) holds,
per kind (connections, streams) and per worker, a count-min sketch: `ROWS` rows of
`WIDTH` counters, an address counting in one counter of each row (each row its own
part of one hash of the address). Each worker writes only its own region, so no lock
is needed. What an address has is, per row, the sum of its counter over every
worker's region, and the least of the rows: never less than the truth, more only if
other addresses share its counter in every row. Two workers admitting one client at
the same instant may both see room for one more, so a limit can be passed by at most
one per worker for as long as those connections live. A dead worker's region is
zeroed by the watcher before its successor starts.
"""

from __future__ import annotations

import hashlib
import mmap
import os

ROWS = 4
WIDTH = 4096
_CELL = 4  # bytes: an unsigned 32-bit counter
CONNECTIONS = 0
STREAMS = 1
_KINDS = 2


def _cells(address: str) -> tuple[int, ...]:
    """The counter of each row for `address` (12 bits of one hash per row)."""
    h = int.from_bytes(hashlib.blake2b(address.encode(), digest_size=8).digest(), "little")
    return tuple(r * WIDTH + ((h >> (12 * r)) & (WIDTH - 1)) for r in range(ROWS))


class SharedCounts:
    """The segment: `workers` regions of each kind. Made by the watcher (`fd` None),
    mapped again by each worker from the descriptor it was handed."""

    def __init__(self, workers: int, fd: int | None = None) -> None:
        self.workers = workers
        self.region = ROWS * WIDTH  # counters per (kind, worker)
        size = _KINDS * workers * self.region * _CELL
        if fd is None:
            fd = os.memfd_create("meshbridge-counts")
            os.ftruncate(fd, size)
        self.fd = fd
        self._map = mmap.mmap(fd, size)
        self.cells = memoryview(self._map).cast("I")

    def table(self, kind: int, worker: int) -> AddressTable:
        """What worker `worker` counts of `kind` (its own region, every region read)."""
        return AddressTable(self, kind, worker)

    def clear(self, worker: int) -> None:
        """Forget what `worker` counted (it is gone; its clients with it)."""
        for kind in range(_KINDS):
            start = self._base(kind, worker)
            self.cells[start:start + self.region] = memoryview(
                bytes(self.region * _CELL)).cast("I")

    def _base(self, kind: int, worker: int) -> int:
        return (kind * self.workers + worker) * self.region

    def close(self) -> None:
        """Unmap and close the segment; closing it again does nothing."""
        if self._map.closed:
            return
        self.cells.release()
        self._map.close()
        os.close(self.fd)


class AddressTable:
    """One worker's counts of one kind: `h2grpc.server.AddressCounts` across workers."""

    __slots__ = ("_bases", "_cells", "_own")

    def __init__(self, counts: SharedCounts, kind: int, worker: int) -> None:
        self._cells = counts.cells
        self._own = counts._base(kind, worker)
        self._bases = tuple(counts._base(kind, w) for w in range(counts.workers))

    def add(self, address: str) -> int:
        cells, own = self._cells, self._own
        at = _cells(address)
        for i in at:
            cells[own + i] += 1
        return self._count(at)

    def remove(self, address: str) -> None:
        cells, own = self._cells, self._own
        for i in _cells(address):
            if cells[own + i]:
                cells[own + i] -= 1

    def count(self, address: str) -> int:
        return self._count(_cells(address))

    def _count(self, at: tuple[int, ...]) -> int:
        cells, bases = self._cells, self._bases
        return min(sum(cells[b + i] for b in bases) for i in at)
