"""How the kube source reads a big cluster, against a real kube-apiserver: each kind's
state streamed by its watch (WatchList) or, where the server cannot, listed in pages;
the API's protobuf for its built-in kinds, decoding to what its JSON decodes to; a
pod kept as far as it is read. Behaviour, not timing (bench.big_cluster has that)."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from bridge.cluster import Cluster
from bridge.objects import Pod, decode_object, object_key
from bridge.sources import kube as kube_source
from bridge.sources import kube_wire
from bridge.sources.kube import KINDS, KindWatcher
from bridge.sources.kube_api import ApiClient, load_credentials
from testkit import kubeapi
from testkit.kubeapi import KubeAPIServer
from testkit.polling import HANG, eventually_sync

kube_apiserver = kubeapi.kube_apiserver  # the shared session fixture

PROXY_ENV = {"LINKERD2_PROXY_INBOUND_LISTEN_ADDR": "[::]:4143",
             "LINKERD2_PROXY_ADMIN_LISTEN_ADDR": "[::]:4191",
             "LINKERD2_PROXY_CONTROL_LISTEN_ADDR": "[::]:4190"}


class Api:
    """Writes objects through the API server's REST interface, in a namespace of its own."""

    def __init__(self, server: KubeAPIServer) -> None:
        self.client = ApiClient(load_credentials(str(server.kubeconfig_path)))
        self.ns = f"s-{uuid.uuid4().hex[:8]}"
        self.post("/api/v1/namespaces", {"metadata": {"name": self.ns}})

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self.client.post_json(path.replace("{ns}", self.ns), body)

    def pod(self, name: str, ip: str, **extra_env: str) -> None:
        env: list[dict[str, Any]] = [{"name": k, "value": v}
                                     for k, v in {**PROXY_ENV, **extra_env}.items()]
        env.append({"name": "POD_NAME", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.name"}}})
        self.post("/api/v1/namespaces/{ns}/pods", {
            "metadata": {"name": name, "labels": {"app": "web", "pod-template-hash": "abc",
                                                  "linkerd.io/control-plane-ns": "linkerd"},
                         "annotations": {"config.linkerd.io/opaque-ports": "9090",
                                         "linkerd.io/proxy-version": "edge",
                                         "kubectl.kubernetes.io/restartedAt": "now"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                              "name": "web-abc", "uid": "u-1"}]},
            "spec": {"nodeName": "n1", "serviceAccountName": "web", "initContainers": [
                {"name": "linkerd-init", "image": "init"}], "containers": [
                {"name": "app", "image": "app", "env": [{"name": "MODE", "value": "x"}],
                 "ports": [{"name": "http", "containerPort": 8080},
                           {"name": "grpc", "containerPort": 9090, "hostPort": 19090}],
                 "readinessProbe": {"httpGet": {"port": "http", "path": "/ready?full=1"}}},
                {"name": "linkerd-proxy", "image": "proxy", "env": env,
                 "ports": [{"name": "linkerd-admin", "containerPort": 4191}],
                 "livenessProbe": {"httpGet": {"port": 4191, "path": "/live"}}}]}})
        self.client.patch_json(f"/api/v1/namespaces/{self.ns}/pods/{name}/status", {
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                       "hostIP": "172.20.0.1"}})


@pytest.fixture
def api(kube_apiserver: KubeAPIServer) -> Api:
    return Api(kube_apiserver)


def watcher(server: KubeAPIServer, kind: str) -> tuple[KindWatcher, list[Any]]:
    """A kind's watcher on its own thread, what it hands the loop kept in a list."""
    seen: list[Any] = []
    w = KindWatcher(KINDS[kind], ApiClient(load_credentials(str(server.kubeconfig_path))),
                    seen.append, None)
    return w, seen


@pytest.fixture
def running(kube_apiserver: KubeAPIServer) -> Iterator[Callable[..., tuple[KindWatcher,
                                                                          list[Any]]]]:
    started: list[KindWatcher] = []

    def start(kind: str, server: KubeAPIServer = kube_apiserver) -> tuple[KindWatcher,
                                                                          list[Any]]:
        w, seen = watcher(server, kind)
        w.start()
        started.append(w)
        return w, seen

    yield start
    for w in started:
        w.stop()


def mine(items: list[Any], ns: str) -> list[Any]:
    return [o for o in items if o.meta.namespace == ns]


