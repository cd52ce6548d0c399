"""Incremental views: a change costs what changed, and ends where a recomputation would.

The equivalence test drives random churn (slices, pods, hints, dual stack, the
Service and Nodes) through a watched registry and checks, after every batch, that
every View holds what a from-scratch merge and filter give, and that the published
deltas replay to it. The others pin down where the work goes.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from bridge.cluster import Cluster
from bridge.enrich import enrich_pod_endpoint
from bridge.model import (
    EndpointId,
    Enrichment,
    FilterKey,
    MeshConfig,
    ResolvedEndpoint,
    ServiceKey,
    ViewKey,
)
from bridge.objects import Pod
from bridge.views import (
    EndpointSnapshot,
    VersionedMap,
    View,
    ViewChange,
    ViewRegistry,
    port_publisher,
)
from linkerd_api.endpoint_streams import UpdateEncoder
from linkerd_api.proto import destination_pb2 as dst
from linkerd_api.translate import MIRROR_CLUSTER_LABEL, Translator
from testkit.builders import delete, endpoint, endpoint_slice, load, node, pod, service

SVC = ServiceKey("app", "web")
PODS = [f"web-{i}" for i in range(10)]
ZONES = ["zone-a", "zone-b"]
NODES = {"node-a": "zone-a", "node-b": "zone-b"}


class Replayer:
    """Applies every published delta to its own dict: what a client would hold."""

    def __init__(self, view: View) -> None:
        self.state: dict[EndpointId, ResolvedEndpoint] = dict(view.snapshot)
        self.changes: list[ViewChange] = []

    def on_view_change(self, view: View, change: ViewChange) -> None:
        assert dict(change.previous) == self.state  # the old version still reads as it was
        for r in change.removed:
            assert self.state.pop(r.id) == r
        for r in change.added:
            assert self.state.get(r.id) != r  # an unchanged endpoint is no change
            self.state[r.id] = r
        self.changes.append(change)


def follow(reg: ViewRegistry, key: ViewKey) -> tuple[View, Replayer]:
    view = reg.view(key, create=True)
    assert view is not None
    rep = Replayer(view)
    reg.subscribe(key, rep, "test")
    return view, rep


def _ip(i: int, v6: bool) -> str:
    return f"fd00::{i + 1}" if v6 else f"10.0.0.{i + 1}"


def _random_slice(rng: random.Random, name: str, v6: bool) -> dict[str, Any]:
    entries = []
    for i in sorted(rng.sample(range(len(PODS)), rng.randint(0, 6))):
        zone = rng.choice(ZONES)
        extra: dict[str, Any] = {}
        if rng.random() < 0.3:
            extra["hostname"] = PODS[i]
        hints = None if rng.random() < 0.2 else [zone] if rng.random() < 0.8 else ZONES
        entries.append(endpoint(_ip(i, v6), PODS[i], ready=rng.random() < 0.85, zone=zone,
                                node="node-a" if zone == "zone-a" else "node-b",
                                hints=hints, **extra))
    if entries and rng.random() < 0.15:
        # The same pod listed twice, at another address: the later entry wins.
        i = rng.randrange(len(PODS))
        entries.append(endpoint(f"fd00::9:{i}" if v6 else f"10.0.9.{i}", PODS[i]))
    return endpoint_slice(name, "web", entries, family="IPv6" if v6 else "IPv4")


def _random_event(rng: random.Random, cluster: Cluster) -> None:
    roll = rng.random()
    if roll < 0.5:
        name = rng.choice(["web-a", "web-b", "web-c", "web-6"])
        raw = _random_slice(rng, name, v6=name == "web-6")
        (delete if rng.random() < 0.15 else load)(cluster, raw)
    elif roll < 0.8:
        i = rng.randrange(len(PODS))
        raw = pod(PODS[i], [_ip(i, False), _ip(i, True)], sa=rng.choice(["web", "other"]),
                  labels={"churn": str(rng.randint(0, 3))}, rv=str(rng.randint(1, 10**6)),
                  node=rng.choice(list(NODES)))
        (delete if rng.random() < 0.1 else load)(cluster, raw)
    elif roll < 0.9:
        spec: dict[str, Any] = (
            {"internalTrafficPolicy": "Local"} if rng.random() < 0.3 else {})
        (delete if rng.random() < 0.1 else load)(cluster, service("web", **spec))
    else:
        name = rng.choice(list(NODES))
        load(cluster, node(name, rng.choice([*ZONES, "zone-c"])))


@pytest.mark.parametrize("config", [
    MeshConfig(), MeshConfig(enable_ipv6=False, zone_weights=True)], ids=["v6", "v4-weights"])
def test_incremental_views_end_where_a_recomputation_does(config: MeshConfig) -> None:
    rng = random.Random(16)
    cluster = Cluster()
    reg = ViewRegistry(cluster, config)
    load(cluster, *(node(n, z) for n, z in NODES.items()), service("web"),
         *(pod(p, [_ip(i, False), _ip(i, True)]) for i, p in enumerate(PODS)))
    keys = [ViewKey(SVC, 80, fk) for fk in (
        FilterKey(), FilterKey(node_name="node-a"), FilterKey(node_name="node-b"),
        FilterKey(hostname="web-3"), FilterKey(node_name="node-a", filtering=False))]
    replayers = {key: follow(reg, key)[1] for key in keys}
    for _ in range(300):
        _random_event(rng, cluster)
        _, merged = reg.merge_endpoints(SVC, 80)
        for key in keys:
            view = reg.view(key)
            assert view is not None
            expected = reg.filter_endpoints(key, merged)
            assert dict(view.snapshot) == expected
            assert replayers[key].state == expected
            assert view.snapshot.ready_count == sum(r.endpoint.ready for r in expected.values())
    assert sum(len(r.changes) for r in replayers.values()) > 150


def test_an_old_version_reads_as_it_was_after_later_ones() -> None:
    v1: VersionedMap[str, int] = VersionedMap({"a": 1, "b": 2})
    v2 = v1.evolve({"a": 10, "c": 3})
    v3 = v2.evolve({"b": None, "d": 4})
    assert dict(v3) == {"a": 10, "c": 3, "d": 4}
    assert v2.get("b") == 2 and v1.get("a") == 1 and "c" not in v1
    assert dict(v1) == {"a": 1, "b": 2} and len(v1) == 2 and len(v2) == 3
    assert dict(v2) == {"a": 10, "b": 2, "c": 3}
    with pytest.raises(ValueError, match="newest"):
        v2.evolve({"x": 1})


def test_the_address_index_answers_for_the_newest_and_old_versions() -> None:
    cluster = Cluster()
    reg = ViewRegistry(cluster, MeshConfig())
    load(cluster, service("web"), pod("web-1", "10.0.0.1"), pod("web-2", "10.0.0.2"),
         endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1"),
                                         endpoint("10.0.0.2", "web-2", ready=False)]))
    view = reg.view(ViewKey(SVC, 80), create=True)
    assert view is not None
    first = view.snapshot
    assert first.holds_ready("10.0.0.1", 8080) and not first.holds_ready("10.0.0.2", 8080)
    load(cluster, endpoint_slice("web-a", "web", [endpoint("10.0.0.2", "web-2")]))
    assert isinstance(view.snapshot, EndpointSnapshot)
    assert view.snapshot.holds_ready("10.0.0.2", 8080)
    assert not view.snapshot.holds_ready("10.0.0.1", 8080)
    assert first.holds_ready("10.0.0.1", 8080) and first.ready_count == 1


def _big_service(cluster: Cluster, slices: int, per_slice: int) -> None:
    objs = [service("web")]
    for s in range(slices):
        entries = []
        for j in range(per_slice):
            n = s * per_slice + j
            ip = f"10.{n // 65536}.{n // 256 % 256}.{n % 256}"
            objs.append(pod(f"web-{n}", ip))
            entries.append(endpoint(ip, f"web-{n}"))
        objs.append(endpoint_slice(f"web-{s:03}", "web", entries))
    load(cluster, *objs)


def test_a_slice_event_enriches_that_slice_and_a_pod_event_that_pod(
        monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster()
    reg = ViewRegistry(cluster, MeshConfig())
    _big_service(cluster, slices=5, per_slice=20)
    view, _ = follow(reg, ViewKey(SVC, 80))
    enriched: list[str] = []

    def counted_enrich(p: Pod, *args: Any) -> Enrichment:
        enriched.append(p.meta.name)
        return enrich_pod_endpoint(p, *args)

    monkeypatch.setattr(port_publisher, "enrich_pod_endpoint", counted_enrich)
    refilters: list[int] = []
    real_filter = View.filter

    def counted_filter(self: View, *args: Any) -> Any:
        refilters.append(1)
        return real_filter(self, *args)

    monkeypatch.setattr(View, "filter", counted_filter)
    # One slice loses an endpoint: that slice's other entries are reused, nothing enriched.
    load(cluster, endpoint_slice("web-002", "web", [
        endpoint(f"10.0.0.{n}", f"web-{n}") for n in range(40, 59)]))
    assert enriched == [] and len(view.snapshot) == 99
    # A pod changes: only its endpoint is enriched again.
    load(cluster, pod("web-7", "10.0.0.7", sa="other", rv="2"))
    assert enriched == ["web-7"]
    assert "other" in view.snapshot[EndpointId("pod", "app", "web-7", "IPv4")
                                    ].endpoint.enrichment.identity
    assert refilters == []  # the View filtered the changed endpoints only


def test_a_pod_change_that_changes_no_endpoint_publishes_nothing() -> None:
    """Issue #17 row 1: a label no one reads, a new resourceVersion: no message."""
    cluster = Cluster()
    reg = ViewRegistry(cluster, MeshConfig())
    load(cluster, service("web"), pod("web-1", "10.0.0.1"),
         endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1")]))
    view, rep = follow(reg, ViewKey(SVC, 80))
    version = view.version
    load(cluster, pod("web-1", "10.0.0.1", labels={"team": "blue"},
                      annotations={"note": "x"}, rv="7"))
    assert view.version == version and rep.changes == []
    load(cluster, pod("web-1", "10.0.0.1", sa="other", rv="8"))
    assert view.version == version + 1
    encoder = UpdateEncoder(Translator(MeshConfig()), "proto")
    assert len(encoder.diff(view, rep.changes[-1])) == 1  # one add, for the real change


def test_set_labels_follow_a_slice_change_without_being_read_per_version() -> None:
    cluster = Cluster()
    reg = ViewRegistry(cluster, MeshConfig())
    load(cluster, service("web"), pod("web-1", "10.0.0.1"), pod("web-2", "10.0.0.2"),
         endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1")]))
    view, rep = follow(reg, ViewKey(SVC, 80))
    encoder = UpdateEncoder(Translator(MeshConfig()), "proto")
    stamp = cluster.slice_stamps[SVC]
    load(cluster, pod("web-1", "10.0.0.1", sa="other", rv="2"))
    assert cluster.slice_stamps[SVC] == stamp  # a pod event leaves the slices' stamp
    encoder.diff(view, rep.changes[-1])
    mirrored = endpoint_slice("web-a", "web", [endpoint("10.0.0.1", "web-1")])
    mirrored["metadata"]["labels"][MIRROR_CLUSTER_LABEL] = "east"
    load(cluster, mirrored)
    load(cluster, endpoint_slice("web-b", "web", [endpoint("10.0.0.2", "web-2")]))
    (add,) = encoder.diff(view, rep.changes[-1])
    labels = dict(dst.Update.FromString(add[1]).add.metric_labels)
    assert labels["target_cluster"] == "east"
