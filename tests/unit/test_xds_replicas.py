"""Failover between replicas (xDS §1.2, §2): versions are content-derived, so two
servers with the same cluster say the same thing, and a delta client that moves to
another replica with what it holds is sent nothing it already has, for every type.

Each `World` here is one replica: its own cluster cache, Views and xDS cache, fed the
same objects, as two meshbridge processes watching one API server are."""

from __future__ import annotations

import pytest
import structlog

from testkit.xds_model import (
    CDS,
    EDS,
    LDS,
    LEDS,
    RDS,
    DeltaClient,
    World,
    delta_names,
    name,
    unpack,
)
from xds_api.subscription import VERSION_DIGITS, HeldVersions, held_version

WEB, API = name("web"), name("api")
ALWAYS = {"meshbridge.io/leds": "always"}
# What a client subscribes to for each type: CDS by wildcard (as Envoy does), the
# others by name (LDS too: the proxyless listeners exist as they are asked for).
SUBSCRIBE = {CDS: ["*"], LDS: [WEB, API], EDS: [WEB, API], RDS: [WEB, API]}
# What a change of api's protocol and endpoints changes, per type (a proxyless
# Listener and RouteConfiguration are a function of the name alone).
CHANGED = {CDS: [API], EDS: [API], LDS: [], RDS: []}


def replicas() -> tuple[World, World]:
    return World(), World()


def held_after_first_answer(client: DeltaClient, type_url: str,
                            subscribe: list[str]) -> dict[str, str]:
    client.request(type_url, subscribe)
    client.one(type_url)
    client.ack(type_url)
    return dict(client.held[type_url])


@pytest.mark.parametrize("type_url", [CDS, EDS, LDS, RDS], ids=["cds", "eds", "lds", "rds"])
def test_two_replicas_give_a_sotw_client_the_same_version_and_bytes(type_url: str) -> None:
    a, b = replicas()
    got = []
    for world in (a, b):
        client = world.sotw()
        client.request(type_url, [] if type_url == CDS else SUBSCRIBE[type_url])
        resp = client.one(type_url)
        got.append((resp.version_info, [r.SerializeToString() for r in resp.resources]))
    assert got[0] == got[1]
    assert len(got[0][0]) == VERSION_DIGITS and got[0][1]


def test_a_sotw_version_is_that_of_everything_the_client_holds() -> None:
    world = World()
    client = world.sotw()
    client.request(EDS, [WEB, API])
    first = client.one(EDS)
    versions = {unpack(r).cluster_name: r for r in first.resources}
    client.ack(EDS, [WEB, API])
    world.set_endpoints("api", ["10.0.1.7"])
    update = client.one(EDS)
    assert [unpack(r).cluster_name for r in update.resources] == [API]
    # Only api was sent, but the version covers web (held) and the new api.
    delta = world.delta()
    delta.request(EDS, [WEB, API])
    now = {r.name: r.version for r in delta.one(EDS).resources}
    assert update.version_info == held_version(now.values())
    assert update.version_info != first.version_info and len(versions) == 2


def test_a_sotw_client_back_from_another_replica_is_recognised_as_current() -> None:
    a, b = replicas()
    on_a = a.sotw()
    on_a.request(EDS, [WEB])
    version = on_a.one(EDS).version_info
    on_b = b.sotw()
    # A new stream: no nonce, the version it last ACKed on the other replica.
    on_b.request(EDS, [WEB], nonce="", version=version)
    assert on_b.one(EDS).version_info == version  # §1.8(a): still answered in full
    assert b.count("meshbridge_xds_reconnects_current_total", type="eds") == 1
    stale = b.sotw()
    b.set_endpoints("web", ["10.0.0.9"])
    stale.request(EDS, [WEB], nonce="", version=version)
    stale.one(EDS)
    assert b.count("meshbridge_xds_reconnects_current_total", type="eds") == 1


@pytest.mark.parametrize("type_url", [CDS, EDS, LDS, RDS], ids=["cds", "eds", "lds", "rds"])
def test_a_delta_client_moving_to_another_replica_is_sent_nothing_it_holds(
        type_url: str) -> None:
    a, b = replicas()
    held = held_after_first_answer(a.delta(), type_url, SUBSCRIBE[type_url])
    assert held
    moved = b.delta()
    moved.request(type_url, SUBSCRIBE[type_url], initial=held)
    got = moved.responses()
    # A wildcard's first request is answered (§2), with nothing in it; a named
    # subscription held at the current versions gets no response at all.
    assert all(not r.resources and not r.removed_resources for r in got)
    assert len(got) == (1 if SUBSCRIBE[type_url] == ["*"] else 0)


