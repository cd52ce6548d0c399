"""The store of each kind the core reads, and the registry the Cluster is built from.

Each store says, for its kind alone, which changes matter downstream: a Service
change touches that service; a slice change its service (and the pods it names); a
pod change the pod (the Cluster adds the services whose slices name it); a Node's
zone every service; a ReplicaSet's or Job's owners, or a Server, its namespace's
services; a ServiceProfile itself. An update that changes nothing the core reads (a
ReplicaSet's status, a Node's other labels) is stored and reported as no change.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from bridge.cluster.change import ClusterChange, PodKey, SliceKey
from bridge.cluster.store import AnyStore, KindStore
from bridge.model import ServiceKey
from bridge.objects import (
    EndpointSlice,
    Job,
    Namespace,
    Node,
    Pod,
    ReplicaSet,
    Secret,
    Server,
    Service,
    ServiceProfile,
)
from bridge.policy_objects import POLICY_KINDS, PolicyObject


def _namespaced(obj: Any) -> PodKey:
    return (obj.meta.namespace, obj.meta.name)


class ServiceStore(KindStore[ServiceKey, Service]):
    """Services, indexed by cluster IP (GetProfile and OutboundPolicies by address)."""

    kinds = frozenset({"Service"})

    def __init__(self) -> None:
        super().__init__()
        self.by_cluster_ip: dict[str, dict[ServiceKey, None]] = {}

    def key(self, obj: Service) -> ServiceKey:
        return ServiceKey(obj.meta.namespace, obj.meta.name)

    def changed(self, key: ServiceKey, old: Service | None, new: Service | None,
                change: ClusterChange) -> None:
        before = old.cluster_ips if old is not None else ()
        after = new.cluster_ips if new is not None else ()
        if before != after:
            for ip in before:
                _discard(self.by_cluster_ip, ip, key)
            for ip in after:
                self.by_cluster_ip.setdefault(ip, {})[key] = None
        change.services.add(key)
        change.service_objects.add(key)

    def with_cluster_ip(self, ip: str) -> list[Service]:
        return [self.objects[k] for k in self.by_cluster_ip.get(ip, ())]


class SliceStore(KindStore[SliceKey, EndpointSlice]):
    """EndpointSlices and v1 Endpoints (decoded as slices), indexed by service, and
    the services whose slices name each pod."""

    kinds = frozenset({"EndpointSlice", "Endpoints"})

    def __init__(self) -> None:
        super().__init__()
        self.by_service: dict[ServiceKey, set[SliceKey]] = {}
        self.services_by_pod: dict[PodKey, set[ServiceKey]] = {}
        # How many slice endpoints of a service name a pod: services_by_pod keeps the
        # service while this is positive, without rescanning the service's slices.
        self._pod_refs: dict[tuple[ServiceKey, PodKey], int] = {}
        # A stamp per service, renewed whenever one of its slices comes, goes or changes
        # its labels or annotations (not its endpoints): what is read from the slices'
        # metadata as a whole (Linkerd's set labels) can be kept until the stamp moves.
        # Stamps are never reused, even after a service goes.
        self.stamps: dict[ServiceKey, int] = {}
        self._stamp = 0

    def key(self, obj: EndpointSlice) -> SliceKey:
        return (obj.kind, obj.meta.namespace, obj.meta.name)

    def of_kind(self, kind: str) -> Iterable[EndpointSlice]:
        return (s for s in self.objects.values() if s.kind == kind)

    def of(self, service: ServiceKey) -> list[EndpointSlice]:
        """The service's slices in a stable order (by kind, then name), so the merge
        that lets a later slice win an ID collision is deterministic."""
        return [self.objects[k] for k in sorted(self.by_service.get(service, ()))]

    def changed(self, skey: SliceKey, old: EndpointSlice | None, new: EndpointSlice | None,
                change: ClusterChange) -> None:
        metadata = old is None or new is None or _slice_metadata(old) != _slice_metadata(new)
        if old is not None and new is not None and old.service_name == new.service_name:
            # An update in place: only the pods it stops or starts naming are indexed
            # again, so an update costs what changed in the slice.
            svc = ServiceKey(new.meta.namespace, new.service_name)
            before, after = _pod_keys(old), _pod_keys(new)
            if before != after:
                had, has = Counter(before), Counter(after)
                for pkey in had.keys() | has.keys():
                    if had[pkey] != has[pkey]:
                        self._count_ref(svc, pkey, has[pkey] - had[pkey])
            self._slice_changed(svc, skey, change, metadata)
            return
        if old is not None:
            svc = ServiceKey(old.meta.namespace, old.service_name)
            _discard(self.by_service, svc, skey)
            for pkey in _pod_keys(old):
                self._count_ref(svc, pkey, -1)
            self._slice_changed(svc, skey, change, metadata)
        if new is not None:
            svc = ServiceKey(new.meta.namespace, new.service_name)
            self.by_service.setdefault(svc, set()).add(skey)
            for pkey in _pod_keys(new):
                self._count_ref(svc, pkey, 1)
            self._slice_changed(svc, skey, change, metadata)

    def _count_ref(self, svc: ServiceKey, pkey: PodKey, delta: int) -> None:
        """Count `delta` more (or fewer) slice entries of `svc` naming `pkey`."""
        ref = (svc, pkey)
        left = self._pod_refs.get(ref, 0) + delta
        if left > 0:
            self._pod_refs[ref] = left
            self.services_by_pod.setdefault(pkey, set()).add(svc)
            return
        self._pod_refs.pop(ref, None)
        _discard(self.services_by_pod, pkey, svc)

    def _slice_changed(self, svc: ServiceKey, skey: SliceKey, change: ClusterChange,
                       metadata: bool) -> None:
        change.services.add(svc)
        change.slices.setdefault(svc, set()).add(skey)
        if not metadata:
            return
        if svc in self.by_service:
            self._stamp += 1
            self.stamps[svc] = self._stamp
        else:
            self.stamps.pop(svc, None)


class PodStore(KindStore[PodKey, Pod]):
    """Pods, indexed by IP. A pod change also touches the services whose slices name
    the pod: the Cluster adds those from the slice store's index (`Cluster.apply`)."""

    kinds = frozenset({"Pod"})

    def __init__(self) -> None:
        super().__init__()
        self.by_ip: dict[str, set[PodKey]] = {}

    def key(self, obj: Pod) -> PodKey:
        return _namespaced(obj)

    def changed(self, key: PodKey, old: Pod | None, new: Pod | None,
                change: ClusterChange) -> None:
        for ip in old.pod_ips if old is not None else ():
            _discard(self.by_ip, ip, key)
        for ip in new.pod_ips if new is not None else ():
            self.by_ip.setdefault(ip, set()).add(key)
        change.pods.add(key)


