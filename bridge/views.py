"""Views: the one enriched, filtered endpoint set that every subscriber shares.

The shape mirrors Linkerd's destination watcher (spec §4.2, §4.6):

    ViewRegistry   owns every watched service port, listens to the Cluster
    PortPublisher  one service port: slices merged and deduplicated, endpoints enriched
    View           one filter key of that port: its snapshot, its diff, its version,
                   its subscribers (Linkerd and xDS alike) and their encoded bytes

A change is merged and enriched once per port, filtered and diffed once per View,
and then handed to each subscriber, which only encodes (once, via `View.cache`) and
queues. Subscribers must never block: they are called on the event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

import structlog

from bridge.cluster import Cluster, ClusterChange
from bridge.enrich import (
    GATEWAY_IDENTITY_ANNOTATION,
    REMOTE_FQN_ANNOTATION,
    EnrichError,
    Enrichment,
    address_endpoint_id,
    enrich_address_endpoint,
    enrich_pod_endpoint,
)
from bridge.model import (
    BASE_WEIGHT,
    Endpoint,
    EndpointId,
    FilterKey,
    MeshConfig,
    ResolvedEndpoint,
    ServiceKey,
    ViewKey,
)
from bridge.objects import EndpointSlice, Pod, Service, SliceEndpoint, TargetRef
from bridge.view_metrics import ViewMetrics

log = structlog.get_logger("meshbridge.views")

Snapshot = Mapping[EndpointId, ResolvedEndpoint]
EMPTY: Snapshot = MappingProxyType({})
# Enrichment results of one port, by their inputs: (pod object, cluster epoch, result).
EnrichMemo = dict[tuple[Any, ...], tuple["Pod | None", int, "Endpoint | None"]]


class InvalidService(LookupError):
    """The service cannot be subscribed to (an ExternalName service)."""


@dataclass(frozen=True, slots=True)
class ViewChange:
    """One published version of a View and how it differs from the one before."""

    version: int
    previous: Snapshot
    current: Snapshot
    added: tuple[ResolvedEndpoint, ...]  # new or changed, in id order
    removed: tuple[ResolvedEndpoint, ...]  # as last published, in id order
    exists_changed: bool = False


class ViewSubscriber(Protocol):
    def on_view_change(self, view: View, change: ViewChange) -> None:
        """Called on the event loop after each new version; must not block."""


class View:
    """The shared state of every subscriber of one (service, port, filter key)."""

    def __init__(self, key: ViewKey, publisher: PortPublisher) -> None:
        self.key = key
        self._publisher = publisher
        self.version = 0
        # When the current version was published (time.monotonic()): the start of every
        # change-to-client latency the protocol layers measure.
        self.published_at = 0.0
        self.snapshot: Snapshot = EMPTY
        self.exists = False
        self.subscribers: dict[ViewSubscriber, str] = {}  # subscriber -> protocol label
        # Per-version scratch space for the protocol layers' encoded bytes, cleared on
        # every new version, so N subscribers cost one serialization.
        self.cache: dict[Hashable, Any] = {}
        self.diff_computations = 0

    def cached(self, key: Hashable, build: Callable[[], Any]) -> Any:
        try:
            return self.cache[key]
        except KeyError:
            value = self.cache[key] = build()
            return value

    def subscriber_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for proto in self.subscribers.values():
            counts[proto] = counts.get(proto, 0) + 1
        return counts

    def publish(self, available: Mapping[EndpointId, Endpoint], exists: bool) -> None:
        """Filter, diff against the snapshot, and tell every subscriber (publishDiff)."""
        previous = self.snapshot
        filtered = self._publisher.registry.filter_endpoints(self.key, available, previous)
        self.diff_computations += 1
        # Unchanged endpoints are the very objects of the previous snapshot (see
        # filter_endpoints), so `is` settles most comparisons without looking inside.
        added = tuple(r for i, r in sorted(filtered.items())
                      if (p := previous.get(i)) is not r and p != r)
        removed = tuple(r for i, r in sorted(previous.items()) if i not in filtered)
        exists_changed = exists != self.exists
        if not added and not removed and not exists_changed and self.version:
            return
        self.version += 1
        self.published_at = time.monotonic()
        self.exists = exists
        self.snapshot = MappingProxyType(filtered)
        self.cache = {}
        change = ViewChange(self.version, previous, self.snapshot, added, removed,
                            exists_changed)
        metrics = self._publisher.registry.metrics
        if metrics is not None:
            metrics.published(self)
        for sub in list(self.subscribers):
            sub.on_view_change(self, change)


class PortPublisher:
    """One port of one service: the merged, enriched endpoints before filtering."""

    def __init__(self, registry: ViewRegistry, service: ServiceKey, port: int) -> None:
        self.registry = registry
        self.service = service
        self.port = port
        self.views: dict[FilterKey, View] = {}
        self.available: Mapping[EndpointId, Endpoint] = EMPTY_ENDPOINTS
        self.exists = False
        self._memo: EnrichMemo = {}

    def load(self) -> None:
        """Merge and enrich the port's endpoints now, reusing what has not changed."""
        memo: EnrichMemo = {}
        self.exists, self.available = self.registry.merge_endpoints(
            self.service, self.port, self._memo, memo)
        # Only what this version used is kept, so the memo never outgrows the service.
        self._memo = memo

    def refresh(self) -> None:
        self.load()
        for view in list(self.views.values()):
            view.publish(self.available, self.exists)


