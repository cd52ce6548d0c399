"""A real Envoy over delta ADS (`DELTA_GRPC`): the delta EDS deletion rule (xDS §2.1)
and LEDS (xDS §7), followed endpoint by endpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from meshbridge.app import App
from testkit.envoy import Envoy, binary, eds_cluster, follows
from testkit.polling import HANG, eventually_seen
from tests.conftest import AppFactory
from tests.integration.xds_helpers import DEMO, Manifests
from xds_api import resource_types as rt
from xds_api.client import DeltaAdsClient

pytestmark = pytest.mark.envoy

BILLING = "billing.legacy.svc.cluster.local:80"
STATIC_BILLING = "static-billing"  # a bootstrap cluster fed the billing CLA over ADS


async def hosts_of(envoy: Envoy, cluster: str) -> set[tuple[str, int]]:
    return set((await envoy.clusters()).get(cluster, {}))


async def hosts_become(envoy: Envoy, cluster: str, expected: set[tuple[str, int]],
                       timeout: float, what: str) -> float:
    """Wait until Envoy's `cluster` holds `expected`: waited for, never timed (how fast
    Envoy follows is bench/'s figure; on a loaded machine an edit can take seconds)."""
    async def probe() -> tuple[bool, Any]:
        seen = await hosts_of(envoy, cluster)
        return seen == expected, sorted(seen)
    return await eventually_seen(probe, timeout, what)


async def test_envoy_loses_a_deleted_services_endpoints_and_regains_them(
        demo_dir: Path, tmp_path: Path, make_app: AppFactory) -> None:
    app: App = await make_app(demo_dir)
    edits = Manifests(demo_dir)
    billing = set(DEMO[BILLING])
    saved = (demo_dir / "40-legacy.yaml").read_text()
    async with Envoy(binary(), tmp_path / "envoy", app.grpc_port, "DELTA_GRPC",
                     static_clusters=[eds_cluster(STATIC_BILLING, BILLING)]) as envoy:
        await hosts_become(envoy, BILLING, billing, HANG, "billing's endpoints")
        await hosts_become(envoy, STATIC_BILLING, billing, HANG, "the static cluster's")
        sent_before = await app.sample_value("pilot_xds_pushes_total", {"type": "eds"})

        edits.delete_service("40-legacy.yaml", "legacy", "billing")
        await hosts_become(envoy, BILLING, set(), HANG, "billing deleted")
        assert BILLING not in await envoy.clusters()

        # Recreated with one endpoint fewer: the CLA is sent again, and even the
        # bootstrap cluster, which outlived the Service, follows it.
        (demo_dir / "40-legacy.yaml").write_text(saved)
        edits.remove_endpoint("40-legacy.yaml", "legacy", "billing-vm", "10.0.5.20")
        billing.discard(("10.0.5.20", 8080))
        await hosts_become(envoy, BILLING, billing, HANG, "billing recreated")
        await hosts_become(envoy, STATIC_BILLING, billing, HANG, "the static cluster too")
        assert await envoy.rejected_updates() == {}
        assert not await app.sample_value("pilot_total_xds_rejects_total", {"type": "eds"})
        assert (await app.sample_value("pilot_xds_pushes_total", {"type": "eds"})
                or 0) > (sent_before or 0)


LEDS_NODE = {"meshbridge.io/leds": "always"}
CATALOG = "catalog.shop.svc.cluster.local:80"
WEB = "web.emojivoto.svc.cluster.local:80"


async def leds_updates(envoy: Envoy, cluster: str) -> int:
    """Updates Envoy applied from the cluster's LEDS collections (its `leds.` stats)."""
    stats = await envoy.stats("leds.update_success")
    prefix = f"cluster.{cluster.replace(':', '_')}.leds."  # Envoy's stat name spelling
    return sum(v for k, v in stats.items() if k.startswith(prefix))


