"""What a GRPCRoute says, seen by grpcio's own `xds:///` client against real gRPC
servers: a header-matched rule reaches its backend, a retry on UNAVAILABLE turns a
failing first attempt into a success, `max_stream_duration` ends a slow call, and
the client NACKs nothing it was sent (Routes §1-3, xDS §3.8).

`web` is a server on 127.0.0.2 and `web-v2` one on 127.0.0.3; each answers
/meshbridge.test.Echo/Who with its address, fails every other Flaky call with
UNAVAILABLE, and never answers Slow (the call waits until the servers stop), so that
only a timeout can end it: the route's, well before the probe's own deadline.

The route's timeout is route-wide (an annotation), so fast calls carry it too. grpc
C-core (grpcio 1.85.3 here) starts a service-config timeout 1 to 2 s before the call
(its cycle-counter and monotonic clocks have process epochs that differ by one second
plus a fraction, src/core/util/time.cc; grpc/grpc#34547, #40633): a timeout below
that fails every call at once without sending it, whatever the control plane sends
(docs/routes.md, "grpc and short timeouts"). The timeout here is 4 s, and the last
part of the test pins grpc's behaviour at 300 ms.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc

from meshbridge.app import App
from testkit.polling import HANG, eventually_seen
from tests.conftest import AppFactory
from tests.integration.grpc_xds_probe import APP_TIMEOUT_S
from tests.integration.test_route_canary import NS, WEB
from tests.integration.test_xds_proxyless import Probe, start_probe
from tests.integration.xds_helpers import Manifests, service_with_addresses

WEB_IP, V2_IP = "127.0.0.2", "127.0.0.3"


def echo_route(timeout: str) -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute",
        "metadata": {"name": "echo", "namespace": NS, "annotations": {
            "retry.linkerd.io/grpc": "unavailable", "retry.linkerd.io/limit": "2",
            "timeout.linkerd.io/request": timeout}},
        "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "web", "port": 80}],
                 "rules": [
                     {"matches": [{"headers": [{"name": "x-version", "value": "v2"}]}],
                      "backendRefs": [{"name": "web-v2", "port": 80}]},
                     {"matches": [{"method": {"service": "meshbridge.test.Echo",
                                              "method": "Flaky"}}],
                      "backendRefs": [{"name": "web", "port": 80}]},
                     {"backendRefs": [{"name": "web", "port": 80}]},
                 ]}}


class Servers:
    def __init__(self) -> None:
        self.servers: list[grpc.aio.Server] = []
        self.port = 0
        self.flaky = 0
        self.who = 0  # calls that reached a server
        self.slow = 0
        self.stopping = asyncio.Event()  # what a Slow call waits for

    async def start(self) -> None:
        for _ in range(10):
            try:
                for ip in (WEB_IP, V2_IP):
                    await self._start(ip)
                return
            except (OSError, RuntimeError):
                await self.stop()
                self.stopping.clear()  # the next attempt's servers are running
                self.port = 0
        raise RuntimeError("no port free on both addresses")

    async def _start(self, ip: str) -> None:
        server = grpc.aio.server()

        async def who(_req: bytes, _ctx: Any) -> bytes:
            self.who += 1
            return ip.encode()

        async def flaky(_req: bytes, ctx: Any) -> bytes:
            self.flaky += 1
            if self.flaky % 2:
                await ctx.abort(grpc.StatusCode.UNAVAILABLE, "every other call fails")
            return ip.encode()

        async def slow(_req: bytes, _ctx: Any) -> bytes:
            self.slow += 1
            await self.stopping.wait()
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
        self.stopping.set()
        for s in self.servers:
            await s.stop(None)
        self.servers = []


async def start_route_probe(xds_port: int) -> asyncio.subprocess.Process:
    return await start_probe(xds_port, "grpc-route-probe", WEB, zone=None,
                             metadata={"NAMESPACE": NS})


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
        edits.write("route.yaml", [echo_route("4s")])
        app: App = await make_app(manifests)
        proc = await start_route_probe(app.grpc_port)
        probe = Probe(proc)

        async def routed() -> tuple[bool, Any]:
            got = await probe.call(5)
            return got["backends"] == {WEB_IP: 5}, got
        await eventually_seen(routed, HANG, "calls reaching web", period=0)
        # The header-matched rule reaches web-v2; without the header, web.
        assert await probe.call(20, "Who", "x-version=v2") == {
            "backends": {V2_IP: 20}, "errors": {}}
        # Every other Flaky call fails UNAVAILABLE: the retry makes every call succeed.
        assert await probe.call(10, "Flaky") == {"backends": {WEB_IP: 10}, "errors": {}}
        assert servers.flaky == 20
        # max_stream_duration ends a call the backend never answers, after the call
        # reached it and before the call's own deadline.
        slow = await probe.call(1, "Slow", timed=True)
        assert (slow["backends"], slow["errors"]) == ({}, {"DEADLINE_EXCEEDED": 1}), slow
        assert servers.slow == 1 and slow["seconds"] < APP_TIMEOUT_S, slow
        # grpc took every resource it was sent.
        [stream] = [s for s in await app.stream_infos() if s.client == "grpc-route-probe"]
        assert sorted(stream.types) == ["cds", "eds", "lds", "rds"]
        for state in stream.types.values():
            assert not state.last_nack_error
            assert state.last_ack_version == state.last_sent_version

        # grpc's behaviour, pinned: a 300 ms route timeout fails every call at once,
        # fast or not, and none reaches a server.
        edits.write("route.yaml", [echo_route("300ms")])

        async def failing() -> tuple[bool, Any]:
            got = await probe.call(1)
            return got["errors"] == {"DEADLINE_EXCEEDED": 1}, got
        await eventually_seen(failing, HANG, "the 300 ms timeout reaching grpc", period=0)
        reached = servers.who
        assert await probe.call(5) == {"backends": {}, "errors": {"DEADLINE_EXCEEDED": 5}}
        assert servers.who == reached
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
        await servers.stop()


async def test_grpc_fails_a_short_service_config_timeout_at_once_without_xds() -> None:
    """The same with no xDS at all: a plain channel whose service config gives every
    method a 300 ms timeout (what grpc makes of max_stream_duration) fails a call to a
    server that answers at once, before sending it: grpc's clocks, not our encoding."""
    server = grpc.aio.server()
    reached = 0

    async def who(_req: bytes, _ctx: Any) -> bytes:
        nonlocal reached
        reached += 1
        return b"ok"

    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "meshbridge.test.Echo", {"Who": grpc.unary_unary_rpc_method_handler(who)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    config = {"methodConfig": [{"name": [{}], "timeout": "0.300s"}]}
    try:
        async with grpc.aio.insecure_channel(
                f"127.0.0.1:{port}",
                options=[("grpc.service_config", json.dumps(config))]) as channel:
            call = channel.unary_unary("/meshbridge.test.Echo/Who")
            codes = []
            for _ in range(5):
                try:
                    await call(b"", timeout=APP_TIMEOUT_S, wait_for_ready=True)
                    codes.append("OK")
                except grpc.aio.AioRpcError as e:
                    codes.append(e.code().name)
        assert codes == ["DEADLINE_EXCEEDED"] * 5 and reached == 0
    finally:
        await server.stop(None)