EMPTY_ENDPOINTS: Mapping[EndpointId, Endpoint] = MappingProxyType({})


class ViewRegistry:
    """Owns every View; recomputes the ports of each service a cluster change touches."""

    def __init__(
        self, cluster: Cluster, config: MeshConfig, metrics: ViewMetrics | None = None
    ) -> None:
        self.cluster = cluster
        self.config = config
        self.metrics = metrics
        self.ports: dict[tuple[ServiceKey, int], PortPublisher] = {}
        self._ports_by_service: dict[ServiceKey, set[int]] = {}
        cluster.add_listener(self._on_cluster_change)

    # ------------------------------------------------------------- subscriptions

    def subscribe(self, key: ViewKey, subscriber: ViewSubscriber, protocol: str) -> View:
        """Join (creating if needed) the View of `key`. The caller reads `view.snapshot`
        for its initial state; later versions arrive through `on_view_change`."""
        svc = self.cluster.services.get(key.service)
        if svc is not None and svc.type == "ExternalName":
            raise InvalidService(f"{key.service} is an ExternalName service")
        view = self.view(key, create=True)
        assert view is not None
        view.subscribers[subscriber] = protocol
        if self.metrics is not None:
            self.metrics.subscribed(view)
        return view

    def unsubscribe(self, key: ViewKey, subscriber: ViewSubscriber) -> None:
        pub = self.ports.get((key.service, key.port))
        if pub is None:
            return
        view = pub.views.get(key.filter)
        if view is None:
            return
        view.subscribers.pop(subscriber, None)
        if self.metrics is not None:
            self.metrics.subscribed(view)
        if not view.subscribers:
            if self.metrics is not None:
                self.metrics.dropped(view)
            del pub.views[key.filter]
            if not pub.views:
                del self.ports[(key.service, key.port)]
                ports = self._ports_by_service.get(key.service)
                if ports is not None:
                    ports.discard(key.port)
                    if not ports:
                        del self._ports_by_service[key.service]

    def view(self, key: ViewKey, create: bool = False) -> View | None:
        pub = self.ports.get((key.service, key.port))
        if pub is None:
            if not create:
                return None
            pub = PortPublisher(self, key.service, key.port)
            pub.load()
            self.ports[(key.service, key.port)] = pub
            self._ports_by_service.setdefault(key.service, set()).add(key.port)
        view = pub.views.get(key.filter)
        if view is None and create:
            view = pub.views[key.filter] = View(key, pub)
            view.publish(pub.available, pub.exists)
        return view

    def views(self) -> list[View]:
        return [v for pub in self.ports.values() for v in pub.views.values()]

    # ------------------------------------------------------------- recomputation

    def _on_cluster_change(self, change: ClusterChange) -> None:
        # Indexed by service so a one-service change costs O(its ports), not O(all ports).
        watched = self._ports_by_service
        if change.all_services:
            services = list(watched)
        else:
            services = [s for s in change.services if s in watched]
            if change.namespaces:
                services += [s for s in watched
                             if s.namespace in change.namespaces and s not in change.services]
        for svc in services:
            for port in sorted(watched.get(svc, ())):
                pub = self.ports.get((svc, port))
                if pub is not None:
                    pub.refresh()

    def merge_endpoints(
        self, service: ServiceKey, port: int, memo: EnrichMemo | None = None,
        used: EnrichMemo | None = None,
    ) -> tuple[bool, Mapping[EndpointId, Endpoint]]:
        """All endpoints of one service port, merged across its slices (spec §4.3-4.5).

        A later slice (in name order) wins an ID collision, as an update of the slice
        that now holds the endpoint would in Linkerd; dual-stack pods stay one endpoint
        per family.
        """
        svc = self.cluster.services.get(service)
        if svc is None or svc.type == "ExternalName":
            return False, EMPTY_ENDPOINTS
        target = _target_port(svc, port)
        merged: dict[EndpointId, Endpoint] = {}
        for slice_ in self.cluster.slices_of(service):
            resolved = _resolve_slice_port(slice_, target)
            if resolved is None:
                continue
            for ep in self._slice_endpoints(slice_, resolved, port, memo or {}, used):
                merged[ep.id] = ep
        return True, MappingProxyType(merged)

    def _slice_endpoints(
        self, slice_: EndpointSlice, port: int, requested_port: int, memo: EnrichMemo,
        used: EnrichMemo | None,
    ) -> list[Endpoint]:
        """The slice's servable endpoints, enriched. An endpoint whose inputs are the very
        objects it was last enriched from (same slice entry, same pod object, no change
        to nodes, ReplicaSets or Servers since) is reused, so a change re-enriches only
        what it touched."""
        out: list[Endpoint] = []
        epoch = self.cluster.enrich_epoch
        annotations = (slice_.meta.annotations.get(GATEWAY_IDENTITY_ANNOTATION),
                       slice_.meta.annotations.get(REMOTE_FQN_ANNOTATION))
        for sep in slice_.endpoints:
            # Linkerd drops only endpoints explicitly not ready; we also keep those that
            # still serve while terminating, so xDS can send them as DRAINING. Each
            # protocol applies its own readiness policy to the conditions kept here.
            if not sep.ready and not (sep.serving and sep.terminating):
                continue
            target = sep.target
            pod = None
            if target is not None and target.kind == "Pod":
                pod = self.cluster.pods.get((target.namespace, target.name))
            for ip in sep.addresses:
                key = (slice_.meta.namespace, slice_.service_name, slice_.address_type,
                       annotations if target is None else None, sep, ip, port, requested_port)
                hit = memo.get(key)
                if hit is not None and hit[0] is pod and hit[1] == epoch:
                    ep: Endpoint | None = hit[2]
                else:
                    ep = self._enrich(slice_, sep, target, pod, ip, port, requested_port)
                if used is not None:
                    used[key] = (pod, epoch, ep)
                if ep is not None:
                    out.append(ep)
        return out

    def _enrich(self, slice_: EndpointSlice, sep: SliceEndpoint, target: TargetRef | None,
                pod: Pod | None, ip: str, port: int, requested_port: int) -> Endpoint | None:
        try:
            if target is not None and target.kind == "Pod":
                if pod is None:
                    raise EnrichError(f"pod {target.namespace}/{target.name} is not known")
                enr = enrich_pod_endpoint(pod, port, sep.zone, self.cluster, self.config)
                eid = EndpointId("pod", target.namespace, target.name, slice_.address_type)
                node = pod.node_name or sep.node_name
                pod_name, pod_rv = pod.meta.name, pod.meta.resource_version
            elif target is None:
                enr = enrich_address_endpoint(slice_, requested_port, self.config)
                eid = address_endpoint_id(slice_, sep, ip, port)
                node, pod_name, pod_rv = sep.node_name, "", ""
            else:
                raise EnrichError(f"targetRef kind {target.kind} is not supported")
        except EnrichError as e:
            # Logged once per distinct input: the memo remembers the failure too.
            log.warning("endpoint skipped", namespace=slice_.meta.namespace,
                        service=slice_.service_name, port=requested_port,
                        slice=slice_.meta.name, address=ip, reason=str(e))
            return None
        return _endpoint(eid, ip, port, sep.ready, sep.serving, sep.terminating,
                         sep.hostname, node, sep.zone, sep.for_zones, pod_name,
                         pod_rv, self.cluster.nodes.get(node), enr)

    def filter_endpoints(
        self, key: ViewKey, available: Mapping[EndpointId, Endpoint],
        previous: Snapshot = EMPTY,
    ) -> dict[EndpointId, ResolvedEndpoint]:
        """Apply the filter key (spec §4.6 filterAddresses) and resolve what depends on
        the subscriber: zone locality and weight."""
        fk = key.filter
        cands = list(available.values())
        if fk.hostname:
            cands = [e for e in cands if e.hostname == fk.hostname]
        node_zone = self.cluster.node_zone(fk.node_name) if fk.node_name else ""
        if fk.filtering:
            svc = self.cluster.services.get(key.service)
            if svc is not None and svc.internal_traffic_local:
                # No fallback: a client on a node without endpoints gets none.
                cands = [e for e in cands if e.pod_name and e.node_name == fk.node_name]
            else:
                cands = _filter_by_hints(cands, node_zone)
        cands = self._select_family(cands)
        out: dict[EndpointId, ResolvedEndpoint] = {}
        for e in cands:
            locality = "unknown"
            if node_zone and e.zone is not None:
                locality = "local" if e.zone == node_zone else "remote"
            weight = BASE_WEIGHT
            if self.config.zone_weights and locality == "local":
                weight *= 10
            prev = previous.get(e.id)
            if (prev is not None and prev.endpoint is e and prev.zone_locality == locality
                    and prev.weight == weight):
                out[e.id] = prev
            else:
                out[e.id] = ResolvedEndpoint(e, locality, weight)
        return out

    def _select_family(self, cands: list[Endpoint]) -> list[Endpoint]:
        if not self.config.enable_ipv6:
            return [e for e in cands if e.id.family != "IPv6"]
        v6_pods = {(e.id.namespace, e.id.name) for e in cands
                   if e.id.kind == "pod" and e.id.family == "IPv6"}
        return [
            e for e in cands
            if not (e.id.kind == "pod" and e.id.family == "IPv4"
                    and (e.id.namespace, e.id.name) in v6_pods)
        ]


