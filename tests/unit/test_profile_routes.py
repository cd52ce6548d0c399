"""ServiceProfiles in the route model (Routes §7): conditions as route matches, the
proxy's choice of profile over policy, the one distribution of dstOverrides, timeouts
and retries, and what each client kind is sent for a port a profile routes."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.cluster import Cluster
from bridge.model import ServiceKey
from bridge.routes.index import route_index
from bridge.routes.objects import Effect, HttpMatch, RetrySource
from bridge.routes.profile_routes import (
    GRPC_FAILURES,
    Inexpressible,
    condition_matches,
    full_match_regex,
)
from bridge.routes.profiles import request_condition
from bridge.routes.regex import re2_full_match
from bridge.routes.status import route_status
from linkerd_api.policy import outbound
from testkit.builders import delete, load
from tests.unit.test_routes import WEB, envoy, http_route, linkerd, svc, table, to
from xds_api.route_config import ClientKind

FQN = "web.app.svc.cluster.local"


def profile(spec: dict[str, Any], ns: str = "app", name: str = FQN) -> dict[str, Any]:
    return {"apiVersion": "linkerd.io/v1alpha2", "kind": "ServiceProfile",
            "metadata": {"name": name, "namespace": ns}, "spec": spec}


def canary(**extra: Any) -> dict[str, Any]:
    """web's profile as the demo ships it: two routes and a 90/10 split."""
    return profile({
        "routes": [
            {"name": "GET /api/list", "condition": {"method": "GET", "pathRegex": "/api/list"},
             "isRetryable": True, "timeout": "300ms",
             "responseClasses": [{"condition": {"status": {"min": 500, "max": 599}},
                                  "isFailure": True}]},
            {"name": "POST /api/vote", "condition": {"method": "POST",
                                                     "pathRegex": "/api/vote"}}],
        "dstOverrides": [{"authority": "web.app.svc.cluster.local:80", "weight": "900m"},
                         {"authority": "web-canary.app.svc.cluster.local", "weight": "100m"}],
        **extra})


@pytest.fixture
def cluster() -> Cluster:
    c = Cluster()
    load(c, svc("web"), svc("web-canary"), svc("api"))
    return c


def matches(raw: dict[str, Any]) -> list[HttpMatch]:
    return condition_matches(request_condition(raw))


# --------------------------------------------------------------------------- conditions


def test_a_method_and_a_path_are_one_match() -> None:
    assert matches({"method": "get", "pathRegex": "/api/.*"}) == [
        HttpMatch("RegularExpression", "/api/.*", method="GET")]


def test_any_is_alternatives_and_all_distributes_over_them() -> None:
    got = matches({"all": [{"any": [{"method": "GET"}, {"method": "HEAD"}]},
                           {"pathRegex": "/a"}]})
    assert got == [HttpMatch("RegularExpression", "/a", method="GET"),
                   HttpMatch("RegularExpression", "/a", method="HEAD")]


def test_two_methods_at_once_match_nothing_and_are_left_out() -> None:
    assert matches({"all": [{"method": "GET"}, {"method": "POST"}]}) == []
    assert matches({"any": []}) == []


def test_an_empty_all_and_a_double_negation_match_as_written() -> None:
    assert matches({"all": []}) == [HttpMatch()]
    assert matches({"not": {"not": {"method": "PUT"}}}) == [HttpMatch(method="PUT")]
    # not (GET or POST) with GET: contradictory, so nothing; the negation is never needed.
    assert matches({"all": [{"method": "GET"}, {"not": {"any": [{"method": "GET"}]}}]}) == []


@pytest.mark.parametrize("raw", [
    {"not": {"method": "GET"}},
    {"not": {"pathRegex": "/admin.*"}},
    {"all": [{"pathRegex": "/a.*"}, {"pathRegex": ".*b"}]},
])
def test_what_no_match_list_can_say_is_inexpressible(raw: dict[str, Any]) -> None:
    with pytest.raises(Inexpressible):
        matches(raw)


@pytest.mark.parametrize(("regex", "paths"), [
    ("/api/list", ["/api/list", "/api/list/x", "/x/api/list"]),
    ("/api/(list|vote)", ["/api/list", "/api/vote", "/api/listx"]),
    ("/a|/b", ["/a", "/a/x", "/x/b", "/b", "/c"]),
    ("^/a.*$", ["/a", "/ab", "/b"]),
    ("/cost\\$", ["/cost$", "/cost$/more", "/cost"]),
    ("[|]x", ["|x", "ax"]),
])
def test_a_full_path_regex_matches_where_the_proxy_finds_its_anchored_one(
        regex: str, paths: list[str]) -> None:
    anchored = ("" if regex.startswith("^") else "^") + regex + (
        "" if regex.endswith("$") else "$")
    full = full_match_regex(regex)
    for path in paths:
        proxy_finds = re2_full_match(f"(?s:.*)(?:{anchored})(?s:.*)", path)
        assert re2_full_match(full, path) is proxy_finds, (regex, path)


