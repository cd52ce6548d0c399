"""Views: merging, dedupe, port resolution, conditions, filter keys and sharing."""

from __future__ import annotations

import pytest

from bridge.authority import format_authority, parse_authority, view_authority
from bridge.cluster import Cluster, ClusterChange, ListenerStage
from bridge.model import FilterKey, MeshConfig, ServiceKey, ViewKey
from bridge.views import Derivation, InvalidService, View, ViewChange, ViewRegistry
from testkit.builders import delete, endpoint, endpoint_slice, load, node, pod, service
from testkit.recorders import ViewRecorder

SVC = ServiceKey("app", "web")


def setup(config: MeshConfig | None = None) -> tuple[Cluster, ViewRegistry]:
    cluster = Cluster()
    return cluster, ViewRegistry(cluster, config or MeshConfig())


def ips(view: View) -> set[str]:
    return {r.endpoint.ip for r in view.snapshot.values()}


def watch(reg: ViewRegistry, port: int = 80, fk: FilterKey | None = None,
          ) -> tuple[View, ViewRecorder]:
    rec = ViewRecorder()
    view = reg.subscribe(ViewKey(SVC, port, fk or FilterKey()), rec, "test")
    return view, rec


def test_slices_are_merged_and_an_endpoint_in_two_slices_is_served_once() -> None:
    cluster, reg = setup()
    load(cluster, service("web"), pod("web-1", "10.0.0.1"), pod("web-2", "10.0.0.2"),
         pod("web-3", "10.0.0.3"),
         endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1"),
                                         endpoint("10.0.0.2", "web-2")]),
         endpoint_slice("web-b", "web", [endpoint("10.0.0.2", "web-2"),
                                         endpoint("10.0.0.3", "web-3")]))
    view, _ = watch(reg)
    assert sorted(ips(view)) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert len(view.snapshot) == 3


def test_moving_an_endpoint_between_slices_sends_nothing() -> None:
    cluster, reg = setup()
    a = endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1"),
                                        endpoint("10.0.0.2", "web-2")])
    load(cluster, service("web"), pod("web-1", "10.0.0.1"), pod("web-2", "10.0.0.2"), a)
    view, rec = watch(reg)
    version = view.version
    # The endpoint slice controller adds the endpoint to the new slice, then drops it
    # from the old one: two events, neither of which changes the merged set.
    load(cluster, endpoint_slice("web-b", "web", [endpoint("10.0.0.2", "web-2")]))
    load(cluster, endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1")]))
    assert rec.changes == []
    assert view.version == version
    assert len(view.snapshot) == 2


def test_target_port_is_resolved_by_service_port_name_not_target_port() -> None:
    cluster, reg = setup()
    load(cluster,
         service("web", ports=[{"name": "http", "port": 80, "targetPort": 1234},
                               {"name": "admin", "port": 9000, "targetPort": 9000}]),
         pod("web-1", "10.0.0.1"),
         endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1")],
                        ports=[{"name": "http", "port": 8080}, {"name": "admin", "port": 9990}]))
    http, _ = watch(reg, 80)
    admin, _ = watch(reg, 9000)
    assert {r.endpoint.port for r in http.snapshot.values()} == {8080}
    assert {r.endpoint.port for r in admin.snapshot.values()} == {9990}


def test_a_port_the_service_does_not_declare_is_used_as_a_number() -> None:
    cluster, reg = setup()
    load(cluster, service("web"), pod("web-1", "10.0.0.1"),
         endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1")],
                        ports=[{"name": "http", "port": 8080}]))
    view, _ = watch(reg, 7777)
    assert {(r.endpoint.ip, r.endpoint.port) for r in view.snapshot.values()} == {
        ("10.0.0.1", 7777)}


def test_a_slice_without_the_named_port_contributes_nothing() -> None:
    cluster, reg = setup()
    load(cluster, service("web"), pod("web-1", "10.0.0.1"), pod("web-2", "10.0.0.2"),
         endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1")]),
         endpoint_slice("web-b", "web", [endpoint("10.0.0.2", "web-2")],
                        ports=[{"name": "grpc", "port": 9090}]))
    view, _ = watch(reg)
    assert ips(view) == {"10.0.0.1"}


