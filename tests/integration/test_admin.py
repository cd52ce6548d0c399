"""The admin port's debug pages, over real HTTP."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bridge.model import FilterKey, ServiceKey, ViewKey
from bridge.views import View, ViewChange
from meshbridge.app import App
from meshbridge.debug_access import DebugAccess
from testkit.polling import HANG, eventually


class Sink:
    def on_view_change(self, view: View, change: ViewChange) -> None:
        pass


def fetch(app: App, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{app.admin_port}{path}", timeout=HANG) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()


async def get(app: App, path: str) -> tuple[int, str]:
    return await asyncio.to_thread(fetch, app, path)


async def test_debug_views_lists_each_view_with_its_subscribers(
    make_app: Any, demo_dir: Path
) -> None:
    app = await make_app(demo_dir)
    key = ViewKey(ServiceKey("shop", "catalog"), 80, FilterKey(node_name="node-a"))
    app.views.subscribe(key, Sink(), "linkerd")
    status, body = await get(app, "/debug/views")
    assert status == 200
    (entry,) = [v for v in json.loads(body) if v["service"] == "catalog"]
    assert entry["authority"] == "catalog.shop.svc.cluster.local:80"
    assert entry["filter"]["node"] == "node-a"
    assert entry["endpoints"] == {"ready": 2, "draining": 0}  # hinted for zone-a
    assert entry["subscribers"] == {"linkerd": 1}


async def test_debug_pages_reject_bad_requests_with_one_line(
    make_app: Any, demo_dir: Path
) -> None:
    app = await make_app(demo_dir)
    cases = {
        "/debug/views?x=1": 400,
        "/debug/streams?verbose=1": 400,
        "/debug/endpoints": 400,
        "/debug/endpoints?authority=web": 400,
        "/debug/endpoints?authority=web.emojivoto.svc.cluster.local:80&bogus=1": 400,
        "/debug/endpoints?authority=nope.emojivoto.svc.cluster.local:80": 404,
        "/debug/endpoints?authority=web.emojivoto.svc.cluster.local:80&format=xml": 400,
        "/debug/nothing": 404,
    }
    for path, expected in cases.items():
        status, body = await get(app, path)
        assert status == expected, path
        assert body.count("\n") == 1 and "Traceback" not in body, body


async def test_debug_pages_follow_debug_access_and_the_probes_do_not(
    make_app: Any, demo_dir: Path
) -> None:
    app = await make_app(demo_dir, debug_access=DebugAccess("off"))
    for path in ("/", "/debug/views", "/debug/streams", "/debug/syncz",
                 "/debug/endpoints?authority=web.emojivoto.svc.cluster.local:80"):
        status, body = await get(app, path)
        assert (status, body) == (403, "debug answers are off (--debug-access off)\n"), path
    for path in ("/metrics", "/ready", "/live"):
        assert (await get(app, path))[0] == 200, path


async def test_debug_endpoints_shows_the_target_and_an_index_page_links_services(
    make_app: Any, demo_dir: Path
) -> None:
    app = await make_app(demo_dir)
    status, body = await get(
        app, "/debug/endpoints?authority=web.emojivoto.svc.cluster.local:80&format=json")
    assert status == 200
    doc = json.loads(body)
    assert doc["agree"] is True and doc["version"] >= 1
    assert set(doc["protocols"]) == set(app.renderers)
    assert doc["view"]["endpoints"]["10.244.3.10:8080"]["state"] == "draining"
    assert doc["published"].endswith("Z")
    status, page = await get(app, "/")
    assert status == 200
    assert "catalog.shop.svc.cluster.local:80" in page and "<table id=\"services\">" in page


async def test_debug_endpoints_is_html_unless_json_is_asked_for(
    make_app: Any, demo_dir: Path
) -> None:
    app = await make_app(demo_dir)
    url = f"http://127.0.0.1:{app.admin_port}/debug/endpoints?authority=web.emojivoto.svc.cluster.local:80"

    def fetch_as(accept: str) -> tuple[str, bytes]:
        req = urllib.request.Request(url, headers={"Accept": accept})
        with urllib.request.urlopen(req, timeout=HANG) as r:
            return r.headers["Content-Type"], r.read()

    kind, body = await asyncio.to_thread(fetch_as, "text/html,*/*")
    assert kind.startswith("text/html") and b'<table id="endpoints">' in body
    kind, body = await asyncio.to_thread(fetch_as, "application/json")
    assert kind == "application/json" and json.loads(body)["agree"] is True


async def test_ready_says_why_while_the_manifest_folder_is_empty_and_recovers(
    make_app: Any, demo_dir: Path, tmp_path: Path
) -> None:
    app = await make_app(demo_dir)
    assert (await get(app, "/ready"))[0] == 200
    aside = tmp_path / "aside"
    demo_dir.rename(aside)  # the folder disappears, then comes back empty
    await eventually(lambda: app.source.stale, why="the source did not notice")
    status, body = await get(app, "/ready")
    assert status == 503 and f"folder {demo_dir} is missing" in body, body
    demo_dir.mkdir()
    await eventually(lambda: app.source.stale_reason == f"folder {demo_dir} holds no manifests")
    assert (await get(app, "/ready"))[0] == 503
    # The last state is still served meanwhile.
    status, _ = await get(app, "/debug/endpoints?authority=web.emojivoto.svc.cluster.local:80")
    assert status == 200
    for manifest in aside.iterdir():
        manifest.rename(demo_dir / manifest.name)

    async def ready() -> bool:
        return (await get(app, "/ready"))[0] == 200

    await eventually(ready, why="/ready stayed 503 after the manifests returned")
