"""The state-of-the-world stream state machine against the rules of xDS §1."""

from __future__ import annotations

import pytest

from testkit.builders import endpoint, endpoint_slice, load, pod
from testkit.xds_model import (
    CDS,
    EDS,
    LDS,
    RDS,
    World,
    ips,
    name,
    unpack,
)
from xds_api.stream import BadRequest, TooManyNames

WEB, API = name("web"), name("api")


def test_ads_request_without_type_url_is_refused() -> None:
    client = World().sotw()
    with pytest.raises(BadRequest, match="type_url is required"):
        client.request("", [WEB])


def test_eds_service_implies_the_type_and_refuses_others() -> None:
    world = World()
    client = world.sotw(ads=False)
    client.request("", [WEB])
    assert ips(unpack(client.one(EDS).resources[0])) == ["10.0.0.1", "10.0.0.2"]
    with pytest.raises(BadRequest, match="serves only"):
        world.sotw(ads=False).request(CDS, [])


def test_node_is_remembered_from_the_first_request() -> None:
    client = World().sotw()
    client.request(EDS, [WEB])
    client.responses()
    client.ack(EDS, [WEB, API])  # no node on later requests
    assert client.stream.node_id == "test-node"


def test_first_request_is_answered_even_when_nothing_exists() -> None:
    client = World(with_services=False).sotw()
    client.request(CDS, [])  # legacy wildcard, no services at all
    client.request(RDS, ["not-a-service-name"])
    got = client.responses()
    assert [(r.type_url, len(r.resources)) for r in got] == [(CDS, 0), (RDS, 0)]
    assert all(r.nonce and r.version_info for r in got)


def test_an_ack_is_not_answered() -> None:
    client = World().sotw()
    client.request(EDS, [WEB, API])
    assert len(client.one(EDS).resources) == 2
    client.ack(EDS, [WEB, API])
    assert client.responses() == []


def test_a_change_sends_only_the_changed_cla() -> None:
    world = World()
    client = world.sotw()
    client.request(EDS, [WEB, API])
    client.responses()
    client.ack(EDS, [WEB, API])
    world.set_endpoints("web", ["10.0.0.1"])
    resp = client.one(EDS)
    assert [unpack(a).cluster_name for a in resp.resources] == [WEB]
    assert ips(unpack(resp.resources[0])) == ["10.0.0.1"]


def test_newly_requested_names_are_sent_even_at_an_unchanged_version() -> None:
    world = World()
    client = world.sotw()
    client.request(EDS, [WEB])
    first = client.one(EDS)
    client.ack(EDS, [WEB, API])
    second = client.one(EDS)
    assert [unpack(a).cluster_name for a in second.resources] == [API]
    assert second.version_info == first.version_info or second.version_info
    # Dropping a name needs no response; asking for it again resends it unchanged.
    client.ack(EDS, [WEB])
    assert client.responses() == []
    client.ack(EDS, [WEB, API])
    assert [unpack(a).cluster_name for a in client.one(EDS).resources] == [API]


def test_a_stale_nonce_is_ignored_until_the_ack_of_the_newer_response() -> None:
    world = World()
    client = world.sotw()
    client.request(EDS, [WEB])
    old = client.one(EDS)
    client.ack(EDS, [WEB])
    world.set_endpoints("web", ["10.0.0.9"])
    pushed = client.one(EDS)
    # The client asks for `api` while the push is in flight: it still carries the old
    # nonce, so the request is stale and ignored (§1.3).
    client.request(EDS, [WEB, API], nonce=old.nonce)
    assert client.responses() == []
    assert world.count("pilot_xds_expired_nonce_total", type="eds") == 1
    # Its ACK of the push carries the same names and is honoured.
    client.request(EDS, [WEB, API], nonce=pushed.nonce)
    assert [unpack(a).cluster_name for a in client.one(EDS).resources] == [API]


