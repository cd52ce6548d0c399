"""The policy APIs over real gRPC on loopback, served from the demo cluster: the
call sequence and field checks a linkerd2-proxy makes (docs/linkerd.md "Policy")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import yaml

from linkerd_api.policy.outbound import address_of
from linkerd_api.proto import inbound_pb2 as ib
from linkerd_api.proto import outbound_pb2 as ob
from testkit.linkerd import Stream, addrs, channel_to, edit, kind
from testkit.linkerd_policy import (
    CLIENT,
    addr,
    backends_of,
    metadata_kinds_all_set,
    watch,
    watch_addr,
    watch_port,
)
from testkit.polling import eventually

AppFactory = Any
CATALOG_IP = "10.96.20.10"
CATALOG = "catalog.shop.svc.cluster.local:80"


def check_service_backend(backend: ob.Backend, name: str, ns: str, port: int) -> str:
    """The default backend's fields as Linkerd 2.20 sends them; returns its dst path."""
    res = backend.metadata.resource
    assert (res.group, res.kind, res.name, res.namespace, res.port) == (
        "core", "Service", name, ns, port)
    assert backend.queue.capacity == 100
    assert backend.queue.failfast_timeout.seconds == 3
    assert backend.WhichOneof("kind") == "balancer"
    ewma = backend.balancer.peak_ewma
    assert backend.balancer.WhichOneof("load") == "peak_ewma"
    assert (ewma.default_rtt.seconds, ewma.default_rtt.nanos) == (0, 30_000_000)
    assert ewma.decay.seconds == 10
    return backend.balancer.discovery.dst.path


async def test_watch_by_cluster_ip_serves_the_default_policy_whose_path_get_resolves(
    make_app: AppFactory, demo_dir: Path
) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        stream = watch_addr(ch, CATALOG_IP, 80)
        policy = await stream.next()
        assert metadata_kinds_all_set(policy) == []
        res = policy.metadata.resource
        assert (res.group, res.kind, res.name, res.namespace, res.port) == (
            "core", "Service", "catalog", "shop", 80)
        detect = policy.protocol.detect
        assert policy.protocol.WhichOneof("kind") == "detect"
        assert detect.timeout.seconds == 10
        (opaq,) = detect.opaque.routes
        assert opaq.metadata.default == "opaq"
        (opaq_rule,) = opaq.rules
        (opaq_backend,) = opaq_rule.backends.first_available.backends
        paths = {check_service_backend(opaq_backend.backend, "catalog", "shop", 80)}
        for http in (detect.http1, detect.http2):
            (route,) = http.routes
            assert route.metadata.default == "http"
            (rule,) = route.rules
            (match,) = rule.matches
            assert match.path.prefix == "/"
            assert rule.HasField("timeouts")
            (rb,) = rule.backends.first_available.backends
            paths.add(check_service_backend(rb.backend, "catalog", "shop", 80))
        assert paths == {CATALOG}

        get = Stream(ch, "Get", CATALOG)
        first = await get.next()
        assert kind(first) == "add" and len(addrs(first)) >= 1
        stream.cancel()
        get.cancel()


async def test_get_by_authority_answers_the_same_policy_once(
    make_app: AppFactory, demo_dir: Path
) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        get = ch.unary_unary("/io.linkerd.proxy.outbound.OutboundPolicies/Get",
                             response_deserializer=ob.OutboundPolicy.FromString)
        by_name = await get(ob.TrafficSpec(source_workload=CLIENT,
                                           authority=CATALOG).SerializeToString())
        by_ip = await get(ob.TrafficSpec(source_workload=CLIENT,
                                         addr=addr(CATALOG_IP, 80)).SerializeToString())
    assert by_name == by_ip