class NodeStore(KindStore[str, Node]):
    kinds = frozenset({"Node"})

    def key(self, obj: Node) -> str:
        return obj.meta.name

    def changed(self, key: str, old: Node | None, new: Node | None,
                change: ClusterChange) -> None:
        # Only the zone and region labels matter downstream.
        if old is None or new is None or (old.zone, old.region) != (new.zone, new.region):
            change.all_services = True
            change.enrichment = True

    def zone(self, node_name: str) -> str:
        node = self.objects.get(node_name)
        return node.zone if node else ""


class _OwnerStore(KindStore[PodKey, Any]):
    """A kind read only for its owners (a pod's workload, through it): a status
    update, as a rolling restart makes many of, is no change to any endpoint."""

    def key(self, obj: Any) -> PodKey:
        return _namespaced(obj)

    def changed(self, key: PodKey, old: Any, new: Any, change: ClusterChange) -> None:
        if old is None or new is None or old.meta.owners != new.meta.owners:
            change.namespaces.add(key[0])
            change.enrichment = True


class ReplicaSetStore(_OwnerStore):
    kinds = frozenset({"ReplicaSet"})
    objects: dict[PodKey, ReplicaSet]


class JobStore(_OwnerStore):
    """A CronJob's pods are labelled after the CronJob, read through their Job."""

    kinds = frozenset({"Job"})
    objects: dict[PodKey, Job]


class ServerStore(KindStore[PodKey, Server]):
    """Linkerd's Servers, by namespace: they decide opaque ports and inbound policy."""

    kinds = frozenset({"Server"})

    def __init__(self) -> None:
        super().__init__()
        self.by_namespace: dict[str, dict[str, Server]] = {}

    def key(self, obj: Server) -> PodKey:
        return _namespaced(obj)

    def changed(self, key: PodKey, old: Server | None, new: Server | None,
                change: ClusterChange) -> None:
        ns, name = key
        if new is None:
            _discard(self.by_namespace, ns, name)
        else:
            self.by_namespace.setdefault(ns, {})[name] = new
        change.namespaces.add(ns)
        change.enrichment = True

    def in_namespace(self, namespace: str) -> Iterator[Server]:
        return iter(self.by_namespace.get(namespace, {}).values())


class ProfileStore(KindStore[PodKey, ServiceProfile]):
    kinds = frozenset({"ServiceProfile"})

    def key(self, obj: ServiceProfile) -> PodKey:
        return _namespaced(obj)

    def changed(self, key: PodKey, old: ServiceProfile | None, new: ServiceProfile | None,
                change: ClusterChange) -> None:
        change.profiles.add(key)


class NamespaceStore(KindStore[str, Namespace]):
    """Read for its annotations (inbound policy's default); no change of its own."""

    kinds = frozenset({"Namespace"})

    def key(self, obj: Namespace) -> str:
        return obj.meta.name


class ObjectStore(KindStore[PodKey, PolicyObject | Secret]):
    """One kind the core does not index (Linkerd's policy kinds, the linked clusters'
    Secrets), by namespace and name; a change names the kind, and its readers look
    again."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kinds = frozenset({kind})
        self.kind = kind

    def key(self, obj: PolicyObject | Secret) -> PodKey:
        return _namespaced(obj)

    def changed(self, key: PodKey, old: PolicyObject | Secret | None,
                new: PolicyObject | Secret | None,
                change: ClusterChange) -> None:
        change.kinds.add(self.kind)


# The store registry: each entry makes one store, which owns the kinds it names; a
# Cluster holds one store per entry. A kind no store owns is ignored by the cache.
CORE_STORES: tuple[Callable[[], AnyStore], ...] = (
    ServiceStore, SliceStore, PodStore, NodeStore, ReplicaSetStore, JobStore, ServerStore,
    ProfileStore, NamespaceStore,
    *(functools.partial(ObjectStore, kind) for kind in sorted(POLICY_KINDS)),
    functools.partial(ObjectStore, "Secret"),  # bridge.multicluster.store reads them
)


def _slice_metadata(slice_: EndpointSlice) -> tuple[Any, Any]:
    return (slice_.meta.labels, slice_.meta.annotations)


def _pod_keys(slice_: EndpointSlice) -> list[PodKey]:
    return [(t.namespace, t.name) for ep in slice_.endpoints
            if (t := ep.target) is not None and t.kind == "Pod"]


def _discard(index: dict[Any, Any], key: Any, member: Any) -> None:
    """Take `member` out of the set or dict `index[key]`; drop the key when empty."""
    members = index.get(key)
    if members is None:
        return
    if isinstance(members, dict):
        members.pop(member, None)
    else:
        members.discard(member)
    if not members:
        del index[key]
