"""Policy translation (linkerd_api.policy): Cluster objects in, the policy Linkerd
2.20's controller would send out (Linkerd §12)."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from bridge.cluster import Cluster
from bridge.model import MeshConfig, ServiceKey
from bridge.objects import ObjectError, decode_object, tombstone
from bridge.routes.index import route_index
from linkerd_api.policy import inbound, outbound
from linkerd_api.policy.outbound import ServiceTarget, UnknownTarget
from linkerd_api.policy.workload import BadWorkload, Workload, parse_workload
from linkerd_api.proto import outbound_pb2 as ob
from testkit.builders import delete, load, pod, service

CONFIG = MeshConfig()
NETS = tuple(ipaddress.ip_network(n) for n in outbound.DEFAULT_CLUSTER_NETWORKS)
SETTINGS = inbound.InboundSettings("all-unauthenticated", NETS)


def svc(name: str, ip: str, ns: str = "app", **spec: Any) -> dict[str, Any]:
    return service(name, ns, clusterIP=ip, clusterIPs=[ip], **spec)


def route(name: str, *rules: dict[str, Any], ns: str = "app", parent: str = "web",
          port: int | None = 80, api: str = "policy.linkerd.io/v1beta3",
          kind: str = "HTTPRoute", created: str = "") -> dict[str, Any]:
    parent_ref: dict[str, Any] = {"group": "core", "kind": "Service", "name": parent,
                                  "namespace": "app"}
    if port is not None:
        parent_ref["port"] = port
    md: dict[str, Any] = {"name": name, "namespace": ns}
    if created:
        md["creationTimestamp"] = created
    return {"apiVersion": api, "kind": kind, "metadata": md,
            "spec": {"parentRefs": [parent_ref], "rules": list(rules)}}


def policy(cluster: Cluster, source_ns: str = "app", port: int = 80,
           semantics: str = "proto") -> ob.OutboundPolicy:
    web = ServiceKey("app", "web")
    return outbound.service_policy(cluster, CONFIG, ServiceTarget(web, port, True),
                                   route_index(cluster).port(web, port), source_ns,
                                   semantics)


@pytest.fixture
def cluster() -> Cluster:
    c = Cluster()
    load(c, svc("web", "10.96.0.10"), svc("web-v2", "10.96.0.11"))
    return c


# --------------------------------------------------------------------------- lookups


def test_a_cluster_ip_names_its_service_port_and_an_undeclared_port_is_refused(
        cluster: Cluster) -> None:
    assert outbound.lookup_addr(cluster, "10.96.0.10", 80, NETS) == ServiceTarget(
        ServiceKey("app", "web"), 80, True)
    undeclared = outbound.lookup_addr(cluster, "10.96.0.10", 81, NETS)
    assert isinstance(undeclared, ServiceTarget) and not undeclared.declared
    p = outbound.service_policy(cluster, CONFIG, undeclared, None, "app")
    (opaq,) = p.protocol.opaque.routes
    assert opaq.metadata.default == "undefined-port"
    assert opaq.rules[0].filters[0].WhichOneof("kind") == "forbidden"
    assert opaq.rules[0].backends.WhichOneof("kind") == "empty"


def test_an_ip_in_the_cluster_networks_is_unknown_and_any_other_is_egress(
        cluster: Cluster) -> None:
    with pytest.raises(UnknownTarget):
        outbound.lookup_addr(cluster, "10.1.2.3", 80, NETS)
    assert outbound.lookup_addr(cluster, "8.8.8.8", 53, NETS) == outbound.EgressTarget(
        "8.8.8.8", 53)
    assert isinstance(outbound.lookup_addr(cluster, "fd00::1", 80, NETS),
                      outbound.EgressTarget)


@pytest.mark.parametrize(("authority", "port"), [
    ("web.app.svc.cluster.local:8080", 8080), ("web.app.svc.cluster.local", 80),
    ("web.app.svc.cluster.local.:80", 80), ("web.app.svc:80", 80)])
def test_authorities_name_a_service_port(cluster: Cluster, authority: str, port: int) -> None:
    assert outbound.lookup_authority(cluster, authority, "cluster.local") == ServiceTarget(
        ServiceKey("app", "web"), port, True)


def test_bad_authorities(cluster: Cluster) -> None:
    for text in ("", "bad host:80", "web.app.svc.cluster.local:x", "w:99999"):
        with pytest.raises(ValueError):
            outbound.lookup_authority(cluster, text, "cluster.local")
    for text in ("web.app:80", "nosuch.app.svc.cluster.local:80", "a.b.c.svc.cluster.local"):
        with pytest.raises(UnknownTarget):
            outbound.lookup_authority(cluster, text, "cluster.local")


# --------------------------------------------------------------------------- protocols


def test_app_protocol_picks_the_protocol_as_linkerd_does() -> None:
    c = Cluster()
    load(c, svc("web", "10.96.0.10", ports=[
        {"name": "a", "port": 80, "appProtocol": "http"},
        {"name": "b", "port": 81, "appProtocol": "kubernetes.io/h2c"},
        {"name": "c", "port": 82, "appProtocol": "grpc"},
        {"name": "d", "port": 3306}, {"name": "e", "port": 83}]))
    kinds = {port: policy(c, port=port).protocol.WhichOneof("kind")
             for port in (80, 81, 82, 3306, 83)}
    assert kinds == {80: "http1", 81: "http2", 82: "opaque", 3306: "opaque", 83: "detect"}
    (opaq,) = policy(c, port=3306).protocol.opaque.routes
    assert opaq.metadata.default == "opaq"


def test_routes_become_rules_with_matches_and_weighted_backends(cluster: Cluster) -> None:
    load(cluster, route("split", {
        "matches": [{"path": {"type": "Exact", "value": "/api"},
                     "headers": [{"name": "x-canary", "value": "1"},
                                 {"name": "x-re", "value": "a.*", "type": "RegularExpression"}],
                     "queryParams": [{"name": "q", "value": "v"}], "method": "POST"}],
        "backendRefs": [{"name": "web", "port": 80, "weight": 3},
                        {"name": "web-v2", "port": 80}]}))
    detect = policy(cluster).protocol.detect
    assert list(detect.http1.routes) == list(detect.http2.routes)
    (r,) = detect.http1.routes
    (rule,) = r.rules
    (m,) = rule.matches
    assert m.path.exact == "/api"
    assert [(h.name, h.WhichOneof("value")) for h in m.headers] == [("x-canary", "exact"),
                                                                   ("x-re", "regex")]
    assert m.headers[0].exact == b"1"
    assert m.query_params[0].exact == "v"
    assert m.method.WhichOneof("type") == "registered" and m.method.registered == 1
    backends = rule.backends.random_available.backends
    assert [(b.weight, b.backend.backend.balancer.discovery.dst.path) for b in backends] == [
        (3, "web.app.svc.cluster.local:80"), (1, "web-v2.app.svc.cluster.local:80")]
    # The opaque route keeps the Service's default backend.
    assert detect.opaque.routes[0].metadata.default == "opaq"


def test_a_rule_without_backends_uses_the_service_itself(cluster: Cluster) -> None:
    load(cluster, route("plain", {"matches": [{"path": {"value": "/x"}}]}))
    (rule,) = policy(cluster).protocol.detect.http1.routes[0].rules
    (rb,) = rule.backends.first_available.backends
    assert rb.backend.balancer.discovery.dst.path == "web.app.svc.cluster.local:80"
    assert rule.matches[0].path.prefix == "/x"


def test_unusable_backends_get_a_failure_filter_and_are_reported(cluster: Cluster) -> None:
    load(cluster, route("broken", {"backendRefs": [
        {"name": "gone", "port": 80}, {"name": "web-v2"},
        {"kind": "Bucket", "group": "example.com", "name": "b"}]}))
    (rule,) = policy(cluster).protocol.detect.http1.routes[0].rules
    messages = [b.backend.filters[0].failure_injector for b in
                rule.backends.random_available.backends]
    assert [(f.status, f.message) for f in messages] == [
        (500, "Service not found gone"), (500, "missing port for backend Service web-v2"),
        (500, "unsupported backend type example.com Bucket")]
    table = route_index(cluster).table(ServiceKey("app", "web"), 80, "app")
    assert table is not None
    (problem,) = [p for p in table.problems if p.problem.reason == "BackendNotFound"]
    assert problem.route.name == "broken"


def test_routes_for_other_ports_or_services_do_not_apply(cluster: Cluster) -> None:
    load(cluster, route("other-port", {}, port=8080), route("other-svc", {}, parent="web-v2"))
    (r,) = policy(cluster).protocol.detect.http1.routes
    assert r.metadata.default == "http"
    load(cluster, route("any-port", {}, port=None))
    (r,) = policy(cluster).protocol.detect.http1.routes
    assert r.metadata.resource.name == "any-port"


def test_routes_are_ordered_oldest_first_then_by_name(cluster: Cluster) -> None:
    load(cluster, route("b", {}), route("a", {}), route("old", {}, created="2020-01-01T00:00:00Z"))
    names = [r.metadata.resource.name for r in policy(cluster).protocol.detect.http1.routes]
    assert names == ["old", "a", "b"]


def test_a_client_namespaces_own_routes_replace_the_producers(cluster: Cluster) -> None:
    load(cluster, route("producer", {}), route("consumer", {}, ns="client"))

    def names(ns: str) -> list[str]:
        return [r.metadata.resource.name
                for r in policy(cluster, source_ns=ns).protocol.detect.http1.routes]

    assert names("client") == ["consumer"]
    assert names("elsewhere") == ["producer"]


def test_gateway_routes_keep_their_group_and_grpc_routes_take_over(cluster: Cluster) -> None:
    load(cluster, route("gw", {}, api="gateway.networking.k8s.io/v1"))
    (r,) = policy(cluster).protocol.detect.http1.routes
    assert r.metadata.resource.group == "gateway.networking.k8s.io"
    load(cluster, route("rpc", {"matches": [{"method": {"service": "pkg.Svc"}}],
                                "backendRefs": [{"name": "web", "port": 80}]},
                        api="gateway.networking.k8s.io/v1", kind="GRPCRoute"))
    p = policy(cluster)
    assert p.protocol.WhichOneof("kind") == "grpc"
    (g,) = p.protocol.grpc.routes
    assert (g.metadata.resource.kind, g.metadata.resource.name) == ("GRPCRoute", "rpc")
    assert g.rules[0].matches[0].rpc.service == "pkg.Svc"


def test_deleting_a_route_restores_the_default(cluster: Cluster) -> None:
    raw = route("gone-soon", {})
    load(cluster, raw)
    delete(cluster, raw)
    assert policy(cluster).protocol.detect.http1.routes[0].metadata.default == "http"


def test_egress_fallback_forwards_to_the_original_destination() -> None:
    p = outbound.egress_fallback("2001:db8::1", 443)
    (rule,) = p.protocol.detect.http2.routes[0].rules
    fwd = rule.backends.first_available.backends[0].backend.forward
    assert outbound.address_of(fwd.addr) == "2001:db8::1" and fwd.weight == 1
    assert not rule.matches[0].HasField("path")  # matches every request


# --------------------------------------------------------------------------- inbound


def cart(**kw: Any) -> dict[str, Any]:
    return pod("cart-1", "10.244.1.5", labels={"app": "cart"}, **kw)


def server_policy(c: Cluster, port: int = 8080, unusable: list[str] | None = None,
                  settings: inbound.InboundSettings = SETTINGS) -> Any:
    return inbound.server_policy(
        c, CONFIG, settings, Workload("app", "cart-1"), port,
        lambda kind, name, why: unusable.append(f"{kind} {name}") if unusable is not None
        else None)


@pytest.mark.parametrize(("name", "permit", "networks"), [
    ("all-unauthenticated", "unauthenticated", [0, 0]),
    ("all-authenticated", "meshTLS", [0, 0]),
    ("cluster-unauthenticated", "unauthenticated", [8, 10, 12, 16]),
    ("cluster-authenticated", "meshTLS", [8, 10, 12, 16]),
    ("audit", "unauthenticated", [0, 0]),
])
def test_default_policies(name: str, permit: str, networks: list[int]) -> None:
    c = Cluster()
    load(c, cart())
    s = server_policy(c, settings=inbound.InboundSettings(name, NETS))
    assert dict(s.labels) == {"group": "", "kind": "default", "name": name}
    (authz,) = s.authorizations
    assert authz.metadata.default == name
    assert authz.authentication.WhichOneof("permit") == permit
    assert sorted(n.net.prefix_len for n in authz.networks) == networks
    if permit == "meshTLS":
        (suffix,) = authz.authentication.meshTLS.identities.suffixes
        assert list(suffix.parts) == []


def test_deny_admits_no_one_and_annotations_override_the_flag() -> None:
    c = Cluster()
    load(c, cart(annotations={inbound.DEFAULT_POLICY_ANNOTATION: "deny"}))
    assert list(server_policy(c).authorizations) == []
    load(c, {"kind": "Namespace", "metadata": {"name": "app", "annotations": {
        inbound.DEFAULT_POLICY_ANNOTATION: "all-authenticated"}}}, cart())
    assert server_policy(c).labels["name"] == "all-authenticated"


def test_opaque_and_require_identity_ports_from_the_pods_annotations() -> None:
    c = Cluster()
    load(c, cart(annotations={"config.linkerd.io/opaque-ports": "8080",
                              inbound.REQUIRE_ID_ANNOTATION: "8080"}))
    s = server_policy(c)
    assert s.protocol.WhichOneof("kind") == "opaque"
    assert s.authorizations[0].authentication.WhichOneof("permit") == "meshTLS"


def server(name: str, port: int | str = "http", proto: str = "", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "policy.linkerd.io/v1beta3", "kind": "Server",
            "metadata": {"name": name, "namespace": "app"},
            "spec": {"podSelector": {"matchLabels": {"app": "cart"}}, "port": port,
                     "proxyProtocol": proto, **spec}}


def authz_policy(name: str, target: str, *refs: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "policy.linkerd.io/v1alpha1", "kind": "AuthorizationPolicy",
            "metadata": {"name": name, "namespace": "app"},
            "spec": {"targetRef": {"group": "policy.linkerd.io", "kind": "Server",
                                   "name": target},
                     "requiredAuthenticationRefs": list(refs)}}


def test_a_server_without_authorizations_denies_and_access_policy_adds_defaults() -> None:
    c = Cluster()
    load(c, cart(), server("cart-http", proto="HTTP/2"))
    s = server_policy(c)
    assert dict(s.labels) == {"group": "policy.linkerd.io", "kind": "server",
                              "name": "cart-http"}
    assert s.protocol.WhichOneof("kind") == "http2" and list(s.authorizations) == []
    load(c, server("cart-http", proto="HTTP/2", accessPolicy="all-unauthenticated"))
    (a,) = server_policy(c).authorizations
    assert a.metadata.default == "all-unauthenticated"
    # The Server selects port "http" (8080); other ports keep the default policy.
    assert server_policy(c, port=9999).labels["kind"] == "default"


def test_authorization_policies_resolve_their_authentications() -> None:
    c = Cluster()
    load(c, cart(), server("cart-http", port=8080),
         {"kind": "MeshTLSAuthentication", "metadata": {"name": "ids", "namespace": "app"},
          "spec": {"identities": ["*.linkerd.cluster.local", "exact.id"],
                   "identityRefs": [{"kind": "ServiceAccount", "name": "web"},
                                    {"kind": "Namespace", "name": "shop"}]}},
         {"kind": "NetworkAuthentication", "metadata": {"name": "lan", "namespace": "app"},
          "spec": {"networks": [{"cidr": "10.0.0.0/8", "except": ["10.9.0.0/16"]}]}},
         authz_policy("by-id", "cart-http",
                      {"group": "policy.linkerd.io", "kind": "MeshTLSAuthentication",
                       "name": "ids"},
                      {"group": "policy.linkerd.io", "kind": "NetworkAuthentication",
                       "name": "lan"}),
         authz_policy("by-sa", "cart-http", {"kind": "ServiceAccount", "name": "web"}),
         authz_policy("broken", "cart-http", {"group": "policy.linkerd.io",
                                              "kind": "MeshTLSAuthentication",
                                              "name": "missing"}))
    unusable: list[str] = []
    s = server_policy(c, unusable=unusable)
    assert [a.metadata.resource.name for a in s.authorizations] == ["by-id", "by-sa"]
    by_id, by_sa = s.authorizations
    ids = by_id.authentication.meshTLS.identities
    assert [i.name for i in ids.identities] == [
        "exact.id", "web.app.serviceaccount.identity.linkerd.cluster.local"]
    assert [list(x.parts) for x in ids.suffixes] == [
        ["linkerd", "cluster", "local"],
        ["shop", "serviceaccount", "identity", "linkerd", "cluster", "local"]]
    (net,) = by_id.networks
    assert net.net.prefix_len == 8 and [e.prefix_len for e in getattr(net, "except")] == [16]
    assert dict(by_sa.labels) == {"group": "policy.linkerd.io", "kind": "authorizationpolicy",
                                  "name": "by-sa"}
    assert sorted(n.net.prefix_len for n in by_sa.networks) == [0, 0]
    assert unusable == ["AuthorizationPolicy app/broken"]


def test_server_authorizations_select_servers_by_name_or_labels() -> None:
    c = Cluster()
    srv = server("cart-http", port=8080)
    srv["metadata"]["labels"] = {"tier": "back"}
    load(c, cart(), srv, {
        "kind": "ServerAuthorization", "metadata": {"name": "tls", "namespace": "app"},
        "spec": {"server": {"selector": {"matchLabels": {"tier": "back"}}},
                 "client": {"meshTLS": {"unauthenticatedTLS": True}}}}, {
        "kind": "ServerAuthorization", "metadata": {"name": "other", "namespace": "app"},
        "spec": {"server": {"name": "not-this-one"}, "client": {"unauthenticated": True}}})
    (a,) = server_policy(c).authorizations
    assert a.metadata.resource.kind == "serverauthorization"
    assert a.authentication.meshTLS.WhichOneof("clients") == "unauthenticated"
    # No networks named: the cluster's networks.
    assert sorted(n.net.prefix_len for n in a.networks) == [8, 10, 12, 16]


def test_an_unknown_pod_is_unknown() -> None:
    with pytest.raises(UnknownTarget):
        server_policy(Cluster())


# --------------------------------------------------------------------------- inputs


@pytest.mark.parametrize(("text", "expected"), [
    ('{"ns":"a","pod":"b"}', Workload("a", "b")),
    ('{"ns":"a","external_workload":"vm"}', Workload("a", "vm", "external_workload")),
    ("a:b", Workload("a", "b")), ("a:b:c", Workload("a", "b:c"))])
def test_workloads(text: str, expected: Workload) -> None:
    assert parse_workload(text) == expected


@pytest.mark.parametrize("text", ["", "a", ":b", "a:", "{", '{"ns":"a"}', "[1]"])
def test_bad_workloads(text: str) -> None:
    with pytest.raises(BadWorkload):
        parse_workload(text)


@pytest.mark.parametrize("raw", [
    {"kind": "NetworkAuthentication", "metadata": {"name": "n", "namespace": "a"},
     "spec": {"networks": [{"cidr": "not-a-net"}]}},
    {"kind": "NetworkAuthentication", "metadata": {"name": "n", "namespace": "a"},
     "spec": {"networks": []}},
    {"kind": "MeshTLSAuthentication", "metadata": {"name": "m", "namespace": "a"},
     "spec": {}},
    {"kind": "AuthorizationPolicy", "metadata": {"name": "p", "namespace": "a"},
     "spec": {"targetRef": {"name": "x"}}},
    {"kind": "ServerAuthorization", "metadata": {"name": "s", "namespace": "a"},
     "spec": {"server": {}}},
    {"kind": "HTTPRoute", "metadata": {"name": "r", "namespace": "a"},
     "spec": {"rules": [{"backendRefs": [{"name": "x", "weight": -1}]}]}},
    {"kind": "HTTPRoute", "metadata": {"name": "r", "namespace": "a"},
     "spec": {"rules": [{"matches": ["not a match"]}]}},
])
def test_unusable_policy_objects_are_refused_naming_the_object(raw: dict[str, Any]) -> None:
    with pytest.raises(ObjectError) as e:
        decode_object(raw)
    assert e.value.name == f"{raw['metadata']['namespace']}/{raw['metadata']['name']}"


def test_policy_kinds_have_tombstones() -> None:
    for kind in ("HTTPRoute", "GatewayHTTPRoute", "GRPCRoute", "AuthorizationPolicy",
                 "ServerAuthorization", "MeshTLSAuthentication", "NetworkAuthentication"):
        obj = tombstone(kind, "ns", "n")
        assert obj is not None and obj.kind == kind


def test_the_pods_http_probes_get_a_probe_route_from_the_probe_networks() -> None:
    raw = cart()
    app = raw["spec"]["containers"][0]
    app["readinessProbe"] = {"httpGet": {"port": "http", "path": "/ready?full=1"}}
    app["livenessProbe"] = {"httpGet": {"port": 8080, "path": "/live"}}
    app["startupProbe"] = {"httpGet": {"port": 9999, "path": "/elsewhere"}}
    c = Cluster()
    load(c, raw)
    settings = inbound.InboundSettings("deny", NETS, (ipaddress.ip_network("0.0.0.0/0"),))
    default, probe = server_policy(c, settings=settings).protocol.detect.http_routes
    assert default.metadata.default == "default" and not default.authorizations
    assert probe.metadata.default == "probe"
    (rule,) = probe.rules
    assert [(m.path.exact, m.method.registered) for m in rule.matches] == [
        ("/live", 0), ("/ready", 0)]  # GET
    (authz,) = probe.authorizations
    assert authz.metadata.default == "probe"
    assert dict(authz.labels) == {"group": "", "kind": "default", "name": "probe"}
    assert authz.authentication.WhichOneof("permit") == "unauthenticated"
    assert [n.net.prefix_len for n in authz.networks] == [0]
    # A Server without routes of its own keeps the probe route; no probe networks, none.
    load(c, server("cart-http", proto="HTTP/1"))
    routes = server_policy(c, settings=settings).protocol.http1.routes
    assert [r.metadata.default for r in routes] == ["default", "probe"]
    assert len(server_policy(c).protocol.http1.routes) == 1
