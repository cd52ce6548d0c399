"""What a GRPCRoute says, seen by grpcio's own `xds:///` client against real gRPC
servers: a header-matched rule reaches its backend, a retry on UNAVAILABLE turns a
failing first attempt into a success, `max_stream_duration` ends a slow call, and
the client NACKs nothing it was sent (Routes §1-3, xDS §3.8).

`web` is a server on 127.0.0.2 and `web-v2` one on 127.0.0.3; each answers
/meshbridge.test.Echo/Who with its address, fails every other Flaky call with
UNAVAILABLE, and takes 3 s to answer Slow."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import grpc

from meshbridge.app import App
from tests.conftest import AppFactory
from tests.integration.test_route_canary import NS, WEB
from tests.integration.test_xds_proxyless import PROBE, Probe
from tests.integration.xds_helpers import Manifests, eventually, service_with_addresses

WEB_IP, V2_IP = "127.0.0.2", "127.0.0.3"

ROUTE = {
    "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute",
    "metadata": {"name": "echo", "namespace": NS, "annotations": {
        "retry.linkerd.io/grpc": "unavailable", "retry.linkerd.io/limit": "2"}},
    "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "web", "port": 80}],
             "rules": [
                 {"matches": [{"headers": [{"name": "x-version", "value": "v2"}]}],
                  "backendRefs": [{"name": "web-v2", "port": 80}]},
                 {"matches": [{"method": {"service": "meshbridge.test.Echo",
                                          "method": "Flaky"}}],
                  "backendRefs": [{"name": "web", "port": 80}]},
                 {"backendRefs": [{"name": "web", "port": 80}]},
             ]}}
# A route of its own, so that its timeout (an annotation is route-wide) is Slow's only.
SLOW = {
    "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute",
    "metadata": {"name": "echo-slow", "namespace": NS,
                 "annotations": {"timeout.linkerd.io/request": "300ms"}},
    "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "web", "port": 80}],
             "rules": [{"matches": [{"method": {"service": "meshbridge.test.Echo",
                                                "method": "Slow"}}],
                        "backendRefs": [{"name": "web", "port": 80}]}]}}


class Servers:
    def __init__(self) -> None:
        self.servers: list[grpc.aio.Server] = []
        self.port = 0
        self.flaky = 0

    async def start(self) -> None:
        for _ in range(10):
            try:
                for ip in (WEB_IP, V2_IP):
                    await self._start(ip)
                return
            except (OSError, RuntimeError):
                await self.stop()
                self.port = 0
        raise RuntimeError("no port free on both addresses")

    async def _start(self, ip: str) -> None:
        server = grpc.aio.server()

        async def who(_req: bytes, _ctx: Any) -> bytes:
            return ip.encode()

        async def flaky(_req: bytes, ctx: Any) -> bytes:
            self.flaky += 1
            if self.flaky % 2:
                await ctx.abort(grpc.StatusCode.UNAVAILABLE, "every other call fails")
            return ip.encode()

        async def slow(_req: bytes, _ctx: Any) -> bytes:
            await asyncio.sleep(3)
            return ip.encode()

        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "meshbridge.test.Echo", {
                "Who": grpc.unary_unary_rpc_method_handler(who),
                "Flaky": grpc.unary_unary_rpc_method_handler(flaky),
                "Slow": grpc.unary_unary_rpc_method_handler(slow)}),))
        bound = server.add_insecure_port(f"{ip}:{self.port}")
        if bound == 0:
            raise OSError(f"cannot bind {ip}:{self.port}")
        self.port = bound
        await server.start()
        self.servers.append(server)

    async def stop(self) -> None:
        for s in self.servers:
            await s.stop(None)
        self.servers = []


async def start_probe(xds_port: int) -> asyncio.subprocess.Process:
    bootstrap = {
        "xds_servers": [{"server_uri": f"127.0.0.1:{xds_port}",
                         "channel_creds": [{"type": "insecure"}],
                         "server_features": ["xds_v3"]}],
        "node": {"id": "grpc-route-probe", "metadata": {"NAMESPACE": NS}},
    }
    env = {**os.environ, "GRPC_XDS_BOOTSTRAP_CONFIG": json.dumps(bootstrap),
           "GRPC_VERBOSITY": "ERROR"}
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    return await asyncio.create_subprocess_exec(
        sys.executable, str(PROBE), f"xds:///{WEB}",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env)


async def test_grpcio_does_what_each_grpc_route_rule_says(tmp_path: Path,
                                                         make_app: AppFactory) -> None:
    servers = Servers()
    await servers.start()
    proc = None
    try:
        manifests = tmp_path / "manifests"
        manifests.mkdir()
        edits = Manifests(manifests)
        for name, ip in (("web", WEB_IP), ("web-v2", V2_IP)):
            edits.write(f"{name}.yaml", service_with_addresses(
                NS, name, 80, servers.port, [(ip, "zone-a")], app_protocol="grpc",
                port_name="grpc"))
        edits.write("route.yaml", [ROUTE, SLOW])
        app: App = await make_app(manifests)
        proc = await start_probe(app.grpc_port)
        probe = Probe(proc)

        async def routed() -> tuple[bool, Any]:
            got = await probe.call(5)
            return got["backends"] == {WEB_IP: 5}, got
        await eventually(routed, 30.0, "calls reaching web", interval=0)
        # The header-matched rule reaches web-v2; without the header, web.
        assert await probe.call(20, "Who", "x-version=v2") == {
            "backends": {V2_IP: 20}, "errors": {}}
        # Every other Flaky call fails UNAVAILABLE: the retry makes every call succeed.
        assert await probe.call(10, "Flaky") == {"backends": {WEB_IP: 10}, "errors": {}}
        assert servers.flaky == 20
        # max_stream_duration (300 ms) ends a call the backend takes 3 s to answer.
        assert await probe.call(2, "Slow") == {"backends": {},
                                                "errors": {"DEADLINE_EXCEEDED": 2}}
        # grpc took every resource it was sent.
        [stream] = [s for s in await app.stream_infos() if s.client == "grpc-route-probe"]
        assert sorted(stream.types) == ["cds", "eds", "lds", "rds"]
        for state in stream.types.values():
            assert not state.last_nack_error
            assert state.last_ack_version == state.last_sent_version
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
        await servers.stop()
