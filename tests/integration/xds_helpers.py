"""What the xDS integration tests share: the demo's expected endpoints and manifest
edits."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

# Every demo service port as an xDS cluster, written from bridge/sources/demo's manifests
# (not computed by meshbridge): {name: {(ip, port): zone}}. The default View has no
# subscriber node, so node-local-agent (internalTrafficPolicy: Local) has none, as
# for a Linkerd client without a node; ExternalName legacy/mail is no cluster.
DEMO: dict[str, dict[tuple[str, int], str]] = {
    "billing.legacy.svc.cluster.local:80": {
        ("10.0.5.20", 8080): "", ("10.244.1.60", 8080): "zone-a",
        ("10.244.2.60", 8080): "zone-b"},
    "cache.shop.svc.cluster.local:6379": {("10.244.3.30", 6379): "zone-c"},
    "cart.shop.svc.cluster.local:8080": {
        ("fd00:10:244::1:30", 8080): "zone-a", ("fd00:10:244::2:30", 8080): "zone-b"},
    "catalog.shop.svc.cluster.local:80": {
        ("10.244.1.20", 8080): "zone-a", ("10.244.1.21", 8080): "zone-a",
        ("10.244.2.20", 8080): "zone-b", ("10.244.2.21", 8080): "zone-b",
        ("10.244.3.20", 8080): "zone-c", ("10.244.3.21", 8080): "zone-c"},
    "db.data.svc.cluster.local:5432": {
        ("10.244.1.50", 5432): "zone-a", ("10.244.2.50", 5432): "zone-b",
        ("10.244.3.50", 5432): "zone-c"},
    "emoji.emojivoto.svc.cluster.local:8080": {
        ("10.244.1.11", 8080): "zone-a", ("10.244.2.11", 8080): "zone-b"},
    "emoji.emojivoto.svc.cluster.local:8801": {
        ("10.244.1.11", 8801): "zone-a", ("10.244.2.11", 8801): "zone-b"},
    "node-local-agent.shop.svc.cluster.local:4317": {},
    "payments.shop.svc.cluster.local:8080": {},
    "queue.shop.svc.cluster.local:15672": {("10.244.2.31", 15672): "zone-b"},
    "queue.shop.svc.cluster.local:5672": {("10.244.2.31", 5672): "zone-b"},
    "reports.legacy.svc.cluster.local:8080": {},
    "search.shop.svc.cluster.local:9090": {
        ("10.244.1.31", 9090): "zone-a", ("10.244.3.31", 9090): "zone-c"},
    "search.shop.svc.cluster.local:9091": {
        ("10.244.1.31", 9091): "zone-a", ("10.244.3.31", 9091): "zone-c"},
    "voting.emojivoto.svc.cluster.local:8080": {
        ("10.244.1.12", 8080): "zone-a", ("10.244.2.12", 8080): "zone-b",
        ("10.244.3.12", 8080): "zone-c"},
    "web-canary.emojivoto.svc.cluster.local:80": {("10.244.2.13", 8080): "zone-b"},
    "web.emojivoto.svc.cluster.local:80": {
        ("10.244.1.10", 8080): "zone-a", ("10.244.2.10", 8080): "zone-b"},
}

# Ports whose Service declares appProtocol grpc: their clusters speak HTTP/2.
DEMO_HTTP2 = {"emoji.emojivoto.svc.cluster.local:8080",
              "voting.emojivoto.svc.cluster.local:8080",
              "search.shop.svc.cluster.local:9091",
              "node-local-agent.shop.svc.cluster.local:4317"}


class Manifests:
    """Edits a manifest folder the way a person would: rewrite a file, add, delete."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def read(self, file: str) -> list[dict[str, Any]]:
        return [d for d in yaml.safe_load_all((self.root / file).read_text()) if d]

    def write(self, file: str, docs: list[dict[str, Any]]) -> None:
        (self.root / file).write_text(yaml.safe_dump_all(docs, sort_keys=False))

    def edit(self, file: str, change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
             ) -> None:
        self.write(file, change(self.read(file)))

    @staticmethod
    def find(docs: list[dict[str, Any]], kind: str, ns: str, name: str) -> dict[str, Any]:
        for d in docs:
            md = d.get("metadata", {})
            if d.get("kind") == kind and md.get("namespace") == ns and md.get("name") == name:
                return d
        raise KeyError(f"{kind} {ns}/{name}")

    def remove_endpoint(self, file: str, ns: str, slice_name: str, ip: str) -> None:
        def change(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
            s = self.find(docs, "EndpointSlice", ns, slice_name)
            s["endpoints"] = [e for e in s["endpoints"] if ip not in e["addresses"]]
            return docs
        self.edit(file, change)

    def add_pod_endpoint(self, file: str, ns: str, slice_name: str, like_pod: str,
                         new_pod: str, ip: str, zone: str, node: str) -> None:
        """Scale up: a copy of an existing pod under a new name and IP, and its endpoint."""
        def change(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
            pod = copy.deepcopy(self.find(docs, "Pod", ns, like_pod))
            pod["metadata"]["name"] = new_pod
            pod["metadata"].pop("uid", None)
            pod["spec"]["nodeName"] = node
            pod["status"]["podIP"] = ip
            pod["status"]["podIPs"] = [{"ip": ip}]
            s = self.find(docs, "EndpointSlice", ns, slice_name)
            s["endpoints"].append({
                "addresses": [ip], "conditions": {"ready": True, "serving": True,
                                                  "terminating": False},
                "nodeName": node, "zone": zone, "hints": {"forZones": [{"name": zone}]},
                "targetRef": {"kind": "Pod", "name": new_pod, "namespace": ns}})
            return [*docs, pod]
        self.edit(file, change)

    def delete_service(self, file: str, ns: str, name: str) -> None:
        """The Service and its EndpointSlices go; its pods stay (as in a real delete)."""
        def change(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
            def gone(d: dict[str, Any]) -> bool:
                md = d.get("metadata", {})
                if md.get("namespace") != ns:
                    return False
                if d.get("kind") == "Service":
                    return bool(md.get("name") == name)
                labels = md.get("labels") or {}
                return bool(d.get("kind") == "EndpointSlice"
                            and labels.get("kubernetes.io/service-name") == name)
            return [d for d in docs if not gone(d)]
        self.edit(file, change)


def service_with_addresses(ns: str, name: str, port: int, target_port: int,
                           addresses: list[tuple[str, str]], app_protocol: str = "",
                           port_name: str = "grpc") -> list[dict[str, Any]]:
    """A Service and one EndpointSlice of addresses without targetRef: [(ip, zone)]."""
    sp: dict[str, Any] = {"name": port_name, "port": port, "targetPort": target_port,
                          "protocol": "TCP"}
    if app_protocol:
        sp["appProtocol"] = app_protocol
    return [
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": name, "namespace": ns},
         "spec": {"type": "ClusterIP", "clusterIP": "10.96.99.9", "ports": [sp]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": f"{name}-1", "namespace": ns,
                      "labels": {"kubernetes.io/service-name": name}},
         "addressType": "IPv4",
         "ports": [{"name": port_name, "port": target_port, "protocol": "TCP"}],
         "endpoints": [{"addresses": [ip], "conditions": {"ready": True}, "zone": zone}
                       for ip, zone in addresses]},
    ]
