"""Two real kube-apiservers for the multicluster tests: the shared one is the local
cluster, a second one (the same launcher, started again) is the linked cluster `east`,
as in docs/multicluster.md's test table:

  L: cluster domain and trust domain cluster.local, controller namespace `linkerd`
     (each test uses its own controller namespace, so that tests sharing the servers
     do not see each other's links);
  R (east): cluster domain cluster.local, trust domain east.local.

`Objects` writes what a test needs into one namespace of one API server.
"""

from __future__ import annotations

import base64
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client, config

from bridge.model import MeshConfig
from bridge.multicluster.links import Link
from bridge.sources.kube import KubeSource
from linkerd_api.service import LinkerdOptions
from meshbridge.app import App
from testkit.kubeapi import KubeAPIServer, put_endpoint_slice
from testkit.polling import eventually
from testkit.serving import loopback_app
from xds_api.service import XdsOptions

EAST_TRUST_DOMAIN = "east.local"
SECRET_TYPE = "mirror.linkerd.io/remote-kubeconfig"
PROXY_ENV = [{"name": "LINKERD2_PROXY_INBOUND_LISTEN_ADDR", "value": "0.0.0.0:4143"},
             {"name": "LINKERD2_PROXY_ADMIN_LISTEN_ADDR", "value": "0.0.0.0:4191"},
             {"name": "LINKERD2_PROXY_CONTROL_LISTEN_ADDR", "value": "0.0.0.0:4190"}]


@pytest.fixture(scope="session")
def remote_apiserver() -> Iterator[KubeAPIServer]:
    """The linked cluster's API server, started once for the session."""
    with KubeAPIServer() as server:
        yield server


@dataclass(frozen=True, slots=True)
class Endpoint:
    pod: str
    ip: str
    zone: str = ""
    ready: bool = True
    hostname: str = ""


