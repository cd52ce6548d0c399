"""The cluster store against two real kube-apiservers: linking from Linkerd's Secret,
what a linked cluster is watched for, rotation, unlinking, bad Secrets, and a linked
API server that is down at start or goes down after sync (docs/multicluster.md)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import prometheus_client
import pytest
import structlog

from bridge.cluster import Cluster, ClusterChange, ListenerStage
from bridge.model import ServiceKey
from bridge.multicluster.store import ClusterStore
from bridge.sources.kube import KubeSource
from testkit import kubeapi, multicluster
from testkit.kubeapi import KubeAPIServer
from testkit.multicluster import Endpoint, Objects, mirror_labels
from testkit.polling import eventually

kube_apiserver = kubeapi.kube_apiserver  # the local cluster (shared session fixture)
remote_apiserver = multicluster.remote_apiserver  # the linked cluster `east`

WAIT = 20.0


@dataclass
class Setup:
    local: Cluster
    store: ClusterStore
    registry: prometheus_client.CollectorRegistry
    local_objs: Objects  # the application namespace, in the local cluster
    east: Objects  # the same namespace, in the linked cluster
    controller_ns: str

    def sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)

    def east_cluster(self) -> Cluster:
        lc = self.store.get("east")
        assert lc is not None
        return lc.cluster


@pytest.fixture
async def setup(kube_apiserver: KubeAPIServer,
                remote_apiserver: KubeAPIServer) -> AsyncIterator[Setup]:
    local_objs = Objects(kube_apiserver)
    controller = Objects(kube_apiserver)  # a controller namespace of this test's own
    east = Objects(remote_apiserver, local_objs.ns)
    local = Cluster()
    registry = prometheus_client.CollectorRegistry()
    source = KubeSource(kubeconfig=str(kube_apiserver.kubeconfig_path),
                        link_namespace=controller.ns)
    synced = asyncio.Event()
    task = asyncio.create_task(source.run(local, synced))
    await asyncio.wait_for(synced.wait(), WAIT)
    store = ClusterStore(local, controller.ns, registry, sync_timeout=2.0)
    store.start()
    try:
        yield Setup(local, store, registry, local_objs, east, controller.ns)
    finally:
        store.stop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for objs in (local_objs, controller, east):
            objs.close()


def foo_in_east(east: Objects) -> None:
    """Row 0 of the table: ns/foo with port 80 -> http (8080), two ready meshed pods,
    and beside it a service nobody mirrors."""
    east.service("foo", selector={"app": "foo"})
    east.pod("foo-0", "10.2.0.1", labels={"app": "foo"})
    east.pod("foo-1", "10.2.0.2", labels={"app": "foo"})
    east.slice("foo-abc", "foo", [Endpoint("foo-0", "10.2.0.1", "z1"),
                                  Endpoint("foo-1", "10.2.0.2", "z2")])
    east.service("bar", selector={"app": "bar"})
    east.pod("bar-0", "10.2.0.9", labels={"app": "bar"})
    east.slice("bar-abc", "bar", [Endpoint("bar-0", "10.2.0.9")])


def mirror_foo(s: Setup) -> None:
    s.local_objs.service("foo-east", labels=mirror_labels("east", "foo"))


def names(cluster: Cluster, kind: str, ns: str) -> set[str]:
    return {o.meta.name for o in cluster.objects(kind) if o.meta.namespace == ns}


async def linked_and_synced(s: Setup) -> None:
    await eventually(lambda: (lc := s.store.get("east")) is not None
                     and lc.state == "synced", WAIT, "east never synced")


async def test_a_linked_cluster_is_watched_only_for_what_the_local_services_want(
        setup: Setup, remote_apiserver: KubeAPIServer) -> None:
    s = setup
    foo_in_east(s.east)
    s.local_objs.link_secret(s.controller_ns, "east", remote_apiserver)
    await linked_and_synced(s)
    assert s.sample("cluster_store_size") == 1
    assert s.sample("endpointslices_cache_size", cluster="east") == 0  # nothing wanted yet
    mirror_foo(s)
    ns = s.local_objs.ns

    def watched() -> tuple[set[str], set[str], set[str]]:
        # Each kind has its own watch: they are seen in no particular order.
        cluster = s.east_cluster()
        return (names(cluster, "Pod", ns), names(cluster, "Service", ns),
                names(cluster, "EndpointSlice", ns))

    await eventually(lambda: watched() == ({"foo-0", "foo-1"}, {"foo"}, {"foo-abc"}), WAIT,
                     lambda: f"pods, services, slices: {watched()}")
    assert set(s.store.demand.of("east")) == {ServiceKey(ns, "foo")}
    assert s.sample("endpointslices_cache_size", cluster="east") == 1
    assert s.sample("pod_cache_size", cluster="east") == 2
    assert s.sample("service_cache_size", cluster="east") == 1
    assert s.sample("meshbridge_cluster_sync_state", cluster="east", state="synced") == 1
    # A new pod of foo is seen; one of bar, or of no service, never is.
    s.east.pod("foo-2", "10.2.0.3", labels={"app": "foo"})
    s.east.pod("stray", "10.2.0.99", labels={"app": "other"})
    await eventually(lambda: "foo-2" in names(s.east_cluster(), "Pod", ns), WAIT)
    assert "stray" not in names(s.east_cluster(), "Pod", ns)
    # The mirror goes: so does everything watched for it.
    s.local_objs.delete_service("foo-east")
    await eventually(lambda: not names(s.east_cluster(), "Pod", ns)
                     and not names(s.east_cluster(), "EndpointSlice", ns), WAIT)


async def test_a_rotated_kubeconfig_takes_over_without_a_gap_or_a_change(
        setup: Setup, remote_apiserver: KubeAPIServer) -> None:
    s = setup
    foo_in_east(s.east)
    mirror_foo(s)
    secret = s.local_objs.link_secret(s.controller_ns, "east", remote_apiserver)
    await linked_and_synced(s)
    ns = s.local_objs.ns
    await eventually(lambda: names(s.east_cluster(), "Pod", ns) == {"foo-0", "foo-1"}, WAIT)
    lc = s.store.get("east")
    assert lc is not None
    first_run = lc.run
    changes: list[ClusterChange] = []
    lc.cluster.add_listener(changes.append, ListenerStage.VIEWS)
    rotated = remote_apiserver.token_kubeconfig_for("rotated-admin", ("system:masters",))
    s.local_objs.link_secret(s.controller_ns, "east", remote_apiserver,
                             kubeconfig=rotated.read_bytes(), name=secret)
    await eventually(lambda: lc.run is not first_run and lc.replacing is None, WAIT,
                     "the new credentials never took over")
    assert lc.link.kubeconfig == rotated.read_bytes()
    assert s.store.get("east") is lc  # the same cache: nothing was torn down
    assert changes == []  # the new watches saw what the old ones had
    # ...and they keep following the cluster.
    s.east.pod("foo-2", "10.2.0.3", labels={"app": "foo"})
    await eventually(lambda: "foo-2" in names(lc.cluster, "Pod", ns), WAIT)


async def test_deleting_the_secret_unlinks_the_cluster_and_empties_its_cache(
        setup: Setup, remote_apiserver: KubeAPIServer) -> None:
    s = setup
    foo_in_east(s.east)
    mirror_foo(s)
    secret = s.local_objs.link_secret(s.controller_ns, "east", remote_apiserver)
    await linked_and_synced(s)
    lc = s.store.get("east")
    assert lc is not None
    ns = s.local_objs.ns
    await eventually(lambda: names(lc.cluster, "Pod", ns) == {"foo-0", "foo-1"}, WAIT)
    s.local_objs.delete_secret(s.controller_ns, secret)
    await eventually(lambda: s.store.get("east") is None, WAIT)
    assert s.sample("cluster_store_size") == 0
    assert s.sample("pod_cache_size", cluster="east") is None  # unregistered, as Linkerd
    assert lc.cluster.services == {} and lc.cluster.objects("Pod") == []


async def test_a_bad_secret_is_logged_once_counted_and_affects_nothing_else(
        setup: Setup, remote_apiserver: KubeAPIServer) -> None:
    s = setup
    with structlog.testing.capture_logs() as logs:
        s.local_objs.link_secret(s.controller_ns, "east", remote_apiserver,
                                 omit=("multicluster.linkerd.io/trust-domain",))
        s.local_objs.link_secret(s.controller_ns, "west", remote_apiserver,
                                 kubeconfig=b"{this is not: a kubeconfig")
        s.local_objs.link_secret(s.controller_ns, "north", remote_apiserver)
        # Credentials the linked API server refuses: linked, not synced, retried.
        refused = remote_apiserver.kubeconfig_path.read_bytes().replace(
            remote_apiserver.token.encode(), b"not-a-valid-token")
        s.local_objs.link_secret(s.controller_ns, "refused", remote_apiserver,
                                 kubeconfig=refused)
        await eventually(lambda: (lc := s.store.get("north")) is not None
                         and lc.state == "synced", WAIT)
        await eventually(lambda: (lc := s.store.get("refused")) is not None
                         and lc.state == "credentials_refused" and lc.failures >= 2, WAIT)
        # Another Secret event: the bad ones are looked at again, and not logged again.
        s.local_objs.link_secret(s.controller_ns, "south", remote_apiserver)
        await eventually(lambda: s.store.get("south") is not None, WAIT)
    assert s.store.get("east") is None and s.store.get("west") is None
    bad = [entry for entry in logs if entry["event"] == "linked cluster not usable"]
    assert sorted(entry["source"] for entry in bad) == [
        f"Secret {s.controller_ns}/cluster-credentials-east",
        f"Secret {s.controller_ns}/cluster-credentials-west"]
    assert "no multicluster.linkerd.io/trust-domain annotation" in bad[0]["reason"]
    assert "kubeconfig" in bad[1]["reason"]
    assert s.sample("meshbridge_cluster_link_errors_total", cluster="east",
                    reason="missing_annotation") == 1
    assert s.sample("meshbridge_cluster_link_errors_total", cluster="west",
                    reason="bad_kubeconfig") == 1
    assert s.sample("meshbridge_cluster_link_errors_total", cluster="refused",
                    reason="credentials_refused") == 1
    assert len([e for e in logs if "refused the credentials" in e["event"]]) == 1
    assert s.sample("cluster_store_size") == 3  # north, south, and refused (not synced)


async def test_an_unreachable_cluster_holds_ready_only_until_the_timeout_then_syncs(
        setup: Setup, remote_apiserver: KubeAPIServer) -> None:
    s = setup
    foo_in_east(s.east)
    mirror_foo(s)
    remote_apiserver.stop_apiserver(kill=True)
    try:
        with structlog.testing.capture_logs() as logs:
            s.local_objs.link_secret(s.controller_ns, "east", remote_apiserver)
            await eventually(lambda: (lc := s.store.get("east")) is not None
                             and lc.state == "unreachable", WAIT)
            assert s.store.ready() == ["east"]
            # sync_timeout is 2 s here (30 s by default): then ready, without east.
            await eventually(lambda: s.store.ready() == [])
            lc = s.store.get("east")
            assert lc is not None
            await eventually(lambda: lc.failures >= 3, WAIT, "the access check was not retried")
        unreachable = [e for e in logs if "cannot be reached" in e["event"]]
        assert len(unreachable) == 1  # once per cause, however many retries
        assert s.sample("meshbridge_cluster_link_errors_total", cluster="east",
                        reason="unreachable") == 1
    finally:
        remote_apiserver.start_apiserver()
    ns = s.local_objs.ns
    await eventually(lambda: names(s.east_cluster(), "Pod", ns) == {"foo-0", "foo-1"}, 60.0,
                     "east's endpoints never appeared once it was back")
    assert s.store.get("east").state == "synced"  # type: ignore[union-attr]


async def test_a_cluster_lost_after_sync_keeps_its_state_marked_stale_and_resumes_quietly(
        setup: Setup, remote_apiserver: KubeAPIServer) -> None:
    s = setup
    foo_in_east(s.east)
    mirror_foo(s)
    s.local_objs.link_secret(s.controller_ns, "east", remote_apiserver)
    await linked_and_synced(s)
    ns = s.local_objs.ns
    await eventually(lambda: names(s.east_cluster(), "Pod", ns) == {"foo-0", "foo-1"}, WAIT)
    lc = s.store.get("east")
    assert lc is not None
    changes: list[ClusterChange] = []
    lc.cluster.add_listener(changes.append, ListenerStage.VIEWS)
    remote_apiserver.stop_apiserver(kill=True)
    try:
        await eventually(lambda: lc.state == "stale", WAIT, "never marked stale")
        assert s.sample("meshbridge_cluster_stale", cluster="east") == 1
        assert names(lc.cluster, "Pod", ns) == {"foo-0", "foo-1"}  # the last state, served
    finally:
        remote_apiserver.start_apiserver()
    started = time.monotonic()
    await eventually(lambda: lc.state == "synced", 60.0, "never resumed")
    assert changes == [], f"resumed with changes after {time.monotonic() - started:.1f}s"
    assert s.sample("meshbridge_cluster_stale", cluster="east") == 0
