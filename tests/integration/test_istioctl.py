"""A real istioctl (built from the same istio.io/istio version as the tests' istiod,
scripts/istioctl.sh) pointed at meshbridge's gRPC port, as an Istio user points it at
istiod: `proxy-status` lists a real Envoy, a proxyless gRPC client and a Linkerd
stream with their per-type sync state; `proxy-status POD --file` compares Envoy's own
config dump with what meshbridge says it sent; `proxy-config` reads what meshbridge
gives of one proxy; over plaintext and over mTLS, and refused where debug answers are
not served."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

from bridge.sources.files import FilesSource
from linkerd_api.proto import destination_pb2 as dst
from meshbridge.app import App, TlsFiles
from meshbridge.debug_access import DebugAccess
from testkit import kubeapi
from testkit.envoy import Envoy, envoy_binary
from testkit.kubeapi import KubeAPIServer
from testkit.polling import HANG, eventually
from testkit.serving import loopback_app
from tests.conftest import AppFactory
from tests.integration.test_grpc_port import _cert, _key_pem, _pem
from tests.integration.test_xds_proxyless import Probe, start_backends, start_probe
from tests.integration.xds_helpers import Manifests, service_with_addresses
from xds_api import resource_types as rt

kube_apiserver = kubeapi.kube_apiserver  # the shared session fixture

REPO = Path(__file__).resolve().parents[2]
ECHO = "echo.xdstest.svc.cluster.local:50051"
ENVOY_ID = "sidecar~127.0.0.1~envoy-1.xdstest~xdstest.svc.cluster.local"
GRPC_ID = "sidecar~127.0.0.1~grpc-1.xdstest~xdstest.svc.cluster.local"
WAIT = HANG


@pytest.fixture(scope="module")
def istioctl() -> str:
    """istioctl, built from the Go module proxy once (scripts/istioctl.sh) and cached."""
    out = subprocess.run(["bash", str(REPO / "scripts" / "istioctl.sh")], capture_output=True,
                         text=True, timeout=5400, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr[-4000:]
    return out.stdout.strip().splitlines()[-1]


@pytest.fixture
def kubeconfig(kube_apiserver: KubeAPIServer) -> Path:
    """istioctl starts a Kubernetes client (and waits for its API server) before it
    looks at --xds-address, which it then uses alone: the tests' kube-apiserver."""
    return kube_apiserver.kubeconfig_path


