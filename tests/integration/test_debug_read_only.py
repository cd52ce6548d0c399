"""Debug pages are read-only: reading /debug/endpoints, for a watched target or one
nobody watches, moves no client's version, no metric and no subscriber count."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from meshbridge.app import App
from testkit.polling import HANG, eventually_seen
from tests.conftest import AppFactory
from tests.integration.test_xds_api import EDS, WEB, read, request
from tests.integration.xds_helpers import Manifests

EMOJI = "emoji.emojivoto.svc.cluster.local:8080"
# What moves while the process runs, whatever it serves: its own resources, and the
# issuer certificate's remaining lifetime (a clock).
_MOVES_BY_ITSELF = ("process_", "python_", "issuer_cert_ttl_seconds")


def _get(app: App, path: str) -> str:
    url = f"http://127.0.0.1:{app.admin_port}{path}"
    with urllib.request.urlopen(url, timeout=HANG) as resp:
        body: bytes = resp.read()
    return body.decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        if not family.name.startswith(_MOVES_BY_ITSELF)
        for s in family.samples
    }


def _count(changes: str) -> int:
    return int(changes.rsplit("-", 1)[1])  # a type's `<process id>-<count>` of encodings


async def test_debug_reads_move_no_client_version_metric_or_subscriber(
        demo_dir: Path, make_app: AppFactory) -> None:
    app: App = await make_app(demo_dir)

    async def page(path: str) -> str:
        return await asyncio.to_thread(_get, app, path)

    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
        call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(ch).StreamAggregatedResources()
        await call.write(request(EDS, [WEB], node={"id": "reader"}))
        first = await read(call)
        await call.write(request(EDS, [WEB], version_info=first.version_info,
                                 response_nonce=first.nonce))

        async def synced() -> tuple[bool, Any]:
            rows = json.loads(await page("/debug/syncz"))
            mine = [r for r in rows if r["client"] == "reader"]
            eds = mine[0]["types"]["eds"] if mine else {}
            return eds.get("acked") == eds.get("sent") == first.version_info, rows
        await eventually_seen(synced, HANG, "the client's ACK on /debug/syncz")

        views = json.loads(await page("/debug/views"))
        metrics = _samples(await page("/metrics"))
        xds = app.service("xds").cache
        eds_changes = xds.version(EDS)  # how often EDS was encoded, in this process
        for path in (f"/debug/endpoints?authority={WEB}&format=json",  # watched
                     f"/debug/endpoints?authority={WEB}",
                     f"/debug/endpoints?authority={WEB}&node=node-b&format=json",  # not
                     f"/debug/endpoints?authority={EMOJI}&format=json"):  # nobody watches
            body = await page(path)
            assert "10.244" in body  # each read did render endpoints
        assert json.loads(await page("/debug/views")) == views
        assert _samples(await page("/metrics")) == metrics
        assert xds.version(EDS) == eds_changes
        ok, rows = await synced()
        assert ok, rows  # the client holds, and was last sent, what it had

        # A real change is encoded once, and reaches the client as its next response.
        Manifests(demo_dir).remove_endpoint("10-emojivoto.yaml", "emojivoto", "web-7xk9q",
                                            "10.244.1.10")
        pushed = await read(call)
        assert pushed.version_info != first.version_info
        assert _count(xds.version(EDS)) == _count(eds_changes) + 1
        call.cancel()