async def test_envoy_follows_every_demo_service_over_leds(
        demo_dir: Path, tmp_path: Path, make_app: AppFactory) -> None:
    app: App = await make_app(demo_dir)
    edits = Manifests(demo_dir)
    expected = {n: dict(eps) for n, eps in DEMO.items()}
    async with Envoy(binary(), tmp_path / "envoy", app.grpc_port, "DELTA_GRPC",
                     metadata=LEDS_NODE) as envoy:
        await follows(envoy, expected, HANG, "every demo service port, over LEDS")
        # Envoy's catalog endpoints came over LEDS (one subscription per zone).
        assert await leds_updates(envoy, CATALOG) >= 3
        leds_pushes = await app.sample_value("pilot_xds_pushes_total", {"type": "leds"})
        assert leds_pushes

        edits.remove_endpoint("20-shop.yaml", "shop", "catalog-5m7kp", "10.244.3.21")
        del expected[CATALOG][("10.244.3.21", 8080)]
        took = [await follows(envoy, expected, HANG, "an endpoint removed")]
        edits.add_pod_endpoint("20-shop.yaml", "shop", "catalog-5m7kp",
                               "catalog-8d6f9c7b5-w2hzb", "catalog-8d6f9c7b5-new01",
                               "10.244.3.22", "zone-c", "node-c")
        expected[CATALOG][("10.244.3.22", 8080)] = "zone-c"
        took.append(await follows(envoy, expected, HANG, "an endpoint added"))
        # A new zone: the CLA gains a collection, and Envoy subscribes to it.
        edits.add_pod_endpoint("20-shop.yaml", "shop", "catalog-5m7kp",
                               "catalog-8d6f9c7b5-w2hzb", "catalog-8d6f9c7b5-new02",
                               "10.244.4.22", "zone-d", "node-c")
        expected[CATALOG][("10.244.4.22", 8080)] = "zone-d"
        took.append(await follows(envoy, expected, HANG, "an endpoint in a new zone"))

        assert await envoy.rejected_updates() == {}
        for t in ("cds", "eds", "leds"):
            assert not await app.sample_value("pilot_total_xds_rejects_total", {"type": t})
        dump = await envoy.get_json("/config_dump?resource=dynamic_warming_clusters")
        assert dump.get("configs", []) == []
        print("LEDS follow times", [round(t, 3) for t in took])


async def test_one_endpoint_change_is_one_small_leds_response(
        demo_dir: Path, make_app: AppFactory) -> None:
    app: App = await make_app(demo_dir)
    edits = Manifests(demo_dir)
    address = f"127.0.0.1:{app.grpc_port}"
    async with grpc.aio.insecure_channel(address) as channel, \
            DeltaAdsClient(channel, "leds-client", LEDS_NODE) as leds, \
            DeltaAdsClient(channel, "eds-client", {"meshbridge.io/leds": "never"}) as eds:
        await leds.subscribe(rt.ENDPOINT, [CATALOG])
        await eds.subscribe(rt.ENDPOINT, [CATALOG])
        cla = (await leds.read(HANG)).resources[0]
        assert (await eds.read(HANG)).resources[0].name == CATALOG
        colls = [loc.leds_cluster_locality_config.leds_collection_name
                 for loc in leds.held[rt.ENDPOINT][CATALOG].endpoints]
        assert len(colls) == 3 and cla.name == CATALOG
        await leds.subscribe(rt.LB_ENDPOINT, colls)
        first = await leds.read(HANG)
        assert len(first.resources) == 6
        base = len(leds.sizes)

        edits.remove_endpoint("20-shop.yaml", "shop", "catalog-5m7kp", "10.244.3.21")
        gone = await leds.read(HANG)
        assert gone.type_url == rt.LB_ENDPOINT and list(gone.resources) == []
        assert [n.rsplit("/", 1)[1] for n in gone.removed_resources] == ["10.244.3.21_8080"]
        edits.add_pod_endpoint("20-shop.yaml", "shop", "catalog-5m7kp",
                               "catalog-8d6f9c7b5-w2hzb", "catalog-8d6f9c7b5-new01",
                               "10.244.3.22", "zone-c", "node-c")
        added = await leds.read(HANG)
        assert [r.name.rsplit("/", 1)[1] for r in added.resources] == ["10.244.3.22_8080"]
        assert list(added.removed_resources) == []
        # Exactly one response per change, and nothing else: a CLA due for catalog
        # would be sent with the one asked for now, before it.
        await leds.subscribe(rt.ENDPOINT, [WEB])
        sentinel = await leds.read(HANG)
        assert [r.name for r in sentinel.resources] == [WEB]
        assert [t for t, _ in leds.sizes[base:]] == [rt.LB_ENDPOINT, rt.LB_ENDPOINT,
                                                     rt.ENDPOINT]
        # The same two changes cost a delta EDS client the whole CLA each time.
        eds_sizes = [(await eds.read(HANG)).ByteSize() for _ in range(2)]
        leds_sizes = [size for _, size in leds.sizes[base:base + 2]]
        print("bytes per change: LEDS", leds_sizes, "delta EDS", eds_sizes)
        # One member and the response's framing, whose version (xDS §1.2: 24 hex
        # digits of content hash) is a tenth of it.
        assert all(size < 450 for size in leds_sizes)
        assert all(size > 2 * max(leds_sizes) for size in eds_sizes)


