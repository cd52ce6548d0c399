"""The files, demo and sim sources."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import structlog
import yaml

from bridge.cluster import Cluster
from bridge.model import ServiceKey
from bridge.sources.base import SourceSpecError
from bridge.sources.catalog import DEMO_DIR, make_source
from bridge.sources.files import FilesSource
from bridge.sources.sim import ScenarioError, SimCluster, SimSource, parse_scenario
from testkit.builders import endpoint, endpoint_slice, pod, service
from testkit.polling import HANG, eventually


def write(path: Path, *docs: object) -> None:
    path.write_text(yaml.safe_dump_all(docs))


def good_folder(root: Path) -> Path:
    write(root / "web.yaml", service("web"), pod("web-1", "10.0.0.1"),
          endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1")]))
    return root


def test_files_source_reads_multi_document_files(tmp_path: Path) -> None:
    cluster = Cluster()
    FilesSource(good_folder(tmp_path)).sync(cluster)
    assert set(cluster.services) == {ServiceKey("app", "web")}
    assert len(cluster.slices) == 1 and len(cluster.pods) == 1


async def test_files_source_follows_adds_edits_and_deletes(tmp_path: Path) -> None:
    cluster = Cluster()
    source = FilesSource(good_folder(tmp_path), poll_interval=0.2)
    synced = asyncio.Event()
    task = asyncio.create_task(source.run(cluster, synced))
    try:
        await synced.wait()
        write(tmp_path / "api.yaml", service("api"))
        await eventually(lambda: ServiceKey("app", "api") in cluster.services)
        write(tmp_path / "api.yaml", service("api", ports=[{"name": "grpc", "port": 9090}]))
        await eventually(
            lambda: cluster.services[ServiceKey("app", "api")].ports[0].port == 9090)
        (tmp_path / "api.yaml").unlink()
        await eventually(lambda: ServiceKey("app", "api") not in cluster.services)
    finally:
        task.cancel()


@pytest.mark.parametrize("folder", ["missing", "empty", "no-manifests"])
def test_a_files_source_with_nothing_to_serve_is_refused(tmp_path: Path, folder: str) -> None:
    root = tmp_path / folder
    if folder != "missing":
        root.mkdir()
    if folder == "no-manifests":
        (root / "notes.txt").write_text("not a manifest")
    with pytest.raises(SourceSpecError, match=str(root)):
        make_source(f"files:{root}")


async def test_a_files_source_refuses_to_start_on_a_missing_folder(tmp_path: Path) -> None:
    source = FilesSource(tmp_path / "gone")
    with pytest.raises(SourceSpecError, match="not a directory"):
        await source.run(Cluster(), asyncio.Event())


@pytest.mark.parametrize("how", ["emptied", "removed"])
def test_a_folder_that_loses_its_manifests_is_stale_until_they_return(
        tmp_path: Path, how: str) -> None:
    root = tmp_path / "m"
    root.mkdir()
    good_folder(root)
    cluster = Cluster()
    source = FilesSource(root)
    source.sync(cluster)
    assert not source.stale
    saved = (root / "web.yaml").read_text()
    with structlog.testing.capture_logs() as logs:
        (root / "web.yaml").unlink()
        if how == "removed":
            root.rmdir()
        for _ in range(3):  # three polls of the lost folder
            source.sync(cluster)
            assert source.stale
    assert source.stale_reason is not None and str(root) in source.stale_reason
    assert [e["reason"] for e in logs if e["log_level"] == "error"] == [
        "holds no manifests" if how == "emptied" else "is missing"]  # once, not per poll
    # An outage, not an empty cluster: the last state is still served.
    assert ServiceKey("app", "web") in cluster.services
    root.mkdir(exist_ok=True)
    (root / "web.yaml").write_text(saved)
    source.sync(cluster)
    assert not source.stale and source.stale_reason is None
    assert ServiceKey("app", "web") in cluster.services
    (root / "api.yaml").write_text(yaml.safe_dump(service("api")))
    source.sync(cluster)
    assert ServiceKey("app", "api") in cluster.services  # followed again


def test_a_file_that_does_not_parse_keeps_its_last_good_state(tmp_path: Path) -> None:
    cluster = Cluster()
    source = FilesSource(good_folder(tmp_path))
    source.sync(cluster)
    with structlog.testing.capture_logs() as logs:
        (tmp_path / "web.yaml").write_text("kind: Service\nmetadata: {name: web\n  bad: [\n")
        source.sync(cluster)
    assert ServiceKey("app", "web") in cluster.services
    assert len(cluster.pods) == 1
    (err,) = [e for e in logs if e["log_level"] == "error"]
    assert err["file"].endswith("web.yaml") and isinstance(err["line"], int)


@pytest.mark.parametrize(
    ("bad", "object_name"),
    [
        ({"kind": "Gadget", "metadata": {"name": "g", "namespace": "app"}}, "Gadget g"),
        ({"kind": "Service", "metadata": {"name": "typo", "namespace": "app"},
          "spec": {"ports": [{"port": "http"}]}}, "Service app/typo"),
        (endpoint_slice("bad-ip", "web", [endpoint("10.0.0.999", "web-1")]),
         "EndpointSlice app/bad-ip"),
        (endpoint_slice("fqdn", "web", [], family="FQDN"), "EndpointSlice app/fqdn"),
        ({**endpoint_slice("orphan", "web", []), "metadata": {"name": "orphan",
                                                             "namespace": "app"}},
         "EndpointSlice app/orphan"),
        ({**pod("no-ip", "10.0.0.5"), "status": {"phase": "Pending"}}, "Pod app/no-ip"),
    ],
)
def test_bad_manifests_are_logged_with_file_and_name_and_the_rest_is_kept(
    tmp_path: Path, bad: dict[str, object], object_name: str
) -> None:
    write(tmp_path / "mixed.yaml", service("web"), bad, pod("web-1", "10.0.0.1"),
          endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1")]))
    cluster = Cluster()
    with structlog.testing.capture_logs() as logs:
        FilesSource(tmp_path).sync(cluster)
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1, warnings
    assert warnings[0]["file"].endswith("mixed.yaml")
    assert warnings[0]["object"] == object_name
    assert ServiceKey("app", "web") in cluster.services
    assert ("EndpointSlice", "app", "web-a") in cluster.slices
    assert ("app", "web-1") in cluster.pods


def test_demo_source_is_the_bundled_folder() -> None:
    src = make_source("demo")
    assert isinstance(src, FilesSource) and src.root == DEMO_DIR
    cluster = Cluster()
    with structlog.testing.capture_logs() as logs:
        src.sync(cluster)
    assert [e for e in logs if e["log_level"] in ("warning", "error")] == []
    assert len(cluster.services) >= 10
    assert {n.zone for n in cluster.nodes.values()} == {"zone-a", "zone-b", "zone-c"}


@pytest.mark.parametrize("spec", ["nope", "files:/definitely/not/here", "sim:"])
def test_bad_source_specs_are_rejected(spec: str) -> None:
    with pytest.raises((SourceSpecError, ScenarioError)):
        make_source(spec)


SCENARIO = {"seed": 42, "cluster": {"services": 5, "endpoints_per_service": 4, "zones": 3},
            "churn": {"rate": 100, "patterns": {"rolling_restart": 1, "scale": 1,
                                                "zone_loss": 0.3, "flap": 1}}}


def fingerprint(seed: int, steps: int = 200) -> list[tuple[str, tuple[tuple[str, str], ...]]]:
    sim = SimCluster(parse_scenario({**SCENARIO, "seed": seed}))
    out = []
    for _, (pattern, events) in zip(range(steps), sim.changes(), strict=False):
        out.append((pattern, tuple((e.type.value, f"{e.obj.kind}/{e.obj.meta.name}")
                                   for e in events)))
    return out


def test_sim_churn_is_identical_for_the_same_seed_and_differs_for_another() -> None:
    assert fingerprint(42) == fingerprint(42)
    assert fingerprint(42) != fingerprint(43)
    patterns = {p for p, _ in fingerprint(42)}
    assert patterns == {"rolling_restart", "scale", "zone_loss", "flap"}


async def test_sim_source_builds_the_cluster_and_churns_at_its_rate() -> None:
    scenario = parse_scenario({**SCENARIO, "duration": 0.5})
    emitted: list[float] = []
    source = SimSource(scenario, on_emit=lambda i, p, t: emitted.append(t))
    cluster = Cluster()
    synced = asyncio.Event()
    task = asyncio.create_task(source.run(cluster, synced))
    await synced.wait()
    assert len(cluster.services) == 5 and len(cluster.nodes) == 3
    await asyncio.wait_for(source.finished.wait(), HANG)
    await task
    assert 40 <= len(emitted) <= 50  # 100/s for 0.5 s


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"sed": 1}, "unknown key 'sed'"),
        ({"cluster": {"services": 0}}, "cluster.services"),
        ({"churn": {"rate": -1}}, "churn.rate"),
        ({"churn": {"patterns": {"earthquake": 1}}}, "unknown key 'earthquake'"),
        ({"duration": 0}, "duration"),
        ([1, 2], "top level"),
    ],
)
def test_bad_scenarios_name_the_key(raw: object, message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario(raw)
    assert message in str(err.value)


def test_demo_serves_the_counts_its_readme_promises() -> None:
    """bridge/sources/demo/README.md's table, checked against what the core computes."""
    from bridge.model import FilterKey, MeshConfig, ViewKey
    from bridge.views import ViewRegistry

    cluster = Cluster()
    registry = ViewRegistry(cluster, MeshConfig())
    make_source("demo").sync(cluster)  # type: ignore[attr-defined]
    expected = {
        ("emojivoto/web", 80): 2, ("emojivoto/web-canary", 80): 1,
        ("emojivoto/emoji", 8080): 2, ("emojivoto/emoji", 8801): 2,
        ("emojivoto/voting", 8080): 3, ("shop/catalog", 80): 6, ("shop/cart", 8080): 2,
        ("shop/payments", 8080): 0, ("shop/cache", 6379): 1, ("shop/queue", 5672): 1,
        ("shop/queue", 15672): 1, ("shop/search", 9090): 2, ("shop/search", 9091): 2,
        ("data/db", 5432): 3, ("legacy/billing", 80): 3, ("legacy/reports", 8080): 0,
    }
    for (svc, port), count in expected.items():
        ns, name = svc.split("/")
        _, merged = registry.merge_endpoints(ServiceKey(ns, name), port)
        view = registry.filter_endpoints(ViewKey(ServiceKey(ns, name), port), merged)
        ready = [r for r in view.values() if r.endpoint.ready]
        assert len(ready) == count, (svc, port, ready)
    local = ViewKey(ServiceKey("shop", "node-local-agent"), 4317, FilterKey(node_name="node-a"))
    _, merged = registry.merge_endpoints(local.service, 4317)
    assert len(registry.filter_endpoints(local, merged)) == 1
    cart = ViewKey(ServiceKey("shop", "cart"), 8080)
    _, merged = registry.merge_endpoints(cart.service, 8080)
    assert {r.endpoint.family for r in registry.filter_endpoints(cart, merged).values()} == {
        "IPv6"}


def test_sim_keeps_endpoints_in_their_slices_and_deletes_emptied_ones() -> None:
    sim = SimCluster(parse_scenario({
        "seed": 3, "cluster": {"services": 1, "endpoints_per_service": 250, "slice_size": 100},
        "churn": {"patterns": {"scale": 1, "rolling_restart": 1}}}))
    cluster = Cluster()
    from bridge.cluster import Event, EventType

    cluster.apply(Event(EventType.ADDED, o) for o in sim.initial_objects())
    assert len(cluster.slices) == 3
    for _, (_, events) in zip(range(600), sim.changes(), strict=False):
        cluster.apply(events)
        # Every endpoint names a pod that exists, and no slice is over its size.
        for sl in cluster.slices.values():
            assert len(sl.endpoints) <= 100
            for ep in sl.endpoints:
                assert ep.target is not None
                assert (ep.target.namespace, ep.target.name) in cluster.pods
        pods = sum(len(sl.endpoints) for sl in cluster.slices.values())
        assert pods == len(sim.services[0].pods)
