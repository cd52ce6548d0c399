"""Get over real gRPC on loopback, served from the demo cluster and edited manifests.

Every wait is a read with a deadline. "Nothing was sent" is proven with a barrier:
make a change whose message is known, and check that it is the next one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog

from bridge.model import MeshConfig
from linkerd_api.endpoint_streams import Semantics
from linkerd_api.service import LinkerdOptions
from testkit.linkerd import (
    Stream,
    addrs,
    by_addr,
    channel_to,
    describe,
    edit,
    metric,
    named,
    remove_objects,
    write_docs,
)
from testkit.polling import eventually

AppFactory = Any

WEB = "web.emojivoto.svc.cluster.local:80"
TOKEN_B = '{"ns":"shop","nodeName":"node-b","pod":"client-1"}'


# ------------------------------------------------------------------ the first message


async def test_the_first_message_is_one_add_of_the_ready_endpoints(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        first = await Stream(ch, "Get", WEB).next()
    # web has 3 endpoints; the terminating one is not ready, so not announced.
    assert describe(first) == ("add", ["10.244.1.10:8080", "10.244.2.10:8080"])
    assert dict(first.add.metric_labels) == {"service": "web", "namespace": "emojivoto"}


async def test_the_port_defaults_to_80_and_a_declared_port_resolves_by_name(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        first = await Stream(ch, "Get", "web.emojivoto.svc.cluster.local").next()
        prom = await Stream(ch, "Get", "emoji.emojivoto.svc.cluster.local:8801").next()
    assert addrs(first) == ["10.244.1.10:8080", "10.244.2.10:8080"]
    assert addrs(prom) == ["10.244.1.11:8801", "10.244.2.11:8801"]


async def test_a_meshed_endpoint_carries_identity_hint_transport_and_labels(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        first = await Stream(ch, "Get", WEB, TOKEN_B).next()
    wa = by_addr(first)["10.244.2.10:8080"]
    ident = "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"
    assert wa.tls_identity.dns_like_identity.name == ident == wa.tls_identity.server_name.name
    assert wa.protocol_hint.WhichOneof("protocol") == "h2"
    assert wa.protocol_hint.opaque_transport.inbound_port == 4143
    assert (wa.http2.keep_alive.interval.seconds, wa.http2.keep_alive.timeout.seconds) == (10, 3)
    assert wa.weight == 10000
    assert dict(wa.metric_labels) == {
        "pod": "web-5d8f7b9c6-9zqtm", "deployment": "web", "serviceaccount": "web",
        "control_plane_ns": "linkerd", "pod_template_hash": "5d8f7b9c6", "zone": "zone-b",
        "zone_locality": "local"}
    assert by_addr(first)["10.244.1.10:8080"].metric_labels["zone_locality"] == "remote"


@pytest.mark.parametrize(("authority", "expected"), [
    # A Server marks emoji's prom port opaque; no annotation involved.
    ("emoji.emojivoto.svc.cluster.local:8801", ("opaque", 4143, True)),
    ("emoji.emojivoto.svc.cluster.local:8080", ("h2", 4143, True)),
    ("cache.shop.svc.cluster.local:6379", ("opaque", 4143, True)),  # a default opaque port
    ("queue.shop.svc.cluster.local:5672", ("opaque", 4143, True)),  # annotation by port name
    ("queue.shop.svc.cluster.local:15672", ("h2", 4143, True)),  # annotation replaces defaults
    ("search.shop.svc.cluster.local:9091", ("h2", 4143, True)),
    ("search.shop.svc.cluster.local:9090", (None, None, False)),  # skip-inbound-ports
    ("node-local-agent.shop.svc.cluster.local:4317", (None, None, False)),  # unmeshed
])
async def test_protocol_hints_follow_opacity_skipping_and_meshing(
        make_app: AppFactory, demo_dir: Path, authority: str, expected: Any) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        first = await Stream(ch, "Get", authority).next()
    for wa in first.add.addrs:
        hint = wa.protocol_hint.WhichOneof("protocol") if wa.HasField("protocol_hint") else None
        transport = wa.protocol_hint.opaque_transport.inbound_port \
            if wa.protocol_hint.HasField("opaque_transport") else None
        assert (hint, transport, wa.HasField("tls_identity")) == expected
        assert wa.HasField("http2") is expected[2]


async def test_unmeshed_pods_and_an_address_without_a_pod(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        first = await Stream(ch, "Get", "billing.legacy.svc.cluster.local").next()
    eps = by_addr(first)
    assert sorted(eps) == ["10.0.5.20:8080", "10.244.1.60:8080", "10.244.2.60:8080"]
    assert dict(eps["10.0.5.20:8080"].metric_labels) == {"zone_locality": "unknown"}
    pod = eps["10.244.1.60:8080"]
    assert pod.metric_labels["serviceaccount"] == "default"
    assert pod.metric_labels["deployment"] == "billing"
    for wa in eps.values():
        assert not wa.HasField("tls_identity") and not wa.HasField("protocol_hint")


# ------------------------------------------------------------------ filtering


async def test_dual_stack_pods_are_announced_by_their_ipv6_address(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    v4_only = await make_app(demo_dir, MeshConfig(enable_ipv6=False))
    async with channel_to(app) as ch, channel_to(v4_only) as ch4:
        both = await Stream(ch, "Get", "cart.shop.svc.cluster.local:8080").next()
        v4 = await Stream(ch4, "Get", "cart.shop.svc.cluster.local:8080").next()
    assert addrs(both) == ["[fd00:10:244::1:30]:8080", "[fd00:10:244::2:30]:8080"]
    assert addrs(v4) == ["10.244.1.30:8080", "10.244.2.30:8080"]


async def test_a_statefulset_instance_name_selects_its_pod(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        one = await Stream(ch, "Get", "db-1.db.data.svc.cluster.local:5432").next()
        all_ = await Stream(ch, "Get", "db.data.svc.cluster.local:5432").next()
    assert addrs(one) == ["10.244.2.50:5432"]
    assert len(all_.add.addrs) == 3
    assert one.add.addrs[0].protocol_hint.WhichOneof("protocol") == "opaque"


async def test_topology_hints_keep_the_clients_zone_and_fall_back_to_all(
        make_app: AppFactory, demo_dir: Path) -> None:
    # node-d is in zone-d, for which no endpoint is hinted: fall back to every endpoint.
    write_docs(demo_dir / "05-node-d.yaml", [{
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-d", "labels": {"topology.kubernetes.io/zone": "zone-d"}}}])
    app = await make_app(demo_dir)
    catalog = "catalog.shop.svc.cluster.local"
    async with channel_to(app) as ch:
        zone_b = await Stream(ch, "Get", catalog, TOKEN_B).next()
        zone_d = await Stream(ch, "Get", catalog, '{"nodeName":"node-d"}').next()
        anywhere = await Stream(ch, "Get", catalog).next()
    assert addrs(zone_b) == ["10.244.2.20:8080", "10.244.2.21:8080"]
    assert {a.metric_labels["zone_locality"] for a in zone_b.add.addrs} == {"local"}
    assert len(zone_d.add.addrs) == 6
    assert {a.metric_labels["zone_locality"] for a in zone_d.add.addrs} == {"remote"}
    assert len(anywhere.add.addrs) == 6  # no node: no zone to filter by


async def test_internal_traffic_policy_local_keeps_the_clients_node_without_fallback(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    agent = "node-local-agent.shop.svc.cluster.local:4317"
    async with channel_to(app) as ch:
        on_a = await Stream(ch, "Get", agent, '{"nodeName":"node-a"}').next()
        on_c = await Stream(ch, "Get", agent, '{"nodeName":"node-c"}').next()
    assert addrs(on_a) == ["10.244.1.40:4317"]
    assert describe(on_c) == ("no_endpoints", True)


# ------------------------------------------------------------------ semantics


@pytest.mark.parametrize("authority", ["payments.shop.svc.cluster.local:8080",
                                       "reports.legacy.svc.cluster.local:8080"])
async def test_proto_semantics_say_an_empty_service_exists_without_endpoints(
        make_app: AppFactory, demo_dir: Path, authority: str) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        assert describe(await Stream(ch, "Get", authority).next()) == ("no_endpoints", True)


async def test_proto_semantics_answer_a_missing_service_and_keep_the_stream_open(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        stream = Stream(ch, "Get", "later.shop.svc.cluster.local:80")
        assert describe(await stream.next()) == ("no_endpoints", False)
        write_docs(demo_dir / "50-later.yaml", [
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": "later", "namespace": "shop"},
             "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": "later-1", "namespace": "shop",
                          "labels": {"kubernetes.io/service-name": "later"}},
             "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
             "endpoints": [{"addresses": ["10.244.1.80"]}]}])
        assert describe(await stream.next()) == ("add", ["10.244.1.80:8080"])


async def test_linkerd_2_20_semantics_refuse_a_missing_service(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir, layer_options=(LinkerdOptions(semantics="linkerd-2.20"),))
    async with channel_to(app) as ch:
        code, details = await Stream(ch, "Get", "nope.shop.svc.cluster.local:80").error()
    assert (code, details) == (grpc.StatusCode.NOT_FOUND, "Service nope.shop not found")


async def test_a_missing_service_retried_by_a_proxy_is_logged_once_and_counted_every_time(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir, layer_options=(LinkerdOptions(semantics="linkerd-2.20"),))
    async with channel_to(app) as ch:
        with structlog.testing.capture_logs() as logs:
            # A linkerd2-proxy's balancer asks again and again (with backoff).
            for _ in range(5):
                code, _ = await Stream(ch, "Get", "nope.shop.svc.cluster.local:80").error()
                assert code == grpc.StatusCode.NOT_FOUND
            await Stream(ch, "Get", "gone.shop.svc.cluster.local:80").error()
    refusals = [e for e in logs if e["event"] == "destination request refused"]
    assert [e["authority"] for e in refusals] == ["nope.shop.svc.cluster.local:80",
                                                  "gone.shop.svc.cluster.local:80"]
    assert all(e["unlogged_repeats"] == 0 for e in refusals)
    assert await metric(app, "meshbridge_destination_requests_refused_total",
                        {"method": "Get", "code": "NOT_FOUND"}) == 6


async def test_linkerd_2_20_semantics_say_nothing_about_an_empty_service(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir, layer_options=(LinkerdOptions(semantics="linkerd-2.20"),))
    async with channel_to(app) as ch:
        stream = Stream(ch, "Get", "reports.legacy.svc.cluster.local:8080")
        await _until_subscribed(app, 1)
        # Barrier: give reports an endpoint; if anything had been sent before, it
        # would be read here instead of this add.
        write_docs(demo_dir / "41-reports.yaml", [{
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "reports-1", "namespace": "legacy",
                         "labels": {"kubernetes.io/service-name": "reports"}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": ["10.244.1.70"]}]}])
        assert describe(await stream.next()) == ("add", ["10.244.1.70:8080"])


@pytest.mark.parametrize(("semantics", "gone"), [
    ("proto", [("remove", ["10.0.5.20:8080", "10.244.1.60:8080", "10.244.2.60:8080"]),
               ("no_endpoints", False)]),
    ("linkerd-2.20", [("remove", ["10.0.5.20:8080", "10.244.1.60:8080",
                                  "10.244.2.60:8080"])]),
])
async def test_a_deleted_service_is_removed_and_its_stream_stays_open(
        make_app: AppFactory, demo_dir: Path, semantics: Semantics, gone: Any) -> None:
    app = await make_app(demo_dir, layer_options=(LinkerdOptions(semantics=semantics),))
    async with channel_to(app) as ch:
        stream = Stream(ch, "Get", "billing.legacy.svc.cluster.local:80")
        assert len((await stream.next()).add.addrs) == 3
        removed = remove_objects(demo_dir, named("Service", "legacy", "billing"))
        assert [describe(await stream.next()) for _ in gone] == gone
        write_docs(demo_dir / "42-billing.yaml", removed)
        assert describe(await stream.next()) == (
            "add", ["10.0.5.20:8080", "10.244.1.60:8080", "10.244.2.60:8080"])


# ------------------------------------------------------------------ changes


def _set_ready(ip: str, ready: bool) -> Any:
    def change(doc: dict[str, Any]) -> dict[str, Any]:
        if doc.get("kind") != "EndpointSlice":
            return doc
        for ep in doc.get("endpoints") or []:
            if ip in ep.get("addresses", []):
                ep["conditions"] = {"ready": ready, "serving": True, "terminating": not ready}
        return doc
    return change


async def test_an_endpoint_that_stops_being_ready_is_removed_and_comes_back(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        stream = Stream(ch, "Get", WEB)
        await stream.next()
        edit(demo_dir, _set_ready("10.244.1.10", False))
        assert describe(await stream.next()) == ("remove", ["10.244.1.10:8080"])
        edit(demo_dir, _set_ready("10.244.1.10", True))
        assert describe(await stream.next()) == ("add", ["10.244.1.10:8080"])


async def test_one_change_sends_add_before_remove(make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        stream = Stream(ch, "Get", WEB)
        await stream.next()
        # The terminating pod becomes ready while 10.244.1.10 stops being ready.
        edit(demo_dir, lambda d: _set_ready("10.244.1.10", False)(
            _set_ready("10.244.3.10", True)(d)))
        assert [describe(await stream.next()) for _ in range(2)] == [
            ("add", ["10.244.3.10:8080"]), ("remove", ["10.244.1.10:8080"])]


async def test_a_reconnecting_client_gets_the_whole_current_set_first(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        stream = Stream(ch, "Get", WEB)
        await stream.next()
        edit(demo_dir, _set_ready("10.244.3.10", True))
        assert describe(await stream.next()) == ("add", ["10.244.3.10:8080"])
        stream.cancel()
        again = await Stream(ch, "Get", WEB).next()
    assert describe(again) == ("add", ["10.244.1.10:8080", "10.244.2.10:8080",
                                       "10.244.3.10:8080"])


async def test_every_stream_of_a_view_gets_one_encoding_of_a_change(
        make_app: AppFactory, demo_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = await make_app(demo_dir)
    translator = app.service("linkerd").translator
    calls: list[int] = []
    real_remove = translator.remove

    def counted(endpoints: Any) -> bytes:
        calls.append(1)
        result: bytes = real_remove(endpoints)
        return result

    monkeypatch.setattr(translator, "remove", counted)
    async with channel_to(app) as ch:
        streams = [Stream(ch, "Get", WEB) for _ in range(20)]
        for s in streams:
            await s.next()
        edit(demo_dir, _set_ready("10.244.2.10", False))
        got = [await s.next() for s in streams]
    assert len(calls) == 1
    assert all(describe(u) == ("remove", ["10.244.2.10:8080"]) for u in got)


# ------------------------------------------------------------------ overflow


def _big_service(folder: Path, n: int, offset: int) -> None:
    """A service with n pod-less endpoints; `offset` picks which addresses."""
    write_docs(folder / "big.yaml", [
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "big", "namespace": "shop"},
         "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "big-1", "namespace": "shop",
                      "labels": {"kubernetes.io/service-name": "big"}},
         "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
         "endpoints": [{"addresses": [f"10.{100 + offset}.{i // 250}.{i % 250 + 1}"]}
                       for i in range(n)]},
    ])


async def test_a_client_that_stops_reading_is_cut_off_and_others_keep_receiving(
        make_app: AppFactory, demo_dir: Path) -> None:
    big = "big.shop.svc.cluster.local:80"
    _big_service(demo_dir, 300, 0)
    app = await make_app(demo_dir, layer_options=(LinkerdOptions(stream_queue_capacity=2),))
    counter = ("endpoint_updates_queue_overflow_total", {"service": big})
    # The stalled client's transport stops taking data once its small HTTP/2 window
    # is full (no BDP probing to grow it); then the server's writes block and the
    # stream's queue fills up.
    slow_opts = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 4096)]
    async with channel_to(app, slow_opts) as slow_ch, channel_to(app) as ch:
        stalled = Stream(slow_ch, "Get", big)
        healthy = Stream(ch, "Get", big)
        assert len((await healthy.next()).add.addrs) == 300
        for flip in range(1, 60):
            _big_service(demo_dir, 300, flip % 2)
            # The healthy client sees every change: add the new set, remove the old.
            assert [describe(await healthy.next())[0] for _ in range(2)] == ["add", "remove"]
            if await metric(app, *counter):
                break
        assert await metric(app, *counter) == 1
        # The stalled client, once it reads again, gets what was in flight and then the
        # end of the stream, with status OK: it would reconnect for a fresh snapshot.
        _, status = await stalled.rest()
        assert status == grpc.StatusCode.OK
        # The healthy one is unaffected.
        _big_service(demo_dir, 300, flip + 1)
        assert [describe(await healthy.next())[0] for _ in range(2)] == ["add", "remove"]
        assert await metric(app, *counter) == 1


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(("path", "details"), [
    ("web.emojivoto", "Invalid authority: web.emojivoto: "),
    ("web", "Invalid authority: web: "),
    ("web.emojivoto.svc.cluster.local.:80", "trailing dot"),
    ("web.emojivoto.svc.example.org:80", "Invalid authority: "),
    ("web.emojivoto.svc.cluster.local:0", "invalid port 0"),
    ("web.emojivoto.svc.cluster.local:99999", "invalid port 99999"),
    ("web.emojivoto.svc.cluster.local:http", "invalid port 'http'"),
    ("web.emojivoto.svc.cluster.local:80:80", "too many colons"),
    ("10.96.10.10:80", "IP queries not supported by Get API: host=10.96.10.10"),
    ("[fd00::1]:80", "IP queries not supported by Get API: host=fd00::1"),
    ("mail.legacy.svc.cluster.local:25", "ExternalName"),
    ("a" * 300 + ".svc.cluster.local", "longer than"),
    ("", "empty"),
])
async def test_bad_authorities_are_refused_with_invalid_argument_and_the_reason(
        make_app: AppFactory, demo_dir: Path, path: str, details: str) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        code, got = await Stream(ch, "Get", path).error()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details in got


async def test_a_refusal_is_logged_once_with_the_peer_and_other_streams_go_on(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        healthy = Stream(ch, "Get", WEB)
        await healthy.next()
        with structlog.testing.capture_logs() as logs:
            await Stream(ch, "Get", "web.emojivoto.svc.cluster.local:0").error()
            await Stream(ch, "Get", "", raw=b"\xff\xff\xff").error()
        refusals = [e for e in logs if e["event"] == "destination request refused"]
        assert len(refusals) == 2
        assert all(e["peer"].startswith("ipv4:127.0.0.1:") for e in refusals)
        assert refusals[0]["reason"].endswith("invalid port 0")
        assert refusals[1]["reason"] == "request is not a GetDestination message"
        assert await metric(app, "meshbridge_destination_requests_refused_total",
                            {"method": "Get", "code": "INVALID_ARGUMENT"}) == 2
        edit(demo_dir, _set_ready("10.244.1.10", False))
        assert describe(await healthy.next()) == ("remove", ["10.244.1.10:8080"])


@pytest.mark.parametrize("token", ["garbage", '{"ns": 7}', "[" * 3000, "x" * 10000])
async def test_a_garbage_context_token_is_served_as_no_token_and_logged_once(
        make_app: AppFactory, demo_dir: Path, token: str) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        with structlog.testing.capture_logs() as logs:
            first = await Stream(ch, "Get", "catalog.shop.svc.cluster.local", token).next()
    # Served as if no token was sent: no node, so no zone filtering.
    assert len(first.add.addrs) == 6
    warned = [e for e in logs if e["event"].startswith("context token not understood")]
    assert len(warned) == 1 and warned[0]["peer"].startswith("ipv4:127.0.0.1:")


async def test_a_port_the_service_does_not_declare_is_served_as_the_target_port(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        with structlog.testing.capture_logs() as logs:
            first = await Stream(ch, "Get", "web.emojivoto.svc.cluster.local:8080").next()
    assert addrs(first) == ["10.244.1.10:8080", "10.244.2.10:8080"]
    noted = [e for e in logs if e["event"].startswith("port not declared")]
    assert len(noted) == 1
    assert (noted[0]["service"], noted[0]["port"]) == ("web", 8080)


# ------------------------------------------------------------------ lifecycle


async def _until_subscribed(app: Any, n: int, method: str = "Get") -> None:
    async def subscribed() -> bool:
        return await metric(app, "meshbridge_destination_streams", {"method": method}) >= n

    await eventually(subscribed, why=f"timed out waiting for {n} {method} streams to be open")


async def test_streams_are_listed_for_debugging_and_counted(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        stream = Stream(ch, "Get", WEB, TOKEN_B)
        await stream.next()
        await _until_subscribed(app, 1)
        infos = [s for s in await app.stream_infos() if s.protocol == "linkerd-get"]
        assert len(infos) == 1
        info = infos[0]
        assert info.client == TOKEN_B and info.messages_sent == 1
        state = info.types[WEB]
        assert state.subscribed == (WEB,) and int(state.last_sent_version) >= 1
        stream.cancel()
        async def forgotten() -> bool:
            return not await app.stream_infos() and not await metric(
                app, "meshbridge_destination_streams", {"method": "Get"})

        await eventually(forgotten,
                         why="timed out waiting for the cancelled stream to be forgotten")


async def test_stopping_the_server_ends_streams_with_ok(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        stream = Stream(ch, "Get", WEB)
        await stream.next()
        await _until_subscribed(app, 1)
        stopping = asyncio.create_task(app.stop(grace=5))
        messages, status = await stream.rest()
        await stopping
    assert (messages, status) == ([], grpc.StatusCode.OK)


async def test_an_unknown_method_of_the_service_is_unimplemented(
        make_app: AppFactory, demo_dir: Path) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        call = ch.unary_stream("/io.linkerd.proxy.destination.Destination/Watch")(b"")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call.read()
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
