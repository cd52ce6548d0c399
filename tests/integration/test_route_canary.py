"""The demo's 90/10 canary seen as 90/10 by the three client kinds, each a real
client: a real Envoy with the docs/proxies/envoy.md bootstrap in front of real HTTP
servers, grpcio's own `xds:///` resolver against real gRPC servers, and Linkerd's
`OutboundPolicies.Watch` and `GetProfile` clients (Routes §1-3, §7).

The demo's `web` has both an HTTPRoute (bridge/sources/demo/50-policy.yaml: 90% web,
10% web-canary) and a ServiceProfile with two routes and dstOverrides (900m web,
100m web-canary, 10-emojivoto.yaml). A linkerd2-proxy follows the profile and ignores
the HTTPRoute, so every client is routed by the profile: its two routes, then a
catch-all, each to the same 90/10 split. Both objects are served here as shipped.

`web` is one server on 127.0.0.2 and `web-canary` one on 127.0.0.3, so who answered
says which backend a request went to. Over N = 2,000 requests the canary's count must
be within 5 standard deviations of 10% (sqrt(N * 0.1 * 0.9) = 13.4): 200 ± 67. A
correct split fails that about once in two million runs; an unsplit route (0 or
2,000) or a wrong weight (50/50: 1,000) never passes it.
"""

from __future__ import annotations

import asyncio
import http.client
import math
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from bridge.sources.catalog import DEMO_DIR
from linkerd_api.proto import outbound_pb2 as ob
from linkerd_api.service import LinkerdOptions
from meshbridge.app import App
from testkit import linkerd_policy as policy_client
from testkit.linkerd import Stream
from testkit.polling import HANG, eventually, eventually_seen
from tests.conftest import AppFactory
from tests.integration.test_proxy_docs import (
    outbound_envoy,
    start_http_backends,
)
from tests.integration.test_xds_proxyless import Probe, start_backends, start_probe
from tests.integration.xds_helpers import Manifests, service_with_addresses

N = 2000
CANARY_SHARE = 0.1
BOUND = 5 * math.sqrt(N * CANARY_SHARE * (1 - CANARY_SHARE))
WEB_IP, CANARY_IP = "127.0.0.2", "127.0.0.3"
NS = "emojivoto"
WEB = f"web.{NS}.svc.cluster.local:80"


def within_bound(canary: int) -> bool:
    return abs(canary - N * CANARY_SHARE) <= BOUND


def demo_object(file: str, kind: str, name: str) -> dict[str, Any]:
    """One object of the bundled demo, as shipped."""
    docs = yaml.safe_load_all((DEMO_DIR / file).read_text())
    [found] = [d for d in docs if d and d.get("kind") == kind
               and d["metadata"]["name"] == name]
    return dict(found)


def demo_canary_route() -> dict[str, Any]:
    return demo_object("50-policy.yaml", "HTTPRoute", "web-canary")


def demo_web_profile() -> dict[str, Any]:
    return demo_object("10-emojivoto.yaml", "ServiceProfile", "web.emojivoto.svc.cluster.local")


def canary_manifests(folder: Path, backend_port: int, app_protocol: str = "") -> None:
    """web and web-canary (port 80), each one real server, and the demo's route and
    web's profile."""
    edits = Manifests(folder)
    edits.write("web.yaml", service_with_addresses(
        NS, "web", 80, backend_port, [(WEB_IP, "zone-a")], app_protocol=app_protocol,
        port_name="http"))
    edits.write("web-canary.yaml", service_with_addresses(
        NS, "web-canary", 80, backend_port, [(CANARY_IP, "zone-a")],
        app_protocol=app_protocol, port_name="http"))
    edits.write("route.yaml", [demo_canary_route(), demo_web_profile()])


@pytest.mark.envoy
async def test_a_real_envoy_splits_the_demo_canary_90_10(tmp_path: Path,
                                                        make_app: AppFactory) -> None:
    servers, backend_port = await start_http_backends((WEB_IP, CANARY_IP))
    try:
        manifests = tmp_path / "manifests"
        manifests.mkdir()
        canary_manifests(manifests, backend_port)
        app: App = await make_app(manifests)
        with outbound_envoy(app.grpc_port, tmp_path) as outbound:
            def count(n: int) -> dict[str, int]:
                seen: dict[str, int] = {}
                conn = http.client.HTTPConnection("127.0.0.1", outbound, timeout=HANG)
                try:
                    for _ in range(n):
                        conn.request("GET", "/")
                        resp = conn.getresponse()
                        body = resp.read().decode()
                        key = body if resp.status == 200 else str(resp.status)
                        seen[key] = seen.get(key, 0) + 1
                finally:
                    conn.close()
                return seen

            async def both() -> bool:
                try:
                    got = await asyncio.to_thread(count, 50)
                except OSError:
                    return False
                return set(got) == {WEB_IP, CANARY_IP}
            await eventually(both, HANG, "requests through Envoy reach web and the canary")
            seen = await asyncio.to_thread(count, N)
        assert set(seen) == {WEB_IP, CANARY_IP}, seen
        assert within_bound(seen[CANARY_IP]), seen
    finally:
        for s in servers:
            s.close()


