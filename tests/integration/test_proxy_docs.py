"""docs/proxies/*.md walked through with real peers, using exactly the text on each page:
the blocks marked `<!-- test: NAME -->`, their `${PLACEHOLDERS}` filled as envsubst
would. Envoy runs the page's bootstrap against `meshbridge serve`; a grpcio client
uses the page's bootstrap and target; the Linkerd page's names are the ones
meshbridge presents, and its Helm and annotation YAML say what the page says."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from bridge.sources.files import FilesSource
from linkerd_api.ca import generate_issuer
from linkerd_api.identity import IdentityOptions
from meshbridge.app import App, ServeOptions
from meshbridge.cli import parse_args
from meshbridge.layers import protocol_layers
from testkit import polling
from testkit.envoy import envoy_binary
from testkit.linkerd import Stream
from testkit.net import free_port, http_text, ready
from testkit.polling import HANG, eventually_seen, eventually_sync
from testkit.processes import running
from tests.conftest import AppFactory
from tests.integration.test_linkerd_identity_tls import (
    certify_over,
    channel,
    served_certificate,
)
from tests.integration.test_xds_proxyless import PROBE, Probe, start_backends
from tests.integration.xds_helpers import Manifests, service_with_addresses

DOCS = Path(__file__).resolve().parents[2] / "docs" / "proxies"
PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def block(page: str, name: str) -> str:
    """The fenced block right after `<!-- test: name -->` on docs/proxies/<page>."""
    text = (DOCS / page).read_text()
    found = re.findall(rf"<!-- test: {re.escape(name)} -->\n```\w*\n(.*?)\n```", text,
                       re.DOTALL)
    assert len(found) == 1, f"{page}: {len(found)} blocks marked {name!r}"
    return str(found[0])


def envsubst(text: str, values: dict[str, str]) -> str:
    """envsubst's `${NAME}`, except that a name with no value is an error (envsubst
    would leave it empty, and the page would be missing a setting)."""
    missing = sorted(set(PLACEHOLDER.findall(text)) - set(values))
    assert not missing, f"placeholders without a value: {missing}"
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def exports(script: str) -> dict[str, str]:
    """The NAME=value words of the `export` commands in a shell block."""
    joined = script.replace("\\\n", " ")
    lines = [ln for ln in joined.splitlines() if ln.strip().startswith("export ")]
    return dict(w.split("=", 1) for ln in lines for w in shlex.split(ln)[1:])


def command(script: str, program: str) -> list[str]:
    """The arguments of the one `program ...` command in a shell block."""
    joined = script.replace("\\\n", " ")
    [line] = [ln for ln in joined.splitlines() if ln.strip().startswith(program + " ")]
    words = shlex.split(line.split("&")[0])
    return words[1:]


# ----------------------------------------------------------------------------- Envoy


@pytest.fixture
def meshbridge_serve() -> Iterator[tuple[int, int]]:
    """`meshbridge serve` as envoy.md starts it, on free loopback ports instead of
    the page's fixed ones: (gRPC port, admin port)."""
    args = command(block("envoy.md", "envoy-run"), "meshbridge")
    grpc_port, admin_port = free_port(), free_port()
    args[args.index("--listen") + 1] = f"127.0.0.1:{grpc_port}"
    args[args.index("--admin") + 1] = f"127.0.0.1:{admin_port}"
    assert args[:3] == ["serve", "--source", "demo"]
    with running([sys.executable, "-m", "meshbridge.cli", *args], lambda: ready(admin_port),
                 "meshbridge serve ready", stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"}):
        yield grpc_port, admin_port


def update_stats(admin: int) -> dict[str, int]:
    out = {}
    for line in http_text(f"http://127.0.0.1:{admin}/stats?filter=update_(success|rejected)"
                         ).splitlines():
        key, _, value = line.partition(": ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def web_hosts(admin: int, name: str) -> list[str]:
    data = json.loads(http_text(f"http://127.0.0.1:{admin}/clusters?format=json"))
    for status in data.get("cluster_statuses", []):
        if status["name"] == name:
            return [h["address"]["socket_address"]["address"]
                    for h in status.get("host_statuses", [])]
    return []


def envoy_bootstrap(values: dict[str, str], api_type: str = "GRPC") -> str:
    """The page's bootstrap, filled; DELTA_GRPC is the page's one-word variant."""
    text = block("envoy.md", "envoy-bootstrap")
    if api_type == "DELTA_GRPC":
        assert text.count("api_type: GRPC\n") == 1
        text = text.replace("api_type: GRPC\n", "api_type: DELTA_GRPC\n")
    return envsubst(text, values)


@contextlib.contextmanager
def outbound_envoy(grpc_port: int, workdir: Path) -> Iterator[int]:
    """The page's Envoy (its run block's settings) fed by meshbridge on `grpc_port`;
    yields the port of its outbound listener, where an app sends its requests."""
    values = exports(block("envoy.md", "envoy-run"))
    outbound = free_port()
    values.update(MESHBRIDGE_PORT=str(grpc_port), OUTBOUND_PORT=str(outbound),
                  ENVOY_ADMIN_PORT="0")
    with envoy(envoy_bootstrap(values), workdir):
        yield outbound


@contextlib.contextmanager
def envoy(bootstrap: str, workdir: Path) -> Iterator[int]:
    """A real Envoy on `bootstrap` (its admin port 0: --admin-address-path says which
    one it took); yields the admin port."""
    binary = envoy_binary()
    assert binary is not None
    config = workdir / "bootstrap.yaml"
    config.write_text(bootstrap)
    address, log = workdir / "admin-address", workdir / "envoy.log"
    def admin_written() -> bool:
        return address.exists() and bool(address.read_text().strip())

    with running([binary, "-c", config, "--admin-address-path", address,
                  "--disable-hot-restart", "--concurrency", "1", "--log-path", log,
                  "--drain-time-s", "0"], admin_written,
                 lambda: f"Envoy's admin; its log: {log.read_text()[-3000:]}",
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL):
        yield int(address.read_text().strip().rsplit(":", 1)[1])


WEB = "web.emojivoto.svc.cluster.local:80"


@pytest.mark.envoy
@pytest.mark.parametrize("api_type", ["GRPC", "DELTA_GRPC"])
def test_envoy_with_the_pages_bootstrap_gets_all_four_types_and_its_node_reaches_meshbridge(
        api_type: str, meshbridge_serve: tuple[int, int], tmp_path: Path) -> None:
    grpc_port, mesh_admin = meshbridge_serve
    values = exports(block("envoy.md", "envoy-run"))
    values.update(MESHBRIDGE_PORT=str(grpc_port), OUTBOUND_PORT=str(free_port()),
                  ENVOY_ADMIN_PORT="0")
    with envoy(envoy_bootstrap(values, api_type), tmp_path) as admin:
        def every_type_accepted() -> bool:
            stats = update_stats(admin)
            success = [k for k, v in stats.items() if k.endswith("update_success") and v]
            return (any(k.startswith("cluster_manager.cds.") for k in success)
                    and any(k.startswith("listener_manager.lds.") for k in success)
                    and any(k.startswith("http.outbound_web.rds.") for k in success)
                    # EDS: Envoy counts a cluster's updates under its stat name
                    and f"cluster.{WEB.replace(':', '_')}.update_success" in success
                    and bool(web_hosts(admin, WEB)))
        eventually_sync(every_type_accepted, HANG,
                        lambda: f"CDS, LDS, RDS and EDS accepted: {update_stats(admin)}")
        rejected = {k: v for k, v in update_stats(admin).items()
                    if k.endswith("update_rejected") and v}
        assert rejected == {}
        routes = json.loads(http_text(
            f"http://127.0.0.1:{admin}/config_dump?resource=dynamic_route_configs"))
        [route] = routes["configs"]
        assert route["route_config"]["name"] == WEB
        # web's ServiceProfile: the same 90/10 split a Linkerd proxy follows.
        clusters = route["route_config"]["virtual_hosts"][0]["routes"][0]["route"][
            "weighted_clusters"]["clusters"]
        assert [(c["name"], c["weight"]) for c in clusters] == [
            (WEB, 9000), (WEB.replace("web.", "web-canary."), 1000)]

        # The page's check: its /clusters grep finds the example line it shows.
        check = block("envoy.md", "envoy-check").splitlines()
        [grep] = [ln for ln in check if ln.startswith("curl -s localhost:15000/clusters")]
        pattern = shlex.split(grep.split("|", 1)[1])[-1]
        example = check[check.index(grep) + 1].removeprefix("#").split()[0]
        lines = http_text(f"http://127.0.0.1:{admin}/clusters").splitlines()
        assert example in lines and re.search(pattern, example)

        # meshbridge saw the node: its id, and NODE_NAME picked a node-aware View.
        node_id = f"{values['POD_NAME']}.{values['POD_NAMESPACE']}"
        streams = json.loads(http_text(f"http://127.0.0.1:{mesh_admin}/debug/streams"))
        assert node_id in json.dumps(streams)
        views = json.loads(http_text(f"http://127.0.0.1:{mesh_admin}/debug/views"))
        assert any(v["authority"] == WEB and v["filter"]["node"] == values["NODE_NAME"]
                   for v in views), views


async def start_http_backends(ips: tuple[str, ...]) -> tuple[list[asyncio.Server], int]:
    """One tiny HTTP/1.1 server per address, on one port; each answers with its IP."""
    for _ in range(10):
        servers: list[asyncio.Server] = []
        port = 0
        try:
            for ip in ips:
                async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                                 ip: str = ip) -> None:
                    # Envoy keeps the connection: answer each request on it until it goes.
                    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                        while await reader.readuntil(b"\r\n\r\n"):
                            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s"
                                         % (len(ip), ip.encode()))
                            await writer.drain()
                    writer.close()
                server = await asyncio.start_server(answer, ip, port)
                port = server.sockets[0].getsockname()[1]
                servers.append(server)
            return servers, port
        except OSError:
            for s in servers:
                s.close()
    raise RuntimeError(f"no port free on all of {ips}")


