"""The service mirror against two real kube-apiservers: the local `<svc>-<cluster>` and
`<svc>-federated` Services follow the linked cluster's exported Services by Linkerd's
rules (docs/multicluster.md, "The mirror")."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import structlog
from kubernetes import client

from bridge.cluster import Cluster
from bridge.multicluster.mirror import (
    MirrorController,
    Writer,
    exported_services_source,
    local_kinds,
)
from bridge.multicluster.mirror_rules import LinkRules
from bridge.multicluster.store import ClusterStore
from bridge.sources.kube import KubeSource
from bridge.sources.kube_api import ApiClient, load_credentials
from testkit import kubeapi, multicluster
from testkit.kubeapi import KubeAPIServer
from testkit.multicluster import Objects
from testkit.polling import eventually

kube_apiserver = kubeapi.kube_apiserver
remote_apiserver = multicluster.remote_apiserver

WAIT = 20.0
EXPORTED = {"mirror.linkerd.io/exported": "remote-discovery"}
FEDERATED = {"mirror.linkerd.io/federated": "member"}


@dataclass
class Mirror:
    local: Objects
    east: Objects
    controller: MirrorController
    store: ClusterStore

    def get(self, name: str) -> client.V1Service | None:
        try:
            svc: client.V1Service = self.local.core.read_namespaced_service(name,
                                                                            self.local.ns)
        except client.ApiException as e:
            if e.status == 404:
                return None
            raise
        return svc


@pytest.fixture
async def mirror(kube_apiserver: KubeAPIServer,
                 remote_apiserver: KubeAPIServer) -> AsyncIterator[Mirror]:
    local = Objects(kube_apiserver)
    controller_ns = Objects(kube_apiserver)
    east = Objects(remote_apiserver, local.ns)
    creds = load_credentials(str(kube_apiserver.kubeconfig_path))
    cluster = Cluster()
    source = KubeSource(credentials=creds, kinds=local_kinds(controller_ns.ns))
    synced = asyncio.Event()
    tasks = [asyncio.create_task(source.run(cluster, synced))]
    await asyncio.wait_for(synced.wait(), WAIT)
    store = ClusterStore(cluster, controller_ns.ns, make_kube_source=exported_services_source)
    store.start()
    controller = MirrorController(cluster, store, Writer(ApiClient(creds)),
                                  lambda name: LinkRules(name, "east.example", rank=1),
                                  LinkRules(""))
    controller.start()
    tasks.append(asyncio.create_task(controller.run()))
    local.link_secret(controller_ns.ns, "east", remote_apiserver)
    try:
        yield Mirror(local, east, controller, store)
    finally:
        store.stop()
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for objs in (local, controller_ns, east):
            objs.close()


async def test_an_exported_service_is_mirrored_followed_and_removed(mirror: Mirror) -> None:
    m = mirror
    m.east.service("foo", selector={"app": "foo"},
                   labels={**EXPORTED, "app": "foo", "mirror.linkerd.io/other": "x"},
                   annotations={"config.linkerd.io/opaque-ports": "8080",
                                "service.kubernetes.io/topology-mode": "Auto"},
                   spec={"type": "NodePort"})
    m.east.service("not-exported", selector={"app": "x"})
    await eventually(lambda: m.get("foo-east") is not None, WAIT, "never mirrored")
    svc = m.get("foo-east")
    assert svc is not None
    remote = m.east.core.read_namespaced_service("foo", m.east.ns)
    assert svc.metadata.labels == {
        "app": "foo", "mirror.linkerd.io/mirrored-service": "true",
        "mirror.linkerd.io/cluster-name": "east",
        "multicluster.linkerd.io/remote-discovery": "east",
        "multicluster.linkerd.io/remote-service": "foo"}
    assert svc.metadata.annotations == {
        "config.linkerd.io/opaque-ports": "8080",
        "mirror.linkerd.io/remote-svc-fq-name": f"foo.{m.east.ns}.svc.east.example",
        "mirror.linkerd.io/remote-resource-version": remote.metadata.resource_version}
    assert svc.spec.type == "ClusterIP" and svc.spec.cluster_ip not in (None, "None")
    assert svc.spec.selector is None
    (port,) = svc.spec.ports
    assert (port.name, port.port, port.target_port, port.node_port) == ("http", 80, 8080, None)
    assert m.get("not-exported-east") is None
    # A remote change is followed.
    m.east.service("foo", selector={"app": "foo"}, labels={**EXPORTED, "app": "foo2"},
                   ports=((80, "http", 8080), (9090, "grpc", 9090)))
    await eventually(lambda: (s := m.get("foo-east")) is not None
                     and s.metadata.labels.get("app") == "foo2" and len(s.spec.ports) == 2,
                     WAIT, "the update never reached the mirror")
    # Unexported: the mirror goes.
    m.east.service("foo", selector={"app": "foo"}, labels={"app": "foo2"})
    await eventually(lambda: m.get("foo-east") is None, WAIT, "the mirror stayed")


async def test_members_join_and_leave_a_federated_service(mirror: Mirror) -> None:
    m = mirror
    m.east.service("bar", selector={"app": "bar"}, labels={**FEDERATED, "from": "east"})
    await eventually(lambda: m.get("bar-federated") is not None, WAIT, "never federated")
    fed = m.get("bar-federated")
    assert fed is not None
    assert fed.metadata.annotations == {"multicluster.linkerd.io/remote-discovery": "bar@east"}
    assert fed.metadata.labels == {"from": "east", "mirror.linkerd.io/mirrored-service": "true"}
    # The local member joins: it is the oldest, its metadata wins.
    m.local.service("bar", selector={"app": "bar"}, labels={**FEDERATED, "from": "local"})
    await eventually(lambda: (s := m.get("bar-federated")) is not None
                     and s.metadata.annotations.get(
                         "multicluster.linkerd.io/local-discovery") == "bar", WAIT)
    fed = m.get("bar-federated")
    assert fed is not None and fed.metadata.labels["from"] == "local"
    assert fed.metadata.annotations["multicluster.linkerd.io/remote-discovery"] == "bar@east"
    # East leaves; then the local member does too, and the federated Service goes.
    m.east.service("bar", selector={"app": "bar"}, labels={"from": "east"})
    await eventually(lambda: (s := m.get("bar-federated")) is not None
                     and "multicluster.linkerd.io/remote-discovery"
                     not in s.metadata.annotations, WAIT)
    m.local.service("bar", selector={"app": "bar"}, labels={"from": "local"})
    await eventually(lambda: m.get("bar-federated") is None, WAIT)


async def test_a_headless_member_is_refused_with_its_reason(mirror: Mirror) -> None:
    m = mirror
    with structlog.testing.capture_logs() as logs:
        m.east.service("db", labels=FEDERATED, spec={"clusterIP": "None"})
        m.east.service("ok", selector={"app": "ok"}, labels=FEDERATED)
        await eventually(lambda: m.get("ok-federated") is not None, WAIT)
    assert m.get("db-federated") is None
    refused = [e["reason"] for e in logs if e["event"] == "not mirrored"]
    assert refused == [f"east: {m.east.ns}/db: headless service cannot join federated service"]


async def test_an_unreachable_cluster_keeps_its_mirrors_and_an_unlinked_one_loses_them(
        mirror: Mirror, remote_apiserver: KubeAPIServer) -> None:
    m = mirror
    m.east.service("foo", selector={"app": "foo"}, labels=EXPORTED)
    m.east.service("baz", selector={"app": "baz"}, labels=FEDERATED)
    await eventually(lambda: m.get("foo-east") is not None
                     and m.get("baz-federated") is not None, WAIT)
    remote_apiserver.stop_apiserver(kill=True)
    try:
        # The link's Secret changes (say, a rotation) while east cannot be reached: the
        # new credentials cannot sync, and nothing east said is taken back.
        m.local.link_secret(m.store.namespace, "east", remote_apiserver,
                            trust_domain="rotated.local")
        await eventually(lambda: (lc := m.store.get("east")) is not None
                         and lc.replacing is not None, WAIT)
        passes = m.controller.passes
        m.local.service("unrelated", selector={"app": "u"})  # another pass
        await eventually(lambda: m.controller.passes > passes, WAIT)
        assert m.get("foo-east") is not None and m.get("baz-federated") is not None
    finally:
        remote_apiserver.start_apiserver()
    m.local.delete_secret(m.store.namespace, "cluster-credentials-east")
    await eventually(lambda: m.get("foo-east") is None and m.get("baz-federated") is None,
                     WAIT, "an unlinked cluster's mirrors stayed")
