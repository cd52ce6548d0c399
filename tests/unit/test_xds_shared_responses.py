"""Nonces from one clock and responses shared by a fan-out (xds_api.shared_responses),
and plain ACKs recognised without `handle` (XdsStream.ack_key / take_ack)."""

from __future__ import annotations

from envoy.service.discovery.v3 import discovery_pb2

from testkit.xds_model import EDS, DeltaClient, SotwClient, World, ips, name, unpack
from xds_api.shared_responses import SharedResponses
from xds_api.stream import DeltaStream, SotwStream

WEB, API = name("web"), name("api")


def sotw_clients(world: World, shared: SharedResponses, n: int) -> list[SotwClient]:
    clients = [SotwClient(SotwStream(world.cache, shared=shared)) for _ in range(n)]
    for client in clients:
        client.request(EDS, [WEB])
    return clients


def test_streams_of_one_batch_send_one_response_object() -> None:
    world, shared = World(), SharedResponses()
    clients = sotw_clients(world, shared, 3)
    shared.tick()
    first = [c.stream.take_responses() for c in clients]
    assert first[0][0] is first[1][0] is first[2][0]
    got = discovery_pb2.DiscoveryResponse.FromString(first[0][0])
    assert got.nonce == str(shared.now)
    assert ips(unpack(got.resources[0])) == ["10.0.0.1", "10.0.0.2"]


def test_different_resources_are_not_shared() -> None:
    world, shared = World(), SharedResponses()
    web = sotw_clients(world, shared, 1)[0]
    api = SotwClient(SotwStream(world.cache, shared=shared))
    api.request(EDS, [API])
    shared.tick()
    a, b = web.stream.take_responses()[0], api.stream.take_responses()[0]
    assert a != b
    assert discovery_pb2.DiscoveryResponse.FromString(b).nonce == str(shared.now)


def test_a_streams_nonces_only_grow_whatever_the_clock() -> None:
    world, shared = World(), SharedResponses()
    client = sotw_clients(world, shared, 1)[0]
    shared.tick()
    nonces = [client.one(EDS).nonce]
    for addresses in (["10.0.0.9"], ["10.0.0.8"], ["10.0.0.7"]):
        client.ack(EDS, [WEB])
        world.set_endpoints("web", addresses)  # no tick: the clock stays behind
        nonces.append(client.one(EDS).nonce)
    shared.tick()  # the clock now reads less than the stream's last nonce + 1
    client.ack(EDS, [WEB])
    world.set_endpoints("web", ["10.0.0.6"])
    nonces.append(client.one(EDS).nonce)
    values = [int(n) for n in nonces]
    assert values == sorted(set(values)), values


def test_without_a_tick_each_stream_counts_its_own() -> None:
    world = World()
    client = world.sotw()
    client.request(EDS, [WEB])
    assert client.one(EDS).nonce == "1"
    client.ack(EDS, [WEB])
    world.set_endpoints("web", ["10.0.0.9"])
    assert client.one(EDS).nonce == "2"


def ack_of(client: SotwClient, names: list[str], nonce: str | None = None
           ) -> discovery_pb2.DiscoveryRequest:
    last = client.last[EDS]
    return discovery_pb2.DiscoveryRequest(
        type_url=EDS, resource_names=names, version_info=last.version_info,
        response_nonce=last.nonce if nonce is None else nonce)


def test_a_plain_sotw_ack_is_taken_as_handle_would() -> None:
    world = World()
    client = world.sotw()
    client.request(EDS, [WEB])
    sent = client.one(EDS)
    key = SotwStream.ack_key(ack_of(client, [WEB]))
    assert key is not None
    assert client.stream.take_ack(key)
    sub = client.stream.subs[EDS]
    assert (sub.answered, sub.acked_version, sub.acks) == (sent.nonce, sent.version_info, 1)
    assert client.stream.take_responses() == []


def test_anything_but_a_plain_ack_goes_to_handle() -> None:
    world = World()
    client = world.sotw()
    client.request(EDS, [WEB])
    client.one(EDS)
    assert not client.stream.take_ack(SotwStream.ack_key(ack_of(client, [WEB, API])))
    assert not client.stream.take_ack(SotwStream.ack_key(ack_of(client, [WEB], "99")))
    nack = ack_of(client, [WEB])
    nack.error_detail.message = "rejected"
    assert SotwStream.ack_key(nack) is None
    with_node = ack_of(client, [WEB])
    with_node.node.id = "other"
    assert SotwStream.ack_key(with_node) is None
    assert SotwStream.ack_key(discovery_pb2.DiscoveryRequest(type_url=EDS)) is None
    assert client.stream.subs[EDS].acks == 0


def test_a_plain_delta_ack_is_taken_and_a_change_is_not() -> None:
    world = World()
    client = DeltaClient(DeltaStream(world.cache))
    client.request(EDS, [WEB])
    sent = client.one(EDS)
    ack = discovery_pb2.DeltaDiscoveryRequest(type_url=EDS, response_nonce=sent.nonce)
    key = DeltaStream.ack_key(ack)
    assert key is not None and client.stream.take_ack(key)
    assert client.stream.subs[EDS].acks == 1
    stale = DeltaStream.ack_key(discovery_pb2.DeltaDiscoveryRequest(
        type_url=EDS, response_nonce="0"))
    assert stale is not None and not client.stream.take_ack(stale)
    assert DeltaStream.ack_key(discovery_pb2.DeltaDiscoveryRequest(
        type_url=EDS, response_nonce=sent.nonce, resource_names_subscribe=[API])) is None