@pytest.mark.envoy
async def test_an_app_sending_to_the_pages_outbound_listener_reaches_the_services_endpoints(
        tmp_path: Path, make_app: AppFactory) -> None:
    # web.emojivoto port 80, its endpoints two real HTTP servers on loopback.
    ips = ("127.0.0.2", "127.0.0.3")
    servers, backend_port = await start_http_backends(ips)
    try:
        manifests = tmp_path / "manifests"
        manifests.mkdir()
        name, ns = WEB.split(".")[:2]
        Manifests(manifests).write("web.yaml", service_with_addresses(
            ns, name, 80, backend_port, [(ip, "zone-a") for ip in ips], port_name="http"))
        app: App = await make_app(manifests)
        with outbound_envoy(app.grpc_port, tmp_path) as outbound:
            seen: dict[str, int] = {}

            async def both() -> bool:
                try:  # what the page says the application does: plain HTTP to the port
                    who = await asyncio.to_thread(http_text, f"http://127.0.0.1:{outbound}/")
                except OSError:
                    return False
                seen[who] = seen.get(who, 0) + 1
                return set(seen) == set(ips)
            await polling.eventually(both, HANG, lambda: f"both endpoints answer: {seen}")
    finally:
        for s in servers:
            s.close()


# --------------------------------------------------------------------- proxyless gRPC


