"""A real proxyless gRPC client (grpcio, `xds:///` target) resolves through meshbridge:
LDS -> RDS -> CDS -> EDS over one ADS stream, to real gRPC servers on 127.0.0.2/.3."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from meshbridge.app import App
from meshbridge.stream_registry import StreamInfo
from testkit.polling import HANG, eventually, eventually_seen
from tests.conftest import AppFactory
from tests.integration.xds_helpers import Manifests, service_with_addresses

AUTHORITY = "echo.xdstest.svc.cluster.local:50051"
PROBE = Path(__file__).with_name("grpc_xds_probe.py")
BACKENDS = ("127.0.0.2", "127.0.0.3")


async def start_backends() -> tuple[list[grpc.aio.Server], int]:
    """Two gRPC servers on one port, one per loopback address; each says who it is."""
    for _ in range(10):
        servers: list[grpc.aio.Server] = []
        port = 0
        try:
            for ip in BACKENDS:
                server = grpc.aio.server()

                async def who(_req: bytes, _ctx: Any, ip: str = ip) -> bytes:
                    return ip.encode()

                server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
                    "meshbridge.test.Echo",
                    {"Who": grpc.unary_unary_rpc_method_handler(who)}),))
                bound = server.add_insecure_port(f"{ip}:{port}")
                if bound == 0:
                    raise OSError(f"cannot bind {ip}:{port}")
                port = bound
                await server.start()
                servers.append(server)
            return servers, port
        except (OSError, RuntimeError):
            for s in servers:
                await s.stop(None)
    raise RuntimeError("no port free on both 127.0.0.2 and 127.0.0.3")


class Probe:
    """The probe process: `call(n)` makes n RPCs and says who answered."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def call(self, n: int, method: str = "Who", *metadata: str,
                   timed: bool = False) -> dict[str, Any]:
        """n calls of /meshbridge.test.Echo/<method>, with KEY=VALUE metadata (`timed`:
        and the slowest call's `seconds`)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        command = "timed" if timed else "call"
        self.proc.stdin.write(f"{command} {n} {method} {' '.join(metadata)}\n".encode())
        await self.proc.stdin.drain()
        line = await asyncio.wait_for(self.proc.stdout.readline(), 60)
        if not line:
            raise RuntimeError("the gRPC probe process died")
        result: dict[str, Any] = json.loads(line)
        return result


@pytest.fixture
async def backends() -> AsyncIterator[int]:
    servers, port = await start_backends()
    yield port
    for s in servers:
        await s.stop(None)


async def start_probe(xds_port: int, node_id: str = "proxyless-probe",
                      authority: str = "", zone: str | None = "zone-a",
                      metadata: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    """The probe process (PROBE) on `xds:///authority`, its bootstrap naming the node
    (`id`, its locality's `zone` unless None, `metadata`) and meshbridge on `xds_port`."""
    node: dict[str, Any] = {"id": node_id}
    if zone is not None:
        node["locality"] = {"zone": zone}
    if metadata:
        node["metadata"] = metadata
    bootstrap = {
        "xds_servers": [{"server_uri": f"127.0.0.1:{xds_port}",
                         "channel_creds": [{"type": "insecure"}],
                         "server_features": ["xds_v3"]}],
        "node": node,
    }
    env = {**os.environ, "GRPC_XDS_BOOTSTRAP_CONFIG": json.dumps(bootstrap),
           "GRPC_VERBOSITY": "ERROR"}
    env.pop("GRPC_XDS_BOOTSTRAP", None)
    return await asyncio.create_subprocess_exec(
        sys.executable, str(PROBE), f"xds:///{authority or AUTHORITY}",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env)


async def test_proxyless_grpc_reaches_both_backends_then_only_the_one_left(
        tmp_path: Path, backends: int, make_app: AppFactory) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    edits = Manifests(manifests)
    edits.write("echo.yaml", service_with_addresses(
        "xdstest", "echo", 50051, backends,
        [("127.0.0.2", "zone-a"), ("127.0.0.3", "zone-b")], app_protocol="grpc"))
    app: App = await make_app(manifests)
    proc = await start_probe(app.grpc_port)
    probe = Probe(proc)
    try:
        async def both() -> tuple[bool, Any]:
            got = await probe.call(20)
            return set(got["backends"]) == set(BACKENDS) and not got["errors"], got
        await eventually_seen(both, HANG, "RPCs reaching both backends", period=0)

        async def probe_stream() -> StreamInfo:
            # Read afresh each time: with workers, what the App lists is a copy.
            [stream] = [s for s in await app.stream_infos() if s.client == "proxyless-probe"]
            return stream

        before = (await probe_stream()).types["eds"].last_sent_version
        edits.remove_endpoint("echo.yaml", "xdstest", "echo-1", "127.0.0.3")
        # The client took the new assignment: meshbridge sent it and grpc ACKed it.
        # grpc swaps its picker just after the ACK, so a few RPCs may still go to
        # 127.0.0.3; a hundred in a row to 127.0.0.2 say the picker changed (with both
        # backends still held, that happens by chance one time in 2**100).
        async def acked() -> bool:
            eds = (await probe_stream()).types["eds"]
            return eds.last_sent_version != before \
                and eds.last_ack_version == eds.last_sent_version
        await eventually(acked, HANG, "an ACKed EDS response after the edit")

        async def only_two() -> tuple[bool, Any]:
            got = await probe.call(100)
            return got["backends"] == {"127.0.0.2": 100}, got
        await eventually_seen(only_two, HANG, "RPCs reaching only 127.0.0.2", period=0)
        # From then on every RPC reaches the backend that is left.
        assert await probe.call(100) == {"backends": {"127.0.0.2": 100}, "errors": {}}

        # One ADS stream carried all four types, named explicitly, each ACKed.
        stream = await probe_stream()
        assert stream.protocol == "xds-sotw"
        assert sorted(stream.types) == ["cds", "eds", "lds", "rds"]
        for state in stream.types.values():
            assert state.subscribed == (AUTHORITY,)
            assert state.last_ack_version == state.last_sent_version
            assert not state.last_nack_error
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
    for t in ("cds", "eds", "lds", "rds"):
        assert not await app.sample_value("pilot_total_xds_rejects_total", {"type": t})
