"""The policy API bindings (outbound, inbound and the route protos): the paths, the
fields a linkerd2-proxy reads, and hand-encoded golden bytes (linkerd2-proxy-api
v0.20.0, Linkerd §12)."""

from __future__ import annotations

import ipaddress

import pytest
from google.protobuf.duration_pb2 import Duration

from linkerd_api.proto import (
    grpc_route_pb2,
    http_route_pb2,
    inbound_pb2,
    meta_pb2,
    net_pb2,
    opaque_route_pb2,
    outbound_pb2,
    tls_route_pb2,
)

PACKAGES = {
    outbound_pb2: ("outbound.proto", "io.linkerd.proxy.outbound"),
    inbound_pb2: ("inbound.proto", "io.linkerd.proxy.inbound"),
    http_route_pb2: ("http_route.proto", "io.linkerd.proxy.http_route"),
    grpc_route_pb2: ("grpc_route.proto", "io.linkerd.proxy.grpc_route"),
    opaque_route_pb2: ("opaque_route.proto", "io.linkerd.proxy.opaque_route"),
    tls_route_pb2: ("tls_route.proto", "io.linkerd.proxy.tls_route"),
}


@pytest.mark.parametrize("module", list(PACKAGES), ids=lambda m: m.__name__)
def test_files_keep_upstreams_names_and_packages(module: object) -> None:
    name, package = PACKAGES[module]  # type: ignore[index]
    fd = module.DESCRIPTOR  # type: ignore[attr-defined]
    assert (fd.name, fd.package) == (name, package)


def test_service_paths_and_streaming() -> None:
    out = outbound_pb2.DESCRIPTOR.services_by_name["OutboundPolicies"]
    inb = inbound_pb2.DESCRIPTOR.services_by_name["InboundServerPolicies"]
    methods = {f"/{s.full_name}/{m.name}": (m.input_type.name, m.output_type.name,
                                            m.server_streaming)
               for s in (out, inb) for m in s.methods}
    assert methods == {
        "/io.linkerd.proxy.outbound.OutboundPolicies/Get":
            ("TrafficSpec", "OutboundPolicy", False),
        "/io.linkerd.proxy.outbound.OutboundPolicies/Watch":
            ("TrafficSpec", "OutboundPolicy", True),
        "/io.linkerd.proxy.inbound.InboundServerPolicies/GetPort":
            ("PortSpec", "Server", False),
        "/io.linkerd.proxy.inbound.InboundServerPolicies/WatchPort":
            ("PortSpec", "Server", True),
    }


# (message, field, number): the fields the proxy needs in a default answer.
FIELDS = [
    (outbound_pb2.TrafficSpec, "source_workload", 1), (outbound_pb2.TrafficSpec, "addr", 2),
    (outbound_pb2.TrafficSpec, "authority", 3),
    (outbound_pb2.OutboundPolicy, "protocol", 1), (outbound_pb2.OutboundPolicy, "metadata", 2),
    (outbound_pb2.ProxyProtocol, "detect", 1), (outbound_pb2.ProxyProtocol, "opaque", 2),
    (outbound_pb2.ProxyProtocol, "http1", 3), (outbound_pb2.ProxyProtocol, "http2", 4),
    (outbound_pb2.ProxyProtocol, "grpc", 5), (outbound_pb2.ProxyProtocol, "tls", 6),
    (outbound_pb2.ProxyProtocol.Detect, "timeout", 1),
    (outbound_pb2.ProxyProtocol.Detect, "opaque", 2),
    (outbound_pb2.ProxyProtocol.Detect, "http1", 3),
    (outbound_pb2.ProxyProtocol.Detect, "http2", 4),
    (outbound_pb2.HttpRoute.Rule, "matches", 1), (outbound_pb2.HttpRoute.Rule, "filters", 2),
    (outbound_pb2.HttpRoute.Rule, "backends", 3),
    (outbound_pb2.HttpRoute.Rule, "requestTimeout", 4),
    (outbound_pb2.HttpRoute.Rule, "timeouts", 5), (outbound_pb2.HttpRoute.Rule, "retry", 6),
    (outbound_pb2.HttpRoute.Rule, "allow_l5d_request_headers", 7),
    (outbound_pb2.HttpRoute.RouteBackend, "filters", 3),
    (outbound_pb2.OpaqueRoute, "rules", 3), (outbound_pb2.OpaqueRoute.RouteBackend, "filters", 3),
    (outbound_pb2.Backend, "metadata", 1), (outbound_pb2.Backend, "forward", 2),
    (outbound_pb2.Backend, "balancer", 3), (outbound_pb2.Backend, "queue", 4),
    (outbound_pb2.Backend.BalanceP2c, "discovery", 1),
    (outbound_pb2.Backend.BalanceP2c, "peak_ewma", 2),
    (outbound_pb2.Backend.BalanceP2c, "penalty_peak_ewma", 3),
    (outbound_pb2.GrpcRoute.Retry.Conditions, "deadine_exceeded", 4),
    (inbound_pb2.PortSpec, "workload", 1), (inbound_pb2.PortSpec, "port", 2),
    (inbound_pb2.Server, "protocol", 1), (inbound_pb2.Server, "server_ips", 2),
    (inbound_pb2.Server, "authorizations", 3), (inbound_pb2.Server, "labels", 4),
    (inbound_pb2.ProxyProtocol, "tls", 3), (inbound_pb2.ProxyProtocol, "http1", 4),
    (inbound_pb2.ProxyProtocol.Detect, "http_routes", 3),
    (inbound_pb2.ProxyProtocol.Http1, "routes", 2),
    (inbound_pb2.Authz, "networks", 1), (inbound_pb2.Authz, "authentication", 2),
    (inbound_pb2.Authz, "labels", 3), (inbound_pb2.Authz, "metadata", 4),
    (inbound_pb2.Authn, "meshTLS", 2),
    (inbound_pb2.HttpLocalRateLimit.Limit, "requestsPerSecond", 1),
]