@pytest.mark.parametrize(
    ("conditions", "kept", "ready"),
    [
        ({}, True, True),  # nil ready counts as ready
        ({"ready": True}, True, True),
        ({"ready": False}, False, False),
        ({"ready": False, "serving": True, "terminating": True}, True, False),
        ({"ready": False, "serving": False, "terminating": True}, False, False),
    ],
)
def test_endpoint_conditions_are_kept_for_each_protocol_to_apply(
    conditions: dict[str, bool], kept: bool, ready: bool
) -> None:
    cluster, reg = setup()
    ep = endpoint("10.0.0.1", "web-1", ready=None)
    ep["conditions"] = conditions
    load(cluster, service("web"), pod("web-1", "10.0.0.1"),
         endpoint_slice("web-a", "web", [ep]))
    view, _ = watch(reg)
    assert bool(view.snapshot) is kept
    if kept:
        (r,) = view.snapshot.values()
        assert r.endpoint.ready is ready


def test_dual_stack_pods_are_served_over_ipv6_when_both_families_exist() -> None:
    cluster, reg = setup()
    load(cluster, service("web"), pod("web-1", ["10.0.0.1", "fd00::1"]),
         pod("web-2", ["10.0.0.2"]),
         endpoint_slice("web-v4", "web", [endpoint("10.0.0.1", "web-1"),
                                          endpoint("10.0.0.2", "web-2")]),
         endpoint_slice("web-v6", "web", [endpoint("fd00::1", "web-1")], family="IPv6"))
    view, _ = watch(reg)
    assert ips(view) == {"fd00::1", "10.0.0.2"}
    cluster2, reg2 = setup(MeshConfig(enable_ipv6=False))
    load(cluster2, service("web"), pod("web-1", ["10.0.0.1", "fd00::1"]),
         endpoint_slice("web-v4", "web", [endpoint("10.0.0.1", "web-1")]),
         endpoint_slice("web-v6", "web", [endpoint("fd00::1", "web-1")], family="IPv6"))
    view2 = reg2.subscribe(ViewKey(SVC, 80), ViewRecorder(), "test")
    assert ips(view2) == {"10.0.0.1"}


def test_statefulset_hostname_filter_keeps_only_that_instance() -> None:
    cluster, reg = setup()
    load(cluster, service("web"), pod("web-0", "10.0.0.1"), pod("web-1", "10.0.0.2"),
         endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-0", hostname="web-0"),
                                         endpoint("10.0.0.2", "web-1", hostname="web-1")]))
    view, _ = watch(reg, fk=FilterKey(hostname="web-1"))
    assert ips(view) == {"10.0.0.2"}


def hinted_cluster() -> tuple[Cluster, ViewRegistry]:
    cluster, reg = setup()
    load(cluster, node("node-a", "zone-a"), node("node-b", "zone-b"), node("node-c", "zone-c"),
         service("web"), pod("web-a", "10.0.0.1"), pod("web-b", "10.0.0.2"),
         endpoint_slice("web-s", "web", [
             endpoint("10.0.0.1", "web-a", zone="zone-a", hints=["zone-a"]),
             endpoint("10.0.0.2", "web-b", zone="zone-b", node="node-b", hints=["zone-b"]),
         ]))
    return cluster, reg


def test_topology_hints_keep_endpoints_hinted_for_the_subscribers_zone() -> None:
    _, reg = hinted_cluster()
    view, _ = watch(reg, fk=FilterKey(node_name="node-b"))
    assert ips(view) == {"10.0.0.2"}
    (r,) = view.snapshot.values()
    assert r.zone_locality == "local"


def test_topology_hints_fall_back_to_all_when_no_endpoint_is_hinted_for_the_zone() -> None:
    _, reg = hinted_cluster()
    view, _ = watch(reg, fk=FilterKey(node_name="node-c"))
    assert ips(view) == {"10.0.0.1", "10.0.0.2"}
    assert {r.zone_locality for r in view.snapshot.values()} == {"remote"}


def test_topology_hints_are_ignored_when_any_endpoint_lacks_them() -> None:
    cluster, reg = hinted_cluster()
    load(cluster, pod("web-c", "10.0.0.3"),
         endpoint_slice("web-t", "web", [endpoint("10.0.0.3", "web-c", zone="zone-c")]))
    view, _ = watch(reg, fk=FilterKey(node_name="node-b"))
    assert ips(view) == {"10.0.0.1", "10.0.0.2", "10.0.0.3"}