async def test_grpc_with_the_pages_bootstrap_and_target_reaches_the_services_backends(
        tmp_path: Path, make_app: AppFactory) -> None:
    target = re.findall(r'"(xds:///[^"]+)"', block("grpc.md", "grpc-client"))
    assert len(target) == 1
    authority = target[0].removeprefix("xds:///")
    name, ns = authority.split(".")[:2]
    port = int(authority.rsplit(":", 1)[1])
    servers, backend_port = await start_backends()
    try:
        # The page's service, its endpoints two real gRPC servers on loopback.
        manifests = tmp_path / "manifests"
        manifests.mkdir()
        Manifests(manifests).write("svc.yaml", service_with_addresses(
            ns, name, port, backend_port, [("127.0.0.2", "zone-a"), ("127.0.0.3", "zone-b")],
            app_protocol="grpc"))
        app: App = await make_app(manifests)
        values = exports(block("grpc.md", "grpc-run"))
        values["MESHBRIDGE_ADDR"] = f"127.0.0.1:{app.grpc_port}"
        bootstrap = tmp_path / "bootstrap.json"
        bootstrap.write_text(envsubst(block("grpc.md", "grpc-bootstrap"), values))
        env = {k: v for k, v in os.environ.items() if k != "GRPC_XDS_BOOTSTRAP_CONFIG"}
        env.update(GRPC_XDS_BOOTSTRAP=str(bootstrap), GRPC_VERBOSITY="ERROR")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(PROBE), target[0], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=env)
        probe = Probe(proc)
        try:
            async def both() -> tuple[bool, Any]:
                got = await probe.call(20)
                return set(got["backends"]) == {"127.0.0.2", "127.0.0.3"} \
                    and not got["errors"], got
            await eventually_seen(both, HANG, "RPCs reaching both backends", period=0)
            node_id = f"{values['POD_NAME']}.{values['POD_NAMESPACE']}"
            [stream] = [s for s in await app.stream_infos() if s.client == node_id]
            assert sorted(stream.types) == ["cds", "eds", "lds", "rds"]
            assert any(v.key.filter.node_name == values["NODE_NAME"]
                       for v in app.views.views())
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
    finally:
        for s in servers:
            await s.stop(None)


