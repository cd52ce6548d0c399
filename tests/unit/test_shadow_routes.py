"""`meshbridge shadow --routes`: route answers as flat fields (harness.shadow.routes),
and routes in the comparison (harness.shadow.model)."""

from __future__ import annotations

from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from google.protobuf import wrappers_pb2

from harness.shadow.fields import FieldFilter, known, linkerd_schema, xds_schema
from harness.shadow.model import DIFFERS, EQUAL, PENDING, Answer, compare
from harness.shadow.routes import authority_reader, rds_fields

WEB = "web.shop.svc.cluster.local:80"


def config(*vhosts: rc.VirtualHost) -> route_pb2.RouteConfiguration:
    return route_pb2.RouteConfiguration(name="80", virtual_hosts=list(vhosts))


def split(*clusters: tuple[str, int]) -> rc.Route:
    return rc.Route(match=rc.RouteMatch(prefix="/"), route=rc.RouteAction(
        weighted_clusters=rc.WeightedCluster(clusters=[
            rc.WeightedCluster.ClusterWeight(name=n, weight=wrappers_pb2.UInt32Value(value=w))
            for n, w in clusters])))


def test_an_eds_name_template_reads_back_to_the_authority() -> None:
    istio = authority_reader("outbound|{port}||{host}")
    assert istio("outbound|80||web.shop.svc.cluster.local") == WEB
    assert istio("PassthroughCluster") == "PassthroughCluster"
    assert authority_reader("{authority}")(WEB) == WEB
    assert authority_reader("eds/{host}/{port}")("eds/web.shop.svc.cluster.local/80") == WEB


def test_the_targets_own_virtual_host_is_compared_with_its_clusters_by_authority() -> None:
    theirs = config(
        rc.VirtualHost(name="other", domains=["other.shop.svc.cluster.local"],
                       routes=[split(("outbound|80||other.shop.svc.cluster.local", 1))]),
        rc.VirtualHost(name=f"{WEB}", domains=["web.shop.svc.cluster.local", WEB],
                       routes=[split(("outbound|80||web.shop.svc.cluster.local", 90),
                                     ("outbound|80||web-canary.shop.svc.cluster.local", 10))]))
    ours = config(rc.VirtualHost(name=WEB, domains=["*"], routes=[
        split((WEB, 90), ("web-canary.shop.svc.cluster.local:80", 10))]))
    read = authority_reader("outbound|{port}||{host}")
    assert rds_fields(theirs, WEB, read) == rds_fields(ours, WEB)
    assert rds_fields(ours, WEB)["rds.routes[0].route.weighted_clusters.clusters[1].name"] \
        == "web-canary.shop.svc.cluster.local:80"
    assert rds_fields(config(), WEB) == {"rds.status": "no virtual host for "
                                                       "web.shop.svc.cluster.local"}


def test_a_case_sensitive_match_is_envoys_default() -> None:
    plain = config(rc.VirtualHost(name="v", domains=["*"], routes=[split((WEB, 1))]))
    explicit = route_pb2.RouteConfiguration()
    explicit.CopyFrom(plain)
    explicit.virtual_hosts[0].routes[0].match.case_sensitive.value = True
    assert rds_fields(explicit, WEB) == rds_fields(plain, WEB)


def test_routes_are_compared_when_both_sides_carry_them() -> None:
    ours = Answer("endpoints", routes={"rds.routes[0].route.timeout.seconds": "5"})
    theirs = Answer("endpoints", routes={"rds.routes[0].route.timeout.seconds": "2"})
    verdict = compare(ours, theirs)
    assert verdict.status == DIFFERS
    assert [d.field for d in verdict.differences] == ["rds.routes[0].route.timeout.seconds"]
    assert compare(ours, theirs, FieldFilter(["rds.routes.route.timeout"])).status == EQUAL
    assert compare(ours, Answer("endpoints")).status == EQUAL  # theirs does not carry them
    assert compare(ours, Answer("endpoints", routes={}, routes_pending=True)).status == PENDING


def test_route_fields_are_known_to_the_field_filter() -> None:
    assert known(linkerd_schema(), "policy.protocol.detect.http1.routes.rules")
    assert known(linkerd_schema(), "policy.status")
    assert known(xds_schema(), "rds.routes.route.retry_policy")
    assert known(xds_schema(), "rds.include_request_attempt_count")
    assert not known(xds_schema(), "rds.domains")