def test_unfiltered_keys_ignore_hints() -> None:
    _, reg = hinted_cluster()
    view, _ = watch(reg, fk=FilterKey(node_name="node-b", filtering=False))
    assert ips(view) == {"10.0.0.1", "10.0.0.2"}


def test_internal_traffic_policy_local_keeps_only_the_subscribers_node() -> None:
    cluster, reg = setup()
    load(cluster, service("web", internalTrafficPolicy="Local"),
         pod("web-a", "10.0.0.1", node="node-a"), pod("web-b", "10.0.0.2", node="node-b"),
         endpoint_slice("web-s", "web", [endpoint("10.0.0.1", "web-a", node="node-a"),
                                         endpoint("10.0.0.2", "web-b", node="node-b")]))
    on_b, _ = watch(reg, fk=FilterKey(node_name="node-b"))
    on_c, _ = watch(reg, fk=FilterKey(node_name="node-c"))
    assert ips(on_b) == {"10.0.0.2"}
    assert ips(on_c) == set()  # no fallback


def test_zone_weights_multiply_local_endpoints() -> None:
    cluster, reg = setup(MeshConfig(zone_weights=True))
    load(cluster, node("node-a", "zone-a"), service("web"), pod("web-a", "10.0.0.1"),
         pod("web-b", "10.0.0.2"),
         endpoint_slice("web-s", "web", [endpoint("10.0.0.1", "web-a", zone="zone-a"),
                                         endpoint("10.0.0.2", "web-b", zone="zone-b")]))
    view, _ = watch(reg, fk=FilterKey(node_name="node-a"))
    weights = {r.endpoint.ip: (r.weight, r.zone_locality) for r in view.snapshot.values()}
    assert weights == {"10.0.0.1": (100000, "local"), "10.0.0.2": (10000, "remote")}


def test_a_thousand_subscribers_of_one_key_share_one_diff_per_change() -> None:
    cluster, reg = setup()
    load(cluster, service("web"), pod("web-1", "10.0.0.1"),
         endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1")]))
    recorders = [ViewRecorder() for _ in range(1000)]
    views = {id(reg.subscribe(ViewKey(SVC, 80), r, "test")) for r in recorders}
    assert len(views) == 1
    view = reg.view(ViewKey(SVC, 80))
    assert view is not None
    before = view.diff_computations
    load(cluster, pod("web-2", "10.0.0.2"),
         endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1"),
                                         endpoint("10.0.0.2", "web-2")]))
    assert view.diff_computations - before == 1
    assert all(len(r.changes) == 1 for r in recorders)
    # Every subscriber is handed the very same change object: nothing is copied per subscriber.
    assert len({id(r.changes[0]) for r in recorders}) == 1
    assert [e.endpoint.ip for e in recorders[0].changes[0].added] == ["10.0.0.2"]


class _PerVersion:
    """A derived value that encodes each version at most once, on first read."""

    def __init__(self, view: View, builds: list[int]) -> None:
        self.view = view
        self.builds = builds
        self.value: int | None = None

    def advance(self, change: ViewChange) -> None:
        self.value = None

    def read(self) -> int:
        if self.value is None:
            self.value = self.view.version
            self.builds.append(self.value)
        return self.value