async def test_a_proxyless_grpc_client_splits_the_demo_canary_90_10(
        tmp_path: Path, make_app: AppFactory) -> None:
    servers, backend_port = await start_backends()
    proc = None
    try:
        manifests = tmp_path / "manifests"
        manifests.mkdir()
        canary_manifests(manifests, backend_port, app_protocol="grpc")
        app: App = await make_app(manifests)
        proc = await start_canary_probe(app.grpc_port)
        probe = Probe(proc)

        async def both() -> tuple[bool, Any]:
            got = await probe.call(50)
            return set(got["backends"]) == {WEB_IP, CANARY_IP} and not got["errors"], got
        await eventually_seen(both, HANG, "RPCs reaching web and the canary", period=0)
        got = await probe.call(N)
        assert not got["errors"], got
        assert within_bound(got["backends"].get(CANARY_IP, 0)), got
        # The client took every route it was sent: no NACK on any type.
        [stream] = [s for s in await app.stream_infos() if s.client == "canary-probe"]
        for state in stream.types.values():
            assert not state.last_nack_error
            assert state.last_ack_version == state.last_sent_version
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
        for s in servers:
            await s.stop(None)


async def start_canary_probe(xds_port: int) -> asyncio.subprocess.Process:
    return await start_probe(xds_port, "canary-probe", WEB, metadata={"NAMESPACE": NS})


async def test_linkerd_clients_are_told_the_demo_canary_90_10(
        demo_dir: Path, make_app: AppFactory) -> None:
    """What a linkerd2-proxy follows (GetProfile: the profile's routes and overrides)
    and what OutboundPolicies says for the same port (the same table) agree."""
    app: App = await make_app(demo_dir)
    canary = WEB.replace("web.", "web-canary.")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        profile = await Stream(channel, "GetProfile", WEB).next()
        stream = policy_client.watch(channel, ob.TrafficSpec(
            source_workload=policy_client.CLIENT, authority=WEB))
        policy = await stream.next()
        stream.cancel()
    assert [(d.authority, d.weight) for d in profile.dst_overrides] == [
        (WEB, 9000), (canary, 1000)]
    assert [r.metrics_labels["route"] for r in profile.routes] == [
        "GET /api/list", "POST /api/vote"]
    (route,) = policy.protocol.detect.http1.routes
    assert (route.metadata.resource.kind, route.metadata.resource.name) == (
        "ServiceProfile", "web.emojivoto.svc.cluster.local")
    assert [r.matches[0].path.WhichOneof("kind") for r in route.rules] == [
        "regex", "regex", "prefix"]
    for rule in route.rules:
        backends = rule.backends.random_available.backends
        assert [(b.backend.backend.balancer.discovery.dst.path, b.weight)
                for b in backends] == [(WEB, 9000), (canary, 1000)]
    assert route.rules[0].timeouts.request.ToMilliseconds() == 300
    assert policy_client.metadata_kinds_all_set(policy) == []


async def test_linkerd_2_20_semantics_answer_the_policy_from_the_httproute(
        demo_dir: Path, make_app: AppFactory) -> None:
    """Linkerd 2.20's policy controller reads no profile: its answer is the HTTPRoute's
    (a proxy that has the profile ignores it either way, Routes §7.1)."""
    app: App = await make_app(demo_dir, layer_options=(
        LinkerdOptions(semantics="linkerd-2.20"),))
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        stream = policy_client.watch(channel, ob.TrafficSpec(
            source_workload=policy_client.CLIENT, authority=WEB))
        policy = await stream.next()
        stream.cancel()
    (route,) = policy.protocol.detect.http1.routes
    assert (route.metadata.resource.kind, route.metadata.resource.name) == (
        "HTTPRoute", "web-canary")
    (rule,) = route.rules
    backends = rule.backends.random_available.backends
    assert [(b.backend.backend.balancer.discovery.dst.path, b.weight) for b in backends] == [
        (WEB, 90), (WEB.replace("web.", "web-canary."), 10)]
