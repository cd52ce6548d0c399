"""MultiClusterViews: which Views a subscription to a mirror, a federated Service or (for
xDS in istiod's mode) any service is served from, and how members and linked clusters
coming and going show in that one View (no network: Clusters fed by hand)."""

from __future__ import annotations

import time

import pytest

from bridge.cluster import Cluster, Event, EventType
from bridge.model import FilterKey, MeshConfig, ServiceKey, ViewKey
from bridge.multicluster.links import Link
from bridge.multicluster.store import LinkedCluster
from bridge.multicluster.views import MissingRemoteService, MultiClusterViews, UnknownCluster
from bridge.objects import (
    EndpointSlice,
    KubeObject,
    Meta,
    Node,
    Pod,
    Service,
    ServicePort,
    SliceEndpoint,
    SlicePort,
    TargetRef,
)
from bridge.views import InvalidService, View, ViewChange

NS = "ns"
HTTP = (ServicePort("http", 80, 8080),)


class Recorder:
    def __init__(self) -> None:
        self.changes: list[ViewChange] = []

    def on_view_change(self, view: View, change: ViewChange) -> None:
        self.changes.append(change)


def add(cluster: Cluster, *objs: KubeObject) -> None:
    cluster.apply(Event(EventType.MODIFIED, o) for o in objs)


def delete(cluster: Cluster, *objs: KubeObject) -> None:
    cluster.apply(Event(EventType.DELETED, o) for o in objs)


def service(name: str, labels: dict[str, str] | None = None,
            annotations: dict[str, str] | None = None, type_: str = "ClusterIP") -> Service:
    return Service(Meta(name, NS, labels=labels or {}, annotations=annotations or {}),
                   type=type_, ports=HTTP, cluster_ips=("10.96.0.1",),
                   selector={"app": name})


def backends(svc: str, *pods: tuple[str, str, str], ready: bool = True
             ) -> list[KubeObject]:
    """Pods (name, ip, zone) of `svc` and one slice naming them all."""
    objs: list[KubeObject] = [Pod(Meta(name, NS), pod_ips=(ip,)) for name, ip, _ in pods]
    objs.append(EndpointSlice(
        Meta(f"{svc}-slice", NS, labels={"kubernetes.io/service-name": svc}), svc, "IPv4",
        (SlicePort("http", 8080),),
        tuple(SliceEndpoint((ip,), ready, ready, False, zone=zone,
                            target=TargetRef("Pod", name, NS)) for name, ip, zone in pods)))
    return objs


def mirror(cluster_name: str, remote: str | None = "foo") -> Service:
    labels = {"multicluster.linkerd.io/remote-discovery": cluster_name}
    if remote is not None:
        labels["multicluster.linkerd.io/remote-service"] = remote
    return service(f"foo-{cluster_name}", labels=labels)


def federated(members: str, local: str | None = None) -> Service:
    annotations = {"multicluster.linkerd.io/remote-discovery": members}
    if local is not None:
        annotations["multicluster.linkerd.io/local-discovery"] = local
    return service("foo-federated", annotations=annotations)


def link(views: MultiClusterViews, name: str, trust_domain: str = "") -> Cluster:
    cluster = Cluster()
    lc = LinkedCluster(Link(name, "cluster.local", trust_domain or f"{name}.local",
                            f"--link {name}"), cluster, time.monotonic())
    views._link_changed(name, lc)
    return cluster


def unlink(views: MultiClusterViews, name: str) -> None:
    views._link_changed(name, None)


def served(view: View) -> dict[str, str]:
    """address -> the cluster its endpoint came from ("" local)."""
    return {r.endpoint.ip: r.id.cluster for r in view.snapshot.values()}


@pytest.fixture
def local() -> Cluster:
    cluster = Cluster()
    add(cluster, Node(Meta("n1", "", labels={"topology.kubernetes.io/zone": "z1"})))
    return cluster


@pytest.fixture
def views(local: Cluster) -> MultiClusterViews:
    return MultiClusterViews(local, MeshConfig())


def key(name: str, node: str = "n1", hostname: str = "") -> ViewKey:
    return ViewKey(ServiceKey(NS, name), 80, FilterKey(node, hostname))


def test_a_mirror_is_served_from_its_linked_clusters_service(
        local: Cluster, views: MultiClusterViews) -> None:
    east = link(views, "east")
    add(east, service("foo"), *backends("foo", ("foo-0", "10.2.0.1", "z1"),
                                        ("foo-1", "10.2.0.2", "z2")))
    add(local, mirror("east"))
    rec = Recorder()
    view = views.subscribe(key("foo-east"), rec, "linkerd")
    assert served(view) == {"10.2.0.1": "east", "10.2.0.2": "east"}
    # Locality is the subscriber's node's zone (local) against the endpoint's.
    localities = {r.endpoint.ip: r.zone_locality for r in view.snapshot.values()}
    assert localities == {"10.2.0.1": "local", "10.2.0.2": "remote"}
    # A pod going unready there is one change here.
    add(east, *backends("foo", ("foo-0", "10.2.0.1", "z1"))[-1:])
    assert served(view) == {"10.2.0.1": "east"}
    assert [len(c.removed) for c in rec.changes] == [1]
    views.unsubscribe(key("foo-east"), rec)
    assert views.merged == {}


