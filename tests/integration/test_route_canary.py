"""The demo's 90/10 canary HTTPRoute (bridge/sources/demo/50-policy.yaml, as shipped)
seen as 90/10 by the three client kinds, each a real client: a real Envoy with the
docs/proxies/envoy.md bootstrap in front of real HTTP servers, grpcio's own `xds:///`
resolver against real gRPC servers, and a Linkerd `OutboundPolicies.Watch` client
(Routes §1-3).

`web` is one server on 127.0.0.2 and `web-canary` one on 127.0.0.3, so who answered
says which backend a request went to. Over N = 2,000 requests the canary's count must
be within 5 standard deviations of 10% (sqrt(N * 0.1 * 0.9) = 13.4): 200 ± 67. A
correct split fails that about once in two million runs; an unsplit route (0 or
2,000) or a wrong weight (50/50: 1,000) never passes it.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from bridge.sources.catalog import DEMO_DIR
from linkerd_api.proto import outbound_pb2 as ob
from meshbridge.app import App
from tests.conftest import AppFactory
from tests.integration import policy_client
from tests.integration.test_proxy_docs import (
    block,
    envoy,
    envoy_bootstrap,
    exports,
    free_port,
    start_http_backends,
)
from tests.integration.test_xds_proxyless import PROBE, Probe, start_backends
from tests.integration.xds_helpers import Manifests, eventually, service_with_addresses
from tests.polling import eventually as eventually_true

N = 2000
CANARY_SHARE = 0.1
BOUND = 5 * math.sqrt(N * CANARY_SHARE * (1 - CANARY_SHARE))
WEB_IP, CANARY_IP = "127.0.0.2", "127.0.0.3"
NS = "emojivoto"
WEB = f"web.{NS}.svc.cluster.local:80"


def within_bound(canary: int) -> bool:
    return abs(canary - N * CANARY_SHARE) <= BOUND


def demo_canary_route() -> dict[str, Any]:
    """The demo's own canary route, as shipped."""
    docs = yaml.safe_load_all((DEMO_DIR / "50-policy.yaml").read_text())
    [route] = [d for d in docs if d and d.get("kind") == "HTTPRoute"
               and d["metadata"]["name"] == "web-canary"]
    return dict(route)


def canary_manifests(folder: Path, backend_port: int, app_protocol: str = "") -> None:
    """web and web-canary (port 80), each one real server, and the demo's route."""
    edits = Manifests(folder)
    edits.write("web.yaml", service_with_addresses(
        NS, "web", 80, backend_port, [(WEB_IP, "zone-a")], app_protocol=app_protocol,
        port_name="http"))
    edits.write("web-canary.yaml", service_with_addresses(
        NS, "web-canary", 80, backend_port, [(CANARY_IP, "zone-a")],
        app_protocol=app_protocol, port_name="http"))
    edits.write("route.yaml", [demo_canary_route()])


@pytest.mark.envoy
async def test_a_real_envoy_splits_the_demo_canary_90_10(tmp_path: Path,
                                                        make_app: AppFactory) -> None:
    servers, backend_port = await start_http_backends((WEB_IP, CANARY_IP))
    try:
        manifests = tmp_path / "manifests"
        manifests.mkdir()
        canary_manifests(manifests, backend_port)
        app: App = await make_app(manifests)
        values = exports(block("envoy.md", "envoy-run"))
        outbound = free_port()
        values.update(MESHBRIDGE_PORT=str(app.grpc_port), OUTBOUND_PORT=str(outbound),
                      ENVOY_ADMIN_PORT="0")
        with envoy(envoy_bootstrap(values), tmp_path):
            def count(n: int) -> dict[str, int]:
                seen: dict[str, int] = {}
                conn = http.client.HTTPConnection("127.0.0.1", outbound, timeout=10)
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
            await eventually_true(both, 30, "requests through Envoy reach web and the canary")
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
        proc = await start_probe(app.grpc_port)
        probe = Probe(proc)

        async def both() -> tuple[bool, Any]:
            got = await probe.call(50)
            return set(got["backends"]) == {WEB_IP, CANARY_IP} and not got["errors"], got
        await eventually(both, 30.0, "RPCs reaching web and the canary", interval=0)
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


async def start_probe(xds_port: int) -> asyncio.subprocess.Process:
    bootstrap = {
        "xds_servers": [{"server_uri": f"127.0.0.1:{xds_port}",
                         "channel_creds": [{"type": "insecure"}],
                         "server_features": ["xds_v3"]}],
        "node": {"id": "canary-probe", "locality": {"zone": "zone-a"},
                 "metadata": {"NAMESPACE": NS}},
    }
    env = {**os.environ, "GRPC_XDS_BOOTSTRAP_CONFIG": json.dumps(bootstrap),
           "GRPC_VERBOSITY": "ERROR"}
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    return await asyncio.create_subprocess_exec(
        sys.executable, str(PROBE), f"xds:///{WEB}",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env)


async def test_a_linkerd_outbound_policies_client_is_told_the_demo_canary_90_10(
        demo_dir: Path, make_app: AppFactory) -> None:
    app: App = await make_app(demo_dir)
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
    assert policy_client.metadata_kinds_all_set(policy) == []
