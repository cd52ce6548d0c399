"""One truth, seen from the xDS side: for every demo target, the ClusterLoadAssignment
and the Linkerd destination answer are rendered from one View at one version and name
the same endpoints with the same zone and identity, before and after a change.
(tests/integration/test_one_truth.py compares what real clients of both protocols
hold; this one pins the version they were both encoded from.)"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

from meshbridge.app import App
from testkit.polling import HANG, eventually_seen
from tests.conftest import AppFactory
from tests.integration.xds_helpers import DEMO, Manifests
from xds_api.service import XdsOptions

INSTANCE = "db-1.db.data.svc.cluster.local:5432"
CATALOG = "catalog.shop.svc.cluster.local:80"


def endpoints_page(app: App, authority: str) -> dict[str, Any]:
    url = f"http://127.0.0.1:{app.admin_port}/debug/endpoints?authority={authority}&format=json"
    with urllib.request.urlopen(url, timeout=HANG) as resp:
        page: dict[str, Any] = json.loads(resp.read())
    return page


async def same_truth(app: App, authority: str) -> dict[str, Any]:
    page = await asyncio.to_thread(endpoints_page, app, authority)
    xds, linkerd = page["protocols"]["xds"], page["protocols"]["linkerd"]
    assert page["agree"], (authority, page["differences"])
    # Both encoded from the View at the very version the page rendered.
    assert xds["message"]["view_version"] == linkerd["message"]["version"] == page["version"]
    assert set(xds["endpoints"]) == set(linkerd["endpoints"])
    for addr, fields in xds["endpoints"].items():
        theirs = linkerd["endpoints"][addr]
        assert (fields["zone"], fields["identity"]) == (theirs["zone"], theirs["identity"])
        assert fields["health"] == "HEALTHY"
    return page


def address(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


async def test_every_demo_target_is_one_truth_for_both_protocols(
        demo_dir: Path, make_app: AppFactory) -> None:
    # The identity an xDS client is told travels in the linkerd metadata profile.
    app: App = await make_app(demo_dir, layer_options=(XdsOptions(endpoint_metadata="linkerd"),))
    assert "linkerd" in app.renderers, "the Linkerd layer is mounted"
    for authority, expected in DEMO.items():
        page = await same_truth(app, authority)
        assert set(page["protocols"]["xds"]["endpoints"]) == {
            address(ip, port) for ip, port in expected}
    page = await same_truth(app, INSTANCE)
    assert list(page["protocols"]["xds"]["endpoints"]) == ["10.244.2.50:5432"]

    # After a change, both still agree, on the new endpoint set.
    Manifests(demo_dir).remove_endpoint("20-shop.yaml", "shop", "catalog-5m7kp", "10.244.2.21")

    async def moved() -> tuple[bool, Any]:
        page = await same_truth(app, CATALOG)
        eps = set(page["protocols"]["xds"]["endpoints"])
        return "10.244.2.21:8080" not in eps and len(eps) == 5, sorted(eps)
    await eventually_seen(moved, HANG, "catalog without 10.244.2.21 on both sides")
