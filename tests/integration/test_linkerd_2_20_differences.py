"""What issue 17 found beside Linkerd 2.20's own controller, on a real kube-apiserver
where it matters: the mirror set labels (row 2), the watch hand-off (row 9) and the
profile_ref kind in `linkerd-2.20` mode (row 8). docs/linkerd.md keeps the table."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from bridge.cluster import Cluster
from bridge.sources.kube import KubeSource
from linkerd_api.endpoint_streams import Semantics
from linkerd_api.proto import destination_pb2 as dst
from linkerd_api.service import LinkerdOptions
from meshbridge.app import App
from testkit import kubeapi
from testkit.kubeapi import KubeAPIServer
from testkit.linkerd import Stream, channel_to
from testkit.polling import HANG, eventually
from testkit.serving import Apps

kube_apiserver = kubeapi.kube_apiserver  # the shared session fixture

AppFactory = Any
WAIT = HANG


@pytest.fixture
def ns(kube_apiserver: KubeAPIServer) -> Iterator[tuple[client.CoreV1Api, client.DiscoveryV1Api,
                                                        str]]:
    api = config.new_client_from_config(str(kube_apiserver.kubeconfig_path))
    core, disc = client.CoreV1Api(api), client.DiscoveryV1Api(api)
    name = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    yield core, disc, name
    api.close()


@pytest.fixture
def kube_app(kube_apiserver: KubeAPIServer, apps: Apps) -> Callable[[], Any]:
    async def start() -> App:
        return await apps.start(KubeSource(kubeconfig=str(kube_apiserver.kubeconfig_path)))

    return start


def mirror_slice(name: str, service: str, ip: str, cluster_label: bool) -> dict[str, Any]:
    labels = {"kubernetes.io/service-name": service}
    if cluster_label:
        labels["mirror.linkerd.io/cluster-name"] = "east"
    return {"metadata": {"name": name, "labels": labels, "annotations": {
                "mirror.linkerd.io/remote-svc-fq-name": f"{service}.app.svc.east.example"}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}]}


async def test_the_remote_fqn_annotation_alone_adds_no_target_labels(
    ns: tuple[client.CoreV1Api, client.DiscoveryV1Api, str], kube_app: Callable[[], Any]
) -> None:
    """Row 2: Linkerd reads the FQN annotation only on a slice with the cluster-name
    label; without it the set labels are the service and its namespace."""
    core, disc, name = ns
    for svc, labelled in (("plain", False), ("mirror", True)):
        core.create_namespaced_service(name, {"metadata": {"name": svc}, "spec": {
            "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
        disc.create_namespaced_endpoint_slice(
            name, mirror_slice(f"{svc}-a", svc, "10.7.0.1" if labelled else "10.7.0.2", labelled))
    app = await kube_app()
    async with channel_to(app) as ch:
        plain = await Stream(ch, "Get", f"plain.{name}.svc.cluster.local:80").next()
        mirrored = await Stream(ch, "Get", f"mirror.{name}.svc.cluster.local:80").next()
    assert dict(plain.add.metric_labels) == {"service": "plain", "namespace": name}
    assert dict(mirrored.add.metric_labels) == {
        "service": "mirror", "namespace": name, "target_cluster": "east",
        "target_service": "mirror", "target_service_namespace": "app"}


async def test_a_watch_event_is_applied_by_the_wake_up_itself_with_no_cache_scan(
    ns: tuple[client.CoreV1Api, client.DiscoveryV1Api, str], kube_app: Callable[[], Any],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row 9: an event read by a watch thread reaches the Cluster in the callback its
    `call_soon_threadsafe` schedules (no task waiting on a queue, no timer), and the
    cache-size gauges are not recounted on that path (they count when scraped)."""
    core, disc, name = ns
    core.create_namespaced_service(name, {"metadata": {"name": "web"}, "spec": {
        "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
    body = mirror_slice("web-a", "web", "10.7.1.1", cluster_label=False)
    disc.create_namespaced_endpoint_slice(name, body)
    app = await kube_app()
    applied_in: list[asyncio.Task[Any] | None] = []
    scans: list[str] = []
    apply, objects = Cluster.apply, Cluster.objects

    def recording_apply(self: Cluster, events: Any) -> Any:
        if any(getattr(e.obj.meta, "namespace", "") == name for e in events):
            applied_in.append(asyncio.current_task())
        return apply(self, events)

    def recording_objects(self: Cluster, kind: str) -> Any:
        scans.append(kind)
        return objects(self, kind)

    monkeypatch.setattr(Cluster, "apply", recording_apply)
    monkeypatch.setattr(Cluster, "objects", recording_objects)
    body["endpoints"].append({"addresses": ["10.7.1.2"], "conditions": {"ready": True}})
    disc.replace_namespaced_endpoint_slice("web-a", name, body)
    await eventually(lambda: bool(applied_in), WAIT)
    assert applied_in == [None]  # a loop callback, not a task resumed by a queue
    assert scans == []
    monkeypatch.setattr(Cluster, "objects", objects)
    assert (app.metrics.get_sample_value("endpointslices_cache_size", {"cluster": "local"})
            or 0) >= 1


@pytest.mark.parametrize(("semantics", "kind"), [("proto", "ServiceProfile"),
                                                  ("linkerd-2.20", "")])
async def test_profile_ref_kind_is_empty_in_linkerd_2_20_mode(
    make_app: AppFactory, demo_dir: Path, semantics: Semantics, kind: str
) -> None:
    """Row 8: Linkerd 2.20 copies the ServiceProfile's TypeMeta kind, which its informer
    cache leaves empty; `linkerd-2.20` mode sends the same, `proto` names the kind."""
    app = await make_app(demo_dir, layer_options=(LinkerdOptions(semantics=semantics),))
    async with channel_to(app) as ch:
        p: dst.DestinationProfile = await Stream(
            ch, "GetProfile", "web.emojivoto.svc.cluster.local:80").next()
    ref = p.profile_ref.resource
    assert (ref.group, ref.kind, ref.namespace) == ("linkerd.io", kind, "emojivoto")
    assert ref.name == "web.emojivoto.svc.cluster.local"
