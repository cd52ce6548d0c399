"""LEDS (xDS §7): a delta client's CLA names one glob collection per locality, and each
endpoint is its own LbEndpoint resource, so one endpoint change is one small delta
response. Also the delta EDS deletion rule (§2.1) it shares its truth with."""

from __future__ import annotations

import pytest
import structlog
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2

from testkit.xds_model import (
    EDS,
    LEDS,
    DeltaClient,
    World,
    delta_names,
    ips,
    name,
    unpack,
)
from xds_api.names import (
    collection_of,
    leds_collection,
    leds_member,
    parse_leds_collection,
)
from xds_api.resources import MetadataEncoder
from xds_api.stream import BadRequest

WEB = name("web")
ALWAYS = {"meshbridge.io/leds": "always"}
NEVER = {"meshbridge.io/leds": "never"}


def collections(cla: endpoint_pb2.ClusterLoadAssignment) -> list[str]:
    return [loc.leds_cluster_locality_config.leds_collection_name
            for loc in cla.endpoints]


def member_ips(resp: discovery_pb2.DeltaDiscoveryResponse) -> list[str]:
    out = []
    for r in resp.resources:
        lb = endpoint_components_pb2.LbEndpoint()
        assert r.resource.Unpack(lb)
        out.append(lb.endpoint.address.socket_address.address)
    return out


def test_collection_names_round_trip_and_refuse_other_spellings() -> None:
    coll = leds_collection(WEB, ("r 1", ""))
    assert coll == ("xdstp://meshbridge/envoy.config.endpoint.v3.LbEndpoint/"
                    "web.app.svc.cluster.local/80/r~201/-/*")
    parsed = parse_leds_collection(coll, "cluster.local")
    assert parsed is not None and parsed[0] == WEB and parsed[2] == ("r 1", "")
    member = leds_member(coll, "fd00::1", 8080)
    assert member.endswith("/r~201/-/fd00~3a~3a1_8080")
    assert ":" not in member.removeprefix("xdstp:")  # Envoy would re-encode a ':'
    assert collection_of(member) == coll
    for bad in (coll.replace("~20", " "), coll[:-2], coll.replace("/80/", "/080/"),
                "xdstp://other/envoy.config.endpoint.v3.LbEndpoint/a/80/-/-/*"):
        assert parse_leds_collection(bad, "cluster.local") is None, bad


def leds_world(metadata: MetadataEncoder | None = None) -> tuple[World, DeltaClient]:
    world = World(metadata=metadata) if metadata is not None else World()
    world.set_endpoints("web", ["10.0.0.1", "10.0.0.2", "10.0.0.3"],
                        zones=["zone-a", "zone-a", "zone-b"])
    return world, world.delta(node=ALWAYS)


def test_a_client_that_asks_gets_one_collection_per_locality_and_its_members() -> None:
    _, client = leds_world()
    client.request(EDS, [WEB])
    cla = unpack(client.one(EDS).resources[0].resource)
    colls = collections(cla)
    assert len(colls) == 2 and ips(cla) == []
    assert [loc.locality.zone for loc in cla.endpoints] == ["zone-a", "zone-b"]
    assert all(not loc.HasField("load_balancing_weight") for loc in cla.endpoints)
    assert all(loc.leds_cluster_locality_config.leds_config.HasField("ads")
               for loc in cla.endpoints)
    client.ack(EDS)
    client.request(LEDS, colls)
    resp = client.one(LEDS)
    assert sorted(member_ips(resp)) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    assert {collection_of(n) for n in delta_names(resp)} == set(colls)
    client.ack(LEDS)
    assert client.responses() == []


def test_one_endpoint_change_is_one_small_response_and_the_cla_stays_put() -> None:
    world, client = leds_world(metadata=MetadataEncoder("none"))
    client.request(EDS, [WEB])
    colls = collections(unpack(client.one(EDS).resources[0].resource))
    client.ack(EDS)
    client.request(LEDS, colls)
    client.responses()
    client.ack(LEDS)
    # 10.0.0.2 leaves, 10.0.0.4 joins zone-a: the localities are the same, so no CLA.
    world.set_endpoints("web", ["10.0.0.1", "10.0.0.4", "10.0.0.3"],
                        zones=["zone-a", "zone-a", "zone-b"])
    [resp] = client.responses()
    assert resp.type_url == LEDS
    assert member_ips(resp) == ["10.0.0.4"]
    assert [n.rsplit("/", 1)[1] for n in resp.removed_resources] == ["10.0.0.2_8080"]
    # One endpoint (~30 B), one removed name, and their names and framing.
    assert len(resp.SerializeToString()) < 450