def test_a_garbage_nonce_before_anything_was_sent_is_a_first_request() -> None:
    client = World().sotw()
    client.request(EDS, [WEB], nonce="no-such-nonce", version="old-server-7")
    assert len(client.one(EDS).resources) == 1


def test_a_nack_is_counted_and_not_answered_until_a_new_version() -> None:
    world = World()
    client = world.sotw()
    client.request(EDS, [WEB])
    rejected = client.one(EDS)
    client.request(EDS, [WEB], version="", error="bad endpoint")
    assert client.responses() == []
    assert world.count("pilot_total_xds_rejects_total", type="eds") == 1
    assert client.stream.subs[EDS].last_nack == "bad endpoint"
    world.set_endpoints("web", ["10.0.0.1", "10.0.0.2", "10.0.0.3"])
    resp = client.one(EDS)
    assert resp.version_info != rejected.version_info
    assert ips(unpack(resp.resources[0])) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]


def test_cds_is_full_state_and_eds_is_not() -> None:
    world = World()
    client = world.sotw()
    client.request(CDS, [WEB, API])
    assert client.names(CDS) == [API, WEB]
    client.ack(CDS, [WEB, API])
    world.set_port_protocol("web", "grpc")
    # §1.6: the change of one cluster resends the whole subscribed set.
    assert client.names(CDS) == [API, WEB]


@pytest.mark.parametrize(
    ("requests", "wildcard", "named"),
    [
        # §1.5: [] means `*` only until something is named.
        ([[]], True, set()),
        ([[], ["*", "x"]], True, {"x"}),
        ([[], ["*", "x"], ["x"]], False, {"x"}),
        ([[], ["*", "x"], ["x"], []], False, set()),
        ([["x"], []], False, set()),
        ([["x"], ["*"]], True, set()),
    ],
)
def test_wildcard_and_legacy_wildcard_transitions(requests: list[list[str]], wildcard: bool,
                                                  named: set[str]) -> None:
    world = World()
    client = world.sotw()
    names = {"x": WEB}
    for i, req in enumerate(requests):
        client.request(CDS, [names.get(n, n) for n in req])
        if i < len(requests) - 1:
            client.responses()
    sub = client.stream.subs[CDS]
    assert (sub.wildcard, sub.names) == (wildcard, {names[n] for n in named})
    # And the cache agrees: a new service reaches the stream only under `*`.
    client.responses()
    client.ack(CDS, [names.get(n, n) for n in requests[-1]])
    world.add_service("new", ["10.0.9.1"])
    got = client.responses()
    if wildcard:
        assert name("new") in [unpack(a).name for a in got[0].resources]
    else:
        assert got == []


def test_wildcard_lds_for_envoy_is_an_empty_set() -> None:
    client = World().sotw()
    client.request(LDS, [])
    assert client.one(LDS).resources == []


def test_names_that_appear_later_are_sent_when_they_appear() -> None:
    world = World()
    client = world.sotw()
    later = name("later")
    client.request(CDS, [WEB, later])
    assert client.names(CDS) == [WEB]
    client.ack(CDS, [WEB, later])
    client.request(LDS, [later])
    client.request(RDS, [later])
    client.request(EDS, [later])
    got = client.responses()
    # LDS/RDS: not yet; EDS: the service port does not exist, so its CLA is empty.
    assert [(r.type_url, len(r.resources)) for r in got] == [(EDS, 1), (LDS, 0), (RDS, 0)]
    assert ips(unpack(got[0].resources[0])) == []
    for r in got:
        client.ack(r.type_url, [later])
    world.add_service("later", ["10.0.7.1"])
    got = client.responses()
    assert [r.type_url for r in got] == [CDS, EDS, LDS, RDS]
    assert sorted(unpack(a).name for a in got[0].resources) == [later, WEB]
    assert ips(unpack(got[1].resources[0])) == ["10.0.7.1"]
    assert [unpack(a).name for a in got[2].resources] == [later]
    assert [unpack(a).name for a in got[3].resources] == [later]


