"""A proxy's policy watches are listed on /debug/streams, next to the Get they lead
to, and leave the list when the proxy drops them (a by-hand run with a real
linkerd2-proxy, docs/linkerd-proxy.md, found them missing there)."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

from meshbridge.app import App
from testkit.linkerd import channel_to
from testkit.linkerd_policy import CLIENT, watch_addr, watch_port
from testkit.polling import HANG, eventually

AppFactory = Any


def streams(app: App) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{app.admin_port}/debug/streams",
                                timeout=HANG) as r:
        listed: list[dict[str, Any]] = json.loads(r.read())
        return listed


async def policy_streams(app: App) -> list[dict[str, Any]]:
    return [s for s in await asyncio.to_thread(streams, app)
            if s["protocol"].startswith("linkerd-") and "policy" in s["protocol"]]


async def test_outbound_and_inbound_policy_watches_are_listed_while_open(
    make_app: AppFactory, demo_dir: Path
) -> None:
    app = await make_app(demo_dir)
    async with channel_to(app) as ch:
        outbound = watch_addr(ch, "10.96.20.10", 80)
        inbound = watch_port(ch, CLIENT, 8080)
        await outbound.next()
        await inbound.next()
        listed = await policy_streams(app)
        by_protocol = {s["protocol"]: s for s in listed}
        assert set(by_protocol) == {"linkerd-outbound-policy", "linkerd-inbound-policy"}
        out = by_protocol["linkerd-outbound-policy"]
        assert out["client"] == CLIENT
        assert "10.96.20.10:80" in json.dumps(out)
        assert out["messages_sent"] == 1
        assert "port 8080" in json.dumps(by_protocol["linkerd-inbound-policy"])

        outbound.cancel()
        inbound.cancel()

        async def gone() -> bool:
            return await policy_streams(app) == []
        await eventually(gone, why="cancelled policy watches still listed")
