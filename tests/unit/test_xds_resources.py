"""Resources built from the View (xDS §3.4, §4.3, §5.3) and their encoding."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2, health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2

from bridge.model import (
    BASE_WEIGHT,
    Endpoint,
    EndpointId,
    Enrichment,
    ProtocolHint,
    ResolvedEndpoint,
    ServiceKey,
    ViewKey,
)
from bridge.objects import ServicePort
from testkit.xds_model import CDS, EDS, World, name, unpack
from xds_api import resources
from xds_api.names import expand_short_name, parse_resource_name
from xds_api.route_config import build_default_route

HEALTHY = health_check_pb2.HealthStatus.HEALTHY
DRAINING = health_check_pb2.HealthStatus.DRAINING


def resolved(ip: str, pod: str = "", zone: str | None = "zone-a", region: str = "r1",
             ready: bool = True, serving: bool = True, terminating: bool = False,
             weight: int = BASE_WEIGHT, **extra: Any) -> ResolvedEndpoint:
    eid = EndpointId("pod" if pod else "address", "app", pod or ip,
                     "IPv6" if ":" in ip else "IPv4")
    enr = Enrichment(**{k: extra.pop(k) for k in list(extra) if k in Enrichment.__slots__})
    ep = Endpoint(eid, ip, 8080, ready=ready, serving=serving, terminating=terminating,
                  zone=zone, region=region, pod_name=pod, enrichment=enr, **extra)
    return ResolvedEndpoint(ep, "unknown", weight)


def decode_cla(data: bytes) -> endpoint_pb2.ClusterLoadAssignment:
    return endpoint_pb2.ClusterLoadAssignment.FromString(data)


@pytest.mark.parametrize(
    ("ready", "serving", "terminating", "draining", "expected"),
    [
        (True, True, False, False, HEALTHY),
        (True, True, True, False, HEALTHY),  # publishNotReadyAddresses
        (False, True, True, False, None),
        (False, True, True, True, DRAINING),
        (False, False, True, True, None),
        (False, True, False, True, None),
    ],
)
def test_health_follows_the_endpoint_conditions(ready: bool, serving: bool, terminating: bool,
                                                draining: bool, expected: int | None) -> None:
    r = resolved("10.0.0.1", ready=ready, serving=serving, terminating=terminating)
    assert resources.health_status(r, draining) == expected


def test_the_cla_is_one_weighted_locality_per_zone_sorted_and_deduplicated() -> None:
    eps = [
        resolved("10.0.0.10", "b", zone="zone-b"),
        resolved("10.0.0.9", "a2", zone="zone-a"),
        resolved("10.0.0.2", "a1", zone="zone-a", weight=3 * BASE_WEIGHT),
        resolved("10.0.0.2", "", zone="zone-a"),  # the same address twice
        resolved("10.0.0.7", "vm", zone=None, region=""),
        resolved("10.0.0.8", "old", ready=False, terminating=True),  # not sent
    ]
    data, _ = resources.encode_cla("c", eps, draining=False)
    cla = decode_cla(data)
    assert cla.cluster_name == "c"
    got = [(loc.locality.region, loc.locality.zone, loc.load_balancing_weight.value,
            [(lb.endpoint.address.socket_address.address, lb.load_balancing_weight.value)
             for lb in loc.lb_endpoints]) for loc in cla.endpoints]
    assert got == [
        ("", "", 1, [("10.0.0.7", 1)]),
        ("r1", "zone-a", 4, [("10.0.0.2", 3), ("10.0.0.9", 1)]),
        ("r1", "zone-b", 1, [("10.0.0.10", 1)]),
    ]
    assert all(loc.priority == 0 for loc in cla.endpoints)


def test_assembled_bytes_equal_the_message_serialization() -> None:
    eps = [resolved("10.0.0.1", "p1", zone="zone-b", identity="web.app.serviceaccount"),
           resolved("fd00::1", "p2", zone="zone-a"),
           resolved("10.0.0.3", "p3", zone="zone-a", ready=False, terminating=True)]
    data, _ = resources.encode_cla("web.app.svc.cluster.local:80", eps, draining=True)
    msg = endpoint_pb2.ClusterLoadAssignment(cluster_name="web.app.svc.cluster.local:80")
    for zone, members in (("zone-a", [eps[2], eps[1]]), ("zone-b", [eps[0]])):
        loc = msg.endpoints.add(locality=base_pb2.Locality(region="r1", zone=zone))
        for r in members:
            lb = endpoint_components_pb2.LbEndpoint.FromString(
                resources.encode_lb_endpoint(r, resources.health_status(r, True) or 0))
            loc.lb_endpoints.append(lb)
        loc.load_balancing_weight.value = len(members)
    assert data == msg.SerializeToString(deterministic=True)


def test_endpoint_metadata_carries_the_linkerd_enrichment() -> None:
    r = resolved("10.0.0.1", "web-1", identity="web.app.serviceaccount.identity.linkerd",
                 hint=ProtocolHint(h2=True, opaque_transport_port=4143), hostname="web-1",
                 metric_labels=(("deployment", "web"), ("serviceaccount", "web")))
    lb = endpoint_components_pb2.LbEndpoint.FromString(resources.encode_lb_endpoint(r, 1))
    meta = lb.metadata.filter_metadata["io.linkerd.destination"]
    fields = {k: v for k, v in meta.fields.items()}
    assert fields["identity"].string_value == "web.app.serviceaccount.identity.linkerd"
    assert fields["protocol_hint"].string_value == "h2"
    assert fields["opaque_transport_port"].number_value == 4143
    assert fields["zone"].string_value == "zone-a"
    assert fields["zone_locality"].string_value == "unknown"
    assert fields["labels"].struct_value.fields["deployment"].string_value == "web"
    assert lb.endpoint.hostname == "web-1"


def test_an_unchanged_endpoint_is_not_encoded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    eps = [resolved(f"10.0.0.{i}", f"p{i}") for i in range(1, 51)]
    _, memo = resources.encode_cla("c", eps, draining=False)
    calls = []
    real = resources.encode_lb_endpoint

    def counting(r: ResolvedEndpoint, health: int, *args: Any) -> bytes:
        calls.append(r.endpoint.ip)
        return real(r, health, *args)

    monkeypatch.setattr(resources, "encode_lb_endpoint", counting)
    eps[7] = resolved("10.0.0.8", "p8", zone="zone-b")
    data, _ = resources.encode_cla("c", eps, draining=False, previous=memo)
    assert calls == ["10.0.0.8"]
    assert len(decode_cla(data).endpoints) == 2


@pytest.mark.parametrize(
    ("port_name", "app_protocol", "h2"),
    [("grpc", "", True), ("http", "grpc", True), ("grpc-web-ui", "", True),
     ("http", "kubernetes.io/h2c", True), ("http2", "", True), ("http", "", False),
     ("otlp-grpc", "", False), ("redis", "", False), ("h2c", "HTTP", False)],
)
def test_http2_upstream_follows_app_protocol_or_port_name(port_name: str, app_protocol: str,
                                                          h2: bool) -> None:
    assert resources.is_http2(ServicePort(port_name, 80, None, "TCP", app_protocol)) == h2


def test_cluster_is_eds_over_ads_round_robin_with_http2_for_grpc() -> None:
    key = ViewKey(ServiceKey("app", "api"), 9090)
    c = resources.build_cluster("api.app.svc.cluster.local:9090", key,
                                ServicePort("grpc", 9090, None, "TCP", "grpc"))
    assert c.type == cluster_pb2.Cluster.DiscoveryType.EDS
    assert c.eds_cluster_config.eds_config.HasField("ads")
    assert not c.eds_cluster_config.service_name
    assert c.lb_policy == cluster_pb2.Cluster.LbPolicy.ROUND_ROBIN
    assert not c.health_checks
    opts = http_protocol_options_pb2.HttpProtocolOptions()
    c.typed_extension_protocol_options[
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].Unpack(opts)
    assert opts.explicit_http_config.HasField("http2_protocol_options")
    plain = resources.build_cluster("x", key, ServicePort("http", 80, None))
    assert not plain.typed_extension_protocol_options


def test_proxyless_listener_and_route_lead_to_the_cluster_of_the_same_name() -> None:
    n = "echo.app.svc.cluster.local:50051"
    listener = resources.build_listener(n)
    manager = hcm_pb2.HttpConnectionManager()
    assert listener.api_listener.api_listener.Unpack(manager)
    assert manager.rds.route_config_name == n and manager.rds.config_source.HasField("ads")
    assert [f.name for f in manager.http_filters] == ["envoy.filters.http.router"]
    assert manager.http_filters[-1].typed_config.Is(router_pb2.Router.DESCRIPTOR)
    route = build_default_route(n)
    assert route.name == n
    [vhost] = route.virtual_hosts
    assert list(vhost.domains) == ["*"]
    assert vhost.routes[0].match.prefix == "" and vhost.routes[0].route.cluster == n


def test_assembled_responses_are_byte_for_byte_what_protobuf_would_write() -> None:
    world = World()
    sotw, delta = world.sotw(), world.delta()
    sotw.request(CDS, [])
    sotw.request(EDS, [name("web"), name("api")])
    delta.request(CDS, ["*", name("gone")])
    delta.request(EDS, [name("web")])
    raws = sotw.stream.take_responses()
    draws = delta.stream.take_responses()
    assert len(raws) == 2 and len(draws) == 2
    for raw in raws:
        msg = discovery_pb2.DiscoveryResponse.FromString(raw)
        assert msg.SerializeToString(deterministic=True) == raw
    for raw in draws:
        dmsg = discovery_pb2.DeltaDiscoveryResponse.FromString(raw)
        assert dmsg.SerializeToString(deterministic=True) == raw
        assert all(r.version and r.name for r in dmsg.resources)


def test_a_response_is_a_valid_discovery_response_with_resources_typed_as_it() -> None:
    client = World().sotw()
    client.request(CDS, [])
    client.request(EDS, [name("web")])
    for resp in client.responses():
        assert resp.control_plane.identifier == "meshbridge"
        assert all(a.type_url == resp.type_url for a in resp.resources)
        # Re-encoding the parsed message gives the very bytes that were sent.
        again = discovery_pb2.DiscoveryResponse.FromString(resp.SerializeToString())
        assert again == resp
        assert [unpack(a) for a in resp.resources]


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("web.app.svc.cluster.local:80", ("app", "web", 80, "")),
        ("db-0.db.data.svc.cluster.local:5432", ("data", "db", 5432, "db-0")),
        ("web.app.svc.cluster.local", None),  # xDS names always carry the port
        ("web.app.svc.cluster.local:080", None),  # one spelling per View
        ("web.app.svc.other.domain:80", None),
        ("Web.app.svc.cluster.local:80", None),
        ("web.app:80", None),
        ("10.0.0.1:80", None),
        ("*", None),
        ("", None),
        ("a" * 300 + ".app.svc.cluster.local:80", None),
    ],
)
def test_resource_names_are_canonical_authorities(
        text: str, parsed: tuple[str, str, int, str] | None) -> None:
    key = parse_resource_name(text, "cluster.local")
    got = None if key is None else (key.service.namespace, key.service.name, key.port,
                                    key.filter.hostname)
    assert got == parsed


def test_short_names_expand_for_people() -> None:
    assert expand_short_name("web.app:80", "cluster.local") == "web.app.svc.cluster.local:80"
    assert expand_short_name("web.app.svc:80", "c.l") == "web.app.svc.c.l:80"
    full = "web.app.svc.cluster.local:80"
    assert expand_short_name(full, "cluster.local") == full


def test_any_wrapping_matches_protobuf() -> None:
    res = resources.encode_resource(EDS, "n", b"\x0a\x01n")
    msg = any_pb2.Any.FromString(res.any_bytes)
    assert msg.type_url == EDS and msg.value == b"\x0a\x01n"


def istio_encoder(labels: dict[str, str]) -> resources.MetadataEncoder:
    return resources.MetadataEncoder("istio", "Kubernetes", lambda _r: labels)


def test_the_istio_profile_sends_what_istiod_sends_a_sidecar() -> None:
    r = resolved("10.0.0.1", "web-1", identity="web.app.serviceaccount.identity.linkerd",
                 owner_kind="deployment", owner_name="web")
    labels = {"security.istio.io/tlsMode": "istio", "app": "web-app",
              "service.istio.io/canonical-name": "web-canonical",
              "service.istio.io/canonical-revision": "v2", "version": "v9"}
    lb = endpoint_components_pb2.LbEndpoint.FromString(
        resources.encode_lb_endpoint(r, 1, istio_encoder(labels)))
    fm = lb.metadata.filter_metadata
    assert sorted(fm) == ["envoy.transport_socket_match", "istio"]
    assert dict(fm["envoy.transport_socket_match"].fields)["tlsMode"].string_value == "istio"
    assert fm["istio"].fields["workload"].string_value == \
        "web;app;web-canonical;v2;Kubernetes"


@pytest.mark.parametrize(("labels", "tls", "workload"), [
    # Not injected (no label) or explicitly out of mTLS: no transport socket match.
    ({}, None, "web;app;web;;Kubernetes"),
    ({"security.istio.io/tlsMode": "disabled", "app.kubernetes.io/name": "shop",
      "app": "ignored", "app.kubernetes.io/version": "1.2"}, None,
     "web;app;shop;1.2;Kubernetes"),
    # A tlsMode istiod does not know takes no mTLS either (found beside a real istiod).
    ({"security.istio.io/tlsMode": "mutual"}, None, "web;app;web;;Kubernetes"),
    # istiod leaves its default revision, "latest", out.
    ({"app": "web-app", "version": "latest"}, None, "web;app;web-app;;Kubernetes"),
    # A label present with an empty value still wins over the ones after it (found
    # beside a real istiod: tests/integration/test_istiod_differential.py).
    ({"app.kubernetes.io/name": "", "app": "web-app", "app.kubernetes.io/version": "",
      "version": "v3"}, None, "web;app;;;Kubernetes"),
])
def test_the_istio_profile_follows_istiods_defaults(labels: dict[str, str], tls: str | None,
                                                    workload: str) -> None:
    r = resolved("10.0.0.1", "web-1", owner_kind="deployment", owner_name="web")
    lb = endpoint_components_pb2.LbEndpoint.FromString(
        resources.encode_lb_endpoint(r, 1, istio_encoder(labels)))
    fm = lb.metadata.filter_metadata
    assert ("envoy.transport_socket_match" in fm) == (tls is not None)
    assert fm["istio"].fields["workload"].string_value == workload


def test_the_none_profile_sends_no_metadata_and_an_unknown_profile_is_refused() -> None:
    r = resolved("10.0.0.1", "web-1", identity="x")
    lb = endpoint_components_pb2.LbEndpoint.FromString(
        resources.encode_lb_endpoint(r, 1, resources.MetadataEncoder("none")))
    assert not lb.HasField("metadata")
    with pytest.raises(ValueError, match="none, istio, linkerd"):
        resources.MetadataEncoder("consul")


def test_a_pod_label_change_reencodes_the_istio_metadata() -> None:
    labels = {"security.istio.io/tlsMode": "istio"}
    enc = istio_encoder(labels)
    eps = [resolved("10.0.0.1", "web-1", owner_kind="deployment", owner_name="web")]
    first, memo = resources.encode_cla("c", eps, False, None, enc)
    labels["security.istio.io/tlsMode"] = "disabled"
    second, _ = resources.encode_cla("c", eps, False, memo, enc)
    assert first != second and b"transport_socket_match" not in second
