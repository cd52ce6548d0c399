"""The Kubernetes side of the same churn: what a watcher of the endpoints API receives.

The sim's changes are replayed from the same seed (the sequence is a pure function
of the scenario) and each changed object is serialised as the API server's JSON
watch event would carry it, for both APIs:

* **v1 Endpoints**: one object per service holding every address (ready ones in
  `addresses`, others in `notReadyAddresses`), rewritten whole on any change;
* **EndpointSlices** (discovery.k8s.io/v1): only the slices whose content changed.

A slice the sim re-emits unchanged is not counted: the slice controller would not
have written it. Objects carry the metadata the controllers set (uid,
resourceVersion, labels, owner reference, the last-change-trigger-time
annotation) but not `managedFields`, which servers also send unless a client asks
otherwise: the byte counts are lower bounds, for both APIs alike. Every watcher
(kube-proxy on each node, every mesh controller...) receives every event, so the
totals are the per-watcher bytes times the number of watchers.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bridge.cluster import Event, EventType
from bridge.objects import EndpointSlice, Pod
from bridge.sources.sim import Scenario, SimCluster

CREATED = "2025-01-01T00:00:00Z"
_UID_NS = uuid.UUID("6ba7b811-9dad-11d1-80b4-00c04fd430c8")  # the URL namespace


def uid(kind: str, namespace: str, name: str) -> str:
    return str(uuid.uuid5(_UID_NS, f"{kind}/{namespace}/{name}"))


def encode(event_type: str, obj: dict[str, Any]) -> bytes:
    """One watch event as the API server frames it in JSON: one line per event."""
    return json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode() + b"\n"


def _meta(kind: str, namespace: str, name: str, rv: str, labels: dict[str, str],
          owner: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name, "namespace": namespace, "uid": uid(kind, namespace, name),
        "resourceVersion": rv, "creationTimestamp": CREATED, "labels": labels,
        "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": CREATED},
    }
    if owner is not None:
        meta["generation"] = 1
        meta["ownerReferences"] = [{
            "apiVersion": "v1", "kind": "Service", "name": owner,
            "uid": uid("Service", namespace, owner), "controller": True,
            "blockOwnerDeletion": True}]
    return meta


def slice_object(s: EndpointSlice, rv: str) -> dict[str, Any]:
    endpoints = []
    for e in s.endpoints:
        ep: dict[str, Any] = {
            "addresses": list(e.addresses),
            "conditions": {"ready": e.ready, "serving": e.serving,
                           "terminating": e.terminating},
        }
        if e.node_name:
            ep["nodeName"] = e.node_name
        if e.zone:
            ep["zone"] = e.zone
        if e.target is not None:
            ep["targetRef"] = {"kind": e.target.kind, "namespace": e.target.namespace,
                               "name": e.target.name,
                               "uid": uid(e.target.kind, e.target.namespace, e.target.name)}
        endpoints.append(ep)
    labels = {"kubernetes.io/service-name": s.service_name,
              "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}
    return {
        "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
        "metadata": _meta("EndpointSlice", s.meta.namespace, s.meta.name, rv, labels,
                          owner=s.service_name),
        "addressType": s.address_type or "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": p.name, "protocol": "TCP", "port": p.port} for p in s.ports or ()],
    }


def endpoints_object(namespace: str, service: str, slices: Sequence[EndpointSlice],
                     pod_rvs: dict[tuple[str, str], str], rv: str) -> dict[str, Any]:
    """The v1 Endpoints object the endpoints controller would write for these slices."""
    ready: list[dict[str, Any]] = []
    not_ready: list[dict[str, Any]] = []
    ports: dict[str, int] = {}
    for s in sorted(slices, key=lambda s: s.meta.name):
        for p in s.ports or ():
            ports.setdefault(p.name, p.port)
        for e in s.endpoints:
            for ip in e.addresses:
                addr: dict[str, Any] = {"ip": ip}
                if e.node_name:
                    addr["nodeName"] = e.node_name
                if e.target is not None:
                    t = e.target
                    # Unlike a slice, an Endpoints address names the pod's version too.
                    addr["targetRef"] = {"kind": t.kind, "namespace": t.namespace,
                                         "name": t.name, "uid": uid(t.kind, t.namespace, t.name),
                                         "resourceVersion": pod_rvs.get((t.namespace, t.name),
                                                                        "1")}
                (ready if e.ready else not_ready).append(addr)
    subset: dict[str, Any] = {}
    if ready:
        subset["addresses"] = sorted(ready, key=lambda a: a["ip"])
    if not_ready:
        subset["notReadyAddresses"] = sorted(not_ready, key=lambda a: a["ip"])
    subsets = []
    if subset:
        subset["ports"] = [{"name": n, "port": p, "protocol": "TCP"}
                           for n, p in sorted(ports.items())]
        subsets.append(subset)
    return {
        "kind": "Endpoints", "apiVersion": "v1",
        "metadata": _meta("Endpoints", namespace, service, rv, {"app": service}),
        "subsets": subsets,
    }


@dataclass(slots=True)
class KubeSide:
    watchers: int
    initial_endpoints: int = 0  # bytes one watcher's initial list carries
    initial_slices: int = 0
    endpoints_by_change: list[int] = field(default_factory=list)  # bytes per watcher
    slices_by_change: list[int] = field(default_factory=list)
    endpoints_events: int = 0
    slices_events: int = 0
    patterns: list[str] = field(default_factory=list)

    @property
    def endpoints_bytes(self) -> int:
        return sum(self.endpoints_by_change)

    @property
    def slices_bytes(self) -> int:
        return sum(self.slices_by_change)


class _Replay:
    """What a watcher of each API has been sent so far."""

    def __init__(self) -> None:
        self.rv = 0
        self.slices: dict[tuple[str, str], EndpointSlice] = {}
        self.by_service: dict[tuple[str, str], dict[str, EndpointSlice]] = {}
        self.slice_sent: dict[tuple[str, str], str] = {}  # content fingerprint
        self.endpoints_sent: dict[tuple[str, str], str] = {}
        self.pod_rvs: dict[tuple[str, str], str] = {}

    def next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    @staticmethod
    def _fingerprint(obj: dict[str, Any]) -> str:
        meta = dict(obj["metadata"])
        meta.pop("resourceVersion", None)
        return json.dumps({**obj, "metadata": meta}, sort_keys=True)

    def apply(self, events: Iterable[Event]) -> tuple[int, int, int, int]:
        """Bytes (Endpoints, slices) and events (Endpoints, slices) one watcher gets."""
        touched: set[tuple[str, str]] = set()
        eb = sb = en = sn = 0
        for ev in events:
            obj = ev.obj
            if isinstance(obj, Pod):
                key = (obj.meta.namespace, obj.meta.name)
                if ev.type is EventType.DELETED:
                    self.pod_rvs.pop(key, None)
                else:
                    self.pod_rvs[key] = self.next_rv()
            elif isinstance(obj, EndpointSlice):
                key = (obj.meta.namespace, obj.meta.name)
                svc_key = (obj.meta.namespace, obj.service_name)
                touched.add(svc_key)
                if ev.type is EventType.DELETED:
                    self.by_service.get(svc_key, {}).pop(obj.meta.name, None)
                    if self.slices.pop(key, None) is not None:
                        self.slice_sent.pop(key, None)
                        sb += len(encode("DELETED", slice_object(obj, self.next_rv())))
                        sn += 1
                    continue
                self.slices[key] = obj
                self.by_service.setdefault(svc_key, {})[obj.meta.name] = obj
                body = slice_object(obj, "")
                fp = self._fingerprint(body)
                if self.slice_sent.get(key) != fp:
                    kind = "MODIFIED" if key in self.slice_sent else "ADDED"
                    self.slice_sent[key] = fp
                    body["metadata"]["resourceVersion"] = self.next_rv()
                    sb += len(encode(kind, body))
                    sn += 1
        for ns, svc in sorted(touched):
            mine = list(self.by_service.get((ns, svc), {}).values())
            body = endpoints_object(ns, svc, mine, self.pod_rvs, "")
            fp = self._fingerprint(body)
            key = (ns, svc)
            if self.endpoints_sent.get(key) != fp:
                kind = "MODIFIED" if key in self.endpoints_sent else "ADDED"
                self.endpoints_sent[key] = fp
                body["metadata"]["resourceVersion"] = self.next_rv()
                eb += len(encode(kind, body))
                en += 1
        return eb, sb, en, sn


def kube_side(scenario: Scenario, changes: int, watchers: int) -> KubeSide:
    """Replay the first `changes` changes of the scenario's churn."""
    sim = SimCluster(scenario)
    replay = _Replay()
    out = KubeSide(watchers)
    out.initial_endpoints, out.initial_slices, _, _ = replay.apply(
        Event(EventType.ADDED, o) for o in sim.initial_objects())
    for n, (pattern, events) in enumerate(sim.changes()):
        if n >= changes:
            break
        eb, sb, en, sn = replay.apply(events)
        out.endpoints_by_change.append(eb)
        out.slices_by_change.append(sb)
        out.endpoints_events += en
        out.slices_events += sn
        out.patterns.append(pattern)
    return out
