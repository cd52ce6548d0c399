"""The kube source against a real kube-apiserver + etcd (testkit/kubeapi.py)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from kubernetes import client, config

from bridge.model import FilterKey, ServiceKey, ViewKey
from bridge.sources.kube import BACKOFF_CAP, KubeSource
from bridge.views import View
from harness.clients import LinkerdClient, XdsClient
from meshbridge.app import App
from testkit import kubeapi
from testkit.kubeapi import KubeAPIServer
from testkit.polling import HANG, eventually
from testkit.recorders import ViewRecorder
from testkit.serving import Apps
from xds_api.service import XdsOptions

kube_apiserver = kubeapi.kube_apiserver  # the shared session fixture

LINKERD_METADATA = XdsOptions(endpoint_metadata="linkerd")
WAIT = HANG  # a write reaching the clients through a real API server: waited for, never timed


@pytest.fixture
def api(kube_apiserver: KubeAPIServer) -> Iterator[client.ApiClient]:
    c = config.new_client_from_config(str(kube_apiserver.kubeconfig_path))
    yield c
    c.close()


class Objects:
    """Creates discovery objects through the API, in a namespace of its own."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.discovery = client.DiscoveryV1Api(api)
        self.ns = f"t-{uuid.uuid4().hex[:8]}"
        self.nodes: list[str] = []
        self.core.create_namespace({"metadata": {"name": self.ns}})

    def node(self, zone: str) -> str:
        name = f"{self.ns}-{zone}"
        self.core.create_node({"metadata": {"name": name,
                                            "labels": {"topology.kubernetes.io/zone": zone}}})
        self.nodes.append(name)
        return name

    def pod(self, name: str, ip: str, node: str, meshed: bool = True) -> None:
        labels = {"app": "web"}
        containers: list[dict[str, Any]] = [
            {"name": "app", "image": "app", "ports": [{"name": "http", "containerPort": 8080}]}]
        if meshed:
            labels["linkerd.io/control-plane-ns"] = "linkerd"
            containers.append({"name": "linkerd-proxy", "image": "proxy", "env": [
                {"name": "LINKERD2_PROXY_INBOUND_LISTEN_ADDR", "value": "0.0.0.0:4143"},
                {"name": "LINKERD2_PROXY_ADMIN_LISTEN_ADDR", "value": "0.0.0.0:4191"},
                {"name": "LINKERD2_PROXY_CONTROL_LISTEN_ADDR", "value": "0.0.0.0:4190"}]})
        self.core.create_namespaced_pod(self.ns, {
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": node, "serviceAccountName": "web", "containers": containers},
        })
        self.core.patch_namespaced_pod_status(name, self.ns, {"status": {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}})

    def service(self, name: str = "web") -> None:
        self.core.create_namespaced_service(self.ns, {
            "metadata": {"name": name},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
        })

    def slice_body(self, name: str, pods: list[tuple[str, str]],
                   service: str = "web") -> dict[str, Any]:
        return {
            "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": True},
                           "targetRef": {"kind": "Pod", "name": pod, "namespace": self.ns}}
                          for pod, ip in pods],
        }

    def put_slice(self, name: str, pods: list[tuple[str, str]]) -> None:
        kubeapi.put_endpoint_slice(self.discovery, self.ns, self.slice_body(name, pods))

    def cleanup(self) -> None:
        for n in self.nodes:
            with contextlib.suppress(client.ApiException):
                self.core.delete_node(n)


@pytest.fixture
def objs(api: client.ApiClient) -> Iterator[Objects]:
    o = Objects(api)
    yield o
    o.cleanup()


@pytest.fixture
def start_app(kube_apiserver: KubeAPIServer, apps: Apps) -> Callable[..., Any]:
    async def start(**source_options: Any) -> App:
        source = KubeSource(kubeconfig=str(kube_apiserver.kubeconfig_path), **source_options)
        # Clients are compared field for field, identity and hints included: over xDS
        # those travel in the linkerd endpoint metadata profile.
        return await apps.start(source, layer_options=(LINKERD_METADATA,))

    return start


def watch(app: App, ns: str, service: str = "web") -> tuple[View, ViewRecorder]:
    rec = ViewRecorder()
    view = app.views.subscribe(ViewKey(ServiceKey(ns, service), 80, FilterKey()), rec, "test")
    return view, rec