def test_a_known_empty_service_gets_an_empty_cla() -> None:
    world = World()
    world.add_service("empty", [])
    client = world.sotw()
    client.request(EDS, [name("empty")])
    cla = unpack(client.one(EDS).resources[0])
    assert cla.cluster_name == name("empty") and list(cla.endpoints) == []


def test_after_a_cluster_changes_its_cla_is_sent_again_for_envoy_warming() -> None:
    world = World()
    client = world.sotw()
    client.request(CDS, [])
    client.request(EDS, [WEB, API])
    assert [r.type_url for r in client.responses()] == [CDS, EDS]
    client.ack(CDS, [])
    client.ack(EDS, [WEB, API])
    world.set_port_protocol("web", "grpc")
    got = client.responses()
    # §1.10: the updated cluster warms until a CLA arrives, even an unchanged one.
    assert [r.type_url for r in got] == [CDS, EDS]
    assert [unpack(a).cluster_name for a in got[1].resources] == [WEB]
    # Envoy's EDS re-request looks exactly like an ACK; nothing more is due.
    client.ack(CDS, [])
    client.ack(EDS, [WEB, API])
    assert client.responses() == []


def test_responses_on_one_stream_go_cds_eds_lds_rds() -> None:
    client = World().sotw()
    client.request(RDS, [WEB])
    client.request(LDS, [WEB])
    client.request(EDS, [WEB])
    client.request(CDS, [WEB])
    assert [r.type_url for r in client.responses()] == [CDS, EDS, LDS, RDS]


def test_deleting_a_service_resends_full_state_without_it() -> None:
    world = World()
    client = world.sotw()
    client.request(CDS, [])
    client.request(LDS, [WEB, API])
    client.responses()
    client.ack(CDS, [])
    client.ack(LDS, [WEB, API])
    world.delete_service("web")
    got = client.responses()
    assert [(r.type_url, [unpack(a).name for a in r.resources]) for r in got] == [
        (CDS, [API]), (LDS, [API])]


def test_an_empty_named_request_unsubscribes_without_a_response() -> None:
    world = World()
    client = world.sotw()
    client.request(CDS, [WEB])
    client.responses()
    client.ack(CDS, [])  # gRPC dropping its last cluster: not a wildcard
    assert client.responses() == []
    world.set_port_protocol("web", "grpc")
    assert client.responses() == []
    assert not world.cache.clusters.watchers.by_name


def test_an_unknown_type_is_answered_once_and_empty() -> None:
    world = World()
    client = world.sotw()
    secret = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
    client.request(secret, ["my-cert"])
    resp = client.one(secret)
    assert resp.resources == [] and resp.nonce
    client.ack(secret, ["my-cert"])
    assert client.responses() == []
    assert world.count("meshbridge_xds_bad_requests_total", reason="unknown_type") == 2


def test_the_same_name_twice_is_one_resource() -> None:
    client = World().sotw()
    client.request(EDS, [WEB, WEB, WEB])
    assert len(client.one(EDS).resources) == 1


def test_more_names_than_the_limit_are_refused() -> None:
    world = World()
    client = world.sotw(max_names=100)
    with pytest.raises(TooManyNames, match="limit is 100"):
        client.request(EDS, [name(f"svc-{i}") for i in range(101)])
    assert not world.views.views()  # nothing was subscribed


def test_a_client_restarting_a_type_without_a_nonce_gets_everything_again() -> None:
    client = World().sotw()
    client.request(EDS, [WEB, API])
    first = client.one(EDS)
    client.request(EDS, [WEB, API], nonce="", version=first.version_info)
    assert len(client.one(EDS).resources) == 2


def test_a_reconnecting_client_gets_a_full_snapshot_first() -> None:
    world = World()
    before = world.sotw()
    before.request(CDS, [])
    before.request(EDS, [WEB, API])
    got = before.responses()
    before.stream.close()
    after = world.sotw()
    after.request(CDS, [], version=got[0].version_info, nonce="")
    after.request(EDS, [WEB, API], version=got[1].version_info, nonce="")
    again = after.responses()
    assert [len(r.resources) for r in again] == [len(r.resources) for r in got]