def run(istioctl: str, kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([istioctl, "--kubeconfig", str(kubeconfig), *args],
                          capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def meshbridge(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshbridge", *args],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


@pytest.fixture
async def world(tmp_path: Path, make_app: AppFactory) -> AsyncIterator[dict[str, Any]]:
    """meshbridge with the echo service, and connected to it: a real Envoy, a
    proxyless gRPC client that has made calls, and a Linkerd Get stream."""
    servers, port = await start_backends()
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    Manifests(manifests).write("echo.yaml", service_with_addresses(
        "xdstest", "echo", 50051, port, [("127.0.0.2", "zone-a"), ("127.0.0.3", "zone-b")],
        app_protocol="grpc"))
    app: App = await make_app(manifests)
    binary = envoy_binary()
    assert binary is not None
    envoy = Envoy(binary, tmp_path / "envoy", app.grpc_port, node_id=ENVOY_ID,
                  metadata={"NAMESPACE": "xdstest"})
    proc = await start_probe(app.grpc_port, node_id=GRPC_ID, authority=ECHO)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}")
    get = channel.unary_stream("/io.linkerd.proxy.destination.Destination/Get",
                               request_serializer=dst.GetDestination.SerializeToString,
                               response_deserializer=dst.Update.FromString)(
        dst.GetDestination(scheme="k8s", path=ECHO,
                           context_token='{"ns":"xdstest","pod":"linkerd-1"}'))
    try:
        await envoy.start()
        assert (await Probe(proc).call(5))["errors"] == {}
        await get.read()

        async def all_acked() -> bool:
            states = {(s.client, t): st.last_ack_version == st.last_sent_version != ""
                      for s in await app.stream_infos() for t, st in s.types.items()}
            return all(states.get((ENVOY_ID, t)) for t in ("cds", "lds", "eds")) and all(
                states.get((GRPC_ID, t)) for t in ("cds", "eds", "lds", "rds"))
        await eventually(all_acked, WAIT, "Envoy and the gRPC client ACK what they hold")
        yield {"app": app, "envoy": envoy}
    finally:
        get.cancel()
        await channel.close()
        await envoy.stop()
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        for s in servers:
            await s.stop(None)


def _rows(table: str) -> dict[str, list[str]]:
    """istioctl's table, by proxy name: its columns."""
    lines = table.strip().splitlines()
    return {line.split()[0]: line.split() for line in lines[1:]}


async def test_proxy_status_lists_an_envoy_and_a_grpc_client_with_their_sync_state(
        istioctl: str, kubeconfig: Path, world: dict[str, Any]) -> None:
    app: App = world["app"]
    xds = ["--xds-address", f"127.0.0.1:{app.grpc_port}", "--plaintext"]
    out = await asyncio.to_thread(run, istioctl, kubeconfig, "proxy-status", *xds)
    assert out.returncode == 0, out.stderr
    rows = _rows(out.stdout)
    # Envoy's bootstrap subscribes CDS and LDS (wildcard) and EDS for its clusters.
    assert rows[ENVOY_ID][-2:] == ["3", "(CDS,LDS,EDS)"], out.stdout
    assert rows[GRPC_ID][-2:] == ["4", "(CDS,LDS,EDS,RDS)"], out.stdout
    linkerd = f"linkerd-get~linkerd-1.xdstest~{ECHO}"
    assert linkerd in rows, out.stdout
    assert rows[ENVOY_ID][1] == "Kubernetes"  # the CLUSTER column

    # One column per type (-v 1): each type SYNCED, with how long ago it was sent.
    out = await asyncio.to_thread(run, istioctl, kubeconfig, "proxy-status", "-v", "1", *xds)
    assert out.returncode == 0, out.stderr
    header, *lines = out.stdout.strip().splitlines()
    columns = {name: header.index(name) for name in ("CDS", "LDS", "EDS", "RDS")}

    def cell(line: str, name: str) -> str:
        return line[columns[name]:].split()[0]
    envoy_line = next(line for line in lines if line.startswith(ENVOY_ID))
    assert [cell(envoy_line, t) for t in ("CDS", "LDS", "EDS", "RDS")] == [
        "SYNCED", "SYNCED", "SYNCED", "IGNORED"], out.stdout
    grpc_line = next(line for line in lines if line.startswith(GRPC_ID))
    assert [cell(grpc_line, t) for t in ("CDS", "LDS", "EDS", "RDS")] == ["SYNCED"] * 4, \
        out.stdout

    # The JSON form is the syncz answer itself.
    out = await asyncio.to_thread(run, istioctl, kubeconfig, "proxy-status", "-o", "json",
                                  *xds)
    assert out.returncode == 0, out.stderr
    resources = json.loads(out.stdout)["resources"]
    ids = {r["node"]["id"] for r in resources}
    assert {ENVOY_ID, GRPC_ID, linkerd} <= ids


async def test_proxy_status_of_one_proxy_compares_envoy_s_dump_with_meshbridge_s(
        istioctl: str, kubeconfig: Path, world: dict[str, Any], tmp_path: Path) -> None:
    app: App = world["app"]
    envoy: Envoy = world["envoy"]
    dump = tmp_path / "envoy-dump.json"
    dump.write_text(await envoy.get("/config_dump"))
    out = await asyncio.to_thread(
        run, istioctl, kubeconfig, "proxy-status", "envoy-1.xdstest", "--file", str(dump),
        "--xds-address", f"127.0.0.1:{app.grpc_port}", "--plaintext")
    assert "Clusters Match" in out.stdout and "Listeners Match" in out.stdout, out.stdout
    # An Envoy with no route configuration has no routes section in its dump, and
    # istioctl stops there; anything else is a failure.
    assert out.returncode == 0 or (
        "no configuration type type.googleapis.com/envoy.admin.v3.RoutesConfigDump"
        in out.stderr and "RoutesConfigDump" not in dump.read_text()), out.stderr


async def test_proxy_config_reads_what_meshbridge_gives_of_one_proxy(
        istioctl: str, kubeconfig: Path, world: dict[str, Any], tmp_path: Path) -> None:
    app: App = world["app"]
    server = ["--server", f"127.0.0.1:{app.grpc_port}"]
    files = {}
    for proxy, form in (("envoy-1.xdstest", "--config-dump"), ("grpc-1.xdstest", "--config-dump"),
                        ("envoy-1.xdstest", "--endpoints")):
        out = await asyncio.to_thread(meshbridge, "status", proxy, form, *server)
        assert out.returncode == 0, out.stderr
        path = tmp_path / f"{proxy}{form}.json"
        path.write_text(out.stdout)
        files[(proxy, form)] = path

    def pc(what: str, path: Path, *flags: str) -> str:
        out = run(istioctl, kubeconfig, "proxy-config", what, "--file", str(path), *flags)
        assert out.returncode == 0, out.stderr
        return out.stdout

    clusters = await asyncio.to_thread(pc, "clusters", files[("envoy-1.xdstest",
                                                              "--config-dump")])
    assert "echo.xdstest.svc.cluster.local" in clusters and "50051" in clusters, clusters
    endpoints = await asyncio.to_thread(pc, "endpoints", files[("envoy-1.xdstest",
                                                                "--endpoints")])
    assert all(f"{ip}:" in endpoints for ip in ("127.0.0.2", "127.0.0.3")), endpoints
    assert endpoints.count("HEALTHY") >= 2, endpoints
    # A proxyless client's listener is an API listener (no address): the summary table
    # lists only socket listeners, so it is looked for in the JSON form.
    listeners = await asyncio.to_thread(pc, "listeners", files[("grpc-1.xdstest",
                                                                "--config-dump")], "-o", "json")
    assert [listener["name"] for listener in json.loads(listeners)] == [ECHO], listeners
    routes = await asyncio.to_thread(pc, "routes", files[("grpc-1.xdstest", "--config-dump")])
    assert ECHO in routes or "echo.xdstest" in routes, routes


# ---------------------------------------------------------------------- TLS


async def test_proxy_status_over_mtls_and_refused_where_debug_answers_are_not_served(
        istioctl: str, kubeconfig: Path, tmp_path: Path, demo_dir: Path) -> None:
    ca, ca_key = _cert("test-ca", None, ca=True)
    server, server_key = _cert("localhost", (ca.subject, ca_key))  # for the name localhost
    client, client_key = _cert("istioctl", (ca.subject, ca_key))
    certs = tmp_path / "certs"  # istioctl's --cert-dir layout
    certs.mkdir()
    (certs / "root-cert.pem").write_bytes(_pem(ca))
    (certs / "cert-chain.pem").write_bytes(_pem(client))
    (certs / "key.pem").write_bytes(_key_pem(client_key))
    (tmp_path / "server.pem").write_bytes(_pem(server))
    (tmp_path / "server-key.pem").write_bytes(_key_pem(server_key))

    async def serve(access: str) -> App:
        app = loopback_app(
            FilesSource(demo_dir, poll_interval=0.05),
            tls=TlsFiles(str(tmp_path / "server.pem"), str(tmp_path / "server-key.pem"),
                         str(certs / "root-cert.pem")),
            debug_access=DebugAccess(access, client_ca=True))
        await app.start()
        return app

    app = await serve("local")
    creds = grpc.ssl_channel_credentials((certs / "root-cert.pem").read_bytes(),
                                         (certs / "key.pem").read_bytes(),
                                         (certs / "cert-chain.pem").read_bytes())
    channel = grpc.aio.secure_channel(f"localhost:{app.grpc_port}", creds)
    ads = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).StreamAggregatedResources()
    try:
        request = discovery_pb2.DiscoveryRequest(
            type_url=rt.CLUSTER, resource_names=["web.emojivoto.svc.cluster.local:80"])
        request.node.id = ENVOY_ID
        await ads.write(request)
        resp = await ads.read()
        await ads.write(discovery_pb2.DiscoveryRequest(
            type_url=rt.CLUSTER, resource_names=list(request.resource_names),
            version_info=resp.version_info, response_nonce=resp.nonce))
        tls = ["--xds-address", f"127.0.0.1:{app.grpc_port}", "--cert-dir", str(certs),
               "--authority", "localhost"]

        async def listed() -> bool:
            out = await asyncio.to_thread(run, istioctl, kubeconfig, "proxy-status", "-v",
                                          "1", *tls)
            return out.returncode == 0 and any(
                line.startswith(ENVOY_ID) and "SYNCED" in line
                for line in out.stdout.splitlines())
        await eventually(listed, WAIT, "istioctl over mTLS lists the client as SYNCED")
    finally:
        ads.cancel()
        await channel.close()
        await app.stop(0.1)

    # Debug answers off: istioctl is told at once, naming the type, and does not wait.
    app = await serve("off")
    try:
        out = await asyncio.to_thread(run, istioctl, kubeconfig, "proxy-status",
                                      "--xds-address", f"127.0.0.1:{app.grpc_port}",
                                      "--cert-dir", str(certs), "--authority", "localhost",
                                      "--timeout", "60s")
        assert out.returncode != 0
        assert "PermissionDenied" in out.stderr and "istio.io/debug/syncz" in out.stderr, \
            out.stderr
    finally:
        await app.stop(0.1)