def served(view: View) -> set[str]:
    return {r.endpoint.ip for r in view.snapshot.values() if r.endpoint.ready}


def addresses(client: LinkerdClient | XdsClient, target: str) -> set[str]:
    return {e.address for e in client.state[target].state()}


async def test_get_and_ads_clients_receive_what_the_api_holds_and_follow_scaling(
    objs: Objects, start_app: Callable[..., Any]
) -> None:
    node = objs.node("zone-a")
    objs.pod("web-1", "10.1.0.1", node)
    objs.pod("web-2", "10.1.0.2", node, meshed=False)
    objs.service()
    objs.put_slice("web-a", [("web-1", "10.1.0.1")])
    app = await start_app()
    target = f"web.{objs.ns}.svc.cluster.local:80"
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        get = LinkerdClient(channel, [target])
        ads = XdsClient(channel, [target], delta=True)
        tasks = [asyncio.create_task(get.run()), asyncio.create_task(ads.run())]
        try:
            both = (get, ads)
            await eventually(lambda: all(addresses(c, target) == {"10.1.0.1"} for c in both),
                             WAIT)
            (ep,) = get.state[target].state()
            assert ep.identity == f"web.{objs.ns}.serviceaccount.identity.linkerd.cluster.local"
            assert ep.port == 8080 and ep.hint == "h2" and ep.opaque_transport == 4143
            assert ads.state[target].state() == get.state[target].state()
            objs.put_slice("web-a", [("web-1", "10.1.0.1"), ("web-2", "10.1.0.2")])
            await eventually(lambda: all(addresses(c, target) == {"10.1.0.1", "10.1.0.2"}
                                         for c in both), WAIT)
            unmeshed = [e for e in get.state[target].state() if e.address == "10.1.0.2"]
            assert unmeshed[0].identity == "" and unmeshed[0].hint == ""
            objs.put_slice("web-a", [("web-2", "10.1.0.2")])
            await eventually(lambda: all(addresses(c, target) == {"10.1.0.2"} for c in both),
                             WAIT)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    assert app.source.stale is False


async def test_moving_an_endpoint_between_slices_causes_no_flap(
    objs: Objects, start_app: Callable[..., Any]
) -> None:
    node = objs.node("zone-a")
    objs.pod("web-1", "10.1.0.1", node)
    objs.pod("web-2", "10.1.0.2", node)
    objs.service()
    objs.put_slice("web-a", [("web-1", "10.1.0.1"), ("web-2", "10.1.0.2")])
    app = await start_app()
    view, rec = watch(app, objs.ns)
    assert served(view) == {"10.1.0.1", "10.1.0.2"}
    objs.put_slice("web-b", [("web-2", "10.1.0.2")])
    objs.put_slice("web-a", [("web-1", "10.1.0.1")])
    # Wait until the cache has seen both writes, then check nothing was published.
    await eventually(lambda: len(app.cluster.slices_of(ServiceKey(objs.ns, "web"))) == 2
                     and len(app.cluster.slices[("EndpointSlice", objs.ns, "web-a")]
                             .endpoints) == 1, WAIT)
    assert rec.changes == []
    assert served(view) == {"10.1.0.1", "10.1.0.2"}


async def test_an_api_outage_keeps_the_last_state_then_converges(
    objs: Objects, start_app: Callable[..., Any], kube_apiserver: KubeAPIServer
) -> None:
    node = objs.node("zone-a")
    objs.pod("web-1", "10.1.0.1", node)
    objs.pod("web-2", "10.1.0.2", node)
    objs.service()
    objs.put_slice("web-a", [("web-1", "10.1.0.1")])
    app = await start_app()
    view, _ = watch(app, objs.ns)
    kube_apiserver.stop_apiserver()
    try:
        await eventually(lambda: app.source.stale, timeout=HANG)
        assert served(view) == {"10.1.0.1"}  # proxies keep the last-known truth
    finally:
        kube_apiserver.start_apiserver()
    objs.put_slice("web-a", [("web-1", "10.1.0.1"), ("web-2", "10.1.0.2")])
    await eventually(lambda: served(view) == {"10.1.0.1", "10.1.0.2"}, timeout=HANG)
    await eventually(lambda: not app.source.stale, timeout=HANG)