# ---------------------------------------------------------------------------- Linkerd


def env_list(text: str) -> dict[str, str]:
    entries = yaml.safe_load(text)
    return {e["name"]: e["value"] for e in entries}


def test_the_linkerd_pages_meshbridge_command_is_one_serve_accepts() -> None:
    words = command(block("linkerd.md", "linkerd-serve-beside"), "meshbridge")
    assert words[0] == "serve"
    args = parse_args(words, environ={})
    assert args.source == "kube" and args.tls_from_identity
    assert str(args.identity_issuer_cert).endswith("crt.pem")
    assert str(args.identity_trust_anchors).endswith("ca-bundle.crt")


def test_the_linkerd_pages_helm_values_and_annotation_set_the_addresses_it_says() -> None:
    meshbridge = "meshbridge.meshbridge.svc.cluster.local.:8086"
    beside = env_list(yaml.dump(yaml.safe_load(block("linkerd.md", "linkerd-helm-beside"))
                                ["proxy"]["additionalEnv"]))
    assert beside == {"LINKERD2_PROXY_DESTINATION_SVC_ADDR": meshbridge}
    alone = yaml.safe_load(block("linkerd.md", "linkerd-helm-alone"))["proxy"]["additionalEnv"]
    assert {e["name"]: e["value"] for e in alone} == {
        f"LINKERD2_PROXY_{api}_SVC_ADDR": meshbridge
        for api in ("DESTINATION", "POLICY", "IDENTITY")}
    annotations = yaml.safe_load(block("linkerd.md", "linkerd-annotation-beside"))[
        "metadata"]["annotations"]
    assert list(annotations) == ["config.linkerd.io/proxy-additional-env"]
    assert json.loads(annotations["config.linkerd.io/proxy-additional-env"]) == [
        {"name": "LINKERD2_PROXY_DESTINATION_SVC_ADDR", "value": meshbridge}]


async def test_meshbridge_presents_the_names_the_linkerd_page_says_proxies_expect(
        demo_dir: Path, tmp_path: Path) -> None:
    expected = env_list(block("linkerd.md", "linkerd-expected"))
    destination = expected["LINKERD2_PROXY_DESTINATION_SVC_NAME"]
    identity = expected["LINKERD2_PROXY_IDENTITY_SVC_NAME"]
    assert expected["LINKERD2_PROXY_POLICY_SVC_NAME"] == destination
    # Layout 1: issued from Linkerd's own issuer, as the page's command loads it.
    issuer = generate_issuer("cluster.local")
    cert, key, anchors = (tmp_path / n for n in ("crt.pem", "key.pem", "ca-bundle.crt"))
    cert.write_bytes(issuer.certificate.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(issuer.key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    anchors.write_bytes(issuer.trust_anchors_pem())
    tokens = tmp_path / "tokens"
    tokens.write_text("web-token emojivoto/web\n")
    options = ServeOptions("127.0.0.1:0", "127.0.0.1:0", layer_options=(IdentityOptions(
        issuer_cert=cert, issuer_key=key, trust_anchors=anchors, tokens=tokens,
        tls_from_identity=True),))
    app = App(FilesSource(demo_dir, poll_interval=0.05), options=options,
              layers=protocol_layers())
    await app.start()
    try:
        for name in (destination, identity):
            served = await served_certificate(app.grpc_port, anchors, name)
            assert served.extensions.get_extension_for_class(
                x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName) == [name]
        async with channel(app.grpc_port, anchors, destination) as ch:
            update = await Stream(ch, "Get", "web.emojivoto.svc.cluster.local:80").next()
            assert update.HasField("add")
        async with channel(app.grpc_port, anchors, identity) as ch:
            response = await certify_over(ch, ec.generate_private_key(ec.SECP256R1()))
            assert response.leaf_certificate
        # A name the page does not give is refused: the check is real.
        with pytest.raises(grpc.aio.AioRpcError):
            async with channel(app.grpc_port, anchors, "linkerd-dst.linkerd.svc") as ch:
                await Stream(ch, "Get", "web.emojivoto.svc.cluster.local:80").next()
    finally:
        await app.stop(0.2)