def test_a_view_change_that_leaves_the_cla_alone_sends_nothing() -> None:
    world = World()  # without --xds-draining
    client = world.sotw()
    client.request(EDS, [WEB])
    client.responses()
    client.ack(EDS, [WEB])
    view = world.views.views()[0]
    version = view.version
    # A terminating pod that still serves joins the View (xDS could send it as
    # DRAINING), but without --xds-draining the CLA's bytes, so its version, stay.
    load(world.cluster, pod("web-9", "10.0.0.9"), endpoint_slice("web-term", "web", [
        endpoint("10.0.0.9", "web-9", ready=None,
                 conditions={"ready": False, "serving": True, "terminating": True})]))
    assert view.version > version
    assert client.responses() == []


def test_closing_a_stream_releases_its_views_and_watches() -> None:
    world = World()
    client = world.sotw()
    client.request(CDS, [])
    client.request(EDS, [WEB, API])
    client.request(LDS, [WEB])
    client.responses()
    assert len(world.views.views()) == 2
    client.stream.close()
    assert world.views.views() == []
    assert not world.cache.clusters.watchers.wildcard
    assert not world.cache.listeners.watchers.by_name


def test_dropping_a_name_under_the_wildcard_resends_the_full_state() -> None:
    # Found by the convergence property test: the client still holds the listener it
    # stopped naming, and `*` for LDS covers nothing, so it must hear the set is empty.
    world = World()
    client = world.sotw()
    client.request(LDS, [WEB])
    assert client.names(LDS) == [WEB]
    client.ack(LDS, ["*"])
    assert client.one(LDS).resources == []
    # For CDS, `*` covers the cluster: the client keeps it and hears nothing.
    client.request(CDS, [WEB])
    client.responses()
    client.ack(CDS, ["*", WEB])
    assert client.names(CDS) == [API, WEB]
    client.ack(CDS, ["*"])
    assert client.responses() == []


def test_answers_to_unknown_types_are_bounded_for_a_client_that_does_not_read() -> None:
    client = World().sotw()
    for _ in range(1000):  # one type asked again and again, nothing read
        client.request("type.googleapis.com/spam.T", ["x"], nonce="")
    assert len(client.responses()) == 16


def test_a_stream_inventing_types_is_ended_naming_the_seventeenth() -> None:
    # xDS §9.1: 16 unserved types per stream, then INVALID_ARGUMENT naming the type.
    client = World().sotw()
    for i in range(16):
        client.request(f"type.googleapis.com/spam.T{i}", ["x"], nonce="")
    with pytest.raises(BadRequest, match=r"spam\.T16: more than 16 types"):
        client.request("type.googleapis.com/spam.T16", ["x"], nonce="")


def test_a_cluster_first_sent_under_the_wildcard_is_sent_again_when_named() -> None:
    # §1.5: newly requested names are sent even if they went out before, unrequested
    # by name, and are unchanged. From `*` to one name, the full state is that name.
    client = World().sotw()
    client.request(CDS, [])
    assert client.names(CDS) == [API, WEB]
    client.ack(CDS, [API])
    assert client.names(CDS) == [API]
    client.ack(CDS, [API])
    assert client.responses() == []


def test_a_response_is_awaiting_its_answer_until_acked_or_nacked() -> None:
    # What shutdown waits for before it ends a stream (xds_api/service.py).
    client = World().sotw()
    assert not client.stream.awaiting_answer()
    client.request(EDS, [WEB])
    client.responses()
    assert client.stream.awaiting_answer()
    client.ack(EDS, [WEB])
    assert not client.stream.awaiting_answer()
    client.request(EDS, [WEB, API])  # a new name: a new response
    client.responses()
    assert client.stream.awaiting_answer()
    client.request(EDS, [WEB, API], error="rejected")
    assert not client.stream.awaiting_answer()  # a NACK answers it too
