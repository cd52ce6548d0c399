"""The incremental (delta) stream state machine against the rules of xDS §2."""

from __future__ import annotations

import pytest

from testkit.xds_model import (
    CDS,
    EDS,
    LDS,
    World,
    delta_names,
    ips,
    name,
    unpack,
)
from xds_api.stream import BadRequest

WEB, API = name("web"), name("api")


def test_a_first_request_with_empty_lists_is_a_legacy_wildcard() -> None:
    client = World().delta()
    client.request(CDS)
    resp = client.one(CDS)
    assert sorted(delta_names(resp)) == [API, WEB]
    assert all(r.version for r in resp.resources)
    assert client.stream.subs[CDS].wildcard


def test_the_first_wildcard_response_comes_even_when_empty() -> None:
    client = World().delta()
    client.request(LDS, ["*"])
    resp = client.one(LDS)
    assert list(resp.resources) == [] and list(resp.removed_resources) == [] and resp.nonce


def test_an_empty_first_eds_request_subscribes_to_nothing() -> None:
    client = World().delta()
    client.request(EDS)
    assert client.responses() == []


def test_ads_delta_requires_a_type_url() -> None:
    with pytest.raises(BadRequest):
        World().delta().request("", [WEB])


def test_only_changed_resources_are_sent_with_their_own_versions() -> None:
    world = World()
    client = world.delta()
    client.request(EDS, [WEB, API])
    first = {r.name: r.version for r in client.one(EDS).resources}
    client.ack(EDS)
    assert client.responses() == []
    world.set_endpoints("web", ["10.0.0.5"])
    resp = client.one(EDS)
    assert delta_names(resp) == [WEB]
    assert resp.resources[0].version != first[WEB]
    assert ips(unpack(resp.resources[0].resource)) == ["10.0.0.5"]


def test_a_deleted_cluster_is_in_removed_resources() -> None:
    world = World()
    client = world.delta()
    client.request(CDS, ["*"])
    client.responses()
    client.ack(CDS)
    world.delete_service("web")
    resp = client.one(CDS)
    assert list(resp.resources) == [] and list(resp.removed_resources) == [WEB]


def test_a_subscribed_name_that_does_not_exist_is_reported_removed_once() -> None:
    world = World()
    client = world.delta()
    later = name("later")
    client.request(CDS, [later])
    resp = client.one(CDS)
    assert list(resp.removed_resources) == [later]
    client.ack(CDS)
    client.request(CDS, [WEB])
    assert delta_names(client.one(CDS)) == [WEB]  # `later` is not reported again
    world.add_service("later", ["10.0.7.1"])
    assert delta_names(client.one(CDS)) == [later]


def test_a_subscription_change_with_a_stale_nonce_is_honoured() -> None:
    world = World()
    client = world.delta()
    client.request(EDS, [WEB])
    old = client.one(EDS)
    client.ack(EDS)
    world.set_endpoints("web", ["10.0.0.9"])
    client.responses()
    client.request(EDS, [API], nonce=old.nonce)  # §2: never rejected for its nonce
    assert delta_names(client.one(EDS)) == [API]


def test_a_name_subscribed_again_is_resent_even_if_the_client_seems_to_hold_it() -> None:
    client = World().delta()
    client.request(EDS, [WEB])
    client.responses()
    client.ack(EDS)
    client.request(EDS, [WEB])  # §2: the client may have forgotten it
    assert delta_names(client.one(EDS)) == [WEB]


def test_an_unsubscribe_needs_no_response_and_a_resubscribe_resends() -> None:
    client = World().delta()
    client.request(EDS, [WEB, API])
    client.responses()
    client.ack(EDS)
    client.request(EDS, unsubscribe=[API, "never-subscribed"])
    assert client.responses() == []
    client.request(EDS, [API])
    assert delta_names(client.one(EDS)) == [API]