@pytest.mark.parametrize(("message", "field", "number"), FIELDS,
                         ids=[f"{m.__name__}.{f}" for m, f, _ in FIELDS])
def test_field_numbers_match_upstream(message: type, field: str, number: int) -> None:
    assert message.DESCRIPTOR.fields_by_name[field].number == number  # type: ignore[attr-defined]


def test_reserved_numbers_stay_reserved() -> None:
    from google.protobuf import descriptor_pb2

    fdp = descriptor_pb2.FileDescriptorProto()
    inbound_pb2.DESCRIPTOR.CopyToProto(fdp)
    (protocol,) = [m for m in fdp.message_type if m.name == "ProxyProtocol"]
    reserved = {n.name: [(r.start, r.end) for r in n.reserved_range]
                for n in protocol.nested_type}
    assert reserved["Detect"] == [(2, 3)] and reserved["Http1"] == [(1, 2)]


def test_traffic_spec_golden_bytes() -> None:
    spec = outbound_pb2.TrafficSpec(
        source_workload="a:b",
        addr=net_pb2.TcpAddress(ip=net_pb2.IPAddress(
            ipv4=int(ipaddress.IPv4Address("10.96.20.10"))), port=80))
    # source_workload(1, LEN) "a:b"; addr(2, LEN) TcpAddress{ip(1, LEN) IPAddress{ipv4(1,
    # fixed32, little-endian)}, port(2, varint)}.
    ip = b"\x0d" + (0x0A60140A).to_bytes(4, "little")
    tcp = b"\x0a\x05" + ip + b"\x10\x50"
    assert spec.SerializeToString() == b"\x0a\x03a:b" + b"\x12\x09" + tcp
    by_name = outbound_pb2.TrafficSpec(source_workload="", authority="w:80")
    assert by_name.SerializeToString() == b"\x1a\x04w:80"


def test_default_backend_golden_bytes() -> None:
    backend = outbound_pb2.Backend(
        metadata=meta_pb2.Metadata(default="x"),
        queue=outbound_pb2.Queue(capacity=100, failfast_timeout=Duration(seconds=3)),
        balancer=outbound_pb2.Backend.BalanceP2c(
            discovery=outbound_pb2.Backend.EndpointDiscovery(
                dst=outbound_pb2.Backend.EndpointDiscovery.DestinationGet(path="p:1")),
            peak_ewma=outbound_pb2.Backend.BalanceP2c.PeakEwma(
                default_rtt=Duration(nanos=30_000_000), decay=Duration(seconds=10))))
    md = b"\x0a\x03" + b"\x0a\x01x"  # metadata(1) > default(1) "x"
    dst_get = b"\x0a\x03p:1"  # DestinationGet.path(1)
    discovery = b"\x0a\x05" + dst_get  # EndpointDiscovery.dst(1)
    # PeakEwma{default_rtt(1) Duration{nanos(2) 30e6}, decay(2) Duration{seconds(1) 10}}
    rtt = b"\x10" + bytes([0x80, 0x87, 0xA7, 0x0E])  # 30_000_000 as a varint
    ewma = b"\x0a\x05" + rtt + b"\x12\x02\x08\x0a"
    balancer = b"\x0a\x07" + discovery + b"\x12\x0b" + ewma
    queue = b"\x08\x64\x12\x02\x08\x03"  # capacity 100; failfast_timeout 3s
    expected = md + b"\x1a" + bytes([len(balancer)]) + balancer + b"\x22\x06" + queue
    assert backend.SerializeToString() == expected
    assert outbound_pb2.Backend.FromString(expected) == backend


def test_port_spec_and_authz_golden_bytes() -> None:
    spec = inbound_pb2.PortSpec(workload="ns:pod", port=4191)
    assert spec.SerializeToString() == b"\x0a\x06ns:pod" + b"\x10\xdf\x20"
    authn = inbound_pb2.Authn(meshTLS=inbound_pb2.Authn.PermitMeshTLS(
        identities=inbound_pb2.Authn.PermitMeshTLS.PermitClientIdentities(
            suffixes=[inbound_pb2.IdentitySuffix()])))
    # meshTLS(2) > identities(2) > suffixes(2) > an empty IdentitySuffix
    assert authn.SerializeToString() == b"\x12\x04\x12\x02\x12\x00"
    server = inbound_pb2.Server(labels={"k": "v"})
    # labels(4): a map entry message {key(1) "k", value(2) "v"}
    assert server.SerializeToString() == b"\x22\x06\x0a\x01k\x12\x01v"


def test_failure_filter_golden_bytes() -> None:
    f = outbound_pb2.HttpRoute.Filter(failure_injector=http_route_pb2.HttpFailureInjector(
        status=500, message="m"))
    # failure_injector(1) > {status(1) 500 = f4 03, message(2) "m"}
    assert f.SerializeToString() == b"\x0a\x06\x08\xf4\x03\x12\x01m"