BIG = "big.scale.svc.cluster.local:80"
BIG_SIZE = 5000
PER_SLICE = 100


def big_slice(index: int, hosts: range) -> list[dict[str, Any]]:
    """One EndpointSlice of the big service: addresses without pods, three zones."""
    return [{
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": f"big-{index:03d}", "namespace": "scale",
                     "labels": {"kubernetes.io/service-name": "big"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": [f"10.{100 + h // 65536}.{h // 256 % 256}.{h % 256}"],
                       "conditions": {"ready": True}, "zone": f"zone-{'abc'[h % 3]}"}
                      for h in hosts]}]


def big_address(h: int) -> tuple[str, int]:
    return (f"10.{100 + h // 65536}.{h // 256 % 256}.{h % 256}", 8080)


async def test_envoy_follows_a_5000_endpoint_service_over_leds_one_small_push_a_change(
        demo_dir: Path, tmp_path: Path, make_app: AppFactory) -> None:
    edits = Manifests(demo_dir)
    edits.write("60-scale.yaml", [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "scale"}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "big", "namespace": "scale"},
         "spec": {"type": "ClusterIP", "clusterIP": "10.96.50.50",
                  "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}])
    for i in range(BIG_SIZE // PER_SLICE):
        edits.write(f"61-big-{i:03d}.yaml",
                    big_slice(i, range(i * PER_SLICE, (i + 1) * PER_SLICE)))
    app: App = await make_app(demo_dir)
    expected = {big_address(h) for h in range(BIG_SIZE)}

    async def pushed() -> tuple[float, float]:
        get = app.sample_value
        return (await get("pilot_xds_pushes_total", {"type": "leds"}) or 0.0,
                await get("pilot_xds_push_bytes_total", {"type": "leds"}) or 0.0)

    # No node metadata: the service is above the default threshold, so LEDS it is.
    async with Envoy(binary(), tmp_path / "envoy", app.grpc_port, "DELTA_GRPC") as envoy:
        await hosts_become(envoy, BIG, expected, HANG, "all 5,000 endpoints")
        assert await leds_updates(envoy, BIG) >= 3
        for step, hosts in enumerate((range(0, 99), range(0, 100))):  # remove, add back
            before = await pushed()
            edits.write("61-big-000.yaml", big_slice(0, hosts))
            if step == 0:
                expected.discard(big_address(99))
            else:
                expected.add(big_address(99))
            await hosts_become(envoy, BIG, expected, HANG, f"change {step}")
            after = await pushed()
            # One LEDS response to the one stream, of one endpoint's size.
            assert after[0] - before[0] == 1, (before, after)
            assert after[1] - before[1] < 400, (before, after)
        assert await envoy.rejected_updates() == {}
