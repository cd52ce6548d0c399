"""Property tests for the route model: whatever routes are attached to a Service port,
resolution never fails, and no client kind is sent a RouteConfiguration it would
reject (Routes §3.4; xDS §3.8, §4.6): no zero weight sum, no `path_separated_prefix`
or `num_retries: 0` for gRPC, no `path_separated_prefix` ending in `/`, every regex
one RE2 compiles; and every route Linkerd is sent carries its metadata kind."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bridge.cluster import Cluster, Event, EventType
from bridge.model import MeshConfig, ServiceKey
from bridge.objects import ObjectError, decode_object
from bridge.routes.index import route_index
from bridge.routes.regex import re2_error
from linkerd_api.policy import outbound
from linkerd_api.policy.outbound import ServiceTarget
from xds_api.route_config import ClientKind, build_route_config

WEB = ServiceKey("app", "web")
PATHS = st.sampled_from(["/", "/a", "/a/", "/api/v1", "/(?=x)", "/a.*", "x", "/[z-a]"])
NAMES = st.sampled_from(["web", "web-v2", "gone"])


def service(name: str) -> dict[str, Any]:
    return {"kind": "Service", "metadata": {"name": name, "namespace": "app"},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}


match = st.fixed_dictionaries({
    "path": st.fixed_dictionaries({
        "type": st.sampled_from(["Exact", "PathPrefix", "RegularExpression", "Glob"]),
        "value": PATHS}),
}, optional={
    "headers": st.lists(st.fixed_dictionaries({
        "name": st.sampled_from(["x-a", "X-A", "x-b"]), "value": PATHS,
        "type": st.sampled_from(["Exact", "RegularExpression"])}), max_size=2),
    "queryParams": st.lists(st.fixed_dictionaries({"name": st.just("q"),
                                                   "value": st.just("1")}), max_size=1),
    "method": st.sampled_from(["GET", "POST"]),
})
backend = st.fixed_dictionaries({"name": NAMES, "port": st.sampled_from([80, 81]),
                                 "weight": st.integers(0, 3)})
flt = st.sampled_from([
    {"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "a",
                                                                         "value": "b"}]}},
    {"type": "RequestRedirect", "requestRedirect": {"hostname": "x"}},
    {"type": "URLRewrite", "urlRewrite": {"path": {"type": "ReplacePrefixMatch",
                                                   "replacePrefixMatch": "/b"}}},
    {"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "web-v2",
                                                               "port": 80}}},
    {"type": "ExtensionRef", "extensionRef": {"name": "x"}},
])
rule = st.fixed_dictionaries({}, optional={
    "matches": st.lists(match, max_size=3),
    "backendRefs": st.lists(backend, max_size=3),
    "filters": st.lists(flt, max_size=2),
    "timeouts": st.fixed_dictionaries({"request": st.sampled_from(["0s", "1s", "2x"])}),
    "retry": st.fixed_dictionaries({"attempts": st.integers(0, 6),
                                    "codes": st.lists(st.sampled_from([503, 700]),
                                                      max_size=2)}),
})
route_annotations = st.dictionaries(
    st.sampled_from(["retry.linkerd.io/grpc", "retry.linkerd.io/limit",
                     "timeout.linkerd.io/request"]),
    st.sampled_from(["unavailable", "0", "3", "5s", "bogus"]), max_size=3)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["HTTPRoute", "GRPCRoute"]),
                          st.lists(rule, max_size=4), route_annotations), max_size=3))
def test_no_client_kind_is_sent_what_it_would_reject(
        routes: list[tuple[str, list[dict[str, Any]], dict[str, str]]]) -> None:
    cluster = Cluster()
    events = [Event(EventType.ADDED, obj) for obj in
              (decode_object(service(n)) for n in ("web", "web-v2")) if obj is not None]
    for i, (kind, rules, notes) in enumerate(routes):
        if kind == "GRPCRoute":
            rules = [{**r, "matches": [{"method": {"service": "s"}}]} for r in rules]
        raw = {"apiVersion": "gateway.networking.k8s.io/v1", "kind": kind,
               "metadata": {"name": f"r{i}", "namespace": "app", "annotations": notes},
               "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "web",
                                        "port": 80}], "rules": rules}}
        try:
            obj = decode_object(raw)
        except ObjectError:
            continue  # not shaped like a route: the source skips it
        if obj is not None:
            events.append(Event(EventType.ADDED, obj))
    cluster.apply(events)
    table = route_index(cluster).table(WEB, 80, "app")
    if table is None:
        return
    for client in ClientKind:
        config, _ = build_route_config("web.app.svc.cluster.local:80", table, client,
                                       "cluster.local")
        for r in config.virtual_hosts[0].routes:
            which = r.match.WhichOneof("path_specifier")
            assert which in ("prefix", "path", "safe_regex", "path_separated_prefix")
            if which == "path_separated_prefix":
                assert client is ClientKind.ENVOY and not r.match.path_separated_prefix \
                    .endswith("/")
            if which == "safe_regex":
                assert re2_error(r.match.safe_regex.regex) == ""
            for h in r.match.headers:
                if h.string_match.WhichOneof("match_pattern") == "safe_regex":
                    assert re2_error(h.string_match.safe_regex.regex) == ""
            if r.WhichOneof("action") != "route":
                continue
            action = r.route
            if action.WhichOneof("cluster_specifier") == "weighted_clusters":
                weights = [c.weight.value for c in action.weighted_clusters.clusters]
                assert sum(weights) > 0 and all(w > 0 for w in weights)
            else:
                assert action.cluster
            if action.HasField("retry_policy"):
                assert action.retry_policy.num_retries.value >= 1
                if client is ClientKind.GRPC:
                    assert action.retry_policy.num_retries.value <= 4
    for semantics in ("proto", "linkerd-2.20"):
        policy = outbound.service_policy(cluster, MeshConfig(), ServiceTarget(WEB, 80, True),
                                         route_index(cluster).port(WEB, 80), "app",
                                         semantics)
        assert policy.protocol.WhichOneof("kind")
