"""The LEDS measuring client's bookkeeping: what it subscribes to and what state it
holds after each response, fed responses as the server's contract describes them
(docs/compare.md, "LEDS"). The stream itself runs against the real server in
tests/integration/test_compare.py."""

from __future__ import annotations

from typing import Any, cast

from envoy.config.core.v3 import address_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2

from harness.clients import EDS_TYPE
from harness.compare.leds import LEDS_TYPE, OPT_IN_KEY, LedsClient, collection_of

TARGET = "svc-0.ns-0.svc.cluster.local:8080"
COLL_A = "xdstp://meshbridge/envoy.config.endpoint.v3.LbEndpoint/ns-0/svc-0/8080/zone-a/*"
COLL_B = "xdstp://meshbridge/envoy.config.endpoint.v3.LbEndpoint/ns-0/svc-0/8080/zone-b/*"


def lb(ip: str) -> endpoint_components_pb2.LbEndpoint:
    return endpoint_components_pb2.LbEndpoint(endpoint=endpoint_components_pb2.Endpoint(
        address=address_pb2.Address(socket_address=address_pb2.SocketAddress(
            address=ip, port_value=8080))))


def cla_response(collections: list[str], nonce: str = "1",
                 inline: tuple[str, ...] = ()) -> bytes:
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name=TARGET)
    for name in collections:
        loc = cla.endpoints.add()
        loc.leds_cluster_locality_config.leds_collection_name = name
    if inline:
        cla.endpoints.add().lb_endpoints.extend(lb(ip) for ip in inline)
    resp = discovery_pb2.DeltaDiscoveryResponse(type_url=EDS_TYPE, nonce=nonce)
    r = resp.resources.add(name=TARGET, version="1")
    r.resource.Pack(cla)
    return bytes(resp.SerializeToString())


def leds_response(added: dict[str, str], removed: tuple[str, ...] = (),
                  nonce: str = "2") -> bytes:
    resp = discovery_pb2.DeltaDiscoveryResponse(type_url=LEDS_TYPE, nonce=nonce,
                                                removed_resources=list(removed))
    for name, ip in added.items():
        r = resp.resources.add(name=name, version="1")
        r.resource.Pack(lb(ip))
    return bytes(resp.SerializeToString())


def member(coll: str, ident: str) -> str:
    return coll[:-1] + ident


def client() -> tuple[LedsClient, list[discovery_pb2.DeltaDiscoveryRequest]]:
    seen: list[Any] = []
    c = LedsClient(cast(Any, None), [TARGET], 0, observe=seen.append)
    return c, seen


def sent(c: LedsClient) -> list[discovery_pb2.DeltaDiscoveryRequest]:
    out = []
    while not c._requests.empty():
        raw = c._requests.get_nowait()
        assert raw is not None
        out.append(discovery_pb2.DeltaDiscoveryRequest.FromString(raw))
    return out


def addrs(c: LedsClient) -> set[str]:
    return {e.address for e in c.state[TARGET].state()}


def test_the_client_opts_in_with_node_metadata() -> None:
    c, _ = client()
    assert c.node.metadata.fields[OPT_IN_KEY].string_value == "always"


def test_a_member_belongs_to_its_glob_collection_with_the_same_context() -> None:
    assert collection_of(member(COLL_A, "10.0.0.1:8080")) == COLL_A
    assert collection_of("xdstp://a/t/p/x?k=v") == "xdstp://a/t/p/*?k=v"
    assert collection_of("plain") == ""


def test_a_cla_naming_collections_subscribes_to_them_on_the_same_stream() -> None:
    c, seen = client()
    c.apply(cla_response([COLL_A, COLL_B]))
    ack, sub = sent(c)
    assert (ack.type_url, ack.response_nonce) == (EDS_TYPE, "1")
    assert sub.type_url == LEDS_TYPE and list(sub.resource_names_subscribe) == [COLL_A, COLL_B]
    assert addrs(c) == set() and not c.complete(TARGET)
    c.apply(leds_response({member(COLL_A, "1"): "10.0.0.1", member(COLL_B, "2"): "10.0.0.2"}))
    (ack,) = sent(c)
    assert (ack.type_url, ack.response_nonce) == (LEDS_TYPE, "2")
    assert addrs(c) == {"10.0.0.1", "10.0.0.2"} and c.complete(TARGET)
    assert c.all_received.is_set() and c.leds_resources == 2
    # Every response is one record naming the target's state after it.
    assert [r.states[0][0] for r in seen] == [TARGET, TARGET]
    assert len(seen[-1].states[0][1]) == 2


def test_one_endpoint_change_is_one_resource_and_a_removal_is_named() -> None:
    c, _ = client()
    c.apply(cla_response([COLL_A]))
    c.apply(leds_response({member(COLL_A, "1"): "10.0.0.1", member(COLL_A, "2"): "10.0.0.2"}))
    c.apply(leds_response({member(COLL_A, "3"): "10.0.0.3"}, (member(COLL_A, "1"),), "3"))
    assert addrs(c) == {"10.0.0.2", "10.0.0.3"} and c.leds_removed == 1


def test_a_collection_dropped_from_the_cla_is_unsubscribed_and_forgotten() -> None:
    c, _ = client()
    c.apply(cla_response([COLL_A, COLL_B]))
    c.apply(leds_response({member(COLL_A, "1"): "10.0.0.1", member(COLL_B, "2"): "10.0.0.2"}))
    sent(c)
    c.apply(cla_response([COLL_A], nonce="4"))
    _, unsub = sent(c)
    assert list(unsub.resource_names_unsubscribe) == [COLL_B]
    assert addrs(c) == {"10.0.0.1"}
    # A late member of the dropped collection changes nothing.
    c.apply(leds_response({member(COLL_B, "9"): "10.0.0.9"}, nonce="5"))
    assert addrs(c) == {"10.0.0.1"}


def test_a_collection_named_in_removed_resources_is_empty() -> None:
    c, _ = client()
    c.apply(cla_response([COLL_A]))
    c.apply(leds_response({}, (COLL_A,)))
    assert addrs(c) == set() and c.complete(TARGET)


def test_a_cla_with_endpoints_inline_is_read_as_a_delta_client_reads_it() -> None:
    c, _ = client()
    c.apply(cla_response([], inline=("10.0.0.7", "10.0.0.8")))
    (ack,) = sent(c)  # no LEDS subscription
    assert ack.type_url == EDS_TYPE
    assert addrs(c) == {"10.0.0.7", "10.0.0.8"} and c.complete(TARGET)
    assert c.leds_resources == 0
