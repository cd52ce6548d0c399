"""The harness' decoding of both protocols' endpoints into NormalEndpoints."""

from __future__ import annotations

import ipaddress

import pytest
from envoy.config.endpoint.v3 import endpoint_components_pb2
from google.protobuf import json_format, struct_pb2

from harness.normalize import (
    METADATA_NAMESPACE,
    NormalEndpoint,
    from_lb_endpoint,
    from_weighted_addr,
    plain_value,
    tcp_address,
)
from linkerd_api.proto import destination_pb2, net_pb2


@pytest.mark.parametrize("ip", ["0.0.0.0", "10.244.1.10", "192.168.0.255",
                                "255.255.255.255", "1.2.3.4"])
def test_an_ipv4_tcp_address_reads_as_ipaddress_writes_it(ip: str) -> None:
    addr = net_pb2.TcpAddress(ip=net_pb2.IPAddress(ipv4=int(ipaddress.IPv4Address(ip))),
                              port=8080)
    assert tcp_address(addr) == (str(ipaddress.IPv4Address(ip)), 8080)


def test_a_weighted_addr_reads_its_zone_labels() -> None:
    wa = destination_pb2.WeightedAddr(
        addr=net_pb2.TcpAddress(ip=net_pb2.IPAddress(ipv4=0x0AF4010A), port=80), weight=7,
        metric_labels={"zone": "zone-a", "zone_locality": "local", "pod": "web-1"})
    assert from_weighted_addr(wa) == NormalEndpoint("10.244.1.10", 80, 7, zone="zone-a",
                                                    locality="local")


def test_plain_value_is_what_message_to_dict_gives() -> None:
    s = struct_pb2.Struct()
    s.update({"n": 4143, "f": 1.5, "s": "h2", "b": True, "z": None,
              "l": [1, "x"], "m": {"zone": "a"}})
    assert {k: plain_value(v) for k, v in s.fields.items()} == json_format.MessageToDict(s)


def test_an_lb_endpoint_reads_meshbridges_metadata() -> None:
    lb = endpoint_components_pb2.LbEndpoint()
    sa = lb.endpoint.address.socket_address
    sa.address, sa.port_value = "10.244.1.10", 8080
    lb.metadata.filter_metadata[METADATA_NAMESPACE].update({
        "weight": 10000, "identity": "web.default.serviceaccount.identity.linkerd.local",
        "protocol_hint": "opaque", "opaque_transport_port": 4143, "zone": "zone-a",
        "zone_locality": "local", "labels": {"pod": "web-1"}, "pod": "web-1"})
    assert from_lb_endpoint(lb) == NormalEndpoint(
        "10.244.1.10", 8080, 10000, "web.default.serviceaccount.identity.linkerd.local",
        "opaque", 4143, "zone-a", "local", "HEALTHY")