def test_a_derived_value_is_made_once_per_view_and_advanced_by_each_new_version() -> None:
    cluster, reg = setup()
    load(cluster, service("web"), pod("web-1", "10.0.0.1"),
         endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1")]))
    view, _ = watch(reg)
    builds: list[int] = []
    made: list[View] = []

    def make(v: View) -> _PerVersion:
        made.append(v)
        return _PerVersion(v, builds)

    derivation = Derivation("bytes", make)
    assert view.derived(derivation).read() == view.derived(derivation).read()
    delete(cluster, endpoint_slice("web-a", "web", []))
    assert view.derived(derivation).read() == view.version
    assert len(builds) == 2 and made == [view]


def test_a_changed_endpoint_is_re_added_and_a_vanished_one_removed() -> None:
    cluster, reg = setup()
    load(cluster, service("web"), pod("web-1", "10.0.0.1"), pod("web-2", "10.0.0.2"),
         endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1"),
                                         endpoint("10.0.0.2", "web-2")]))
    _view, rec = watch(reg)
    load(cluster, pod("web-1", "10.0.0.1", sa="other", rv="2"),
         endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1")]))
    (change,) = rec.changes
    assert [r.endpoint.ip for r in change.added] == ["10.0.0.1"]
    assert "other.app.serviceaccount" in change.added[0].endpoint.enrichment.identity
    assert [r.endpoint.ip for r in change.removed] == ["10.0.0.2"]


def test_service_deletion_empties_the_view_and_clears_exists() -> None:
    cluster, reg = setup()
    load(cluster, service("web"), pod("web-1", "10.0.0.1"),
         endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1")]))
    view, rec = watch(reg)
    assert view.exists
    delete(cluster, service("web"))
    assert not view.exists and not view.snapshot
    assert rec.changes[-1].exists_changed
    load(cluster, service("web"))
    assert view.exists and ips(view) == {"10.0.0.1"}


def test_external_name_services_cannot_be_subscribed() -> None:
    cluster, reg = setup()
    load(cluster, service("mail", ports=[], type="ExternalName", externalName="smtp.example"))
    with pytest.raises(InvalidService):
        reg.subscribe(ViewKey(ServiceKey("app", "mail"), 25), ViewRecorder(), "test")


def test_the_last_unsubscribe_drops_the_view() -> None:
    cluster, reg = setup()
    load(cluster, service("web"))
    a, b = ViewRecorder(), ViewRecorder()
    key = ViewKey(SVC, 80)
    reg.subscribe(key, a, "test")
    reg.subscribe(key, b, "test")
    reg.unsubscribe(key, a)
    assert reg.view(key) is not None
    reg.unsubscribe(key, b)
    assert reg.view(key) is None and not reg.ports


def test_an_endpoint_whose_pod_is_unknown_is_skipped_and_the_rest_served() -> None:
    cluster, reg = setup()
    load(cluster, service("web"), pod("web-1", "10.0.0.1"),
         endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1"),
                                         endpoint("10.0.0.9", "ghost")]))
    view, _ = watch(reg)
    assert ips(view) == {"10.0.0.1"}


def test_address_endpoints_without_a_pod_are_named_after_the_address() -> None:
    cluster, reg = setup()
    load(cluster, service("web"),
         endpoint_slice("web-a", "web", [endpoint("192.0.2.7", None, zone=None)],
                        annotations={"mirror.linkerd.io/remote-gateway-identity": "gw.id",
                                     "mirror.linkerd.io/remote-svc-fq-name": "web.app.svc.east"}))
    view, _ = watch(reg)
    (r,) = view.snapshot.values()
    assert r.id.kind == "address" and r.id.name == "web-192.0.2.7-8080"
    assert r.endpoint.enrichment.identity == "gw.id"
    assert r.endpoint.enrichment.authority_override == "web.app.svc.east:80"
    assert r.endpoint.enrichment.hint is not None and r.endpoint.enrichment.hint.h2


def test_view_metrics_follow_subscribers_versions_and_size() -> None:
    import prometheus_client

    from bridge.views.metrics import ViewMetrics

    registry = prometheus_client.CollectorRegistry()
    cluster = Cluster()
    reg = ViewRegistry(cluster, MeshConfig(), ViewMetrics(registry))
    load(cluster, service("web"), pod("web-1", "10.0.0.1"),
         endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1")]))
    labels = {"cluster": "local", "namespace": "app", "service": "web", "port": "80",
              "hostname": "", "nodename": "node-b"}
    key = ViewKey(SVC, 80, FilterKey(node_name="node-b"))
    a, b = ViewRecorder(), ViewRecorder()
    reg.subscribe(key, a, "linkerd")
    reg.subscribe(key, b, "xds-sotw")

    def value(name: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("endpoints_subscribers") == 2
    assert value("endpoints_pods") == 1 and value("endpoints_exists") == 1
    updates = value("endpoints_updates_total")
    load(cluster, pod("web-2", "10.0.0.2"),
         endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1"),
                                         endpoint("10.0.0.2", "web-2")]))
    assert value("endpoints_updates_total") == (updates or 0) + 1
    assert value("endpoints_pods") == 2
    reg.unsubscribe(key, a)
    assert value("endpoints_subscribers") == 1
    reg.unsubscribe(key, b)
    assert value("endpoints_subscribers") is None  # the series goes with the View


