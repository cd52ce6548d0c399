"""ServiceProfiles and workloads -> DestinationProfile (Linkerd §2.8, §2.9), and the shared
profile publications that GetProfile streams read."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.cluster import Cluster
from bridge.model import MeshConfig, ServiceKey
from bridge.objects import Service, ServiceProfile
from linkerd_api.errors import AmbiguousAddress, NoSuchWorkload
from linkerd_api.profile_streams import (
    EndpointProfileKey,
    ProfileRegistry,
    ProfileStream,
    ServiceProfileKey,
    instance_ip,
    workload_at,
)
from linkerd_api.profiles import (
    ProfileError,
    endpoint_profile,
    go_split_host_port_ok,
    parse_go_duration,
    quantity_milli_value,
    request_match,
    response_match,
    service_opaque_ports,
    service_profile,
)
from linkerd_api.proto import destination_pb2 as dst
from linkerd_api.proto import http_types_pb2 as http
from linkerd_api.translate import Translator
from testkit.builders import decode, delete, endpoint, endpoint_slice, load, pod, service

SVC = ServiceKey("app", "web")
FQN = "web.app.svc.cluster.local"


# ------------------------------------------------------------------ values


@pytest.mark.parametrize(("text", "nanos"), [
    ("300ms", 300_000_000), ("1.5s", 1_500_000_000), ("1h30m", 5_400_000_000_000),
    ("0", 0), ("0s", 0), ("2us", 2_000), ("1µs", 1_000), ("1μs", 1_000), ("7ns", 7),
    ("+5s", 5_000_000_000), ("1m0.5s", 60_500_000_000), (".5s", 500_000_000),
])
def test_go_durations(text: str, nanos: int) -> None:
    assert parse_go_duration(text) == nanos


@pytest.mark.parametrize("text", ["", "5", "-1s", "1x", "s", ".s", "1.2.3s", "1s 2s", "1S"])
def test_bad_go_durations(text: str) -> None:
    with pytest.raises(ProfileError):
        parse_go_duration(text)


@pytest.mark.parametrize(("raw", "milli"), [
    (1, 1000), ("1", 1000), ("500m", 500), ("0.5", 500), (0.25, 250), ("1k", 1_000_000),
    ("1Ki", 1_024_000), ("1e3", 1_000_000), ("1.0005", 1001), ("100u", 1), ("0", 0),
])
def test_quantities_in_thousandths_rounded_up(raw: Any, milli: int) -> None:
    assert quantity_milli_value(raw) == milli


@pytest.mark.parametrize("raw", ["abc", True, None, "1x", "", [1], "1 k"])
def test_bad_quantities(raw: Any) -> None:
    with pytest.raises(ProfileError):
        quantity_milli_value(raw)


@pytest.mark.parametrize(("text", "ok"), [
    ("web.app.svc.cluster.local:80", True), ("web:", True), ("[::1]:80", True),
    ("web.app.svc.cluster.local", False), ("a:b:c", False), ("[::1]", False),
    ("[::1]:80:1", False),
])
def test_which_authorities_go_splits(text: str, ok: bool) -> None:
    assert go_split_host_port_ok(text) is ok


# ------------------------------------------------------------------ matches


def test_one_request_match_field_is_the_match_itself() -> None:
    assert request_match({"pathRegex": "/x"}) == dst.RequestMatch(path=dst.PathMatch(regex="/x"))


def test_several_request_match_fields_are_wrapped_in_all_in_linkerds_order() -> None:
    m = request_match({"pathRegex": "/x", "method": "get", "not": {"method": "POST"},
                       "any": [{"pathRegex": "/a"}], "all": [{"pathRegex": "/b"}]})
    kinds = [x.WhichOneof("match") for x in m.all.matches]
    assert kinds == ["all", "any", "method", "not", "path"]
    assert m.all.matches[2].method.registered == http.HttpMethod.GET
    assert getattr(m.all.matches[3], "not").method.registered == http.HttpMethod.POST


def test_an_unknown_method_is_unregistered_and_upper_cased() -> None:
    assert request_match({"method": "purge"}).method.unregistered == "PURGE"


def test_an_empty_all_list_is_still_a_field() -> None:
    assert request_match({"all": []}).WhichOneof("match") == "all"


@pytest.mark.parametrize("raw", [{}, {"pathRegex": ""}, {"not": {}}, "GET", {"all": "x"},
                                 {"method": 7}])
def test_bad_request_matches(raw: Any) -> None:
    with pytest.raises(ProfileError):
        request_match(raw)


def test_response_matches() -> None:
    m = response_match({"status": {"min": 500, "max": 599}})
    assert (m.status.min, m.status.max) == (500, 599)
    m = response_match({"not": {"status": {"min": 200, "max": 299}}, "status": {"min": 100}})
    assert [x.WhichOneof("match") for x in m.all.matches] == ["status", "not"]


@pytest.mark.parametrize("status", [{"min": 99}, {"max": 600}, {"min": 500, "max": 400},
                                    {"min": "500"}, {"min": True}])
def test_bad_status_ranges(status: dict[str, Any]) -> None:
    with pytest.raises(ProfileError):
        response_match({"status": status})


def test_a_status_range_open_on_one_side_is_valid() -> None:
    assert response_match({"status": {"max": 499}}).status.max == 499


# ------------------------------------------------------------------ service profiles


def sp(spec: dict[str, Any], ns: str = "app") -> ServiceProfile:
    obj = decode({"kind": "ServiceProfile", "metadata": {"name": FQN, "namespace": ns},
                  "spec": spec})
    assert isinstance(obj, ServiceProfile)
    return obj


def test_without_a_service_profile_the_default_profile_is_sent() -> None:
    p = service_profile(None, fqn=FQN, service=SVC, port=80, opaque=True)
    assert p.fully_qualified_name == FQN and p.opaque_protocol is True
    assert p.retry_budget.retry_ratio == pytest.approx(0.2)
    assert (p.retry_budget.min_retries_per_second, p.retry_budget.ttl.seconds) == (10, 10)
    assert not p.routes and not p.dst_overrides and not p.HasField("endpoint")
    r = p.parent_ref.resource
    assert (r.group, r.kind, r.name, r.namespace, r.port) == ("core", "Service", "web", "app", 80)
    # Linkerd sets profile_ref even for its implicit empty profile.
    assert p.profile_ref.resource == p.profile_ref.resource.__class__(group="linkerd.io")


def test_a_service_profile_converts_routes_budget_and_overrides() -> None:
    p = service_profile(sp({
        "routes": [
            {"name": "list", "condition": {"method": "GET", "pathRegex": "/api/list"},
             "responseClasses": [{"condition": {"status": {"min": 500, "max": 599}},
                                  "isFailure": True}],
             "isRetryable": True, "timeout": "300ms"},
            {"name": "slow", "condition": {"pathRegex": "/slow"}, "timeout": "soon"},
            {"name": "zero", "condition": {"pathRegex": "/z"}, "timeout": "0s"},
        ],
        "retryBudget": {"retryRatio": 0.5, "minRetriesPerSecond": 3, "ttl": "1m"},
        "dstOverrides": [{"authority": "web.app.svc.cluster.local", "weight": "900m"},
                         {"authority": "canary.app.svc.cluster.local:8080", "weight": 1}],
    }), fqn=FQN, service=SVC, port=80, opaque=False)
    list_, slow, zero = p.routes
    assert dict(list_.metrics_labels) == {"route": "list"} and list_.is_retryable
    assert list_.condition.all.matches[0].method.registered == http.HttpMethod.GET
    assert (list_.timeout.seconds, list_.timeout.nanos) == (0, 300_000_000)
    assert list_.response_classes[0].is_failure
    assert not slow.HasField("timeout")  # a bad timeout is dropped, the route kept
    assert not zero.HasField("timeout")  # and a zero one means none
    assert (p.retry_budget.retry_ratio, p.retry_budget.min_retries_per_second,
            p.retry_budget.ttl.seconds) == (0.5, 3, 60)
    assert [(d.authority, d.weight) for d in p.dst_overrides] == [
        ("web.app.svc.cluster.local:80", 9000), ("canary.app.svc.cluster.local:8080", 10000)]
    r = p.profile_ref.resource
    assert (r.group, r.kind, r.name, r.namespace) == ("linkerd.io", "ServiceProfile", FQN, "app")


@pytest.mark.parametrize("spec", [
    {"routes": [{"name": "r", "condition": {}}]},
    {"routes": [{"name": "r"}]},
    {"routes": [{"name": "r", "condition": {"pathRegex": "/"},
                 "responseClasses": [{"condition": {"status": {"min": 700}}}]}]},
    {"routes": "all"},
    {"retryBudget": {"retryRatio": 0.2, "minRetriesPerSecond": 10, "ttl": "ten"}},
    {"retryBudget": {"retryRatio": -1, "minRetriesPerSecond": 10, "ttl": "10s"}},
    {"dstOverrides": [{"authority": "x", "weight": "lots"}]},
    {"dstOverrides": [{"authority": "x", "weight": "1G"}]},  # overflows uint32
    {"routes": [{"name": "r", "condition": {"pathRegex": "/"}, "isRetryable": "yes"}]},
])
def test_any_conversion_error_drops_the_whole_profile(spec: dict[str, Any]) -> None:
    with pytest.raises(ProfileError):
        service_profile(sp(spec), fqn=FQN, service=SVC, port=80, opaque=False)


def opaque_service(value: str | None) -> Service:
    raw = service("web", ports=[{"name": "http", "port": 80}, {"name": "db", "port": 5432},
                                {"name": "amqp", "port": 5672}])
    if value is not None:
        raw["metadata"]["annotations"] = {"config.linkerd.io/opaque-ports": value}
    obj = decode(raw)
    assert isinstance(obj, Service)
    return obj


@pytest.mark.parametrize(("value", "ports"), [
    (None, MeshConfig().default_opaque_ports),
    ("", frozenset()),
    ("db", frozenset({5432})),  # a Service port name
    ("db, 9000-9002 ,amqp", frozenset({5432, 5672, 9000, 9001, 9002})),
    ("nosuchname,80", frozenset({80})),
    ("70000,80", frozenset({80})),  # a bad entry is skipped, not the whole annotation
])
def test_service_opaque_ports(value: str | None, ports: frozenset[int]) -> None:
    assert service_opaque_ports(opaque_service(value), MeshConfig()) == ports


# ------------------------------------------------------------------ endpoint profiles


def cluster_with(*raws: dict[str, Any]) -> Cluster:
    cluster = Cluster()
    load(cluster, *raws)
    return cluster


def test_an_unmeshed_pod_endpoint_has_labels_and_namespace_but_no_mesh_fields() -> None:
    cluster = cluster_with(pod("job-1", "10.0.0.5", meshed=False, owner=("Job", "reindex")))
    p = endpoint_profile("10.0.0.5", 8080, cluster.pods[("app", "job-1")], cluster,
                         MeshConfig(), Translator(MeshConfig()))
    assert dict(p.endpoint.metric_labels) == {
        "pod": "job-1", "k8s_job": "reindex", "serviceaccount": "web", "zone": "",
        "namespace": "app"}
    assert not p.endpoint.HasField("tls_identity") and not p.opaque_protocol
    assert p.retry_budget.min_retries_per_second == 10 and not p.fully_qualified_name


def test_a_meshed_pod_on_a_default_opaque_port_is_opaque() -> None:
    cluster = cluster_with(pod("db-0", "10.0.0.6", ports=[{"name": "pg", "containerPort": 5432}]))
    p = endpoint_profile("10.0.0.6", 5432, cluster.pods[("app", "db-0")], cluster,
                         MeshConfig(), Translator(MeshConfig()))
    assert p.opaque_protocol is True
    assert p.endpoint.protocol_hint.WhichOneof("protocol") == "opaque"
    assert "zone_locality" not in p.endpoint.metric_labels


def test_a_server_marks_a_pod_port_opaque_for_its_endpoint_profile() -> None:
    server = {"kind": "Server", "metadata": {"name": "s", "namespace": "app"},
              "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "port": "http",
                       "proxyProtocol": "opaque"}}
    cluster = cluster_with(pod("web-a", "10.0.0.1", meshed=False, labels={"app": "web"}),
                           server)
    p = endpoint_profile("10.0.0.1", 8080, cluster.pods[("app", "web-a")], cluster,
                         MeshConfig(), Translator(MeshConfig()))
    assert p.opaque_protocol is True


def test_an_address_without_a_workload_has_only_address_weight_and_default_opacity() -> None:
    config = MeshConfig()
    p = endpoint_profile("192.0.2.9", 3306, None, Cluster(), config, Translator(config))
    assert p.endpoint.weight == 10000 and not p.endpoint.metric_labels
    assert p.opaque_protocol is True  # 3306 is a default opaque port
    assert not endpoint_profile("192.0.2.9", 80, None, Cluster(), config,
                                Translator(config)).opaque_protocol


# ------------------------------------------------------------------ workloads


def with_status(raw: dict[str, Any], **status: Any) -> dict[str, Any]:
    raw["status"].update(status)
    return raw


@pytest.mark.parametrize(("variant", "found"), [
    ({}, True),
    ({"phase": "Pending"}, False),  # known, but only a Running pod is attached
    ({"phase": "Succeeded"}, False),
])
def test_the_workload_behind_a_pod_ip(variant: dict[str, Any], found: bool) -> None:
    cluster = cluster_with(with_status(pod("web-a", "10.0.0.1"), **variant))
    got = workload_at(cluster, "10.0.0.1", 8080)
    assert (got is not None) is found


def test_host_network_and_terminating_pods_do_not_own_their_ip() -> None:
    host = pod("agent", "10.1.0.1")
    host["spec"]["hostNetwork"] = True
    leaving = pod("old", "10.0.0.2")
    leaving["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    cluster = cluster_with(host, leaving)
    assert workload_at(cluster, "10.1.0.1", 8080) is None
    assert workload_at(cluster, "10.0.0.2", 8080) is None


def test_a_host_port_finds_its_pod_by_host_ip_and_port() -> None:
    raw = with_status(pod("agent", "10.244.1.7", meshed=False,
                          ports=[{"name": "otlp", "containerPort": 4317, "hostPort": 4317}]),
                      hostIP="192.168.1.10")
    cluster = cluster_with(raw)
    got = workload_at(cluster, "192.168.1.10", 4317)
    assert got is not None and got.meta.name == "agent"
    assert workload_at(cluster, "192.168.1.10", 9999) is None


def test_two_pods_with_one_ip_are_a_conflict() -> None:
    cluster = cluster_with(pod("a", "10.0.0.1"), pod("b", "10.0.0.1"))
    with pytest.raises(AmbiguousAddress, match="found 2 pods with a conflicting pod network IP"):
        workload_at(cluster, "10.0.0.1", 8080)


def test_statefulset_instances_resolve_through_slice_hostnames() -> None:
    db = ServiceKey("app", "db")
    cluster = cluster_with(
        service("db"), pod("db-0", "10.0.0.10"),
        endpoint_slice("db-1", "db", [endpoint("10.0.0.10", "db-0", hostname="db-0"),
                                      endpoint("10.0.0.11", None, hostname="vm-1")]))
    assert instance_ip(cluster, db, "db-0") == "10.0.0.10"
    with pytest.raises(NoSuchWorkload, match="no pod found in EndpointSlices of Service "
                                             "app/db for hostname db-9"):
        instance_ip(cluster, db, "db-9")
    with pytest.raises(NoSuchWorkload, match="is not a pod"):
        instance_ip(cluster, db, "vm-1")


# ------------------------------------------------------------------ publications


class Sink:
    def __init__(self, key: Any) -> None:
        self.overflowed: list[ProfileStream] = []
        self.stream = ProfileStream(10, key, "test", self.overflowed.append)

    def take(self) -> list[dst.DestinationProfile]:
        out = []
        while len(self.stream):
            item = self.stream._items.pop(0)
            out.append(dst.DestinationProfile.FromString(item[1]))
        return out


def registry_for(cluster: Cluster) -> ProfileRegistry:
    config = MeshConfig()
    return ProfileRegistry(cluster, config, Translator(config), "proto")


def profile_raw(ns: str, routes: list[str]) -> dict[str, Any]:
    return {"kind": "ServiceProfile", "metadata": {"name": FQN, "namespace": ns},
            "spec": {"routes": [{"name": r, "condition": {"pathRegex": f"/{r}"}}
                                for r in routes]}}


def route_names(p: dst.DestinationProfile) -> list[str]:
    return [r.metrics_labels["route"] for r in p.routes]


def test_the_client_namespace_profile_wins_and_falls_back_to_the_service_one() -> None:
    cluster = cluster_with(service("web"), profile_raw("app", ["server"]),
                           profile_raw("client", ["client"]))
    reg = registry_for(cluster)
    mine = Sink(ServiceProfileKey(SVC, FQN, 80, "client"))
    other = Sink(ServiceProfileKey(SVC, FQN, 80, "elsewhere"))
    reg.subscribe(mine.stream)
    reg.subscribe(other.stream)
    assert [route_names(p) for p in mine.take()] == [["client"]]
    assert [route_names(p) for p in other.take()] == [["server"]]
    delete(cluster, profile_raw("client", ["client"]))
    assert [route_names(p) for p in mine.take()] == [["server"]]
    assert other.take() == []  # its answer did not change, so nothing is re-sent


def test_a_profile_is_resent_only_when_it_changes() -> None:
    cluster = cluster_with(service("web"))
    reg = registry_for(cluster)
    sink = Sink(ServiceProfileKey(SVC, FQN, 80, ""))
    reg.subscribe(sink.stream)
    assert len(sink.take()) == 1
    load(cluster, profile_raw("other", ["x"]), pod("unrelated", "10.9.9.9"))
    assert sink.take() == []
    annotated = service("web")
    annotated["metadata"]["annotations"] = {"config.linkerd.io/opaque-ports": "80"}
    load(cluster, annotated)
    assert [p.opaque_protocol for p in sink.take()] == [True]


def test_a_broken_profile_keeps_the_last_good_one() -> None:
    cluster = cluster_with(service("web"), profile_raw("app", ["a"]))
    reg = registry_for(cluster)
    sink = Sink(ServiceProfileKey(SVC, FQN, 80, ""))
    reg.subscribe(sink.stream)
    assert [route_names(p) for p in sink.take()] == [["a"]]
    broken = profile_raw("app", ["a"])
    broken["spec"]["routes"][0]["condition"] = {}
    load(cluster, broken)
    assert sink.take() == []
    load(cluster, profile_raw("app", ["b"]))
    assert [route_names(p) for p in sink.take()] == [["b"]]


def test_an_endpoint_profile_follows_its_pod_coming_and_going() -> None:
    cluster = Cluster()
    reg = registry_for(cluster)
    sink = Sink(EndpointProfileKey("10.0.0.1", 8080))
    reg.subscribe(sink.stream)
    assert [p.endpoint.metric_labels.get("pod") for p in sink.take()] == [None]
    load(cluster, pod("web-a", "10.0.0.1"))
    assert [p.endpoint.metric_labels["pod"] for p in sink.take()] == ["web-a"]
    delete(cluster, pod("web-a", "10.0.0.1"))
    assert [p.endpoint.metric_labels.get("pod") for p in sink.take()] == [None]


def test_an_endpoint_profile_follows_servers_in_its_pods_namespace() -> None:
    cluster = cluster_with(pod("web-a", "10.0.0.1", labels={"app": "web"}))
    reg = registry_for(cluster)
    sink = Sink(EndpointProfileKey("10.0.0.1", 8080))
    reg.subscribe(sink.stream)
    assert [p.opaque_protocol for p in sink.take()] == [False]
    load(cluster, {"kind": "Server", "metadata": {"name": "s", "namespace": "app"},
                   "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "port": 8080,
                            "proxyProtocol": "opaque"}})
    assert [p.opaque_protocol for p in sink.take()] == [True]


def test_subscribing_to_a_conflicting_address_is_refused() -> None:
    cluster = cluster_with(pod("a", "10.0.0.1"), pod("b", "10.0.0.1"))
    reg = registry_for(cluster)
    with pytest.raises(AmbiguousAddress):
        reg.subscribe(Sink(EndpointProfileKey("10.0.0.1", 8080)).stream)
    assert not reg.publications


def test_publications_are_shared_and_dropped_with_their_last_stream() -> None:
    cluster = cluster_with(service("web"))
    reg = registry_for(cluster)
    key = ServiceProfileKey(SVC, FQN, 80, "")
    a, b = Sink(key), Sink(key)
    reg.subscribe(a.stream)
    reg.subscribe(b.stream)
    assert len(reg.publications) == 1
    assert a.stream._items[0] is b.stream._items[0]  # one encoding, shared
    reg.unsubscribe(a.stream)
    assert len(reg.publications) == 1
    reg.unsubscribe(b.stream)
    assert not reg.publications


def test_an_absent_service_is_opaque_only_in_proto_semantics() -> None:
    config = MeshConfig()
    key = ServiceProfileKey(ServiceKey("app", "db"), "db.app.svc.cluster.local", 5432, "")
    for semantics, opaque in (("proto", True), ("linkerd-2.20", False)):
        reg = ProfileRegistry(Cluster(), config, Translator(config), semantics)  # type: ignore[arg-type]
        sink = Sink(key)
        reg.subscribe(sink.stream)
        assert [p.opaque_protocol for p in sink.take()] == [opaque], semantics