@pytest.mark.parametrize("type_url", [CDS, EDS, LDS, RDS], ids=["cds", "eds", "lds", "rds"])
def test_a_delta_client_moving_after_a_change_is_sent_only_that_change(
        type_url: str) -> None:
    a, b = replicas()
    held = held_after_first_answer(a.delta(), type_url, SUBSCRIBE[type_url])
    # While it moves, api changes (its protocol: every type's api resource changes).
    b.set_port_protocol("api", "http2")
    b.set_endpoints("api", ["10.0.1.8"])
    moved = b.delta()
    moved.request(type_url, SUBSCRIBE[type_url], initial=held)
    got = moved.responses()
    assert [delta_names(r) for r in got if r.resources] == (
        [CHANGED[type_url]] if CHANGED[type_url] else [])
    assert all(not r.removed_resources for r in got)


def test_a_delta_leds_client_moving_to_another_replica_is_sent_nothing_it_holds() -> None:
    a, b = replicas()
    for world in (a, b):
        world.set_endpoints("web", ["10.0.0.1", "10.0.0.2", "10.0.0.3"],
                            zones=["zone-a", "zone-a", "zone-b"])
    on_a = a.delta(node=ALWAYS)
    eds_held = held_after_first_answer(on_a, EDS, [WEB])
    cla = unpack(on_a.last[EDS].resources[0].resource)
    colls = [loc.leds_cluster_locality_config.leds_collection_name for loc in cla.endpoints]
    on_a.request(LEDS, colls)
    assert len(on_a.one(LEDS).resources) == 3
    leds_held = dict(on_a.held[LEDS])

    moved = b.delta(node=ALWAYS)
    moved.request(EDS, [WEB], initial=eds_held)
    moved.request(LEDS, colls, initial=leds_held)
    # §7.3: a newly subscribed collection is answered, here with nothing in it.
    answers = moved.responses()
    assert [r.type_url for r in answers] == [LEDS]
    assert not answers[0].resources and not answers[0].removed_resources
    # One endpoint changes on the new replica: one member is sent, nothing else.
    b.set_endpoints("web", ["10.0.0.1", "10.0.0.2", "10.0.0.4"],
                    zones=["zone-a", "zone-a", "zone-b"])
    got = {r.type_url: r for r in moved.responses()}
    assert EDS not in got  # the collections did not change
    assert len(got[LEDS].resources) == 1 and len(got[LEDS].removed_resources) == 1


# ---------------------------------------------------------------------- bad input


def test_initial_versions_for_names_not_subscribed_are_ignored_with_one_log_line() -> None:
    world = World()
    client = world.delta()
    with structlog.testing.capture_logs() as logs:
        client.request(EDS, [WEB], initial={name("secret"): "0" * 24, API: "1" * 24,
                                            WEB: "x"})
    resp = client.one(EDS)
    # Neither name it did not subscribe to is answered (not even as removed); the
    # garbage version of web is an unknown one, so web is sent.
    assert delta_names(resp) == [WEB] and not resp.removed_resources
    lines = [e for e in logs if e["event"] == "xds initial_resource_versions ignored"]
    assert len(lines) == 1
    assert lines[0]["not_subscribed"] == 2 and lines[0]["not_versions"] == 1


def test_a_million_initial_versions_are_bounded_by_the_name_limit() -> None:
    world = World()
    stream_world = world.delta()
    stream_world.stream.max_names = 1000
    initial = {f"n{i}": "0" * 24 for i in range(1_000_000)}
    initial[WEB] = "y" * 24
    stream_world.request(CDS, ["*"], initial=initial)
    resp = stream_world.one(CDS)
    # The wildcard may hold any cluster, so what it claims is kept, up to the name
    # limit: at most 1,000 names are told removed, and every real cluster is sent.
    assert sorted(delta_names(resp)) == sorted([API, WEB])
    assert len(resp.removed_resources) <= 1000
    assert len(stream_world.stream.subs[CDS].sent) <= 1000 + 2
    # Another client of the same replica is not affected.
    other = world.delta()
    other.request(CDS, ["*"])
    assert sorted(delta_names(other.one(CDS))) == sorted([API, WEB])


def test_held_version_ignores_markers_and_strings_that_are_not_versions() -> None:
    v = "0123456789abcdef01234567"
    assert held_version([v, "", "\x00resend", "zz" * 12, "x", "-" + "1" * 23]) == v
    assert held_version([]) == "0" * VERSION_DIGITS
    assert held_version(["f" * 24, "0" * 23 + "1"]) == "0" * 24  # modulo 2^96


def test_the_held_set_keeps_its_version_in_step_with_every_change() -> None:
    held = HeldVersions({"a": "1" * 24, "b": "\x00resend"})
    held["c"] = "2" * 24
    held["a"] = "3" * 24
    held.update({"d": "4" * 24})
    held.pop("d")
    held.pop("nothing")
    del held["b"]
    assert held.version() == held_version(held.values()) == held_version(["3" * 24, "2" * 24])
    held.clear()
    assert held.version() == "0" * VERSION_DIGITS