def test_a_collection_that_does_not_exist_is_reported_removed_and_sent_when_it_does() -> None:
    world, client = leds_world()
    later = leds_collection(name("later"), ("", "zone-a"))
    client.request(LEDS, [later, "xdstp://meshbridge/not-ours/*"])
    resp = client.one(LEDS)
    assert sorted(resp.removed_resources) == sorted([later, "xdstp://meshbridge/not-ours/*"])
    client.ack(LEDS)
    assert client.responses() == []
    world.add_service("later", ["10.0.9.1"])
    resp = client.one(LEDS)
    assert member_ips(resp) == ["10.0.9.1"] and list(resp.removed_resources) == []
    client.ack(LEDS)
    world.delete_service("later")
    resp = client.one(LEDS)
    assert [n for n in resp.removed_resources] == [
        leds_member(later, "10.0.9.1", 8080), later]


def test_an_empty_collection_of_an_existing_service_is_answered_empty() -> None:
    _, client = leds_world()
    empty = leds_collection(WEB, ("", "zone-z"))
    client.request(LEDS, [empty])
    resp = client.one(LEDS)
    assert list(resp.resources) == [] and list(resp.removed_resources) == [] and resp.nonce


def test_unsubscribing_a_collection_forgets_its_members_and_resubscribing_resends() -> None:
    _, client = leds_world()
    coll = leds_collection(WEB, ("", "zone-a"))
    client.request(LEDS, [coll])
    assert len(client.one(LEDS).resources) == 2
    client.request(LEDS, unsubscribe=[coll])
    assert client.responses() == []
    assert client.stream.subs[LEDS].sent == {}
    client.request(LEDS, [coll])
    assert len(client.one(LEDS).resources) == 2


def test_the_threshold_decides_for_clients_that_do_not_say() -> None:
    world = World(leds_threshold=3)
    world.set_endpoints("web", ["10.0.0.1", "10.0.0.2"])
    auto, never = world.delta(node={}), world.delta(node=NEVER)
    sotw = world.sotw()
    for c in (auto, never):
        c.request(EDS, [WEB])
        assert ips(unpack(c.one(EDS).resources[0].resource)) == ["10.0.0.1", "10.0.0.2"]
        c.ack(EDS)
    sotw.request(EDS, [WEB])
    sotw.responses()
    world.set_endpoints("web", ["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    cla = unpack(auto.one(EDS).resources[0].resource)
    assert ips(cla) == [] and len(collections(cla)) == 1
    assert len(ips(unpack(never.one(EDS).resources[0].resource))) == 3
    # SotW clients (proxyless gRPC among them) keep getting whole CLAs.
    assert len(ips(unpack(sotw.one(EDS).resources[0]))) == 3


def test_leds_over_sotw_ends_the_stream_with_invalid_argument_logged_once_per_node() -> None:
    world = World()
    coll = leds_collection(WEB, ("", "zone-a"))
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):  # a client reconnecting in a loop
            client = world.sotw()
            client.node_id = "sotw-leds-node"
            with pytest.raises(BadRequest, match="delta xDS only"):
                client.request(LEDS, [coll])
    assert world.count("meshbridge_xds_bad_requests_total", reason="delta_only_type") == 3
    warned = [e for e in logs if e["event"] == "xds LEDS asked for over state-of-the-world"]
    assert [(e["node"], e["log_level"]) for e in warned] == [("sotw-leds-node", "warning")]


def test_a_deleted_service_leaves_a_delta_client_and_comes_back_when_recreated() -> None:
    world = World()
    client = world.delta()
    client.request(EDS, [WEB])
    assert ips(unpack(client.one(EDS).resources[0].resource)) == ["10.0.0.1", "10.0.0.2"]
    client.ack(EDS)
    world.set_endpoints("web", [])  # exists, no endpoints: an empty CLA
    resp = client.one(EDS)
    assert delta_names(resp) == [WEB] and ips(unpack(resp.resources[0].resource)) == []
    client.ack(EDS)
    world.delete_service("web")  # gone: its name in removed_resources
    resp = client.one(EDS)
    assert list(resp.resources) == [] and list(resp.removed_resources) == [WEB]
    client.ack(EDS)
    world.add_service("web", ["10.0.0.7"])
    resp = client.one(EDS)
    assert delta_names(resp) == [WEB]
    assert ips(unpack(resp.resources[0].resource)) == ["10.0.0.7"]


def test_a_sotw_client_keeps_an_empty_cla_for_a_deleted_service() -> None:
    world = World()
    client = world.sotw()
    client.request(EDS, [WEB])
    client.responses()
    client.ack(EDS, [WEB])
    world.delete_service("web")
    resp = client.one(EDS)
    assert [ips(unpack(a)) for a in resp.resources] == [[]]


def test_a_delta_subscription_to_a_service_not_yet_created_is_removed_then_sent() -> None:
    world = World()
    client = world.delta()
    later = name("later")
    client.request(EDS, [later])
    assert list(client.one(EDS).removed_resources) == [later]
    world.add_service("later", ["10.0.9.1"])
    assert delta_names(client.one(EDS)) == [later]
