"""The informer cache of one cluster: a store per kind, listeners in declared stages.

A source hands batches of events to `Cluster.apply`; each event goes to the store of
its kind (`stores.py`), which keeps its objects and indexes and writes its part of
the batch's `ClusterChange`; the Cluster then tells its listeners, once per batch,
what changed. An update that changes nothing (the same object again, as a relist
produces) is not a change, so it reaches no subscriber.

A Cluster is a value with an identity (`ClusterIdentity`: its name, cluster domain
and trust domain); one process may hold several, each with its own stores.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TypeVar

from bridge.cluster.change import ClusterChange, Event, EventType
from bridge.cluster.store import AnyStore
from bridge.cluster.stores import (
    CORE_STORES,
    JobStore,
    NamespaceStore,
    NodeStore,
    PodStore,
    ProfileStore,
    ReplicaSetStore,
    ServerStore,
    ServiceStore,
    SliceStore,
)
from bridge.model import ClusterIdentity, ServiceKey
from bridge.objects import EndpointSlice, KubeObject, Server, Service, object_key

Listener = Callable[[ClusterChange], None]
S = TypeVar("S", bound=AnyStore)
K = TypeVar("K")
V = TypeVar("V")


class ListenerStage(enum.IntEnum):
    """When a listener hears of a change: every listener of an earlier stage has
    handled the change before any of a later one is called, so a later stage may read
    what an earlier one derived from the same change. Listeners of one stage must not
    depend on each other (they run in the order they were added)."""

    # bridge.views: the merged, enriched, filtered endpoint views.
    VIEWS = 0
    # A protocol layer's per-service state that may read the views (xDS CDS/LDS/RDS).
    RESOURCES = 1
    # Linkerd's service and endpoint profiles.
    PROFILES = 2


class Cluster:
    """The last known state of every object of one cluster, whatever the source.

    The core kinds' objects and indexes are readable as plain mappings (`services`,
    `slices`, `pods`, ...: the stores' own dicts, read on every change, never to be
    written but through `apply`); any store is `store(SomeStore)`."""

    def __init__(self, identity: ClusterIdentity | None = None,
                 stores: Iterable[Callable[[], AnyStore]] = CORE_STORES) -> None:
        self.identity = identity if identity is not None else ClusterIdentity()
        self._stores: dict[type[AnyStore], AnyStore] = {}
        self._by_kind: dict[str, AnyStore] = {}
        for make in stores:
            store = make()
            self._stores.setdefault(type(store), store)
            for kind in store.kinds:
                if kind in self._by_kind:
                    raise ValueError(f"two stores for kind {kind}")
                self._by_kind[kind] = store
        self._services = self.store(ServiceStore)
        self._slices = self.store(SliceStore)
        self._pods = self.store(PodStore)
        self._nodes = self.store(NodeStore)
        self._servers = self.store(ServerStore)
        self.services = _read_only(self._services.objects)
        self.slices = _read_only(self._slices.objects)
        self.slices_by_service = _read_only(self._slices.by_service)
        self.services_by_pod = _read_only(self._slices.services_by_pod)
        self.slice_stamps = _read_only(self._slices.stamps)
        self.pods = _read_only(self._pods.objects)
        self.pods_by_ip = _read_only(self._pods.by_ip)
        self.nodes = _read_only(self._nodes.objects)
        self.replicasets = _read_only(self.store(ReplicaSetStore).objects)
        self.jobs = _read_only(self.store(JobStore).objects)
        self.profiles = _read_only(self.store(ProfileStore).objects)
        self.namespaces = _read_only(self.store(NamespaceStore).objects)
        # Moved whenever an object that enrichment reads besides pods and slices
        # changes (Nodes, ReplicaSets, Jobs, Servers), so memoised enrichment can tell.
        self.enrich_epoch = 0
        self._listeners: list[tuple[ListenerStage, Listener]] = []
        self.generation = 0  # bumped on every batch that changed something

    @property
    def name(self) -> str:
        return self.identity.name

    def store(self, kind: type[S]) -> S:
        """This cluster's store of class `kind`."""
        store = self._stores.get(kind)
        if store is None:
            raise LookupError(f"cluster {self.name} has no {kind.__name__}")
        assert isinstance(store, kind)
        return store

    # ------------------------------------------------------------------ listening

    def add_listener(self, listener: Listener, stage: ListenerStage) -> None:
        """Call `listener` once per batch that changed something, in `stage`."""
        self._listeners.append((stage, listener))
        # Stable: one stage keeps the order its listeners were added in.
        self._listeners.sort(key=lambda entry: entry[0])

    def remove_listener(self, listener: Listener) -> None:
        for i, (_, known) in enumerate(self._listeners):
            if known == listener:
                del self._listeners[i]
                return
        raise ValueError(f"{listener!r} is not listening")

    # ------------------------------------------------------------------ reading

    def slices_of(self, service: ServiceKey) -> list[EndpointSlice]:
        return self._slices.of(service)

    def services_with_cluster_ip(self, ip: str) -> list[Service]:
        return self._services.with_cluster_ip(ip)

    def node_zone(self, node_name: str) -> str:
        return self._nodes.zone(node_name)

    def servers_in(self, namespace: str) -> Iterator[Server]:
        return self._servers.in_namespace(namespace)

    def counts(self) -> dict[str, int]:
        return {
            "services": len(self.services),
            "endpointslices": len(self.slices),
            "pods": len(self.pods),
            "nodes": len(self.nodes),
            "replicasets": len(self.replicasets),
            "jobs": len(self.jobs),
            "servers": len(self._servers),
            "serviceprofiles": len(self.profiles),
        }

    def objects(self, kind: str) -> list[KubeObject]:
        """Every cached object of one kind, for relisting sources to diff against."""
        store = self._by_kind.get(kind)
        return list(store.of_kind(kind)) if store is not None else []

    # ------------------------------------------------------------------ writing

    def apply(self, events: Iterable[Event]) -> ClusterChange:
        """Apply a batch of events and notify listeners once if anything changed."""
        change = ClusterChange()
        by_kind = self._by_kind
        for ev in events:
            store = by_kind.get(ev.obj.kind)
            if store is None:
                continue
            if ev.type is EventType.DELETED:
                store.delete(ev.obj, change)
            else:
                store.upsert(ev.obj, change)
        if change.pods:
            # A pod is read through the slices that name it: their services changed.
            owners = self._slices.services_by_pod
            for pkey in change.pods:
                change.services.update(owners.get(pkey, ()))
        if change.enrichment:
            self.enrich_epoch += 1
        if change:
            self.generation += 1
            for _, listener in list(self._listeners):
                listener(change)
        return change

    def replace(self, kind: str, objs: Iterable[KubeObject]) -> ClusterChange:
        """Make the cache's objects of `kind` exactly `objs` (a relist), applying only the
        real difference: unchanged objects produce no event at all."""
        return self.apply(self.replace_events(kind, objs))

    def replace_events(self, kind: str, objs: Iterable[KubeObject]) -> list[Event]:
        """The events `replace` applies, for a caller that applies several kinds' at
        once (one change for the listeners, not one per kind)."""
        fresh = {object_key(o): o for o in objs}
        events = [
            Event(EventType.DELETED, old)
            for old in self.objects(kind)
            if object_key(old) not in fresh
        ]
        events.extend(Event(EventType.MODIFIED, o) for o in fresh.values())
        return events


def _read_only(index: Mapping[K, V]) -> Mapping[K, V]:
    """A store's dict as its readers may use it (the store alone writes it)."""
    return index
