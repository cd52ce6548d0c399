"""The admin index page as a person sees it: loaded by headless Chromium."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]


def dump_dom(url: str, profile: Path) -> str:
    chromium = shutil.which("chromium")
    assert chromium is not None, "chromium is installed by `make test` (make chromium)"
    out = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
        capture_output=True, text=True, timeout=60, check=True)
    return out.stdout


async def test_the_index_page_lists_the_demo_services_in_a_real_browser(
    make_app: Any, demo_dir: Path, tmp_path: Path
) -> None:
    app = await make_app(demo_dir)
    dom = await asyncio.to_thread(dump_dom, f"http://127.0.0.1:{app.admin_port}/",
                                  tmp_path / "profile")
    assert "<h1>meshbridge</h1>" in dom
    for authority in ("catalog.shop.svc.cluster.local:80", "db.data.svc.cluster.local:5432",
                      "web.emojivoto.svc.cluster.local:80"):
        assert authority in dom
    assert 'href="/debug/views"' in dom and 'href="/debug/streams"' in dom
