"""The policy API on the kube source against a real kube-apiserver: policy CRDs
(tests/integration/crds/policy.yaml) installed, objects written through the API,
answers read as a proxy reads them."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, config

from bridge.sources.kube import KubeSource
from testkit import kubeapi
from testkit.kubeapi import KubeAPIServer
from testkit.linkerd import channel_to
from testkit.linkerd_policy import watch_addr, watch_port
from testkit.polling import HANG, eventually_sync
from testkit.serving import loopback_app

kube_apiserver = kubeapi.kube_apiserver  # the shared session fixture

CRDS = Path(__file__).parent / "crds" / "policy.yaml"
WAIT = HANG  # a write reaching the clients through a real API server: waited for, never timed


def install_crds(api: client.ApiClient, path: Path = CRDS) -> None:
    ext = client.ApiextensionsV1Api(api)
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        try:
            ext.create_custom_resource_definition(doc)
        except client.ApiException as e:
            if e.status != 409:  # 409: installed by an earlier test of the session
                raise

    def established() -> bool:
        for doc in docs:
            crd = ext.read_custom_resource_definition(doc["metadata"]["name"])
            conditions = {c.type: c.status for c in (crd.status.conditions or [])}
            if conditions.get("Established") != "True":
                return False
        return True

    eventually_sync(established, timeout=WAIT)


@pytest.fixture
def api(kube_apiserver: KubeAPIServer) -> Iterator[client.ApiClient]:
    c = config.new_client_from_config(str(kube_apiserver.kubeconfig_path))
    install_crds(c)
    yield c
    c.close()


def custom(api: client.ApiClient, ns: str, group: str, version: str, plural: str,
           body: dict[str, Any]) -> None:
    client.CustomObjectsApi(api).create_namespaced_custom_object(group, version, ns, plural,
                                                                 body)


async def test_routes_and_servers_written_through_the_api_are_served_and_followed(
    api: client.ApiClient, kube_apiserver: KubeAPIServer
) -> None:
    core = client.CoreV1Api(api)
    ns = f"p-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": ns}})
    for name in ("web", "web-v2"):
        core.create_namespaced_service(ns, {"metadata": {"name": name}, "spec": {
            "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
    ip = core.read_namespaced_service("web", ns).spec.cluster_ip
    route: dict[str, Any] = {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "split"},
        "spec": {"parentRefs": [{"group": "core", "kind": "Service", "name": "web", "port": 80}],
                 "rules": [{"backendRefs": [{"name": "web", "port": 80, "weight": 1},
                                            {"name": "web-v2", "port": 80, "weight": 1}]}]}}
    custom(api, ns, "gateway.networking.k8s.io", "v1", "httproutes", route)
    core.create_namespaced_pod(ns, {
        "metadata": {"name": "web-1", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "image": "app",
                                 "ports": [{"name": "http", "containerPort": 8080}]}]}})
    core.patch_namespaced_pod_status("web-1", ns, {"status": {
        "phase": "Running", "podIP": "10.244.77.5", "podIPs": [{"ip": "10.244.77.5"}]}})
    custom(api, ns, "policy.linkerd.io", "v1beta3", "servers", {
        "apiVersion": "policy.linkerd.io/v1beta3", "kind": "Server",
        "metadata": {"name": "web-http"},
        "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "port": "http",
                 "proxyProtocol": "HTTP/1"}})

    source = KubeSource(kubeconfig=str(kube_apiserver.kubeconfig_path))
    app = loopback_app(source)
    await app.start()
    try:
        async with channel_to(app) as ch:
            stream = watch_addr(ch, ip, 80, workload=f'{{"ns":"{ns}","pod":"client"}}')
            policy = await stream.next(WAIT)
            (r,) = policy.protocol.detect.http1.routes
            assert (r.metadata.resource.group, r.metadata.resource.name) == (
                "gateway.networking.k8s.io", "split")
            weights = [b.weight for b in r.rules[0].backends.random_available.backends]
            assert weights == [1, 1]

            objs = client.CustomObjectsApi(api)
            route["spec"]["rules"][0]["backendRefs"][1]["weight"] = 9
            # A merge patch of the spec, as `kubectl patch` sends: meshbridge's route
            # status writer patches the same object, so a replace carrying the
            # resourceVersion read a moment before can meet a 409 Conflict.
            objs.patch_namespaced_custom_object(
                "gateway.networking.k8s.io", "v1", ns, "httproutes", "split",
                {"spec": route["spec"]}, _content_type="application/merge-patch+json")
            deadline = time.monotonic() + WAIT
            while True:
                pushed = await stream.next(max(0.1, deadline - time.monotonic()))
                backends = pushed.protocol.detect.http1.routes[0].rules[0] \
                    .backends.random_available.backends
                if [b.weight for b in backends] == [1, 9]:
                    break
            stream.cancel()

            server = await watch_port(ch, f'{{"ns":"{ns}","pod":"web-1"}}', 8080).next(WAIT)
            assert server.labels["name"] == "web-http"
            assert server.protocol.WhichOneof("kind") == "http1"
            assert list(server.authorizations) == []  # a Server alone admits no one
    finally:
        await app.stop(0.2)
        with contextlib.suppress(client.ApiException):
            core.delete_namespace(ns)