async def test_the_demo_profile_splits_web_and_an_edit_is_pushed_on_the_open_stream(
    make_app: AppFactory, demo_dir: Path
) -> None:
    """web's ServiceProfile routes it (its dstOverrides, 90/10), for a proxy that
    reads only this policy as for one that follows the profile (Routes §7)."""
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        stream = watch_addr(ch, "10.96.10.10", 80)
        policy = await stream.next()
        (route,) = policy.protocol.detect.http1.routes
        res = route.metadata.resource
        assert (res.group, res.kind, res.namespace, res.name) == (
            "linkerd.io", "ServiceProfile", "emojivoto", "web.emojivoto.svc.cluster.local")
        catch_all = route.rules[-1]
        weighted = catch_all.backends.random_available.backends
        assert [(b.weight, b.backend.backend.balancer.discovery.dst.path) for b in weighted] == [
            (9000, "web.emojivoto.svc.cluster.local:80"),
            (1000, "web-canary.emojivoto.svc.cluster.local:80")]

        def retarget(doc: dict[str, Any]) -> dict[str, Any]:
            if doc.get("kind") == "ServiceProfile" and doc["metadata"]["name"].startswith("web."):
                doc["spec"]["dstOverrides"][1]["authority"] = \
                    "no-such-svc.emojivoto.svc.cluster.local:80"
            return doc

        edit(demo_dir, retarget)
        pushed = await stream.next()
        rule = pushed.protocol.detect.http1.routes[0].rules[-1]
        missing = rule.backends.random_available.backends[1]
        (failure,) = missing.backend.filters
        assert failure.failure_injector.status == 500
        assert failure.failure_injector.message == "Service not found emojivoto/no-such-svc"
        assert missing.backend.backend.metadata.resource.name == "no-such-svc"
        assert missing.backend.backend.WhichOneof("kind") is None
        assert metadata_kinds_all_set(pushed) == []
        stream.cancel()


async def test_a_route_edit_encodes_again_only_the_policies_of_its_own_port(
    make_app: AppFactory, demo_dir: Path
) -> None:
    """Routes §4: an edit of web's HTTPRoute re-encodes web:80's policy once (its
    watchers share it) and leaves catalog's, watched beside it, alone."""
    app = await make_app(demo_dir)
    service = app.service("policy")
    async with channel_to(app) as ch:
        web = [watch_addr(ch, "10.96.10.10", 80) for _ in range(3)]
        catalog = watch_addr(ch, CATALOG_IP, 80)
        for stream in [*web, catalog]:
            await stream.next()
        before = service.encodings

        def reweigh(doc: dict[str, Any]) -> dict[str, Any]:
            if doc.get("kind") == "HTTPRoute" and doc["metadata"]["name"] == "web-canary":
                doc["spec"]["rules"][0]["backendRefs"][1]["weight"] = 20
            return doc

        assert edit(demo_dir, reweigh) == 1
        await eventually(lambda: service.encodings > before,
                         why="web's policy was not encoded again after its route's edit")
        # The edit is applied in one call: everything it re-encodes is counted now.
        assert service.encodings == before + 1
        for stream in [*web, catalog]:
            stream.cancel()


async def test_an_address_outside_the_cluster_gets_the_egress_fallback(
    make_app: AppFactory, demo_dir: Path
) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        stream = watch_addr(ch, "203.0.113.7", 443)
        policy = await stream.next()
        assert policy.metadata.default == "egress-fallback"
        assert policy.protocol.detect.timeout.seconds == 10
        backends = backends_of(policy)
        assert len(backends) == 3  # opaque, http1 and http2 routes
        for b in backends:
            assert b.WhichOneof("kind") == "forward"
            assert (address_of(b.forward.addr), b.forward.addr.port) == ("203.0.113.7", 443)
            assert b.metadata.default == "egress-fallback"
        assert metadata_kinds_all_set(policy) == []
        stream.cancel()
        # In the cluster's networks but no Service: NOT_FOUND, the proxy forwards as is.
        code, _ = await watch_addr(ch, "10.244.9.9", 80).error()
        assert code is grpc.StatusCode.NOT_FOUND


async def test_malformed_targets_are_invalid_argument(
    make_app: AppFactory, demo_dir: Path
) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        for spec in (
            ob.TrafficSpec(source_workload=CLIENT),  # no target
            ob.TrafficSpec(source_workload=CLIENT, addr=addr(CATALOG_IP, 0)),
            ob.TrafficSpec(source_workload=CLIENT, addr=ob.TrafficSpec().addr),
            ob.TrafficSpec(source_workload="nonsense", addr=addr(CATALOG_IP, 80)),
            ob.TrafficSpec(source_workload=CLIENT, authority="bad host:80"),
        ):
            code, _ = await watch(ch, spec).error()
            assert code is grpc.StatusCode.INVALID_ARGUMENT, spec


async def test_watch_port_without_a_server_is_the_default_policy(
    make_app: AppFactory, demo_dir: Path
) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        stream = watch_port(ch, '{"ns":"shop","pod":"cart-69b8c7d4f-q4tnx"}', 8080)
        server = await stream.next()
        assert dict(server.labels) == {"group": "", "kind": "default",
                                       "name": "all-unauthenticated"}
        assert server.protocol.detect.timeout.seconds == 10
        (route,) = server.protocol.detect.http_routes
        assert route.metadata.default == "default"
        assert route.rules[0].matches[0].path.prefix == "/"
        (authz,) = server.authorizations
        assert authz.metadata.default == "all-unauthenticated"
        assert dict(authz.labels) == {"group": "", "kind": "default",
                                      "name": "all-unauthenticated"}
        assert authz.authentication.WhichOneof("permit") == "unauthenticated"
        assert sorted(n.net.prefix_len for n in authz.networks) == [0, 0]
        stream.cancel()
        # The older "ns:pod" form names the same workload.
        old = await watch_port(ch, "shop:cart-69b8c7d4f-q4tnx", 8080).next()
        assert old == server


