"""LEDS under churn (xDS §7.3): streams that follow every change, fall a few changes
behind, or further behind than the View remembers, all end up holding exactly what a
new client is sent, each endpoint change costing its stream only what changed."""

from __future__ import annotations

import random

from testkit.xds_model import EDS, LEDS, DeltaClient, World, name
from xds_api.caches import leds as leds_cache
from xds_api.names import leds_collection
from xds_api.resources import MetadataEncoder

WEB = name("web")
ALWAYS = {"meshbridge.io/leds": "always"}
COLLECTIONS = [leds_collection(WEB, ("", zone)) for zone in ("zone-a", "zone-b")]
ADDRESSES = [f"10.0.0.{i}" for i in range(1, 13)]


def zone_of(ip: str) -> str:
    return "zone-a" if int(ip.rsplit(".", 1)[1]) % 3 else "zone-b"


def set_web(world: World, addresses: list[str]) -> None:
    world.set_endpoints("web", addresses, zones=[zone_of(ip) for ip in addresses])


def subscribed(world: World) -> DeltaClient:
    client = world.delta(node=ALWAYS)
    client.request(LEDS, COLLECTIONS)
    client.responses()
    client.ack(LEDS)
    return client


def fresh_view(world: World) -> dict[str, str]:
    return dict(subscribed(world).held.get(LEDS, {}))


def test_every_stream_holds_what_a_new_client_gets_whatever_it_missed() -> None:
    rng = random.Random(7)
    world = World(metadata=MetadataEncoder("none"))
    set_web(world, ADDRESSES[:6])
    # One keeps up, one reads every 5th change, one sleeps past the View's log.
    clients = [subscribed(world) for _ in range(3)]
    every = [1, 5, leds_cache.LOG_VERSIONS + 3]
    current = set(ADDRESSES[:6])
    for step in range(1, 3 * leds_cache.LOG_VERSIONS):
        ip = rng.choice(ADDRESSES)
        if ip in current and len(current) > 1:
            current.discard(ip)
        else:
            current.add(ip)
        set_web(world, sorted(current, key=ADDRESSES.index))
        for client, period in zip(clients, every, strict=True):
            if step % period == 0:
                client.responses()
                client.ack(LEDS)
        if step % 17 == 0:
            expected = fresh_view(world)
            assert clients[0].held[LEDS] == expected
    expected = fresh_view(world)
    for client in clients:
        client.responses()
        assert client.held[LEDS] == expected
    assert {n.rsplit("/", 1)[1] for n in expected} == {f"{ip}_8080" for ip in current}


def test_a_stream_in_step_is_sent_only_the_endpoint_that_changed() -> None:
    world = World(metadata=MetadataEncoder("none"))
    set_web(world, ADDRESSES)
    client = subscribed(world)
    client.request(EDS, [WEB])
    client.responses()
    client.ack(EDS)
    set_web(world, ADDRESSES[:-1])
    [resp] = client.responses()
    assert resp.type_url == LEDS and list(resp.resources) == []
    assert [n.rsplit("/", 1)[1] for n in resp.removed_resources] == ["10.0.0.12_8080"]
    client.ack(LEDS)
    set_web(world, ADDRESSES)
    [resp] = client.responses()
    assert [r.name.rsplit("/", 1)[1] for r in resp.resources] == ["10.0.0.12_8080"]