async def test_a_410_relist_sends_no_spurious_updates(
    objs: Objects, start_app: Callable[..., Any], kube_apiserver: KubeAPIServer
) -> None:
    node = objs.node("zone-a")
    objs.pod("web-1", "10.1.0.1", node)
    objs.service()
    objs.put_slice("web-a", [("web-1", "10.1.0.1")])
    app = await start_app()
    source = app.source
    assert isinstance(source, KubeSource)
    view, rec = watch(app, objs.ns)
    target = f"web.{objs.ns}.svc.cluster.local:80"
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}")
    get = LinkerdClient(channel, [target])
    get_task = asyncio.create_task(get.run())
    await eventually(lambda: addresses(get, target) == {"10.1.0.1"}, WAIT)
    messages = get.messages
    before = {w.spec.kind: w.relists for w in source.watchers}
    # Break every watch while etcd compacts past their resourceVersions: each must
    # come back with 410 Gone and relist.
    kube_apiserver.stop_apiserver()
    try:
        kube_apiserver.compact_etcd()
    finally:
        kube_apiserver.start_apiserver()
    await eventually(lambda: all(w.relists > before[w.spec.kind] for w in source.watchers
                                 if w.spec.kind in ("Service", "EndpointSlice", "Pod")),
                     timeout=HANG)
    assert rec.changes == []
    assert served(view) == {"10.1.0.1"}
    assert get.messages == messages  # no remove/add reached the Get stream
    # And the watches that follow the relist still deliver changes.
    objs.pod("web-2", "10.1.0.2", node)
    objs.put_slice("web-a", [("web-1", "10.1.0.1"), ("web-2", "10.1.0.2")])
    await eventually(lambda: served(view) == {"10.1.0.1", "10.1.0.2"}, timeout=HANG)
    await eventually(lambda: addresses(get, target) == {"10.1.0.1", "10.1.0.2"}, WAIT)
    get_task.cancel()
    await asyncio.gather(get_task, return_exceptions=True)
    await channel.close()


async def test_endpoints_api_mode_watches_v1_endpoints(
    objs: Objects, start_app: Callable[..., Any], api: client.ApiClient
) -> None:
    node = objs.node("zone-a")
    objs.pod("web-1", "10.1.0.1", node)
    objs.service()
    objs.core.create_namespaced_endpoints(objs.ns, {
        "metadata": {"name": "web"},
        "subsets": [{"addresses": [{"ip": "10.1.0.1", "targetRef": {
            "kind": "Pod", "name": "web-1", "namespace": objs.ns}}],
            "ports": [{"name": "http", "port": 8080}]}],
    })
    # A slice that disagrees, to prove the Endpoints API is the one read.
    objs.put_slice("web-a", [("web-1", "10.1.0.99")])
    app = await start_app(endpoints_api="endpoints")
    view, _ = watch(app, objs.ns)
    assert served(view) == {"10.1.0.1"}
    assert {r.id.family for r in view.snapshot.values()} == {""}


async def test_informer_lag_and_cache_size_metrics_move(
    objs: Objects, start_app: Callable[..., Any]
) -> None:
    node = objs.node("zone-a")
    objs.pod("web-1", "10.1.0.1", node)
    objs.service()
    objs.put_slice("web-a", [("web-1", "10.1.0.1")])
    app = await start_app()

    def sample(name: str, labels: dict[str, str] | None = None) -> float:
        return app.metrics.get_sample_value(name, labels or {}) or 0.0

    assert sample("pod_cache_size", {"cluster": "local"}) >= 1
    assert sample("endpointslices_cache_size", {"cluster": "local"}) >= 1
    before = sample("endpointslices_informer_lag_seconds_count")
    # managedFields times have one-second resolution and Linkerd observes the lag only
    # when that time changes: let the clock reach the next second before writing again.
    written = int(time.time())
    await eventually(lambda: int(time.time()) > written, WAIT)
    objs.put_slice("web-a", [("web-1", "10.1.0.1"), ("web-2", "10.1.0.2")])
    await eventually(lambda: sample("endpointslices_informer_lag_seconds_count") > before,
                     WAIT)
    # The lag is measured from the write's managedFields time: seconds, not hours.
    assert sample("endpointslices_informer_lag_seconds_sum") < 3600


