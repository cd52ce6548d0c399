"""The informer cache: every object a source sent, indexed the ways the core asks.

A source hands batches of events to `Cluster.apply`; the cache updates its indexes
and tells its listeners, once per batch, which services (and pods, profiles) changed.
An update that changes nothing (the same object again, as a relist produces) is not
a change, so it reaches no subscriber.
"""

from __future__ import annotations

import enum
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field

from bridge.model import ServiceKey
from bridge.objects import (
    EndpointSlice,
    Job,
    KubeObject,
    Namespace,
    Node,
    Pod,
    ReplicaSet,
    Server,
    Service,
    ServiceProfile,
    object_key,
)

PodKey = tuple[str, str]  # (namespace, name)
SliceKey = tuple[str, str, str]  # (kind, namespace, name): Endpoints and slices may share names


class EventType(enum.Enum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


@dataclass(frozen=True, slots=True)
class Event:
    type: EventType
    obj: KubeObject


@dataclass(slots=True)
class ClusterChange:
    """What one batch changed. `all_services` is set when something every service may
    depend on changed (a Node's zone, a ReplicaSet's owner) in a namespace-less way.

    `services` is every service touched in any way; `service_objects` those whose
    Service object itself changed, and `slices` the slices that changed, by service
    (the old service too when a slice moved), so a consumer can redo only those."""

    services: set[ServiceKey] = field(default_factory=set)
    service_objects: set[ServiceKey] = field(default_factory=set)
    slices: dict[ServiceKey, set[SliceKey]] = field(default_factory=dict)
    pods: set[PodKey] = field(default_factory=set)
    profiles: set[tuple[str, str]] = field(default_factory=set)
    namespaces: set[str] = field(default_factory=set)  # every service in these changed
    all_services: bool = False
    kinds: set[str] = field(default_factory=set)  # other kinds (policy objects) that changed

    def __bool__(self) -> bool:
        return bool(
            self.services or self.pods or self.profiles or self.namespaces or self.all_services
            or self.kinds
        )

    def touches(self, service: ServiceKey) -> bool:
        return (
            self.all_services or service in self.services or service.namespace in self.namespaces
        )

    def touched(self, among: Collection[ServiceKey]) -> list[ServiceKey]:
        """The services of `among` that this change touches (`touches`), without
        looking at every one of them when the change names its services."""
        if self.all_services or self.namespaces:
            return [s for s in among if self.touches(s)]
        return [s for s in self.services if s in among]


Listener = Callable[[ClusterChange], None]


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
    """Holds the last known state of every object, whatever the source."""

    def __init__(self) -> None:
        self.services: dict[ServiceKey, Service] = {}
        self.slices: dict[SliceKey, EndpointSlice] = {}
        self.slices_by_service: defaultdict[ServiceKey, set[SliceKey]] = defaultdict(set)
        self.pods: dict[PodKey, Pod] = {}
        self.pods_by_ip: defaultdict[str, set[PodKey]] = defaultdict(set)
        self.services_by_pod: defaultdict[PodKey, set[ServiceKey]] = defaultdict(set)
        # How many slice endpoints of a service name a pod: services_by_pod keeps the
        # service while this is positive, without rescanning the service's slices.
        self._pod_refs: dict[tuple[ServiceKey, PodKey], int] = {}
        # Bumped whenever an object that enrichment reads besides pods and slices
        # changes (Nodes, ReplicaSets, Jobs, Servers), so memoised enrichment can tell.
        self.enrich_epoch = 0
        # A stamp per service, renewed whenever one of its slices comes, goes or changes
        # its labels or annotations (not its endpoints): what is read from the slices'
        # metadata as a whole (Linkerd's set labels) can be kept until the stamp moves.
        # Stamps are never reused, even after a service goes.
        self.slice_stamps: dict[ServiceKey, int] = {}
        self._stamp = 0
        self.nodes: dict[str, Node] = {}
        self.replicasets: dict[PodKey, ReplicaSet] = {}
        self.jobs: dict[PodKey, Job] = {}
        self.servers: defaultdict[str, dict[str, Server]] = defaultdict(dict)
        self.profiles: dict[tuple[str, str], ServiceProfile] = {}
        self.namespaces: dict[str, Namespace] = {}
        # Kinds the core does not index (Linkerd's policy objects): by kind, then (ns, name).
        self.others: defaultdict[str, dict[PodKey, KubeObject]] = defaultdict(dict)
        self._listeners: list[tuple[ListenerStage, Listener]] = []
        self.generation = 0  # bumped on every batch that changed something

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
        """The service's slices in a stable order (by kind, then name), so the merge
        that lets a later slice win an ID collision is deterministic."""
        return [self.slices[k] for k in sorted(self.slices_by_service.get(service, ()))]

    def services_with_cluster_ip(self, ip: str) -> list[Service]:
        return [s for s in self.services.values() if ip in s.cluster_ips]

    def node_zone(self, node_name: str) -> str:
        node = self.nodes.get(node_name)
        return node.zone if node else ""

    def servers_in(self, namespace: str) -> Iterator[Server]:
        return iter(self.servers.get(namespace, {}).values())

    def counts(self) -> dict[str, int]:
        return {
            "services": len(self.services),
            "endpointslices": len(self.slices),
            "pods": len(self.pods),
            "nodes": len(self.nodes),
            "replicasets": len(self.replicasets),
            "jobs": len(self.jobs),
            "servers": sum(len(v) for v in self.servers.values()),
            "serviceprofiles": len(self.profiles),
        }

    def objects(self, kind: str) -> list[KubeObject]:
        """Every cached object of one kind, for relisting sources to diff against."""
        stores: dict[str, Iterable[KubeObject]] = {
            "Service": self.services.values(),
            "EndpointSlice": (s for s in self.slices.values() if s.kind == "EndpointSlice"),
            "Endpoints": (s for s in self.slices.values() if s.kind == "Endpoints"),
            "Pod": self.pods.values(),
            "Node": self.nodes.values(),
            "ReplicaSet": self.replicasets.values(),
            "Job": self.jobs.values(),
            "Server": (s for by_ns in self.servers.values() for s in by_ns.values()),
            "ServiceProfile": self.profiles.values(),
            "Namespace": self.namespaces.values(),
        }
        return list(stores.get(kind, self.others.get(kind, {}).values()))

    # ------------------------------------------------------------------ writing

    def apply(self, events: Iterable[Event]) -> ClusterChange:
        """Apply a batch of events and notify listeners once if anything changed."""
        change = ClusterChange()
        for ev in events:
            if ev.type is EventType.DELETED:
                self._delete(ev.obj, change)
            else:
                self._upsert(ev.obj, change)
        if change:
            self.generation += 1
            for _, listener in list(self._listeners):
                listener(change)
        return change

    def replace(self, kind: str, objs: Iterable[KubeObject]) -> ClusterChange:
        """Make the cache's objects of `kind` exactly `objs` (a relist), applying only the
        real difference: unchanged objects produce no event at all."""
        fresh = {object_key(o): o for o in objs}
        events = [
            Event(EventType.DELETED, old)
            for old in self.objects(kind)
            if object_key(old) not in fresh
        ]
        events.extend(Event(EventType.MODIFIED, o) for o in fresh.values())
        return self.apply(events)

    def _upsert(self, obj: KubeObject, change: ClusterChange) -> None:
        match obj:
            case Service():
                key = ServiceKey(obj.meta.namespace, obj.meta.name)
                if self.services.get(key) != obj:
                    self.services[key] = obj
                    change.services.add(key)
                    change.service_objects.add(key)
            case EndpointSlice():
                skey = (obj.kind, obj.meta.namespace, obj.meta.name)
                old = self.slices.get(skey)
                if old == obj:
                    return
                meta = old is None or (old.meta.labels, old.meta.annotations) != (
                    obj.meta.labels, obj.meta.annotations)
                if old is not None and old.service_name == obj.service_name:
                    # An update in place: only the pods it stops or starts naming are
                    # indexed again, so an update costs what changed in the slice.
                    svc = ServiceKey(obj.meta.namespace, obj.service_name)
                    before, after = _pod_keys(old), _pod_keys(obj)
                    if before != after:
                        had, has = Counter(before), Counter(after)
                        for pkey in had.keys() | has.keys():
                            if had[pkey] != has[pkey]:
                                self._count_ref(svc, pkey, has[pkey] - had[pkey])
                    self.slices[skey] = obj
                    change.services.add(svc)
                    self._slice_changed(svc, skey, change, meta)
                    return
                if old is not None:
                    self._unindex_slice(skey, old, change, meta)
                self.slices[skey] = obj
                svc = ServiceKey(obj.meta.namespace, obj.service_name)
                self.slices_by_service[svc].add(skey)
                for ep in obj.endpoints:
                    if ep.target is not None and ep.target.kind == "Pod":
                        pkey = (ep.target.namespace, ep.target.name)
                        ref = (svc, pkey)
                        self._pod_refs[ref] = self._pod_refs.get(ref, 0) + 1
                        self.services_by_pod[pkey].add(svc)
                change.services.add(svc)
                self._slice_changed(svc, skey, change, meta)
            case Pod():
                pkey = (obj.meta.namespace, obj.meta.name)
                old_pod = self.pods.get(pkey)
                if old_pod == obj:
                    return
                if old_pod is not None:
                    for ip in old_pod.pod_ips:
                        self.pods_by_ip[ip].discard(pkey)
                self.pods[pkey] = obj
                for ip in obj.pod_ips:
                    self.pods_by_ip[ip].add(pkey)
                change.pods.add(pkey)
                change.services.update(self.services_by_pod.get(pkey, ()))
            case Node():
                old_node = self.nodes.get(obj.meta.name)
                if old_node == obj:
                    return
                self.nodes[obj.meta.name] = obj
                # Only the zone and region labels matter downstream.
                if old_node is None or (old_node.zone, old_node.region) != (obj.zone, obj.region):
                    change.all_services = True
                    self.enrich_epoch += 1
            case ReplicaSet():
                rkey = (obj.meta.namespace, obj.meta.name)
                old_rs = self.replicasets.get(rkey)
                if old_rs == obj:
                    return
                self.replicasets[rkey] = obj
                # Only its owners are read (a pod's workload): a status update, as a
                # rolling restart makes many of, is no change to any endpoint.
                if old_rs is None or old_rs.meta.owners != obj.meta.owners:
                    change.namespaces.add(obj.meta.namespace)
                    self.enrich_epoch += 1
            case Job():
                jkey = (obj.meta.namespace, obj.meta.name)
                old_job = self.jobs.get(jkey)
                if old_job == obj:
                    return
                self.jobs[jkey] = obj
                if old_job is None or old_job.meta.owners != obj.meta.owners:
                    change.namespaces.add(obj.meta.namespace)
                    self.enrich_epoch += 1
            case Server():
                if self.servers[obj.meta.namespace].get(obj.meta.name) == obj:
                    return
                self.servers[obj.meta.namespace][obj.meta.name] = obj
                change.namespaces.add(obj.meta.namespace)
                self.enrich_epoch += 1
            case ServiceProfile():
                prkey = (obj.meta.namespace, obj.meta.name)
                if self.profiles.get(prkey) == obj:
                    return
                self.profiles[prkey] = obj
                change.profiles.add(prkey)
            case Namespace():
                self.namespaces[obj.meta.name] = obj
            case _:
                okey = (obj.meta.namespace, obj.meta.name)
                if self.others[obj.kind].get(okey) != obj:
                    self.others[obj.kind][okey] = obj
                    change.kinds.add(obj.kind)

    def _delete(self, obj: KubeObject, change: ClusterChange) -> None:
        ns, name = obj.meta.namespace, obj.meta.name
        match obj:
            case Service():
                if self.services.pop(ServiceKey(ns, name), None) is not None:
                    change.services.add(ServiceKey(ns, name))
                    change.service_objects.add(ServiceKey(ns, name))
            case EndpointSlice():
                skey = (obj.kind, ns, name)
                old = self.slices.pop(skey, None)
                if old is not None:
                    self._unindex_slice(skey, old, change)
            case Pod():
                old_pod = self.pods.pop((ns, name), None)
                if old_pod is not None:
                    for ip in old_pod.pod_ips:
                        self.pods_by_ip[ip].discard((ns, name))
                        if not self.pods_by_ip[ip]:
                            del self.pods_by_ip[ip]
                    change.pods.add((ns, name))
                    change.services.update(self.services_by_pod.get((ns, name), ()))
            case Node():
                if self.nodes.pop(name, None) is not None:
                    change.all_services = True
                    self.enrich_epoch += 1
            case ReplicaSet():
                if self.replicasets.pop((ns, name), None) is not None:
                    change.namespaces.add(ns)
                    self.enrich_epoch += 1
            case Job():
                if self.jobs.pop((ns, name), None) is not None:
                    change.namespaces.add(ns)
                    self.enrich_epoch += 1
            case Server():
                if self.servers[ns].pop(name, None) is not None:
                    change.namespaces.add(ns)
                    self.enrich_epoch += 1
            case ServiceProfile():
                if self.profiles.pop((ns, name), None) is not None:
                    change.profiles.add((ns, name))
            case Namespace():
                self.namespaces.pop(name, None)
            case _:
                if self.others[obj.kind].pop((ns, name), None) is not None:
                    change.kinds.add(obj.kind)

    def _unindex_slice(self, skey: SliceKey, old: EndpointSlice, change: ClusterChange,
                       metadata: bool = True) -> None:
        svc = ServiceKey(old.meta.namespace, old.service_name)
        keys = self.slices_by_service.get(svc)
        if keys is not None:
            keys.discard(skey)
            if not keys:
                del self.slices_by_service[svc]
        for ep in old.endpoints:
            if ep.target is not None and ep.target.kind == "Pod":
                self._count_ref(svc, (ep.target.namespace, ep.target.name), -1)
        change.services.add(svc)
        self._slice_changed(svc, skey, change, metadata)

    def _count_ref(self, svc: ServiceKey, pkey: PodKey, delta: int) -> None:
        """Count `delta` more (or fewer) slice entries of `svc` naming `pkey`."""
        ref = (svc, pkey)
        left = self._pod_refs.get(ref, 0) + delta
        if left > 0:
            self._pod_refs[ref] = left
            self.services_by_pod[pkey].add(svc)
            return
        self._pod_refs.pop(ref, None)
        owners = self.services_by_pod.get(pkey)
        if owners is not None:
            owners.discard(svc)
            if not owners:
                del self.services_by_pod[pkey]

    def _slice_changed(self, svc: ServiceKey, skey: SliceKey, change: ClusterChange,
                       metadata: bool) -> None:
        change.slices.setdefault(svc, set()).add(skey)
        if not metadata:
            return
        if svc in self.slices_by_service:
            self._stamp += 1
            self.slice_stamps[svc] = self._stamp
        else:
            self.slice_stamps.pop(svc, None)


def _pod_keys(slice_: EndpointSlice) -> list[PodKey]:
    return [(t.namespace, t.name) for ep in slice_.endpoints
            if (t := ep.target) is not None and t.kind == "Pod"]