def test_each_kind_decodes_the_same_from_protobuf_and_from_json(
        api: Api, kube_apiserver: KubeAPIServer) -> None:
    api.pod("web-1", "10.3.0.1")
    api.post("/api/v1/namespaces/{ns}/services", {
        "metadata": {"name": "web", "annotations": {"config.linkerd.io/opaque-ports": "9090"}},
        "spec": {"internalTrafficPolicy": "Local", "ports": [
            {"name": "http", "port": 80, "targetPort": "http", "appProtocol": "http"},
            {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 5353}]}})
    api.post("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", {
        "metadata": {"name": "web-a", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "appProtocol": "h2"}],
        "endpoints": [
            {"addresses": ["10.3.0.1"], "conditions": {"ready": True}, "zone": "zone-a",
             "nodeName": "n1", "hints": {"forZones": [{"name": "zone-a"}]},
             "targetRef": {"kind": "Pod", "name": "web-1", "namespace": api.ns}},
            {"addresses": ["10.3.0.2"], "hostname": "web-2",
             "conditions": {"ready": False, "serving": True, "terminating": True}}]})
    api.post("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", {
        "metadata": {"name": "web-v6", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv6", "endpoints": [{"addresses": ["fd00::1"]}]})
    api.post("/api/v1/namespaces/{ns}/endpoints", {
        "metadata": {"name": "web"}, "subsets": [{
            "addresses": [{"ip": "10.3.0.1", "nodeName": "n1", "targetRef": {
                "kind": "Pod", "name": "web-1", "namespace": api.ns}}],
            "notReadyAddresses": [{"ip": "10.3.0.2", "hostname": "web-2"}],
            "ports": [{"name": "http", "port": 8080}]}]})
    api.post("/apis/apps/v1/namespaces/{ns}/replicasets", {
        "metadata": {"name": "web-abc", "labels": {"app": "web"}, "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "u-2"}]},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {
            "metadata": {"labels": {"app": "web"}},
            "spec": {"containers": [{"name": "app", "image": "app"}]}}}})
    node = f"{api.ns}-n"
    api.post("/api/v1/nodes", {"metadata": {"name": node, "labels": {
        "topology.kubernetes.io/zone": "zone-a", "topology.kubernetes.io/region": "r"}}})
    try:
        for kind in ("Pod", "Service", "EndpointSlice", "Endpoints", "ReplicaSet", "Node"):
            decoded = {}
            for accept in (kube_wire.JSON, kube_wire.PROTOBUF):
                resp = api.client.open(KINDS[kind].path, {}, 30.0, accept=accept)
                try:
                    page = kube_wire.decode_list(kind, resp.read(),
                                                 resp.headers.get("Content-Type"))
                finally:
                    resp.release_conn()
                assert kube_wire.is_protobuf(resp.headers.get("Content-Type")) == (
                    accept == kube_wire.PROTOBUF), kind
                objs = [decode_object(raw, kind=kind) for raw in page.items]
                decoded[accept] = {object_key(o): o for o in objs
                                   if o is not None and (o.meta.namespace == api.ns
                                                         or o.meta.name == node)}
            assert decoded[kube_wire.JSON], kind
            assert decoded[kube_wire.PROTOBUF] == decoded[kube_wire.JSON], kind
    finally:
        api.client.pool.request("DELETE", api.client.creds.host + f"/api/v1/nodes/{node}",
                                headers=api.client.creds.headers)


def test_a_pod_is_kept_as_far_as_it_is_read(api: Api, kube_apiserver: KubeAPIServer,
                                            running: Callable[..., Any]) -> None:
    api.pod("web-1", "10.3.0.1", LINKERD2_PROXY_LOG="debug")
    w, seen = running("Pod")
    eventually_sync(lambda: w.synced, HANG)
    (pod,) = mine(seen[0][2], api.ns)
    assert isinstance(pod, Pod)
    # The annotations read (config.linkerd.io/*), the proxy's listen addresses, no other
    # environment, no field of the API's own; the rest as it was written.
    assert dict(pod.meta.annotations) == {"config.linkerd.io/opaque-ports": "9090"}
    app, proxy = pod.containers
    assert dict(app.env) == {} and dict(proxy.env) == PROXY_ENV
    assert [(p.name, p.container_port, p.host_port) for p in app.ports] == [
        ("http", 8080, 0), ("grpc", 9090, 19090)]
    assert app.http_probes == (("http", "/ready"),) and proxy.http_probes == ((4191, "/live"),)
    assert [c.name for c in pod.init_containers] == ["linkerd-init"]
    assert (pod.service_account, pod.node_name, pod.pod_ips, pod.host_ip) == (
        "web", "n1", ("10.3.0.1",), "172.20.0.1")
    assert [(o.kind, o.name) for o in pod.meta.owners] == [("ReplicaSet", "web-abc")]
    # A workload's pods share what they have equal.
    api.pod("web-2", "10.3.0.2")

    def web2() -> Pod | None:  # once it has its IP (created without one, it is skipped)
        return next((i[1].obj for i in seen if i[0] == "event" and i[1].obj.pod_ips
                     and i[1].obj.meta.name == "web-2"), None)

    eventually_sync(lambda: web2() is not None, HANG)
    other = web2()
    assert other is not None
    assert other.meta.labels is pod.meta.labels and other.meta.owners is pod.meta.owners
    assert other.containers[0] is pod.containers[0]


def test_the_state_is_streamed_and_changes_follow_on_the_same_watch(
        api: Api, running: Callable[..., Any]) -> None:
    for i in range(5):
        api.pod(f"web-{i}", f"10.3.1.{i + 1}")
    w, seen = running("Pod")
    eventually_sync(lambda: w.synced, HANG)
    assert w.watch_list is True and w.relists == 1
    assert [item[0] for item in seen] == ["replace"]
    assert {p.meta.name for p in mine(seen[0][2], api.ns)} == {f"web-{i}" for i in range(5)}
    assert w.resource_version  # from the bookmark that ended the initial state
    api.pod("web-5", "10.3.1.6")
    eventually_sync(lambda: any(i[0] == "event" and i[1].obj.meta.name == "web-5"
                                and i[1].obj.meta.namespace == api.ns and i[1].obj.pod_ips
                                for i in seen), 30)
    assert w.relists == 1  # the change came on the watch, not by listing again


@pytest.fixture(scope="module")
def no_watch_list() -> Iterator[KubeAPIServer]:
    """An API server that cannot stream a watch's initial state (as before 1.27, or
    with the feature off)."""
    with KubeAPIServer(extra_apiserver_args=["--feature-gates=WatchList=false"]) as server:
        yield server


def test_a_server_that_cannot_stream_is_listed_in_pages(
        no_watch_list: KubeAPIServer, running: Callable[..., Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube_source, "LIST_PAGE", 2)  # five pods: three pages
    api = Api(no_watch_list)
    for i in range(5):
        api.pod(f"web-{i}", f"10.3.2.{i + 1}")
    w, seen = running("Pod", no_watch_list)
    eventually_sync(lambda: w.synced, 60)
    assert w.watch_list is False
    assert {p.meta.name for p in mine(seen[0][2], api.ns)} == {f"web-{i}" for i in range(5)}
    api.pod("web-5", "10.3.2.6")  # and the watch from the list's version follows changes
    eventually_sync(lambda: any(i[0] == "event" and i[1].obj.meta.name == "web-5"
                                and i[1].obj.pod_ips for i in seen), 30)


async def test_the_cache_built_from_a_stream_equals_the_one_from_pages(
        api: Api, kube_apiserver: KubeAPIServer, no_watch_list: KubeAPIServer) -> None:
    """Both ways of reading the state give one Cluster (the same objects applied)."""
    for server in (kube_apiserver, no_watch_list):
        target = Api(server) if server is no_watch_list else api
        for i in range(3):
            target.pod(f"web-{i}", f"10.3.3.{i + 1}")
    caches = []
    for server, ns in ((kube_apiserver, api.ns), (no_watch_list, None)):
        w, seen = watcher(server, "Pod")
        w.start()
        try:
            await asyncio.to_thread(eventually_sync, functools.partial(getattr, w, "synced"),
                                    60)
        finally:
            w.stop()
        cluster = Cluster()
        cluster.replace("Pod", [o for o in seen[0][2] if o.meta.name.startswith("web-")
                                and (ns is None or o.meta.namespace == ns)
                                and o.pod_ips[0].startswith("10.3.3.")])
        caches.append({p.meta.name: (p.pod_ips, p.containers, dict(p.meta.annotations))
                       for p in cluster.pods.values()})
    assert caches[0] == caches[1] and len(caches[0]) == 3
