"""The load client's check of SotW responses (bench/sotw_check.py): a response is
right only if it says the change, whether it is read in full or by its bytes, and
its ACK is the one a client would build for it."""

from __future__ import annotations

from typing import Any

from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2

from bench.sotw_check import SotwReader

EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
NAME = "web.shop.svc.cluster.local:80"


def response(endpoints: int, nonce: str, version: str = "v1") -> bytes:
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name=NAME)
    locality = cla.endpoints.add()
    for i in range(endpoints):
        address = locality.lb_endpoints.add().endpoint.address.socket_address
        address.address, address.port_value = f"10.0.0.{i + 1}", 8080
    message = discovery_pb2.DiscoveryResponse(version_info=version, type_url=EDS,
                                              nonce=nonce)
    message.resources.add(type_url=EDS, value=cla.SerializeToString())
    data: bytes = message.SerializeToString()
    return data


def endpoint_count(n: int, message: Any) -> bool:
    cla = endpoint_pb2.ClusterLoadAssignment.FromString(message.resources[0].value)
    return sum(len(loc.lb_endpoints) for loc in cla.endpoints) == 3 + n % 2


def expected_ack(version: str, nonce: str) -> bytes:
    data: bytes = discovery_pb2.DiscoveryRequest(
        type_url=EDS, resource_names=[NAME], version_info=version,
        response_nonce=nonce).SerializeToString()
    return data


def test_the_first_response_of_a_change_is_decoded_and_the_rest_compared_by_bytes() -> None:
    reader = SotwReader(EDS, [NAME], endpoint_count)
    assert reader.read(1, response(4, "a1", "v2")) == (True, expected_ack("v2", "a1"))
    assert reader.read(1, response(4, "b7", "v2")) == (True, expected_ack("v2", "b7"))
    assert reader.read(1, response(4, "c9", "v2")) == (True, expected_ack("v2", "c9"))
    assert reader.decoded == 1


def test_a_wrong_response_is_wrong_before_and_after_a_right_one_is_known() -> None:
    reader = SotwReader(EDS, [NAME], endpoint_count)
    # Change 2 must carry 3 endpoints: a message with 4 (change 1's) is wrong...
    ok, ack = reader.read(2, response(4, "a1", "v2"))
    assert not ok and ack == expected_ack("v2", "a1")
    # ... and stays wrong once the right bytes are known for the change.
    assert reader.read(2, response(3, "a2", "v3"))[0]
    assert not reader.read(2, response(4, "a3", "v2"))[0]
    assert not reader.read(2, b"\xff\xff not a message")[0]
    assert reader.decoded == 4


def test_a_response_of_another_type_is_wrong() -> None:
    reader = SotwReader("type.googleapis.com/envoy.config.cluster.v3.Cluster", [NAME],
                        endpoint_count)
    assert not reader.read(1, response(4, "a1"))[0]