def _filter_by_hints(cands: list[Endpoint], node_zone: str) -> list[Endpoint]:
    """Topology-aware hints: only when every ready candidate carries hints; fall back to
    all candidates when none is hinted for the subscriber's zone."""
    ready = [e for e in cands if e.ready]
    if not ready or any(not e.for_zones for e in ready):
        return cands
    matching = [e for e in cands if e.for_zones and node_zone in e.for_zones]
    if not any(e.ready for e in matching):
        return cands
    return matching


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


def _endpoint(
    eid: EndpointId, ip: str, port: int, ready: bool, serving: bool, terminating: bool,
    hostname: str, node_name: str, zone: str | None, for_zones: frozenset[str] | None,
    pod_name: str, pod_rv: str, node: Any, enr: Enrichment,
) -> Endpoint:
    return Endpoint(
        id=eid, ip=ip, port=port, ready=ready, serving=serving, terminating=terminating,
        hostname=hostname, node_name=node_name, zone=zone,
        region=node.region if node is not None else "",
        for_zones=for_zones, pod_name=pod_name, pod_resource_version=pod_rv,
        identity=enr.identity, server_name=enr.server_name, hint=enr.hint,
        meshed_http2=enr.meshed_http2, opaque=enr.opaque,
        authority_override=enr.authority_override, owner_kind=enr.owner_kind,
        owner_name=enr.owner_name, metric_labels=enr.metric_labels,
    )


