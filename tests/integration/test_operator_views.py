"""What an operator sees of a node-aware Linkerd client and an xDS client: the admin
page's tables (in headless Chromium), /debug/syncz, and `meshbridge status`."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

from linkerd_api.proto import destination_pb2 as dst
from meshbridge.app import App
from testkit.polling import HANG, eventually
from tests.conftest import AppFactory
from tests.integration.test_admin_browser import dump_dom
from xds_api import resource_types as rt
from xds_api.service import XdsOptions

WEB = "web.emojivoto.svc.cluster.local:80"
TOKEN = '{"ns":"emojivoto","nodeName":"node-a"}'


def fetch(app: App, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{app.admin_port}{path}", timeout=HANG) as r:
        return str(r.read().decode())


async def clients(app: App) -> AsyncIterator[None]:
    """A Linkerd Get that names its node, and an xDS client that ACKs."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
        get = ch.unary_stream("/io.linkerd.proxy.destination.Destination/Get",
                              request_serializer=dst.GetDestination.SerializeToString,
                              response_deserializer=dst.Update.FromString)(
            dst.GetDestination(scheme="k8s", path=WEB, context_token=TOKEN))
        await get.read()
        ads = ads_pb2_grpc.AggregatedDiscoveryServiceStub(ch).StreamAggregatedResources()
        first = discovery_pb2.DiscoveryRequest(type_url=rt.ENDPOINT, resource_names=[WEB])
        first.node.id = "sidecar~10.0.0.9~envoy-1.emojivoto~emojivoto.svc.cluster.local"
        await ads.write(first)
        resp = await ads.read()
        await ads.write(discovery_pb2.DiscoveryRequest(
            type_url=rt.ENDPOINT, resource_names=[WEB], version_info=resp.version_info,
            response_nonce=resp.nonce))
        try:
            yield
        finally:
            get.cancel()
            ads.cancel()


async def synced(app: App) -> bool:
    syncz = json.loads(await asyncio.to_thread(fetch, app, "/debug/syncz"))
    states = {(s["protocol"], t["state"]) for s in syncz for t in s["types"].values()}
    return {("linkerd-get", "SENT"), ("xds-sotw", "SYNCED")} <= states


async def test_syncz_the_page_and_status_show_both_clients_and_their_sync_state(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path) -> None:
    app: App = await make_app(demo_dir)
    async for _ in clients(app):
        await eventually(lambda: synced(app), HANG, "both clients on /debug/syncz")
        syncz = json.loads(await asyncio.to_thread(fetch, app, "/debug/syncz"))
        (xds,) = [s for s in syncz if s["protocol"] == "xds-sotw"]
        eds = xds["types"]["eds"]
        assert eds["sent"] and eds["acked"] == eds["sent"] and eds["subscribed"] == [WEB]
        assert xds["started"].endswith("Z") and "T" in xds["started"]  # a human timestamp
        (get,) = [s for s in syncz if s["protocol"] == "linkerd-get"]
        assert get["client"] == TOKEN and get["types"][WEB]["acked"] is None

        dom = await asyncio.to_thread(dump_dom, f"http://127.0.0.1:{app.admin_port}/",
                                      tmp_path / "profile")
        # The web port's row counts both clients, the node-aware Linkerd one included.
        row = next(r for r in dom.split("<tr>") if f">{WEB}</a>" in r)
        assert "linkerd 1" in row and "xds-sotw 1" in row, row
        cells = [c.split("</td>")[0] for c in row.split("<td>")[1:]]
        assert cells[4] == "2" and cells[6] != "-"  # ready endpoints, a View version
        assert "SYNCED" in dom and "SENT" in dom and "<th>ACKed</th>" in dom

        # The same table from the gRPC port (istio.io/debug/syncz) and the admin port.
        for where in (["--server", f"127.0.0.1:{app.grpc_port}"],
                      ["--admin", f"127.0.0.1:{app.admin_port}"]):
            out = await asyncio.to_thread(status, *where)
            assert out.returncode == 0, out.stderr
            lines = out.stdout.splitlines()
            assert lines[0].split() == ["ID", "PROTOCOL", "CLIENT", "PEER", "TYPE/TARGET",
                                        "SENT", "ACKED", "STATE", "BEHIND"]
            assert any("xds-sotw" in line and "eds" in line and "SYNCED" in line
                       for line in lines), (where, lines)
            assert any("linkerd-get" in line and WEB in line and "SENT" in line
                       for line in lines), (where, lines)
            # The status client itself is no proxy: only the two clients are listed.
            assert len(lines) == 3, (where, lines)

        # Each address where the other is expected: one line naming what answered.
        out = await asyncio.to_thread(status, "--server", f"127.0.0.1:{app.admin_port}")
        assert out.returncode == 1 and out.stdout == ""
        assert out.stderr.count("\n") == 1 and "HTTP/1.1 server answered" in out.stderr \
            and "--admin" in out.stderr, out.stderr
        out = await asyncio.to_thread(status, "--admin", f"127.0.0.1:{app.grpc_port}")
        assert out.returncode == 1 and out.stdout == ""
        assert out.stderr.count("\n") == 1 and "HTTP/2 server (gRPC) answered" in out.stderr \
            and "--server" in out.stderr, out.stderr