def test_a_server_added_later_re_enriches_endpoints_it_selects() -> None:
    cluster, reg = setup()
    load(cluster, service("web", ports=[{"name": "http", "port": 80}]),
         pod("web-1", "10.0.0.1", labels={"app": "web"}),
         endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1")]))
    view, rec = watch(reg)
    (r,) = view.snapshot.values()
    assert r.endpoint.enrichment.hint is not None and not r.endpoint.enrichment.hint.opaque
    load(cluster, {"kind": "Server", "metadata": {"name": "s", "namespace": "app"},
                   "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "port": 8080,
                            "proxyProtocol": "opaque"}})
    (change,) = rec.changes
    hint = change.added[0].endpoint.enrichment.hint
    assert hint is not None and hint.opaque


def test_a_pod_in_two_services_stays_indexed_until_its_last_slice_goes() -> None:
    cluster, _ = setup()
    load(cluster, service("web"), service("api"), pod("p", "10.0.0.1"),
         endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "p")]),
         endpoint_slice("web-b", "web", [endpoint("10.0.0.1", "p")]),
         endpoint_slice("api-a", "api", [endpoint("10.0.0.1", "p")]))
    assert cluster.services_by_pod[("app", "p")] == {SVC, ServiceKey("app", "api")}
    delete(cluster, endpoint_slice("web-a", "web", []))
    assert SVC in cluster.services_by_pod[("app", "p")]  # still in web-b
    delete(cluster, endpoint_slice("web-b", "web", []))
    assert cluster.services_by_pod[("app", "p")] == {ServiceKey("app", "api")}
    delete(cluster, endpoint_slice("api-a", "api", []))
    assert ("app", "p") not in cluster.services_by_pod


def test_listeners_are_called_in_their_declared_stage_order_not_their_add_order() -> None:
    cluster = Cluster()
    calls: list[str] = []
    cluster.add_listener(lambda _c: calls.append("profiles"), ListenerStage.PROFILES)
    cluster.add_listener(lambda _c: calls.append("resources"), ListenerStage.RESOURCES)
    cluster.add_listener(lambda _c: calls.append("views"), ListenerStage.VIEWS)
    cluster.add_listener(lambda _c: calls.append("resources-2"), ListenerStage.RESOURCES)
    load(cluster, service("web"))
    assert calls == ["views", "resources", "resources-2", "profiles"]


def test_a_later_stage_reads_views_that_already_hold_the_same_change() -> None:
    cluster = Cluster()
    seen: list[list[set[str]]] = []
    # Added before the registry exists, yet called after it: stages, not add order.
    cluster.add_listener(lambda _c: seen.append([ips(v) for v in reg.views()]),
                         ListenerStage.RESOURCES)
    reg = ViewRegistry(cluster, MeshConfig())
    load(cluster, service("web"))
    watch(reg)
    load(cluster, pod("web-1", "10.0.0.1"),
         endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1")]))
    assert seen[-1] == [{"10.0.0.1"}]


def test_a_change_touches_its_services_and_every_service_of_its_namespaces() -> None:
    a, b, c = ServiceKey("app", "a"), ServiceKey("app", "b"), ServiceKey("other", "c")
    assert ClusterChange(services={a}).touched({a, b, c}) == [a]
    assert ClusterChange(services={a, ServiceKey("x", "unwatched")}).touched({a}) == [a]
    assert sorted(ClusterChange(namespaces={"app"}).touched([a, b, c])) == [a, b]
    assert ClusterChange(all_services=True).touched([a, b, c]) == [a, b, c]
    assert not ClusterChange(pods={("app", "p")}).touched([a, b, c])


def test_a_view_key_is_named_by_the_one_authority_formatter() -> None:
    key = ViewKey(SVC, 8080, FilterKey(hostname="web-0"))
    assert view_authority(key, "c.l") == format_authority(SVC, 8080, "c.l", "web-0")
    assert format_authority(SVC, 8080, "c.l") == "web.app.svc.c.l:8080"
    assert parse_authority(view_authority(key, "c.l"), "c.l") == key


def test_one_off_reads_see_what_a_new_subscriber_would() -> None:
    cluster, reg = setup()
    load(cluster, service("web"), pod("web-1", "10.0.0.1"),
         endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1")]))
    exists, merged = reg.merge_endpoints(SVC, 80)
    assert exists and not reg.ports  # no View was made for it
    key = ViewKey(SVC, 80)
    once = reg.filter_endpoints(key, merged)
    view, _ = watch(reg)
    assert once == dict(view.snapshot)
