"""Kubernetes-shaped manifests for unit tests, decoded the way every source decodes them."""

from __future__ import annotations

from typing import Any

from bridge.cluster import Cluster, Event, EventType
from bridge.objects import KubeObject, decode_object

PROXY_ENV = [
    {"name": "LINKERD2_PROXY_INBOUND_LISTEN_ADDR", "value": "0.0.0.0:4143"},
    {"name": "LINKERD2_PROXY_ADMIN_LISTEN_ADDR", "value": "0.0.0.0:4191"},
    {"name": "LINKERD2_PROXY_CONTROL_LISTEN_ADDR", "value": "0.0.0.0:4190"},
]


def service(name: str, ns: str = "app", ports: list[dict[str, Any]] | None = None,
            **spec: Any) -> dict[str, Any]:
    return {
        "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"ports": ports if ports is not None else
                 [{"name": "http", "port": 80, "targetPort": 8080}], **spec},
    }


def pod(name: str, ip: str | list[str], ns: str = "app", meshed: bool = True,
        node: str = "node-a", sa: str = "web", labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None, owner: tuple[str, str] | None = None,
        ports: list[dict[str, Any]] | None = None, proxy_env: list[dict[str, str]] | None = None,
        rv: str = "1") -> dict[str, Any]:
    ips = [ip] if isinstance(ip, str) else ip
    lbl = dict(labels or {})
    containers: list[dict[str, Any]] = [
        {"name": "app", "ports": ports or [{"name": "http", "containerPort": 8080}]}
    ]
    if meshed:
        lbl.setdefault("linkerd.io/control-plane-ns", "linkerd")
        containers.append({"name": "linkerd-proxy",
                           "env": PROXY_ENV if proxy_env is None else proxy_env})
    md: dict[str, Any] = {"name": name, "namespace": ns, "labels": lbl,
                          "annotations": annotations or {}, "resourceVersion": rv}
    if owner:
        md["ownerReferences"] = [{"kind": owner[0], "name": owner[1]}]
    return {
        "kind": "Pod",
        "metadata": md,
        "spec": {"nodeName": node, "serviceAccountName": sa, "containers": containers},
        "status": {"phase": "Running", "podIP": ips[0], "podIPs": [{"ip": i} for i in ips]},
    }


def endpoint(ip: str, pod_name: str | None, ns: str = "app", ready: bool | None = True,
             zone: str | None = "zone-a", node: str = "node-a",
             hints: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    ep: dict[str, Any] = {"addresses": [ip], "nodeName": node}
    if ready is not None:
        ep["conditions"] = {"ready": ready}
    if zone is not None:
        ep["zone"] = zone
    if pod_name is not None:
        ep["targetRef"] = {"kind": "Pod", "name": pod_name, "namespace": ns}
    if hints is not None:
        ep["hints"] = {"forZones": [{"name": z} for z in hints]}
    ep.update(extra)
    return ep


def endpoint_slice(name: str, service_name: str, endpoints: list[dict[str, Any]],
                   ns: str = "app", family: str = "IPv4",
                   ports: list[dict[str, Any]] | None = None,
                   annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations or {},
                     "labels": {"kubernetes.io/service-name": service_name}},
        "addressType": family,
        "ports": ports if ports is not None else [{"name": "http", "port": 8080}],
        "endpoints": endpoints,
    }


def node(name: str, zone: str) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name,
                                         "labels": {"topology.kubernetes.io/zone": zone}}}


def decode(raw: dict[str, Any]) -> KubeObject:
    obj = decode_object(raw)
    assert obj is not None
    return obj


def load(cluster: Cluster, *raws: dict[str, Any]) -> None:
    cluster.apply(Event(EventType.ADDED, decode(r)) for r in raws)


def delete(cluster: Cluster, *raws: dict[str, Any]) -> None:
    cluster.apply(Event(EventType.DELETED, decode(r)) for r in raws)
