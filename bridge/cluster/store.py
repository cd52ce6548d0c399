"""One kind's part of the cache: its objects, its indexes, and what a change to one
of them means (client-go's store, indexer and event handler, for one kind).

A store keeps the last object of each key. `upsert` and `delete` skip what changes
nothing (the same object again, as a relist produces) and hand the rest to the
store's `changed`, which keeps its indexes and writes the store's own part of the
batch's `ClusterChange`. The `Cluster` composes one store per entry of its store
registry (`bridge.cluster.stores.CORE_STORES`): a new kind is a new store class and
one entry there.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any, Generic, TypeVar

from bridge.cluster.change import ClusterChange

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class KindStore(Generic[K, V]):
    """The objects of the kinds in `kinds` (each object's `kind`), by key."""

    kinds: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.objects: dict[K, V] = {}

    def key(self, obj: V) -> K:
        """Where `obj` is kept (an object's identity within its kind)."""
        raise NotImplementedError

    def changed(self, key: K, old: V | None, new: V | None, change: ClusterChange) -> None:
        """`key` went from `old` to `new` (None: absent): update the indexes and say
        what that changed. Called only when something did."""

    def upsert(self, obj: V, change: ClusterChange) -> None:
        key = self.key(obj)
        old = self.objects.get(key)
        if old == obj:
            return
        self.objects[key] = obj
        self.changed(key, old, obj, change)

    def delete(self, obj: V, change: ClusterChange) -> None:
        key = self.key(obj)
        old = self.objects.pop(key, None)
        if old is not None:
            self.changed(key, old, None, change)

    def of_kind(self, kind: str) -> Iterable[V]:
        """Every object of `kind` (one of `kinds`), for a relisting source to diff
        against."""
        return self.objects.values()

    def __len__(self) -> int:
        return len(self.objects)


AnyStore = KindStore[Any, Any]