async def test_a_relist_and_an_outage_during_churn_leave_every_client_on_the_truth(
    objs: Objects, start_app: Callable[..., Any], kube_apiserver: KubeAPIServer
) -> None:
    """Slices of three services change all the time while the watches are broken by
    an etcd compaction (410 Gone, relist) and then by an API outage; the churn goes on
    throughout (its writes fail while the API is down). Afterwards every Get, SotW
    and delta client holds exactly what the API holds."""
    node = objs.node("zone-a")
    pods = [(f"web-{i}", f"10.2.0.{i + 1}") for i in range(8)]
    for name, ip in pods:
        objs.pod(name, ip, node)
    services = ("alpha", "beta", "gamma")

    def put(service: str, chosen: list[tuple[str, str]]) -> None:
        kubeapi.put_endpoint_slice(objs.discovery, objs.ns,
                                   objs.slice_body(f"{service}-a", chosen, service=service))

    for i, svc in enumerate(services):
        objs.service(svc)
        put(svc, pods[i:i + 2])
    app = await start_app()
    source = app.source
    assert isinstance(source, KubeSource)
    targets = [f"{svc}.{objs.ns}.svc.cluster.local:80" for svc in services]
    rng = random.Random(11)
    writes = 0

    def delete(service: str) -> None:
        try:
            objs.discovery.delete_namespaced_endpoint_slice(f"{service}-a", objs.ns)
        except client.ApiException as e:
            if e.status != 404:
                raise

    async def churn() -> None:
        nonlocal writes
        while True:
            svc = rng.choice(services)
            chosen = rng.sample(pods, rng.randint(1, 5))
            try:
                if rng.random() < 0.2:  # the slice goes away (all endpoints gone)
                    await asyncio.to_thread(delete, svc)
                else:
                    await asyncio.to_thread(put, svc, chosen)
                writes += 1
            except Exception:  # the API is down: the next write will tell
                await asyncio.sleep(0.1)  # pacing a retry, not synchronisation
            await asyncio.sleep(0.02)  # the churn's rate

    def truth() -> dict[str, set[str]]:
        held = {}
        for svc, target in zip(services, targets, strict=True):
            listed = objs.discovery.list_namespaced_endpoint_slice(
                objs.ns, label_selector=f"kubernetes.io/service-name={svc}").items
            held[target] = {a for s in listed for e in s.endpoints or () for a in e.addresses}
        return held

    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        clients: list[LinkerdClient | XdsClient] = [
            *(LinkerdClient(channel, [t], i) for i, t in enumerate(targets)),
            XdsClient(channel, targets, 10, node_id="sotw"),
            XdsClient(channel, targets, 11, delta=True, node_id="delta")]
        tasks = [asyncio.create_task(c.run()) for c in clients]
        churning = asyncio.create_task(churn())
        try:
            await eventually(lambda: writes >= 20, timeout=HANG)
            before = {w.spec.kind: w.relists for w in source.watchers}
            # In threads, so that the churn (and meshbridge) run on meanwhile.
            await asyncio.to_thread(kube_apiserver.stop_apiserver)
            try:
                await asyncio.to_thread(kube_apiserver.compact_etcd)
            finally:
                await asyncio.to_thread(kube_apiserver.start_apiserver)
            await eventually(lambda: all(w.relists > before[w.spec.kind]
                                         for w in source.watchers
                                         if w.spec.kind in ("EndpointSlice", "Pod")),
                             timeout=60)
            after_relist = writes
            await eventually(lambda: writes >= after_relist + 20, timeout=HANG)
            await asyncio.to_thread(kube_apiserver.stop_apiserver)
            try:
                await eventually(lambda: source.stale, timeout=HANG)
            finally:
                await asyncio.to_thread(kube_apiserver.start_apiserver)
            after_outage = writes
            await eventually(lambda: writes >= after_outage + 20, timeout=60)
        finally:
            churning.cancel()
            await asyncio.gather(churning, return_exceptions=True)
        expected = await asyncio.to_thread(truth)

        def wrong() -> list[str]:
            return [f"{type(c).__name__} {t}: {sorted(addresses(c, t))} != "
                    f"{sorted(expected[t])}" for c in clients for t in c.targets
                    if addresses(c, t) != expected[t]]

        try:
            await eventually(lambda: not wrong(), 60, lambda: "; ".join(wrong()))
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    # Each kind's watcher reconnects after its own back-off (which grew during the
    # outage, up to BACKOFF_CAP): the source is current again once every one has.
    await eventually(lambda: not source.stale, timeout=BACKOFF_CAP + 30,
                     why=lambda: "still disconnected: " + ", ".join(
                         w.spec.kind for w in source.watchers if w.synced and not w.connected))