class Objects:
    """Creates and changes objects through one API server, in one namespace."""

    def __init__(self, server: KubeAPIServer, ns: str | None = None) -> None:
        self.server = server
        self.api = config.new_client_from_config(str(server.kubeconfig_path))
        self.core = client.CoreV1Api(self.api)
        self.discovery = client.DiscoveryV1Api(self.api)
        self.ns = ns or f"mc-{uuid.uuid4().hex[:8]}"
        with contextlib.suppress(client.ApiException):
            self.core.create_namespace({"metadata": {"name": self.ns}})

    def close(self) -> None:
        self.api.close()

    def service(self, name: str, *, selector: Mapping[str, str] | None = None,
                labels: Mapping[str, str] | None = None,
                annotations: Mapping[str, str] | None = None,
                ports: Sequence[tuple[int, str, int]] = ((80, "http", 8080),),
                spec: Mapping[str, Any] | None = None) -> None:
        body = self.service_body(name, selector=selector, labels=labels,
                                 annotations=annotations, ports=ports, spec=spec)
        try:
            self.core.create_namespaced_service(self.ns, body)
        except client.ApiException as e:
            if e.status != 409:
                raise
            current = self.core.read_namespaced_service(name, self.ns)
            body["metadata"]["resourceVersion"] = current.metadata.resource_version
            body["spec"]["clusterIP"] = current.spec.cluster_ip
            body["spec"]["clusterIPs"] = current.spec.cluster_ips
            self.core.replace_namespaced_service(name, self.ns, body)

    @staticmethod
    def service_body(name: str, *, selector: Mapping[str, str] | None = None,
                     labels: Mapping[str, str] | None = None,
                     annotations: Mapping[str, str] | None = None,
                     ports: Sequence[tuple[int, str, int]] = ((80, "http", 8080),),
                     spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "metadata": {"name": name, "labels": dict(labels or {}),
                         "annotations": dict(annotations or {})},
            "spec": {"ports": [{"name": n, "port": p, "targetPort": t} for p, n, t in ports],
                     **dict(spec or {})}}
        if selector is not None:
            body["spec"]["selector"] = dict(selector)
        return body

    def delete_service(self, name: str) -> None:
        self.core.delete_namespaced_service(name, self.ns)

    def pod(self, name: str, ip: str, *, labels: Mapping[str, str] | None = None,
            sa: str = "foo", control_plane_ns: str | None = "linkerd") -> None:
        all_labels = dict(labels or {})
        containers: list[dict[str, Any]] = [
            {"name": "app", "image": "app", "ports": [{"name": "http", "containerPort": 8080}]}]
        if control_plane_ns is not None:
            all_labels["linkerd.io/control-plane-ns"] = control_plane_ns
            containers.append({"name": "linkerd-proxy", "image": "proxy", "env": PROXY_ENV})
        self.core.create_namespaced_pod(self.ns, {
            "metadata": {"name": name, "labels": all_labels},
            "spec": {"serviceAccountName": sa, "containers": containers}})
        self.core.patch_namespaced_pod_status(name, self.ns, {"status": {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}})

    def slice(self, name: str, service: str, endpoints: Sequence[Endpoint], *,
              port: int = 8080, port_name: str = "http",
              hints: Sequence[str] | None = None) -> None:
        body: dict[str, Any] = {
            "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
            "endpoints": [self._endpoint(e, hints) for e in endpoints]}
        put_endpoint_slice(self.discovery, self.ns, body)

    def _endpoint(self, e: Endpoint, hints: Sequence[str] | None) -> dict[str, Any]:
        out: dict[str, Any] = {"addresses": [e.ip], "conditions": {"ready": e.ready},
                               "targetRef": {"kind": "Pod", "name": e.pod,
                                             "namespace": self.ns}}
        if e.zone:
            out["zone"] = e.zone
        if e.hostname:
            out["hostname"] = e.hostname
        if hints is not None:
            out["hints"] = {"forZones": [{"name": z} for z in hints]}
        return out

    def link_secret(self, controller_ns: str, cluster: str, remote: KubeAPIServer, *,
                    trust_domain: str = EAST_TRUST_DOMAIN, cluster_domain: str = "cluster.local",
                    kubeconfig: bytes | None = None, name: str | None = None,
                    omit: Sequence[str] = ()) -> str:
        """A cluster-credentials Secret as `linkerd multicluster link` writes it
        (`omit` leaves out a label or annotation key, or "kubeconfig")."""
        name = name or f"cluster-credentials-{cluster}"
        labels = {"multicluster.linkerd.io/cluster-name": cluster}
        annotations = {"multicluster.linkerd.io/cluster-domain": cluster_domain,
                       "multicluster.linkerd.io/trust-domain": trust_domain}
        data = {"kubeconfig": kubeconfig if kubeconfig is not None
                else remote.kubeconfig_path.read_bytes()}
        body = {
            "metadata": {"name": name, "namespace": controller_ns,
                         "labels": {k: v for k, v in labels.items() if k not in omit},
                         "annotations": {k: v for k, v in annotations.items()
                                         if k not in omit}},
            "type": SECRET_TYPE,
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()
                     if k not in omit}}
        try:
            self.core.create_namespaced_secret(controller_ns, body)
        except client.ApiException as e:
            if e.status != 409:
                raise
            self.core.replace_namespaced_secret(name, controller_ns, body)
        return name

    def delete_secret(self, controller_ns: str, name: str) -> None:
        self.core.delete_namespaced_secret(name, controller_ns)


    def node(self, zone: str) -> str:
        """A Node in `zone` (cluster-scoped: named after this namespace; `close` leaves
        it, `delete_nodes` removes it)."""
        name = f"{self.ns}-{zone}"
        with contextlib.suppress(client.ApiException):
            self.core.create_node({"metadata": {"name": name, "labels": {
                "topology.kubernetes.io/zone": zone}}})
        return name

    def delete_nodes(self) -> None:
        for node in self.core.list_node().items:
            if node.metadata.name.startswith(f"{self.ns}-"):
                with contextlib.suppress(client.ApiException):
                    self.core.delete_node(node.metadata.name)


def token(ns: str, node: str) -> str:
    """A proxy's context token: its namespace and node."""
    return json.dumps({"ns": ns, "nodeName": node, "pod": "client"})


@contextlib.asynccontextmanager
async def serving(local: KubeAPIServer, controller_ns: str, *, semantics: str = "proto",
                  xds: XdsOptions | None = None, links: Sequence[Link] = (),
                  sync_timeout: float = 30.0) -> AsyncIterator[App]:
    """meshbridge serving the local cluster, reading linked clusters' Secrets from
    `controller_ns` (its controller namespace too: identities name it)."""
    source = KubeSource(kubeconfig=str(local.kubeconfig_path), link_namespace=controller_ns)
    layer_options: list[object] = [LinkerdOptions(semantics)]  # type: ignore[arg-type]
    if xds is not None:
        layer_options.append(xds)
    app = loopback_app(source, MeshConfig(controller_namespace=controller_ns),
                       links=tuple(links), link_sync_timeout=sync_timeout,
                       layer_options=tuple(layer_options))
    await app.start()
    try:
        yield app
    finally:
        await app.stop(0.2)


async def linked(app: App, name: str, timeout: float = 20.0) -> None:
    """Wait until the linked cluster `name` has synced."""
    await eventually(lambda: (lc := app.clusters.get(name)) is not None
                     and lc.state == "synced", timeout, f"cluster {name} never synced")


def mirror_labels(cluster: str, remote_service: str) -> dict[str, str]:
    """The labels a remote-discovery mirror carries (docs/multicluster.md)."""
    return {"mirror.linkerd.io/mirrored-service": "true",
            "mirror.linkerd.io/cluster-name": cluster,
            "multicluster.linkerd.io/remote-discovery": cluster,
            "multicluster.linkerd.io/remote-service": remote_service}
