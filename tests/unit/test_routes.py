"""The one route model (bridge.routes): decoding with problems, resolution per Service
port, precedence, producer and consumer routes, the incremental index, and the three
encodings of one table (Routes §1-4, xDS §3.8, Linkerd §12.5)."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.config.route.v3 import route_components_pb2 as rc

from bridge.cluster import Cluster
from bridge.model import MeshConfig, ServiceKey
from bridge.objects import decode_object
from bridge.routes.index import route_index
from bridge.routes.objects import Effect, Route, validate_route
from bridge.routes.table import RouteTable, RouteType
from linkerd_api.policy import outbound
from linkerd_api.policy.outbound import ServiceTarget
from linkerd_api.proto import outbound_pb2 as ob
from testkit.builders import delete, endpoint, endpoint_slice, load, service
from xds_api.route_config import ClientKind, build_route_config

WEB = ServiceKey("app", "web")
DOMAIN = "cluster.local"


def svc(name: str, ns: str = "app", port: int = 80, **spec: Any) -> dict[str, Any]:
    return service(name, ns, ports=[{"name": "http", "port": port, "targetPort": 8080}],
                   **spec)


def http_route(name: str, *rules: dict[str, Any], ns: str = "app", parent: str = "web",
               port: int | None = 80, created: str = "", kind: str = "HTTPRoute",
               annotations: dict[str, str] | None = None) -> dict[str, Any]:
    ref: dict[str, Any] = {"group": "", "kind": "Service", "name": parent, "namespace": "app"}
    if port is not None:
        ref["port"] = port
    md: dict[str, Any] = {"name": name, "namespace": ns, "annotations": annotations or {}}
    if created:
        md["creationTimestamp"] = created
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": kind, "metadata": md,
            "spec": {"parentRefs": [ref], "rules": list(rules)}}


def to(*backends: tuple[str, int], **rule: Any) -> dict[str, Any]:
    return {"backendRefs": [{"name": n, "port": 80, "weight": w} for n, w in backends],
            **rule}


def prefix(value: str) -> dict[str, Any]:
    return {"path": {"type": "PathPrefix", "value": value}}


@pytest.fixture
def cluster() -> Cluster:
    c = Cluster()
    load(c, svc("web"), svc("web-canary"), svc("api"))
    return c


def table(cluster: Cluster, client_ns: str = "app") -> RouteTable:
    found = route_index(cluster).table(WEB, 80, client_ns)
    assert found is not None
    return found


def envoy(cluster: Cluster, client: ClientKind = ClientKind.ENVOY,
          client_ns: str = "app") -> tuple[list[rc.Route], list[str]]:
    name = "web.app.svc.cluster.local:80"
    config, left_out = build_route_config(name, table(cluster, client_ns), client, DOMAIN)
    (vhost,) = config.virtual_hosts
    return list(vhost.routes), [str(x) for x in left_out]


def linkerd(cluster: Cluster, client_ns: str = "app",
            semantics: str = "proto") -> ob.OutboundPolicy:
    return outbound.service_policy(cluster, MeshConfig(), ServiceTarget(WEB, 80, True),
                                   route_index(cluster).port(WEB, 80), client_ns, semantics)


# --------------------------------------------------------------------------- decoding


def test_validate_route_lists_each_problem_with_its_field_path() -> None:
    raw = http_route("bad", {
        "matches": [{"path": {"type": "RegularExpression", "value": "/a(?=b)"}},
                    {"headers": [{"name": "x", "type": "RegularExpression",
                                  "value": "(a)\\1"}]}],
        "filters": [{"type": "ExtensionRef", "extensionRef": {"name": "x"}}],
        "backendRefs": [{"name": "web", "port": 80, "weight": 0}]})
    problems = {(p.path, p.effect) for p in validate_route(raw)}
    assert ("spec.rules[0].matches[0].path.value", Effect.RULE_DROPPED) in problems
    assert ("spec.rules[0].matches[1].headers[0].value", Effect.RULE_DROPPED) in problems
    assert ("spec.rules[0].filters[0].type", Effect.RULE_FAILS) in problems
    assert ("spec.rules[0].backendRefs", Effect.RULE_FAILS) in problems


def test_re2_refuses_what_python_accepts_and_accepts_what_it_should() -> None:
    ok = http_route("ok", {"matches": [{"path": {"type": "RegularExpression",
                                                 "value": "/api/v[0-9]+/.*"}}]})
    assert validate_route(ok) == []
    lookahead = http_route("la", {"matches": [{"path": {"type": "RegularExpression",
                                                        "value": "/(?!admin).*"}}]})
    (problem,) = validate_route(lookahead)
    assert "RE2 cannot compile" in problem.rule


def test_a_shapeless_route_is_one_problem_naming_the_field() -> None:
    raw = http_route("r", {"backendRefs": [{"name": "x", "weight": -1}]})
    (problem,) = validate_route(raw)
    assert problem.effect is Effect.ROUTE and "weight" in problem.rule


def test_annotations_give_timeouts_and_retries() -> None:
    route = decode_object(http_route("r", {}, annotations={
        "timeout.linkerd.io/request": "5s", "retry.linkerd.io/http": "5xx,429",
        "retry.linkerd.io/grpc": "unavailable,bogus", "retry.linkerd.io/timeout": "250ms"}))
    assert isinstance(route, Route)
    policy = route.policy
    assert policy.timeouts.request == 5000 and policy.retry is not None
    assert policy.retry.limit == 1 and policy.retry.http_statuses == ((500, 599), (429, 429))
    assert policy.retry.grpc_codes == ("unavailable",) and policy.retry.timeout_ms == 250
    assert [p.path for p in policy.problems] == [
        "metadata.annotations[retry.linkerd.io/grpc]"]


# --------------------------------------------------------------------------- resolution


def test_the_demo_canary_is_one_rule_split_90_10(cluster: Cluster) -> None:
    load(cluster, http_route("canary", to(("web", 90), ("web-canary", 10), **prefix("/"))))
    t = table(cluster)
    (entry,) = t.entries
    assert [(b.service.name, b.weight) for b in entry.rule.backends if b.service] == [
        ("web", 90), ("web-canary", 10)]
    assert t.problems == ()


def test_matches_are_ordered_by_the_gateway_api_precedence(cluster: Cluster) -> None:
    load(cluster,
         http_route("old", to(("api", 1), matches=[prefix("/a")]),
                    created="2020-01-01T00:00:00Z"),
         http_route("new", to(("api", 1), matches=[
             prefix("/a/b"), {"path": {"type": "Exact", "value": "/a"}},
             {**prefix("/a"), "method": "GET"},
             {**prefix("/a"), "headers": [{"name": "x", "value": "1"}]},
             {"path": {"type": "RegularExpression", "value": "/r.*"}}]),
             created="2021-01-01T00:00:00Z"))
    order = [(e.rule.route.name, e.match.path_type, e.match.path, e.match.method,  # type: ignore[union-attr]
              len(e.match.headers)) for e in table(cluster).entries]
    assert order == [
        ("new", "Exact", "/a", "", 0),
        ("new", "PathPrefix", "/a/b", "", 0),
        ("new", "PathPrefix", "/a", "GET", 0),
        ("new", "PathPrefix", "/a", "", 1),
        ("old", "PathPrefix", "/a", "", 0),  # a tie: the older route first
        ("new", "RegularExpression", "/r.*", "", 0),
    ]


def test_consumer_routes_replace_the_producers_for_their_namespace_only(
        cluster: Cluster) -> None:
    load(cluster, http_route("producer", to(("web", 1))),
         http_route("consumer", to(("web-canary", 1)), ns="client"))
    assert [r.ref.name for r in table(cluster, "client").routes] == ["consumer"]
    assert [r.ref.name for r in table(cluster, "other").routes] == ["producer"]
    # Linkerd 2.20 gives the consumer namespace both (Routes §5.1).
    names = [r.metadata.resource.name for r in linkerd(
        cluster, "client", "linkerd-2.20").protocol.detect.http1.routes]
    assert sorted(names) == ["consumer", "producer"]


def test_a_grpc_route_wins_the_port_and_the_http_route_is_conflicted(cluster: Cluster) -> None:
    load(cluster, http_route("h", to(("web", 1))),
         http_route("g", {"matches": [{"method": {"service": "pkg.Svc"}}],
                          "backendRefs": [{"name": "api", "port": 80}]}, kind="GRPCRoute"))
    port = route_index(cluster).port(WEB, 80)
    assert port is not None and port.producer is not None
    assert port.producer.route_type is RouteType.GRPC
    assert [(ref.name, winner) for _, ref, winner in port.conflicted] == [("h", RouteType.GRPC)]


def test_each_unservable_backend_fails_its_share_with_its_reason(cluster: Cluster) -> None:
    load(cluster, svc("elsewhere", ns="other"), http_route("b", {"backendRefs": [
        {"name": "web", "port": 80, "weight": 1},
        {"name": "gone", "port": 80, "weight": 1},
        {"name": "web-canary", "port": 9999, "weight": 1},
        {"name": "elsewhere", "namespace": "other", "port": 80, "weight": 1},
        {"kind": "Bucket", "group": "example.com", "name": "b", "weight": 1}]}))
    (entry,) = table(cluster).entries
    assert [(b.usable, b.reason) for b in entry.rule.backends] == [
        (True, ""), (False, "BackendNotFound"), (False, "BackendNotFound"),
        (False, "RefNotPermitted"), (False, "InvalidKind")]
    routes, _ = envoy(cluster)
    action = routes[0].route
    assert [c.name for c in action.weighted_clusters.clusters][:3] == [
        "web.app.svc.cluster.local:80", "gone.app.svc.cluster.local:80",
        "web-canary.app.svc.cluster.local:9999"]
    assert action.cluster_not_found_response_code == \
        rc.RouteAction.ClusterNotFoundResponseCode.INTERNAL_SERVER_ERROR


# --------------------------------------------------------------------------- index


def test_a_route_edit_recomputes_only_the_ports_it_attaches_to(cluster: Cluster) -> None:
    load(cluster, http_route("w", to(("web", 1))),
         http_route("a", to(("api", 1)), parent="api"))
    index = route_index(cluster)
    changed: list[frozenset[Any]] = []
    index.add_listener(changed.append)
    before = index.recomputed
    load(cluster, http_route("w", to(("web", 9), ("web-canary", 1))))
    assert index.recomputed - before == 1
    assert changed == [frozenset({(WEB, 80)})]
    delete(cluster, http_route("w"))
    assert index.port(WEB, 80) is None
    assert index.port(ServiceKey("app", "api"), 80) is not None


def test_the_routes_a_change_concerns_are_told_and_an_endpoint_change_concerns_none(
        cluster: Cluster) -> None:
    load(cluster, http_route("w", to(("web", 1), ("later", 1))),
         http_route("a", to(("api", 1)), parent="api"))
    index = route_index(cluster)
    told: list[frozenset[Any]] = []
    index.add_routes_listener(told.append)
    load(cluster, endpoint_slice("web-1", "web", [endpoint("10.0.0.1", None)]))
    assert told == []  # endpoints are no route's business
    load(cluster, svc("later"))  # w's backend appears: w is concerned, a is not
    assert told == [frozenset({("GatewayHTTPRoute", "app", "w")})]
    delete(cluster, http_route("a", to(("api", 1)), parent="api"))
    assert told[1:] == [frozenset({("GatewayHTTPRoute", "app", "a")})]
    assert index.route(("GatewayHTTPRoute", "app", "a")) is None
    assert index.route_keys() == {("GatewayHTTPRoute", "app", "w")}


def test_a_backend_service_appearing_resolves_its_share(cluster: Cluster) -> None:
    load(cluster, http_route("w", to(("web", 1), ("later", 1))))
    assert not table(cluster).entries[0].rule.backends[1].usable
    load(cluster, svc("later"))
    assert table(cluster).entries[0].rule.backends[1].usable


# --------------------------------------------------------------------------- Envoy RDS


def test_envoy_gets_every_field(cluster: Cluster) -> None:
    load(cluster, http_route("r", to(
        ("web", 90), ("web-canary", 10),
        matches=[{**prefix("/api/"), "headers": [{"name": "X-User", "value": "a"}],
                  "queryParams": [{"name": "q", "value": "1"}], "method": "GET"}],
        filters=[{"type": "RequestHeaderModifier",
                  "requestHeaderModifier": {"set": [{"name": "x-s", "value": "1"}],
                                            "remove": ["x-r"]}},
                 {"type": "URLRewrite", "urlRewrite": {"path": {
                     "type": "ReplacePrefixMatch", "replacePrefixMatch": "/v2/"}}}],
        timeouts={"request": "2s"},
        retry={"attempts": 3, "codes": [503], "backoff": "100ms"})))
    (route,), left_out = envoy(cluster)
    assert left_out == []
    assert route.match.path_separated_prefix == "/api"
    assert [(h.name, h.string_match.exact) for h in route.match.headers] == [
        (":method", "GET"), ("x-user", "a")]
    assert route.match.query_parameters[0].string_match.exact == "1"
    action = route.route
    assert [(c.name, c.weight.value) for c in action.weighted_clusters.clusters] == [
        ("web.app.svc.cluster.local:80", 90), ("web-canary.app.svc.cluster.local:80", 10)]
    assert action.timeout.seconds == 2 and action.prefix_rewrite == "/v2/"
    retry = action.retry_policy
    assert retry.num_retries.value == 3 and list(retry.retriable_status_codes) == [503]
    assert "retriable-status-codes" in retry.retry_on.split(",")
    assert retry.retry_back_off.base_interval.ToMilliseconds() == 100
    assert route.request_headers_to_remove == ["x-r"]


def test_a_redirect_a_failed_rule_and_no_catch_all(cluster: Cluster) -> None:
    load(cluster, http_route(
        "r",
        {"matches": [prefix("/old")], "filters": [{"type": "RequestRedirect",
                                                   "requestRedirect": {"hostname": "new",
                                                                       "statusCode": 301}}]},
        {"matches": [prefix("/ext")], "filters": [{"type": "ExtensionRef"}],
         "backendRefs": [{"name": "web", "port": 80}]},
        to(("web", 1), matches=[prefix("/app")])))
    routes, _ = envoy(cluster)
    kinds = {r.match.path_separated_prefix: r.WhichOneof("action") for r in routes}
    assert kinds == {"/old": "redirect", "/ext": "direct_response", "/app": "route"}
    failed = next(r for r in routes if r.WhichOneof("action") == "direct_response")
    assert failed.direct_response.status == 500
    # No catch-all after them: an unmatched request is Envoy's 404.
    assert [r.match.WhichOneof("path_specifier") for r in routes] == [
        "path_separated_prefix"] * 3


# --------------------------------------------------------------------------- proxyless gRPC


def test_grpc_is_never_sent_what_it_nacks_and_is_told_what_it_skips(cluster: Cluster) -> None:
    load(cluster, http_route(
        "r",
        to(("web", 0), ("web-canary", 5), matches=[prefix("/pkg.Svc")],
           filters=[{"type": "ResponseHeaderModifier",
                     "responseHeaderModifier": {"add": [{"name": "a", "value": "b"}]}}]),
        to(("api", 1), matches=[{**prefix("/q"), "queryParams": [{"name": "q",
                                                                   "value": "1"}]}]),
        {"matches": [prefix("/r")], "filters": [{"type": "RequestRedirect",
                                                 "requestRedirect": {"hostname": "x"}}]},
        annotations={"retry.linkerd.io/grpc": "unavailable",
                     "retry.linkerd.io/limit": "9"}))
    routes, left_out = envoy(cluster, ClientKind.GRPC)
    (route,) = routes  # the query and redirect rules are left out
    assert route.match.prefix == "/pkg.Svc/" and not route.match.path_separated_prefix
    assert route.route.cluster == "web-canary.app.svc.cluster.local:80"  # weight 0 dropped
    assert route.route.retry_policy.num_retries.value == 4
    assert route.route.retry_policy.retry_on == "unavailable"
    assert not route.response_headers_to_add
    assert any("query parameter" in x for x in left_out)
    assert any("RequestRedirect" in x for x in left_out)
    assert any("ResponseHeaderModifier" in x for x in left_out)


def test_grpc_routes_become_paths_and_timeouts_max_stream_duration(cluster: Cluster) -> None:
    load(cluster, http_route("g", {
        "matches": [{"method": {"service": "pkg.Svc", "method": "Get"}},
                    {"method": {"service": "pkg.Svc"}}, {"method": {"method": "Put"}}],
        "backendRefs": [{"name": "api", "port": 80}]}, kind="GRPCRoute",
        annotations={"timeout.linkerd.io/request": "1500ms"}))
    routes, _ = envoy(cluster, ClientKind.GRPC)
    assert [r.match.WhichOneof("path_specifier") for r in routes] == [
        "path", "prefix", "safe_regex"]
    assert routes[0].match.path == "/pkg.Svc/Get"
    assert routes[0].route.max_stream_duration.max_stream_duration.ToMilliseconds() == 1500


# --------------------------------------------------------------------------- Linkerd


def test_linkerd_gets_filters_timeouts_and_retries(cluster: Cluster) -> None:
    load(cluster, http_route("r", to(
        ("web", 90), ("web-canary", 10),
        filters=[{"type": "ResponseHeaderModifier",
                  "responseHeaderModifier": {"set": [{"name": "x", "value": "y"}]}}],
        timeouts={"request": "3s"}, retry={"attempts": 2, "codes": [503]})))
    (rule,) = linkerd(cluster).protocol.detect.http1.routes[0].rules
    assert [b.weight for b in rule.backends.random_available.backends] == [90, 10]
    assert rule.filters[0].response_header_modifier.set.headers[0].value == b"y"
    assert rule.timeouts.request.seconds == 3
    assert rule.retry.max_retries == 2
    assert [(r.start, r.end) for r in rule.retry.conditions.status_ranges] == [(503, 503)]
    # Linkerd 2.20 reads no Gateway API retry stanza (Routes §5.3).
    (rule,) = linkerd(cluster, semantics="linkerd-2.20").protocol.detect.http1.routes[0].rules
    assert not rule.HasField("retry")


def test_linkerd_2_20_drops_a_route_it_cannot_convert_and_the_spec_keeps_it(
        cluster: Cluster) -> None:
    load(cluster, http_route("m", to(("web", 1), filters=[
        {"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "api",
                                                                   "port": 80}}}])))
    (route,) = linkerd(cluster).protocol.detect.http1.routes
    assert route.metadata.resource.name == "m"
    (route,) = linkerd(cluster, semantics="linkerd-2.20").protocol.detect.http1.routes
    assert route.metadata.default == "http"


# --------------------------------------------------------------------------- status


def test_status_says_accepted_resolved_conflicted_or_no_parent(cluster: Cluster) -> None:
    from bridge.routes.status import route_status

    load(cluster,
         http_route("ok", to(("web", 1), ("gone", 1))),
         http_route("g", {"matches": [{"method": {"service": "s"}}],
                          "backendRefs": [{"name": "web", "port": 80}]}, kind="GRPCRoute"),
         http_route("orphan", to(("web", 1)), parent="nowhere"),
         http_route("wrong-port", to(("web", 1)), port=8080))
    index = route_index(cluster)

    def conditions(name: str, kind: str = "GatewayHTTPRoute") -> dict[str, tuple[bool, str]]:
        [route] = [r for r in cluster.objects(kind) if isinstance(r, Route)
                   and r.meta.name == name]
        (status,) = route_status(route, cluster.services.get, index.port)
        return {c.type: (c.status, c.reason) for c in status.conditions}

    assert conditions("ok") == {"Accepted": (False, "Conflicted"),
                                "ResolvedRefs": (True, "ResolvedRefs")}
    assert conditions("g", "GRPCRoute") == {"Accepted": (True, "Accepted"),
                                            "ResolvedRefs": (True, "ResolvedRefs")}
    assert conditions("orphan")["Accepted"] == (False, "NoMatchingParent")
    assert conditions("wrong-port")["Accepted"] == (False, "NoMatchingParent")
    delete(cluster, http_route("g", kind="GRPCRoute"))
    assert conditions("ok") == {"Accepted": (True, "Accepted"),
                                "ResolvedRefs": (False, "BackendNotFound")}
