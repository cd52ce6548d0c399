"""One service port: its slices merged, deduplicated and enriched, and its Views.

Linkerd's port publisher (Linkerd §4.3-4.5): it owns the port's endpoints before any
subscriber's filter, computed once per change, and the Views that filter them.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import structlog

from bridge.cluster import Cluster
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
from bridge.view_metrics import ViewMetrics
from bridge.views.view import View

log = structlog.get_logger("meshbridge.views")

EMPTY_ENDPOINTS: Mapping[EndpointId, Endpoint] = MappingProxyType({})
# Enrichment results of one port, by their inputs: (pod object, cluster epoch, result).
EnrichMemo = dict[tuple[Any, ...], tuple["Pod | None", int, "Endpoint | None"]]


class PortPublisher:
    """One port of one service: the merged, enriched endpoints before filtering."""

    def __init__(self, service: ServiceKey, port: int, cluster: Cluster, config: MeshConfig,
                 metrics: ViewMetrics | None = None) -> None:
        self.service = service
        self.port = port
        self._cluster = cluster
        self._config = config
        self._metrics = metrics
        self.views: dict[FilterKey, View] = {}
        self.available: Mapping[EndpointId, Endpoint] = EMPTY_ENDPOINTS
        self.exists = False
        self._memo: EnrichMemo = {}

    # ------------------------------------------------------------- views

    def view(self, fk: FilterKey, create: bool = False) -> View | None:
        view = self.views.get(fk)
        if view is None and create:
            key = ViewKey(self.service, self.port, fk)
            view = self.views[fk] = View(key, self._cluster, self._config, self._metrics)
            view.publish(self.available, self.exists)
        return view

    def drop(self, fk: FilterKey) -> bool:
        """Forget the View of `fk`; True when the port has no View left."""
        self.views.pop(fk, None)
        return not self.views

    # ------------------------------------------------------------- recomputation

    def load(self) -> None:
        """Merge and enrich the port's endpoints now, reusing what has not changed."""
        memo: EnrichMemo = {}
        self.exists, self.available = self.merge(self._memo, memo)
        # Only what this version used is kept, so the memo never outgrows the service.
        self._memo = memo

    def refresh(self) -> None:
        self.load()
        for view in list(self.views.values()):
            view.publish(self.available, self.exists)

    def merge(
        self, memo: EnrichMemo | None = None, used: EnrichMemo | None = None,
    ) -> tuple[bool, Mapping[EndpointId, Endpoint]]:
        """Whether the service exists, and every endpoint of this port merged across its
        slices (Linkerd §4.3-4.5). `memo` holds earlier results to reuse; `used` receives
        the results this merge used.

        A later slice (in name order) wins an ID collision, as an update of the slice
        that now holds the endpoint would in Linkerd; dual-stack pods stay one endpoint
        per family.
        """
        svc = self._cluster.services.get(self.service)
        if svc is None or svc.type == "ExternalName":
            return False, EMPTY_ENDPOINTS
        target = _target_port(svc, self.port)
        merged: dict[EndpointId, Endpoint] = {}
        for slice_ in self._cluster.slices_of(self.service):
            resolved = _resolve_slice_port(slice_, target)
            if resolved is None:
                continue
            for ep in self._slice_endpoints(slice_, resolved, memo or {}, used):
                merged[ep.id] = ep
        return True, MappingProxyType(merged)

    def _slice_endpoints(
        self, slice_: EndpointSlice, port: int, memo: EnrichMemo, used: EnrichMemo | None,
    ) -> list[Endpoint]:
        """The slice's servable endpoints, enriched. An endpoint whose inputs are the very
        objects it was last enriched from (same slice entry, same pod object, no change
        to nodes, ReplicaSets or Servers since) is reused, so a change re-enriches only
        what it touched."""
        out: list[Endpoint] = []
        cluster = self._cluster
        epoch = cluster.enrich_epoch
        requested_port = self.port
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
                pod = cluster.pods.get((target.namespace, target.name))
            for ip in sep.addresses:
                key = (slice_.meta.namespace, slice_.service_name, slice_.address_type,
                       annotations if target is None else None, sep, ip, port, requested_port)
                hit = memo.get(key)
                if hit is not None and hit[0] is pod and hit[1] == epoch:
                    ep: Endpoint | None = hit[2]
                else:
                    ep = self._enrich(slice_, sep, target, pod, ip, port)
                if used is not None:
                    used[key] = (pod, epoch, ep)
                if ep is not None:
                    out.append(ep)
        return out

    def _enrich(self, slice_: EndpointSlice, sep: SliceEndpoint, target: TargetRef | None,
                pod: Pod | None, ip: str, port: int) -> Endpoint | None:
        try:
            if target is not None and target.kind == "Pod":
                if pod is None:
                    raise EnrichError(f"pod {target.namespace}/{target.name} is not known")
                enr = enrich_pod_endpoint(pod, port, sep.zone, self._cluster, self._config)
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
        node = self._cluster.nodes.get(node_name)
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
