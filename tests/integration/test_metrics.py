"""/metrics as Prometheus reads it: parsed with the text-format parser, series moving
as a Linkerd and an xDS client follow a change."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc
from prometheus_client.parser import text_string_to_metric_families

from harness.clients import LinkerdClient, XdsClient
from meshbridge.app import App
from testkit.linkerd import drop_an_endpoint
from testkit.polling import HANG, eventually

TARGET = "catalog.shop.svc.cluster.local:80"


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(app: App) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{app.admin_port}/metrics", timeout=HANG) as r:
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels`."""
    return sum(v for (n, ls), v in samples.items()
               if n == name and set(labels.items()) <= set(ls))


async def test_metrics_series_move_as_clients_follow_a_change(
    make_app: Any, demo_dir: Path
) -> None:
    app = await make_app(demo_dir)
    before: Samples = {}
    after: Samples = {}

    async def converged() -> bool:
        nonlocal after
        after = await asyncio.to_thread(scrape, app)  # a thread: the admin port is on this loop
        # The change's own observations: one per stream, after those `before` holds.
        return all(value(after, "meshbridge_convergence_seconds_count", protocol=p)
                   > value(before, "meshbridge_convergence_seconds_count", protocol=p)
                   for p in ("linkerd-get", "xds-sotw"))

    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        get = LinkerdClient(channel, [TARGET])
        ads = XdsClient(channel, [TARGET])
        tasks = [asyncio.create_task(get.run()), asyncio.create_task(ads.run())]
        try:
            await eventually(lambda: len(get.state[TARGET].state()) == 6
                             and len(ads.state[TARGET].state()) == 6,
                             why="both clients did not get catalog's 6 endpoints")
            before = await asyncio.to_thread(scrape, app)
            view = dict(namespace="shop", service="catalog", port="80")
            assert value(before, "endpoints_subscribers", **view) == 2
            assert value(before, "endpoints_pods", **view) == 6
            assert value(before, "endpoints_exists", **view) == 1
            assert value(before, "pilot_xds", api="sotw") == 1
            get_rpc = dict(grpc_service="io.linkerd.proxy.destination.Destination",
                           grpc_method="Get", grpc_type="server_stream")
            assert value(before, "grpc_server_started_total", **get_rpc) == 1
            assert value(before, "grpc_server_msg_sent_total", **get_rpc) == 1

            written = time.monotonic()
            drop_an_endpoint(demo_dir, "shop", "catalog")
            await eventually(lambda: len(get.state[TARGET].state()) == 5
                             and len(ads.state[TARGET].state()) == 5,
                             why="both clients did not follow the removed endpoint")

            await eventually(converged, HANG, "no convergence was observed")
            window = time.monotonic() - written
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    assert value(after, "endpoints_pods", **view) == 5
    assert value(after, "endpoints_updates_total", **view) == \
        value(before, "endpoints_updates_total", **view) + 1
    assert value(after, "grpc_server_msg_sent_total", **get_rpc) == 2  # the remove
    eds = dict(type="eds")
    pushes = value(after, "pilot_xds_pushes_total", **eds) - \
        value(before, "pilot_xds_pushes_total", **eds)
    pushed = value(after, "meshbridge_xds_push_bytes_total", **eds) - \
        value(before, "meshbridge_xds_push_bytes_total", **eds)
    assert pushes == 1 and pushed > 0
    assert value(after, "pilot_total_xds_rejects_total") == 0
    # Each stream's convergence on this change lies inside the window the test measured
    # from its write to its last scrape: a figure in seconds, and the change's own.
    converge = ("meshbridge_convergence_seconds_sum", "meshbridge_convergence_seconds_count")
    took, streams = (value(after, n) - value(before, n) for n in converge)
    assert streams == 2 and 0 < took <= streams * window, (took, streams, window)