def test_the_common_regex_is_sent_as_written() -> None:
    assert full_match_regex("/api/(list|vote)") == "/api/(list|vote)"
    assert full_match_regex("/a|/b").startswith("(?s:.*)")


# --------------------------------------------------------------------------- the table


def test_a_routing_profile_replaces_the_ports_routes_in_its_own_order(
        cluster: Cluster) -> None:
    load(cluster, http_route("split", to(("web", 50), ("web-canary", 50))), canary())
    t = table(cluster)
    assert t.profile is not None and t.profile.label == f"ServiceProfile app/{FQN}"
    names = [e.rule.rule.name for e in t.entries]
    assert names == ["GET /api/list", "POST /api/vote", "default"]
    for entry in t.entries:
        assert [(b.service, b.port, b.weight) for b in entry.rule.backends] == [
            (WEB, 80, 9000), (ServiceKey("app", "web-canary"), 80, 1000)]
    first = t.entries[0].rule
    assert first.timeouts.request == 300
    assert first.retry is not None and first.retry.source is RetrySource.PROFILE
    assert first.retry.http_statuses == ((500, 599),)
    assert first.retry.grpc_codes == GRPC_FAILURES
    assert t.entries[1].rule.retry is None


def test_response_classes_decide_what_is_retried() -> None:
    c = Cluster()
    load(c, svc("web"), profile({"routes": [{
        "name": "r", "condition": {"pathRegex": "/r"}, "isRetryable": True,
        "responseClasses": [
            {"condition": {"status": {"min": 200, "max": 299}}, "isFailure": False},
            {"condition": {"not": {"status": {"max": 399}}}, "isFailure": True}]}]}))
    retry = table(c).entries[0].rule.retry
    assert retry is not None
    assert retry.http_statuses == ((400, 599),)
    assert retry.grpc_codes == ()  # a 200 is claimed by a class: no gRPC status is read


def test_a_profile_without_routes_or_weighted_overrides_routes_nothing(
        cluster: Cluster) -> None:
    load(cluster, profile({"retryBudget": {"retryRatio": 0.1, "minRetriesPerSecond": 1,
                                           "ttl": "5s"},
                           "dstOverrides": [{"authority": "web-canary.app.svc.cluster.local",
                                             "weight": 0}]}))
    assert route_index(cluster).port(WEB, 80) is None


def test_the_clients_own_namespace_profile_wins_even_when_it_does_not_route(
        cluster: Cluster) -> None:
    load(cluster, http_route("split", to(("web", 50), ("web-canary", 50))), canary(),
         profile({}, ns="quiet"), profile({"routes": [
             {"name": "own", "condition": {"pathRegex": "/own"}}]}, ns="team"))
    port = route_index(cluster).port(WEB, 80)
    assert port is not None
    assert port.group_of("other") == "profile:app"
    assert port.group_of("team") == "profile:team"
    quiet = port.table_for("quiet")
    assert quiet is not None and quiet.profile is None  # the HTTPRoute again
    assert port.table_for("other", profiles=False) is port.producer


def test_overrides_that_cannot_be_served_keep_their_share_and_fail(cluster: Cluster) -> None:
    load(cluster, profile({"dstOverrides": [
        {"authority": "web.app.svc.cluster.local:80", "weight": 1},
        {"authority": "gone.app.svc.cluster.local:80", "weight": 1},
        {"authority": "example.com:80", "weight": 1},
        {"authority": "web-canary.app.svc.cluster.local:80", "weight": 0}]}))
    t = table(cluster)
    backends = t.entries[-1].rule.backends
    assert [(b.weight, b.usable) for b in backends] == [(10000, True), (10000, False),
                                                         (10000, False)]
    assert {p.problem.effect for p in t.problems} == {Effect.BACKEND_FAILS}
    routes, _ = envoy(cluster)
    (only,) = routes  # no routes in the profile: the catch-all alone
    assert only.route.cluster_not_found_response_code == \
        only.route.ClusterNotFoundResponseCode.INTERNAL_SERVER_ERROR


def test_all_overrides_at_weight_zero_send_to_the_port_itself(cluster: Cluster) -> None:
    load(cluster, profile({"routes": [{"name": "a", "condition": {"pathRegex": "/a"}}],
                           "dstOverrides": [{"authority": "web-canary.app.svc.cluster.local",
                                             "weight": 0}]}))
    rule = table(cluster).entries[0].rule
    assert rule.to_parent and [b.service for b in rule.backends] == [WEB]


