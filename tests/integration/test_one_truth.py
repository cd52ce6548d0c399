"""One truth: for every demo target, what a Linkerd `Get` stream holds equals what an
xDS client holds in its ClusterLoadAssignment, field by field, before and after churn,
and both equal the View they were encoded from."""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import pytest

from bridge.authority import parse_authority
from harness.clients import LinkerdClient, XdsClient
from harness.normalize import NormalEndpoint, State
from meshbridge.app import App
from testkit.linkerd import drop_an_endpoint
from testkit.polling import HANG, eventually
from tests.conftest import AppFactory
from xds_api.service import XdsOptions


@pytest.fixture
def make_app(make_app: AppFactory) -> AppFactory:
    # Field by field includes identity and hints: the linkerd metadata profile.
    return partial(make_app, layer_options=(XdsOptions(endpoint_metadata="linkerd"),))


def demo_targets(app: App) -> list[str]:
    targets = [
        f"{key.name}.{key.namespace}.svc.cluster.local:{sp.port}"
        for key, svc in sorted(app.cluster.services.items()) if svc.type != "ExternalName"
        for sp in svc.ports
    ]
    return [*targets, "db-1.db.data.svc.cluster.local:5432"]  # one StatefulSet instance


def view_truth(app: App, target: str) -> State | None:
    """The View's ready endpoints, normalised the way both clients normalise (None
    until some client has subscribed to it)."""
    view = app.views.view(parse_authority(target, "cluster.local"))
    if view is None:
        return None
    out = set()
    for r in view.snapshot.values():
        ep, enr = r.endpoint, r.endpoint.enrichment
        if not ep.ready:
            continue
        hint = "" if enr.hint is None else "opaque" if enr.hint.opaque else \
            "h2" if enr.hint.h2 else ""
        transport = enr.hint.opaque_transport_port or 0 if enr.hint is not None else 0
        out.add(NormalEndpoint(ep.ip, ep.port, r.weight, enr.identity, hint, transport,
                               ep.zone or "", r.zone_locality))
    return frozenset(out)


async def converged(app: App, linkerd: LinkerdClient, xds: list[XdsClient],
                    targets: list[str], timeout: float = HANG) -> None:
    bad: list[str] = []

    def agree() -> bool:
        bad[:] = [t for t in targets
                  if not (linkerd.state[t].state() == view_truth(app, t)
                          and all(x.state[t].state() == view_truth(app, t) for x in xds))]
        return not bad

    def why() -> str:
        t = bad[0]
        truth = sorted(view_truth(app, t) or ())
        return (f"{len(bad)} targets disagree, e.g. {t}:\n view    {truth}"
                f"\n linkerd {sorted(linkerd.state[t].state())}"
                + "".join(f"\n {x.model:7} {sorted(x.state[t].state())}" for x in xds)
                + "\n")

    await eventually(agree, timeout, why)


async def test_linkerd_and_xds_clients_hold_the_same_truth_through_churn(
    make_app: Any, demo_dir: Path
) -> None:
    app = await make_app(demo_dir)
    targets = demo_targets(app)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        linkerd = LinkerdClient(channel, targets)
        sotw = XdsClient(channel, targets, client_id=1)
        delta = XdsClient(channel, targets, client_id=2, delta=True)
        tasks = [asyncio.create_task(c.run()) for c in (linkerd, sotw, delta)]
        try:
            await converged(app, linkerd, [sotw, delta], targets)
            # Every target has endpoints on both sides, or is empty on both sides; the
            # demo has both kinds.
            sizes = {t: len(linkerd.state[t].state()) for t in targets}
            assert sizes["catalog.shop.svc.cluster.local:80"] == 6
            assert sizes["db-1.db.data.svc.cluster.local:5432"] == 1
            assert sizes["payments.shop.svc.cluster.local:8080"] == 0
            # Churn: scale catalog down by one endpoint, and mesh-out a web pod's proxy.
            drop_an_endpoint(demo_dir, "shop", "catalog")
            before = view_truth(app, "catalog.shop.svc.cluster.local:80")
            await eventually(lambda: view_truth(app, "catalog.shop.svc.cluster.local:80")
                             != before, HANG, "the source did not see the edit")
            await converged(app, linkerd, [sotw, delta], targets)
            assert len(linkerd.state["catalog.shop.svc.cluster.local:80"].state()) == 5
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_node_sees_the_same_filtered_truth_over_both_protocols(
    make_app: Any, demo_dir: Path
) -> None:
    """nodeName in a Linkerd context token and NODE_NAME in an xDS node pick the same
    View: topology hints, internalTrafficPolicy: Local and zone locality alike."""
    app = await make_app(demo_dir)
    catalog = "catalog.shop.svc.cluster.local:80"
    agent = "node-local-agent.shop.svc.cluster.local:4317"
    targets = [catalog, agent]
    token = '{"ns":"shop","nodeName":"node-a","pod":"client"}'
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as channel:
        linkerd = LinkerdClient(channel, targets, token=token)
        xds = [XdsClient(channel, targets, client_id=1, node_name="node-a"),
               XdsClient(channel, targets, client_id=2, delta=True, node_name="node-a")]
        clients: list[LinkerdClient | XdsClient] = [linkerd, *xds]
        tasks = [asyncio.create_task(c.run()) for c in clients]
        try:
            await eventually(
                lambda: all(len(c.state[t].state()) == n for c in clients
                            for t, n in ((catalog, 2), (agent, 1))), HANG,
                lambda: str([sorted(c.state[t].state()) for c in clients for t in targets]))
            for t in targets:
                assert all(x.state[t].state() == linkerd.state[t].state() for x in xds), t
                assert {e.locality for e in linkerd.state[t].state()} == {"local"}
                assert {e.zone for e in linkerd.state[t].state()} == {"zone-a"}
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