def test_linkerds_refusals_of_a_remote_discovery_target(
        local: Cluster, views: MultiClusterViews) -> None:
    east = link(views, "east")
    add(local, mirror("east", remote=None), mirror("west"))
    with pytest.raises(MissingRemoteService):
        views.check(key("foo-east"))
    with pytest.raises(UnknownCluster, match="Remote cluster not found: west"):
        views.check(key("foo-west"))
    add(local, mirror("east"))
    add(east, service("foo", type_="ExternalName"))
    with pytest.raises(InvalidService):
        views.check(key("foo-east"))
    views.check(key("foo"))  # a local service: nothing to refuse here


def test_a_federated_service_is_the_union_and_follows_its_members(
        local: Cluster, views: MultiClusterViews) -> None:
    east, north = link(views, "east"), link(views, "north")
    add(local, service("foo"), *backends("foo", ("foo-l", "10.1.0.1", "z1")))
    add(east, service("foo"), *backends("foo", ("foo-0", "10.2.0.1", "z1")))
    add(north, service("foo"), *backends("foo", ("foo-0", "10.3.0.1", "z2")))
    add(local, federated("foo@east,foo@north", local="foo"))
    rec = Recorder()
    view = views.subscribe(key("foo-federated"), rec, "linkerd")
    # One pod name in two clusters: two endpoints.
    assert served(view) == {"10.1.0.1": "", "10.2.0.1": "east", "10.3.0.1": "north"}
    # north leaves the annotation: its addresses go, in one change.
    add(local, federated("foo@east", local="foo"))
    assert served(view) == {"10.1.0.1": "", "10.2.0.1": "east"}
    assert [r.endpoint.ip for r in rec.changes[-1].removed] == ["10.3.0.1"]
    # The federated Service goes: the View says it no longer exists.
    delete(local, federated("foo@east"))
    assert not view.exists and served(view) == {}


def test_a_cluster_linked_after_the_stream_opened_joins_it_and_an_unlinked_one_leaves(
        local: Cluster, views: MultiClusterViews) -> None:
    add(local, federated("foo@east"))
    rec = Recorder()
    view = views.subscribe(key("foo-federated"), rec, "linkerd")
    assert served(view) == {}
    east = Cluster()
    add(east, service("foo"), *backends("foo", ("foo-0", "10.2.0.1", "z1")))
    lc = LinkedCluster(Link("east", "cluster.local", "east.local", "--link east"), east,
                       time.monotonic())
    views._link_changed("east", lc)
    assert served(view) == {"10.2.0.1": "east"}  # Linkerd 2.20 would not add it
    unlink(views, "east")
    assert served(view) == {}


def test_remote_members_are_not_filtered_and_the_local_one_is(
        local: Cluster, views: MultiClusterViews) -> None:
    east = link(views, "east")
    itp_local = Service(Meta("foo", NS), ports=HTTP, cluster_ips=("10.96.0.2",),
                        internal_traffic_local=True, selector={"app": "foo"})
    add(local, itp_local, *backends("foo", ("foo-l", "10.1.0.1", "z1")))  # on no node
    add(east, itp_local, *backends("foo", ("foo-0", "10.2.0.1", "z9")))
    add(local, federated("foo@east", local="foo"))
    view = views.subscribe(key("foo-federated"), Recorder(), "linkerd")
    # internalTrafficPolicy: Local keeps the local endpoint (no pod on n1) out; the
    # remote one is served whatever its policy says.
    assert served(view) == {"10.2.0.1": "east"}


def test_istio_merging_is_for_its_protocols_and_keeps_cluster_local_hosts_local(
        local: Cluster, views: MultiClusterViews) -> None:
    east = link(views, "east")
    views.enable_istio_merge({"xds-sotw"}, ["foo.ns.svc.cluster.local"])
    for cluster, ip in ((local, "10.1.0.1"), (east, "10.2.0.1")):
        add(cluster, service("web"), *backends("web", ("web-0", ip, "z1")))
        add(cluster, service("foo"), *backends("foo", ("foo-0", ip.replace(".0.", ".9."),
                                                       "z1")))
    xds = views.subscribe(key("web"), Recorder(), "xds-sotw")
    linkerd = views.subscribe(key("web"), Recorder(), "linkerd")
    assert served(xds) == {"10.1.0.1": "", "10.2.0.1": "east"}
    assert served(linkerd) == {"10.1.0.1": ""}
    cluster_local = views.subscribe(key("foo"), Recorder(), "xds-sotw")
    assert served(cluster_local) == {"10.1.9.1": ""}