async def test_watch_port_with_a_server_and_policy_then_a_new_policy_is_pushed(
    make_app: AppFactory, demo_dir: Path
) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        stream = watch_port(ch, '{"ns":"emojivoto","pod":"voting-7f5c6d9b8-bx4fw"}', 8080)
        server = await stream.next()
        assert dict(server.labels) == {"group": "policy.linkerd.io", "kind": "server",
                                       "name": "voting-grpc"}
        assert server.protocol.WhichOneof("kind") == "grpc"
        (authz,) = server.authorizations
        assert authz.metadata.resource.kind == "authorizationpolicy"
        assert authz.metadata.resource.name == "voting-from-web"
        ids = authz.authentication.meshTLS.identities
        assert [i.name for i in ids.identities] == [
            "web.emojivoto.serviceaccount.identity.linkerd.cluster.local"]
        assert metadata_kinds_all_set(server) == []

        (demo_dir / "60-more.yaml").write_text(yaml.safe_dump({
            "apiVersion": "policy.linkerd.io/v1beta1", "kind": "ServerAuthorization",
            "metadata": {"name": "voting-probes", "namespace": "emojivoto"},
            "spec": {"server": {"name": "voting-grpc"},
                     "client": {"unauthenticated": True,
                                "networks": [{"cidr": "10.0.0.0/8"}]}}}))
        pushed = await stream.next()
        kinds = [a.metadata.resource.kind for a in pushed.authorizations]
        assert kinds == ["authorizationpolicy", "serverauthorization"]
        saz = pushed.authorizations[1]
        assert saz.authentication.WhichOneof("permit") == "unauthenticated"
        assert [n.net.prefix_len for n in saz.networks] == [8]
        stream.cancel()


async def test_an_unknown_workload_is_not_found_and_a_bad_one_invalid(
    make_app: AppFactory, demo_dir: Path
) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        code, _ = await watch_port(ch, '{"ns":"shop","pod":"nope"}', 80).error()
        assert code is grpc.StatusCode.NOT_FOUND
        for workload, port in (("", 80), ("{not json", 80), ("shop:cart-69b8c7d4f-q4tnx", 0)):
            code, _ = await watch_port(ch, workload, port).error()
            assert code is grpc.StatusCode.INVALID_ARGUMENT, workload
        bad = ch.unary_stream("/io.linkerd.proxy.inbound.InboundServerPolicies/WatchPort",
                              response_deserializer=ib.Server.FromString)(b"\xff\xff")
        try:
            await bad.read()
            raise AssertionError("expected INVALID_ARGUMENT")
        except grpc.aio.AioRpcError as e:
            assert e.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_a_service_edit_is_pushed_on_the_open_stream(
    make_app: AppFactory, demo_dir: Path
) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        stream = watch_addr(ch, CATALOG_IP, 80)
        assert (await stream.next()).protocol.WhichOneof("kind") == "detect"

        def http_only(doc: dict[str, Any]) -> dict[str, Any]:
            md = doc.get("metadata") or {}
            if doc.get("kind") == "Service" and md.get("name") == "catalog":
                doc["spec"]["ports"][0]["appProtocol"] = "http"
            return doc

        edit(demo_dir, http_only)
        pushed = await stream.next()
        assert pushed.protocol.WhichOneof("kind") == "http1"
        (route,) = pushed.protocol.http1.routes
        assert route.metadata.default == "http"
        stream.cancel()


async def test_the_admin_port_authorizes_the_proxys_readiness_probe(
    make_app: AppFactory, demo_dir: Path
) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        stream = watch_port(ch, '{"ns":"emojivoto","pod":"web-5d8f7b9c6-4xk2p"}', 4191)
        server = await stream.next()
        default, probe = server.protocol.detect.http_routes
        assert default.metadata.default == "default"
        assert probe.metadata.default == "probe"
        assert [m.path.exact for m in probe.rules[0].matches] == ["/ready"]
        (authz,) = probe.authorizations
        assert authz.authentication.WhichOneof("permit") == "unauthenticated"
        assert sorted(n.net.prefix_len for n in authz.networks) == [0, 0]
        stream.cancel()