def test_an_inexpressible_route_is_reported_and_its_requests_fall_through(
        cluster: Cluster) -> None:
    load(cluster, profile({"routes": [
        {"name": "not-admin", "condition": {"not": {"pathRegex": "/admin.*"}},
         "timeout": "1s"},
        {"name": "bad-regex", "condition": {"pathRegex": "/a(?=b)"}},
        {"name": "b", "condition": {"pathRegex": "/b"}}]}))
    t = table(cluster)
    assert [e.rule.rule.name for e in t.entries] == ["b", "default"]
    assert {(p.problem.path, p.problem.effect) for p in t.problems} == {
        ("spec.routes[0].condition", Effect.RULE_DROPPED),
        ("spec.routes[1].condition", Effect.RULE_DROPPED)}


def test_an_unreadable_profile_leaves_the_port_to_its_routes(cluster: Cluster) -> None:
    load(cluster, http_route("split", to(("web", 50), ("web-canary", 50))),
         profile({"routes": [{"name": "x"}]}))  # no condition: Linkerd drops it whole
    assert table(cluster).profile is None


# --------------------------------------------------------------------------- incremental


def test_a_profile_edit_recomputes_its_services_ports_only(cluster: Cluster) -> None:
    load(cluster, http_route("api-route", to(("api", 1)), parent="api"),
         http_route("split", to(("web", 50), ("web-canary", 50))))
    index = route_index(cluster)
    changed: list[frozenset[Any]] = []
    index.add_listener(changed.append)
    before = index.recomputed
    load(cluster, canary())
    assert index.recomputed - before == 1
    assert changed == [frozenset({(WEB, 80)})]
    assert table(cluster).profile is not None
    delete(cluster, canary())
    assert table(cluster).profile is None  # the HTTPRoute's table again


# --------------------------------------------------------------------------- encoders


def test_every_client_kind_is_sent_the_profiles_split(cluster: Cluster) -> None:
    load(cluster, http_route("split", to(("web", 50), ("web-canary", 50))), canary())
    routes, left_out = envoy(cluster)
    assert [r.match.safe_regex.regex or r.match.prefix for r in routes] == [
        "/api/list", "/api/vote", "/"]
    for r in routes:
        assert [(c.name, c.weight.value) for c in r.route.weighted_clusters.clusters] == [
            ("web.app.svc.cluster.local:80", 9000),
            ("web-canary.app.svc.cluster.local:80", 1000)]
    retry = routes[0].route.retry_policy
    # Only what the proxy classes as a failure: no connect-failure, no reset.
    assert retry.retry_on == "retriable-status-codes,deadline-exceeded,internal,unavailable"
    assert list(retry.retriable_status_codes) == list(range(500, 600))
    assert routes[0].route.timeout.ToMilliseconds() == 300
    assert any("budget" in x for x in left_out)
    grpc_routes, grpc_left = envoy(cluster, ClientKind.GRPC)
    assert [r.match.safe_regex.regex or r.match.prefix for r in grpc_routes] == [
        "/api/vote", "/"]  # a GET is no gRPC call
    assert any("GET method" in x for x in grpc_left)
    policy = linkerd(cluster)
    (route,) = policy.protocol.detect.http1.routes
    assert route.metadata.resource.kind == "ServiceProfile"
    assert [r.backends.random_available.backends[1].weight for r in route.rules] == [1000] * 3
    assert route.rules[0].timeouts.request.ToMilliseconds() == 300


def test_linkerd_2_20_answers_the_policy_from_its_routes(cluster: Cluster) -> None:
    load(cluster, http_route("split", to(("web", 50), ("web-canary", 50))), canary())
    policy = linkerd(cluster, semantics=outbound.LINKERD_2_20)
    (route,) = policy.protocol.detect.http1.routes
    assert route.metadata.resource.name == "split"


def test_an_opaque_connection_is_split_by_the_overrides(cluster: Cluster) -> None:
    load(cluster, canary())
    policy = linkerd(cluster)
    (opaque,) = policy.protocol.detect.opaque.routes
    backends = opaque.rules[0].backends.random_available.backends
    assert [b.weight for b in backends] == [9000, 1000]


def test_a_route_a_profile_overrides_says_so_in_its_status(cluster: Cluster) -> None:
    raw = http_route("split", to(("web", 50), ("web-canary", 50)))
    load(cluster, raw, canary())
    route = next(r for r in route_index(cluster).routes() if r.meta.name == "split")
    (parent,) = route_status(route, cluster.services.get, route_index(cluster).port)
    accepted = parent.conditions[0]
    assert accepted.status and f"ServiceProfile app/{FQN} routes port 80" in accepted.message
