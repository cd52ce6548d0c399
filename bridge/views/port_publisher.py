"""One service port: its slices merged, deduplicated and enriched, and its Views.

Linkerd's port publisher (Linkerd §4.3-4.5): it owns the port's endpoints before any
subscriber's filter, computed once per change, and the Views that filter them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import structlog

from bridge.cluster import Cluster, ClusterChange, PodKey
from bridge.enrich import (
    GATEWAY_IDENTITY_ANNOTATION,
    REMOTE_FQN_ANNOTATION,
    EnrichError,
    address_endpoint_id,
    enrich_address_endpoint,
    enrich_pod_endpoint,
)
from bridge.model import Endpoint, EndpointId, FilterKey, MeshConfig, ServiceKey, ViewKey
from bridge.objects import EndpointSlice, Pod, Service, SliceEndpoint, TargetRef
from bridge.views.metrics import ViewMetrics
from bridge.views.snapshot import VersionedMap
from bridge.views.view import View

log = structlog.get_logger("meshbridge.views")

EMPTY_ENDPOINTS: Mapping[EndpointId, Endpoint] = MappingProxyType({})

_SliceKey = tuple[str, str, str]
# A slice's enrichment results by address: (slice entry, pod object, cluster epoch,
# result). Keyed by the address (a string, hashed once) and checked against the entry.
EnrichMemo = dict[str, tuple[SliceEndpoint, "Pod | None", int, "Endpoint | None"]]


@dataclass(slots=True)
class _SliceState:
    """What one slice contributes to the port, and how to redo a part of it."""

    obj: EndpointSlice
    port: int | None  # the slice's port for the service port; None: contributes nothing
    endpoints: dict[EndpointId, Endpoint]
    # The servable entries naming each pod, so a pod change redoes only those.
    pods: dict[PodKey, list[SliceEndpoint]]
    memo: EnrichMemo


class PortPublisher:
    """One port of one service: the merged, enriched endpoints before filtering.

    A slice event redoes that slice, a pod event that pod's entries, and the Views
    are told which endpoints changed; a change to the Service, or to an object every
    endpoint may depend on (Nodes, ReplicaSets, Servers), redoes the port."""

    def __init__(self, service: ServiceKey, port: int, cluster: Cluster, config: MeshConfig,
                 metrics: ViewMetrics | None = None) -> None:
        self.service = service
        self.port = port
        # The Cluster this port's slices, pods and nodes are read from (its inputs).
        self.cluster = cluster
        self._config = config
        self._metrics = metrics
        self.views: dict[FilterKey, View] = {}
        self.available: VersionedMap[EndpointId, Endpoint] = VersionedMap()
        self.exists = False
        self._target: int | str = port
        self._slices: dict[_SliceKey, _SliceState] = {}
        # Which slices hold each endpoint: the greatest key wins (`merge`).
        self._owners: dict[EndpointId, set[_SliceKey]] = {}
        self._pod_slices: dict[PodKey, set[_SliceKey]] = {}
        self._epoch = -1

    # ------------------------------------------------------------- views

    def view(self, fk: FilterKey, create: bool = False) -> View | None:
        view = self.views.get(fk)
        if view is None and create:
            key = ViewKey(self.service, self.port, fk)
            view = self.views[fk] = View(key, self.cluster, self._config, self._metrics)
            view.publish(self.available, self.exists)
        return view

    def drop(self, fk: FilterKey) -> bool:
        """Forget the View of `fk`; True when the port has no View left."""
        self.views.pop(fk, None)
        return not self.views

    # ------------------------------------------------------------- recomputation

    def load(self) -> None:
        """Merge and enrich the port's endpoints now, reusing what has not changed."""
        self._reload()

    def refresh(self, change: ClusterChange | None = None) -> None:
        """Bring the port up to date with `change` (None: anything may have changed)
        and publish to every View what changed."""
        if change is None or self._whole_port(change):
            self._reload()
            changed: set[EndpointId] | None = None
        else:
            changed = self._update(change)
            if not changed:
                return
        for view in list(self.views.values()):
            view.publish(self.available, self.exists, changed)

    def merge(self) -> tuple[bool, Mapping[EndpointId, Endpoint]]:
        """Whether the service exists, and every endpoint of this port merged across its
        slices (Linkerd §4.3-4.5), as of now.

        A later slice (in name order) wins an ID collision, as an update of the slice
        that now holds the endpoint would in Linkerd; dual-stack pods stay one endpoint
        per family.
        """
        self._reload()
        return self.exists, self.available

    def _whole_port(self, change: ClusterChange) -> bool:
        # Without a Service there is nothing to merge into: reloading costs nothing.
        return (not self.exists or change.all_services
                or self.service.namespace in change.namespaces
                or self.service in change.service_objects
                or self._epoch != self.cluster.enrich_epoch)

    def _reload(self) -> None:
        cluster = self.cluster
        self._epoch = cluster.enrich_epoch
        svc = cluster.services.get(self.service)
        old_slices = self._slices
        self._slices, self._owners, self._pod_slices = {}, {}, {}
        if svc is None or svc.type == "ExternalName":
            self.exists = False
        else:
            self.exists = True
            self._target = _target_port(svc, self.port)
            for skey in sorted(cluster.slices_by_service.get(self.service, ())):
                self._add_slice(skey, cluster.slices[skey], old_slices.get(skey))
        merged = {i: self._slices[max(keys)].endpoints[i] for i, keys in self._owners.items()}
        old = self.available
        delta: dict[EndpointId, Endpoint | None] = {
            i: e for i, e in merged.items() if (p := old.get(i)) is not e and p != e}
        delta.update((i, None) for i in old if i not in merged)
        if delta:
            self.available = old.evolve(delta)

    def _update(self, change: ClusterChange) -> set[EndpointId]:
        """Redo the slices and pods `change` names: the ids whose value changed."""
        cluster = self.cluster
        touched: set[EndpointId] = set()
        for skey in sorted(change.slices.get(self.service, ())):
            old = self._slices.get(skey)
            obj = cluster.slices.get(skey)
            if obj is not None and obj.service_name == self.service.name:
                touched.update(self._add_slice(skey, obj, old))
            elif old is not None:
                touched.update(self._remove_slice(skey, old))
        pods = change.pods
        if not pods:
            mine = []
        elif len(pods) <= len(self._pod_slices):
            mine = [p for p in pods if p in self._pod_slices]
        else:
            mine = [p for p in self._pod_slices if p in pods]
        for pkey in mine:
            for skey in self._pod_slices.get(pkey, ()):
                touched.update(self._redo_pod(skey, pkey))
        old_av = self.available
        delta: dict[EndpointId, Endpoint | None] = {}
        for i in touched:
            keys = self._owners.get(i)
            e = self._slices[max(keys)].endpoints[i] if keys else None
            p = old_av.get(i)
            if e is None:
                if p is not None:
                    delta[i] = None
            elif p is not e and p != e:
                delta[i] = e
        if delta:
            self.available = old_av.evolve(delta)
        return set(delta)

    def _add_slice(self, skey: _SliceKey, obj: EndpointSlice,
                   old: _SliceState | None) -> set[EndpointId]:
        """Make `obj` the slice at `skey` (replacing `old`): the ids it may have changed.

        Entries whose address, entry and pod are what they were keep their results, and
        the slice's endpoints are the old ones with only the changed addresses redone,
        so an update costs one comparison per entry plus what changed."""
        port = _resolve_slice_port(obj, self._target)
        # `old` is the slice's current state (an update), or one from before a reload.
        registered = old is not None and self._slices.get(skey) is old
        compatible = (old is not None and old.port == port
                      and old.obj.address_type == obj.address_type
                      and _slice_annotations(old.obj) == _slice_annotations(obj))
        prior = old.memo if old is not None and compatible else {}
        cluster = self.cluster
        pods_of, epoch = cluster.pods, cluster.enrich_epoch
        memo: EnrichMemo = {}
        pods: dict[PodKey, list[SliceEndpoint]] = {}
        fresh: list[str] = []  # addresses enriched anew
        if port is not None:
            for sep in obj.endpoints:
                # Linkerd drops only endpoints explicitly not ready; we also keep those
                # that still serve while terminating, so xDS can send them as DRAINING.
                # Each protocol applies its own readiness policy to the conditions kept.
                if not sep.ready and not (sep.serving and sep.terminating):
                    continue
                target = sep.target
                pod = None
                if target is not None and target.kind == "Pod":
                    pkey = (target.namespace, target.name)
                    pods.setdefault(pkey, []).append(sep)
                    pod = pods_of.get(pkey)
                for ip in sep.addresses:
                    hit = prior.get(ip)
                    if (hit is not None and hit[1] is pod and hit[2] == epoch
                            and (hit[0] is sep or hit[0] == sep)):
                        memo[ip] = hit
                    else:
                        memo[ip] = (sep, pod, epoch, self._enrich(obj, sep, target, pod, ip,
                                                                  port))
                        fresh.append(ip)
        touched: set[EndpointId] | None = None
        if registered and compatible:
            assert old is not None
            touched = self._patch_endpoints(skey, old, memo, fresh)
        if touched is None:
            # A new slice, one whose port or family changed, or two entries giving
            # one id (then the entries' order decides): build the slice's set anew.
            touched = self._remove_slice(skey, old) if registered and old else set()
            endpoints = {e[3].id: e[3] for e in memo.values() if e[3] is not None}
            self._slices[skey] = _SliceState(obj, port, endpoints, pods, memo)
            for i in endpoints:
                self._owners.setdefault(i, set()).add(skey)
            for pkey in pods:
                self._pod_slices.setdefault(pkey, set()).add(skey)
            return touched | set(endpoints)
        assert old is not None
        old_pods = old.pods
        if pods.keys() != old_pods.keys():
            for pkey in old_pods.keys() - pods.keys():
                self._unindex_pod(pkey, skey)
            for pkey in pods.keys() - old_pods.keys():
                self._pod_slices.setdefault(pkey, set()).add(skey)
        old.obj, old.pods, old.memo = obj, pods, memo
        return touched

    def _patch_endpoints(self, skey: _SliceKey, state: _SliceState, memo: EnrichMemo,
                         fresh: list[str]) -> set[EndpointId] | None:
        """Apply to `state.endpoints` what the addresses in `fresh` and those no longer
        in `memo` changed; None when two entries give one id (then the order of the
        entries decides, and the caller redoes the set)."""
        prior = state.memo
        gone = list(prior.keys() - memo.keys())
        if not gone and not fresh:
            return set()
        endpoints = dict(state.endpoints)  # a copy (no rehashing): `state` stays whole on None
        touched: set[EndpointId] = set()
        for ip in (*gone, *fresh):
            old = prior.get(ip)
            ep = old[3] if old is not None else None
            if ep is not None:
                if endpoints.get(ep.id) is not ep:
                    return None
                del endpoints[ep.id]
                touched.add(ep.id)
        for ip in fresh:
            ep = memo[ip][3]
            if ep is not None:
                if ep.id in endpoints:
                    return None
                endpoints[ep.id] = ep
                touched.add(ep.id)
        state.endpoints = endpoints
        for i in touched:
            if i in endpoints:
                self._owners.setdefault(i, set()).add(skey)
            else:
                self._unown(i, skey)
        return touched

    def _unown(self, i: EndpointId, skey: _SliceKey) -> None:
        keys = self._owners.get(i)
        if keys is not None:
            keys.discard(skey)
            if not keys:
                del self._owners[i]

    def _unindex_pod(self, pkey: PodKey, skey: _SliceKey) -> None:
        skeys = self._pod_slices.get(pkey)
        if skeys is not None:
            skeys.discard(skey)
            if not skeys:
                del self._pod_slices[pkey]

    def _remove_slice(self, skey: _SliceKey, state: _SliceState) -> set[EndpointId]:
        del self._slices[skey]
        for i in state.endpoints:
            self._unown(i, skey)
        for pkey in state.pods:
            self._unindex_pod(pkey, skey)
        return set(state.endpoints)

    def _redo_pod(self, skey: _SliceKey, pkey: PodKey) -> set[EndpointId]:
        """Redo one pod's entries of one slice: the one id a pod has in a slice."""
        state = self._slices[skey]
        assert state.port is not None
        eid = EndpointId("pod", pkey[0], pkey[1], state.obj.address_type)
        pod = self.cluster.pods.get(pkey)
        epoch = self.cluster.enrich_epoch
        new: Endpoint | None = None
        for sep in state.pods.get(pkey, ()):
            for ip in sep.addresses:
                ep = self._enrich(state.obj, sep, sep.target, pod, ip, state.port)
                state.memo[ip] = (sep, pod, epoch, ep)
                if ep is not None:
                    new = ep
        old = state.endpoints.get(eid)
        if new is None:
            if old is None:
                return set()
            del state.endpoints[eid]
            self._unown(eid, skey)
        else:
            state.endpoints[eid] = new
            self._owners.setdefault(eid, set()).add(skey)
        return {eid}

    def _enrich(self, slice_: EndpointSlice, sep: SliceEndpoint, target: TargetRef | None,
                pod: Pod | None, ip: str, port: int) -> Endpoint | None:
        try:
            if target is not None and target.kind == "Pod":
                if pod is None:
                    raise EnrichError(f"pod {target.namespace}/{target.name} is not known")
                enr = enrich_pod_endpoint(pod, port, sep.zone, self.cluster, self._config)
                eid = EndpointId("pod", target.namespace, target.name, slice_.address_type)
                node_name = pod.node_name or sep.node_name
                pod_name, pod_rv = pod.meta.name, pod.meta.resource_version
            elif target is None:
                enr = enrich_address_endpoint(slice_, self.port, self._config)
                eid = address_endpoint_id(slice_, sep, ip, port)
                node_name, pod_name, pod_rv = sep.node_name, "", ""
            else:
                raise EnrichError(f"targetRef kind {target.kind} is not supported")
        except EnrichError as e:
            # Logged once per distinct input: the memo remembers the failure too.
            log.warning("endpoint skipped", namespace=slice_.meta.namespace,
                        service=slice_.service_name, port=self.port,
                        slice=slice_.meta.name, address=ip, reason=str(e))
            return None
        node = self.cluster.nodes.get(node_name)
        return Endpoint(
            id=eid, ip=ip, port=port, ready=sep.ready, serving=sep.serving,
            terminating=sep.terminating, hostname=sep.hostname, node_name=node_name,
            zone=sep.zone, region=node.region if node is not None else "",
            for_zones=sep.for_zones, pod_name=pod_name, pod_resource_version=pod_rv,
            enrichment=enr,
        )


def _target_port(svc: Service, port: int) -> int | str:
    """Linkerd resolves the target by Service port *name*; targetPort is not read (§4.3)."""
    sp = svc.port(port)
    return sp.name if sp is not None else port


def _resolve_slice_port(slice_: EndpointSlice, target: int | str) -> int | None:
    if slice_.ports is None:
        return None
    if isinstance(target, int):
        return target
    for p in slice_.ports:
        if p.name == target:
            return p.port
    return None


def _slice_annotations(slice_: EndpointSlice) -> tuple[str | None, str | None]:
    """The slice annotations an address endpoint (no pod) is enriched from."""
    return (slice_.meta.annotations.get(GATEWAY_IDENTITY_ANNOTATION),
            slice_.meta.annotations.get(REMOTE_FQN_ANNOTATION))