def status(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshbridge", "status", *args,
                           "--timeout", "60"], capture_output=True, text=True,
                          timeout=2 * HANG)


@pytest.mark.parametrize("flag", ["--server", "--admin"])
def test_status_without_a_server_is_one_line_and_exit_1(flag: str) -> None:
    out = subprocess.run([sys.executable, "-m", "meshbridge", "status", flag,
                          "127.0.0.1:1", "--timeout", "2"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 1 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and "127.0.0.1:1" in out.stderr
    assert "connection refused" in out.stderr


def endpoints_table(dom: str) -> str:
    """The page's endpoints table alone: the port's routes follow in a table of their
    own, whose rows highlight where client kinds are told different routes."""
    return dom.split('<table id="endpoints">', 1)[1].split("</table>", 1)[0]


async def test_endpoints_page_puts_the_view_and_both_protocols_side_by_side_in_a_browser(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path) -> None:
    # With DRAINING on, xDS sends the terminating web pod that Linkerd leaves out: the
    # one real difference between the protocols the demo has, and it must stand out.
    app: App = await make_app(demo_dir, layer_options=(XdsOptions(draining=True),))
    dom = await asyncio.to_thread(
        dump_dom, f"http://127.0.0.1:{app.admin_port}/debug/endpoints?authority={WEB}",
        tmp_path / "profile")
    assert "<th>core View</th><th>Linkerd Get stream</th><th>xDS ClusterLoadAssignment</th>" \
        in dom
    endpoints = endpoints_table(dom)
    assert '<table id="routes">' in dom.split('<table id="endpoints">', 1)[1]
    rows = {r.split("</td>")[0]: r for r in endpoints.split('<tr class="')[1:]
            for r in [r.split("<td>", 1)[1]] if "</td>" in r}
    assert set(rows) == {"10.244.1.10:8080", "10.244.2.10:8080", "10.244.3.10:8080"}
    ready = endpoints.split('<tr class="')[1:]
    kinds = {r.split("<td>", 1)[1].split("</td>")[0]: r.split('"', 1)[0] for r in ready}
    assert kinds == {"10.244.1.10:8080": "same", "10.244.2.10:8080": "same",
                     "10.244.3.10:8080": "differ"}
    draining = rows["10.244.3.10:8080"]
    assert "state <b>draining</b>" in draining and "health <b>DRAINING</b>" in draining
    assert '<td class="absent">absent</td>' in draining  # Linkerd's cell
    assert "the holders differ" in dom
    published = dom.split('<span id="published">', 1)[1].split("<", 1)[0]
    assert published.endswith("Z") and "T" in published, published


async def test_endpoints_page_of_agreeing_protocols_says_so(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path) -> None:
    app: App = await make_app(demo_dir)
    dom = await asyncio.to_thread(
        dump_dom, f"http://127.0.0.1:{app.admin_port}/debug/endpoints?authority={WEB}",
        tmp_path / "profile")
    endpoints = endpoints_table(dom)
    assert '<b id="verdict">every holder agrees</b>' in dom
    assert 'class="differ"' not in endpoints
    # The terminating pod is in the View, and neither protocol announces it.
    assert endpoints.count('<td class="omitted">not announced</td>') == 2
