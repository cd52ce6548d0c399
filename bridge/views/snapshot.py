"""Versions of an endpoint set that cost what changed, not what is there.

A `VersionedMap` is one immutable version of a mapping. The newest version of a
chain owns the one dict; `evolve` applies a delta to that dict in place and hands it
to the new version, and the old version keeps only what the delta overwrote (its
undo). An old version therefore answers `get` by walking the undos up to the newest
version (one hop for the version just replaced, which is what diffing reads), and
answers iteration by materialising itself once. Publishing a version costs the size
of its delta; reading the newest costs what a dict costs.

Holding an old version keeps every delta since it alive (never the whole set twice):
a consumer that keeps a version around for long should copy it (`dict(version)`).
"""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, KeysView, Mapping, ValuesView
from typing import Generic, TypeVar

from bridge.model import EndpointId, ResolvedEndpoint

K = TypeVar("K")
V = TypeVar("V")

_MISSING = object()


class VersionedMap(Mapping[K, V], Generic[K, V]):
    """One version of a persistent mapping; see the module docstring."""

    __slots__ = ("__weakref__", "_data", "_len", "_newer", "_undo")

    def __init__(self, initial: Mapping[K, V] | None = None) -> None:
        # The newest version's dict, or an old version's materialised copy; None while
        # an old version has not been materialised.
        self._data: dict[K, V] | None = dict(initial) if initial else {}
        self._newer: VersionedMap[K, V] | None = None
        # What the delta to `_newer` overwrote: key -> the value here, or _MISSING.
        self._undo: dict[K, object] | None = None
        self._len = len(self._data)

    @property
    def is_newest(self) -> bool:
        return self._newer is None and self._undo is None

    def evolve(self, changes: Mapping[K, V | None]) -> VersionedMap[K, V]:
        """The next version: `changes` applied (a None value removes the key). Only
        the newest version of a chain may evolve; this one then becomes an old one."""
        if not self.is_newest:
            raise ValueError("only the newest version can evolve")
        data = self._data
        assert data is not None
        undo: dict[K, object] = {}
        for k, v in changes.items():
            old = data.get(k, _MISSING)
            if v is None:
                if old is _MISSING:
                    continue
                del data[k]
            else:
                data[k] = v
            undo[k] = old
            self._changed(k, None if old is _MISSING else old, v)  # type: ignore[arg-type]
        new = self._successor(data)
        self._data = None
        self._newer = new
        self._undo = undo
        return new

    def _successor(self, data: dict[K, V]) -> VersionedMap[K, V]:
        new: VersionedMap[K, V] = object.__new__(type(self))
        new._data = data
        new._newer = None
        new._undo = None
        new._len = len(data)
        return new

    def _changed(self, key: K, old: V | None, new: V | None) -> None:
        """Hook for subclasses keeping an index of the newest version."""

    # ------------------------------------------------------------- reading

    def get(self, key: K, default: V | None = None) -> V | None:  # type: ignore[override]
        version = self
        while version._data is None:
            undo = version._undo
            assert undo is not None and version._newer is not None
            if key in undo:
                value = undo[key]
                return default if value is _MISSING else value  # type: ignore[return-value]
            version = version._newer
        return version._data.get(key, default)

    def __getitem__(self, key: K) -> V:
        value = self.get(key, _MISSING)  # type: ignore[arg-type]
        if value is _MISSING:
            raise KeyError(key)
        return value  # type: ignore[return-value]

    def __contains__(self, key: object) -> bool:
        return self.get(key, _MISSING) is not _MISSING  # type: ignore[arg-type]

    def __len__(self) -> int:
        return self._len

    def _dict(self) -> dict[K, V]:
        """This version as a dict: the live one for the newest, else built once from
        the newest by undoing each delta since (and kept, cutting the chain)."""
        if self._data is not None:
            return self._data
        chain: list[VersionedMap[K, V]] = []
        version: VersionedMap[K, V] = self
        while version._data is None:
            chain.append(version)
            assert version._newer is not None
            version = version._newer
        data = dict(version._data)
        for old in reversed(chain):
            assert old._undo is not None
            for k, v in old._undo.items():
                if v is _MISSING:
                    data.pop(k, None)
                else:
                    data[k] = v  # type: ignore[assignment]
        self._data = data
        # Materialised: the newer versions may go (an empty undo still marks it old).
        self._newer = None
        self._undo = {}
        return data

    def __iter__(self) -> Iterator[K]:
        return iter(self._dict())

    # dict views: one C-level pass, not a Python call per key. The newest version's
    # views follow later versions, so iterate them at once (as every consumer does).
    def keys(self) -> KeysView[K]:
        return self._dict().keys()

    def values(self) -> ValuesView[V]:
        return self._dict().values()

    def items(self) -> ItemsView[K, V]:
        return self._dict().items()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, VersionedMap):
            return self._dict() == other._dict()
        if isinstance(other, Mapping):
            return self._dict() == dict(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._dict()!r})"


Addr = tuple[str, int]


class EndpointSnapshot(VersionedMap[EndpointId, ResolvedEndpoint]):
    """A View's version: its endpoints by id, plus what the protocol layers ask of a
    whole set without reading all of it: how many are ready, and whether an address
    is still held by a ready endpoint (proxies key endpoints by address)."""

    __slots__ = ("_by_addr", "ready_count")

    def __init__(self, initial: Mapping[EndpointId, ResolvedEndpoint] | None = None) -> None:
        super().__init__(initial)
        # (ip, port) -> ids of the newest version with that address; shared down the chain.
        self._by_addr: dict[Addr, set[EndpointId]] = {}
        self.ready_count = 0
        for r in self.values():
            self._changed(r.id, None, r)

    def _successor(self, data: dict[EndpointId, ResolvedEndpoint]) -> EndpointSnapshot:
        new = super()._successor(data)
        assert isinstance(new, EndpointSnapshot)
        new._by_addr = self._by_addr
        new.ready_count = self.ready_count
        return new

    def evolve(self, changes: Mapping[EndpointId, ResolvedEndpoint | None]) -> EndpointSnapshot:
        # The hook counts on this version while the delta is applied; the count is
        # the new version's, and this one keeps its own.
        ready = self.ready_count
        new = super().evolve(changes)
        assert isinstance(new, EndpointSnapshot)
        self.ready_count = ready
        return new

    def _changed(self, key: EndpointId, old: ResolvedEndpoint | None,
                 new: ResolvedEndpoint | None) -> None:
        if old is not None:
            a = (old.endpoint.ip, old.endpoint.port)
            ids = self._by_addr.get(a)
            if ids is not None:
                ids.discard(key)
                if not ids:
                    del self._by_addr[a]
            self.ready_count -= old.endpoint.ready
        if new is not None:
            self._by_addr.setdefault((new.endpoint.ip, new.endpoint.port), set()).add(key)
            self.ready_count += new.endpoint.ready

    def holds_ready(self, ip: str, port: int) -> bool:
        """Whether a ready endpoint of this version has address `ip:port`."""
        if not self.is_newest:
            return any(r.endpoint.ready and r.endpoint.ip == ip and r.endpoint.port == port
                       for r in self.values())
        data = self._data
        assert data is not None
        return any(data[i].endpoint.ready for i in self._by_addr.get((ip, port), ()))