def test_unsubscribing_a_name_the_wildcard_covers_resends_it() -> None:
    world = World()
    client = world.delta()
    client.request(CDS, ["*", WEB, name("gone")])
    client.responses()
    client.ack(CDS)
    client.request(CDS, unsubscribe=[WEB, name("gone")])
    resp = client.one(CDS)
    # §2: `*` still covers web, so the client must hear it is still there; the name
    # that exists under no wildcard is removed.
    assert delta_names(resp) == [WEB]
    assert list(resp.removed_resources) == [name("gone")]


def test_a_reconnect_with_initial_resource_versions_sends_only_the_difference() -> None:
    world = World()
    world.add_service("old", ["10.0.3.1"])
    before = world.delta()
    before.request(CDS, ["*"])
    held = {r.name: r.version for r in before.one(CDS).resources}
    before.stream.close()
    world.set_port_protocol("web", "grpc")  # changes while disconnected
    world.delete_service("old")
    after = world.delta()
    after.request(CDS, ["*"], initial=held)
    resp = after.one(CDS)
    # Unchanged `api` is not resent; changed `web` is; deleted `old` is removed.
    assert delta_names(resp) == [WEB]
    assert list(resp.removed_resources) == [name("old")]


def test_a_reconnect_naming_resources_explicitly_honours_their_versions() -> None:
    world = World()
    before = world.delta()
    before.request(EDS, [WEB, API])
    held = {r.name: r.version for r in before.one(EDS).resources}
    before.stream.close()
    world.set_endpoints("api", ["10.0.1.2"])
    after = world.delta()
    after.request(EDS, [WEB, API], initial=held)
    assert delta_names(after.one(EDS)) == [API]


def test_a_nack_is_counted_and_not_answered() -> None:
    world = World()
    client = world.delta()
    client.request(EDS, [WEB])
    client.responses()
    client.request(EDS, error="no thanks")
    assert client.responses() == []
    assert world.count("pilot_total_xds_rejects_total", type="eds") == 1
    world.set_endpoints("web", ["10.0.0.3"])
    assert delta_names(client.one(EDS)) == [WEB]


def test_a_cluster_update_resends_its_cla_for_envoy_warming() -> None:
    world = World()
    client = world.delta()
    client.request(CDS, ["*"])
    client.request(EDS, [WEB, API])
    client.responses()
    client.ack(CDS)
    client.ack(EDS)
    world.set_port_protocol("api", "h2")
    got = client.responses()
    assert [r.type_url for r in got] == [CDS, EDS]
    assert delta_names(got[0]) == [API] and delta_names(got[1]) == [API]


def test_an_unknown_type_gets_its_names_removed() -> None:
    client = World().delta()
    secret = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
    client.request(secret, ["a", "b"])
    resp = client.one(secret)
    assert list(resp.removed_resources) == ["a", "b"]
    client.ack(secret)
    assert client.responses() == []


def test_dropping_the_wildcard_forgets_what_only_it_brought() -> None:
    world = World()
    client = world.delta()
    client.request(CDS, ["*", WEB])
    client.responses()
    client.ack(CDS)
    client.request(CDS, unsubscribe=["*"])
    assert client.responses() == []
    world.delete_service("api")  # the client no longer holds api: nothing to say
    assert client.responses() == []
    assert set(client.stream.subs[CDS].sent) == {WEB}


def test_adding_the_wildcard_and_dropping_a_name_at_once_answers_under_the_wildcard() -> None:
    world = World()
    client = world.delta()
    client.request(LDS, [WEB])
    client.responses()
    client.ack(LDS)
    client.request(LDS, ["*"], [WEB])
    # `*` covers no listener, so the one it dropped is removed.
    assert list(client.one(LDS).removed_resources) == [WEB]


def test_a_delta_response_is_awaiting_its_answer_until_acked() -> None:
    client = World().delta()
    client.request(EDS, [name("web")])
    client.responses()
    assert client.stream.awaiting_answer()
    client.ack(EDS)
    assert not client.stream.awaiting_answer()
