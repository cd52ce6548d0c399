"""`meshbridge compare` costs the server's loop what a change changed: the sim source
rebuilds only the slices a change touched, the truth recorder and the Linkerd clients
keep their states and digests change by change, and each equals what a rebuild from
scratch would give. Nothing running."""

from __future__ import annotations

import random

from bridge.cluster import Cluster, Event, EventType
from bridge.model import MeshConfig
from bridge.objects import EndpointSlice
from bridge.sources.sim import SimCluster, parse_scenario
from bridge.views import ViewRegistry
from harness.clients import TargetState
from harness.compare.truth import TruthRecorder, truth_state
from harness.normalize import NormalEndpoint, digest

EVERY_PATTERN = {"rolling_restart": 2, "scale": 2, "zone_loss": 0.2, "flap": 2}


def test_a_flap_in_a_big_service_writes_one_slice_and_leaves_nothing_behind() -> None:
    sim = SimCluster(parse_scenario({
        "seed": 5, "cluster": {"services": 1, "endpoints_per_service": 5000,
                               "slice_size": 100},
        "churn": {"patterns": {"flap": 1}}}))
    sim.initial_objects()
    svc = sim.services[0]
    for _, (_, events) in zip(range(20), sim.changes(), strict=False):
        assert [(e.type, e.obj.kind) for e in events] == [
            (EventType.MODIFIED, "EndpointSlice")]
        (sl,) = (e.obj for e in events)
        assert isinstance(sl, EndpointSlice) and len(sl.endpoints) == 100
        # A rebuild of every slice finds nothing the change did not already write.
        assert sim._slice_events(svc) == []


def test_every_pattern_leaves_no_slice_unwritten() -> None:
    sim = SimCluster(parse_scenario({
        "seed": 9, "cluster": {"services": 4, "endpoints_per_service": 30,
                               "slice_size": 7, "zones": 3},
        "churn": {"patterns": EVERY_PATTERN}}))
    sim.initial_objects()
    for _, _ in zip(range(400), sim.changes(), strict=False):
        for svc in sim.services:
            assert sim._slice_events(svc) == []


def test_the_truth_kept_by_deltas_is_the_views_truth() -> None:
    sim = SimCluster(parse_scenario({
        "seed": 4, "cluster": {"services": 3, "endpoints_per_service": 40,
                               "slice_size": 10, "zones": 3},
        "churn": {"patterns": EVERY_PATTERN}}))
    cluster = Cluster()
    views = ViewRegistry(cluster, MeshConfig())
    cluster.apply(Event(EventType.ADDED, o) for o in sim.initial_objects())
    targets = [f"svc-{i}.ns-0.svc.cluster.local:8080" for i in range(3)]
    recorder = TruthRecorder()
    recorder.follow(views, targets)
    for index, (pattern, events) in zip(range(300), sim.changes(), strict=False):
        recorder.on_emit(index, pattern, 0.0)
        cluster.apply(events)
        for target in targets:
            view = recorder._views[target]
            whole = truth_state(view.snapshot)
            assert recorder.final[target] == whole
            assert recorder.versions[target][-1].digest == digest(whole)
            assert recorder.final_digests()[target] == digest(whole)
    assert recorder.churn_versions() > 100


def test_a_target_states_kept_digest_is_the_digest_of_its_state() -> None:
    rng = random.Random(1)
    st = TargetState()
    addresses = [(f"10.0.{i // 250}.{i % 250}", 8080 + i % 2) for i in range(60)]
    for step in range(2000):
        address, port = rng.choice(addresses)
        roll = rng.random()
        if roll < 0.55:
            st.put(NormalEndpoint(address, port, weight=rng.randrange(3)))
        elif roll < 0.98:
            st.drop((address, port))
        else:
            st.clear()
        if step % 97 == 0:  # a whole answer (an xDS CLA) replaces it
            st.assign({(e.address, e.port): e for e in list(st.endpoints.values())[::2]})
        assert st.digest() == digest(st.state())
