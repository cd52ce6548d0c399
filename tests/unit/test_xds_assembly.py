"""The CLA assembled change by change is the CLA encoded from scratch (xds_api.assembly)."""

from __future__ import annotations

import random

import pytest
from envoy.config.endpoint.v3 import endpoint_pb2
from google.protobuf import any_pb2

from bridge.model import BASE_WEIGHT, Endpoint, EndpointId, Enrichment, ResolvedEndpoint
from xds_api import assembly, resources
from xds_api import resource_types as rt
from xds_api.assembly import ClaAssembly
from xds_api.resources import MetadataEncoder

NAME = "web.app.svc.cluster.local:8080"
ENCODERS = {p: MetadataEncoder(p) for p in resources.METADATA_PROFILES}


def random_endpoint(rng: random.Random, eid: EndpointId) -> ResolvedEndpoint:
    # Few addresses and zones, so that duplicates, moves and empty localities happen.
    ip = rng.choice([f"10.0.{rng.randrange(2)}.{rng.randrange(12)}",
                     f"fd00::{rng.randrange(1, 6):x}"])
    zone = rng.choice(["zone-a", "zone-b", "zone-c", None])
    ready = rng.random() < 0.8
    ep = Endpoint(eid, ip, rng.choice([8080, 9090]), ready=ready,
                  serving=ready or rng.random() < 0.5, terminating=not ready,
                  zone=zone, region="" if zone is None else "r1",
                  pod_name=eid.name if eid.kind == "pod" else "",
                  enrichment=Enrichment(identity=rng.choice(["", "a.b.c"])))
    return ResolvedEndpoint(ep, "unknown", rng.choice([1, 3]) * BASE_WEIGHT)


def cla_of(any_bytes: bytes) -> endpoint_pb2.ClusterLoadAssignment:
    wrapped = any_pb2.Any.FromString(any_bytes)
    assert wrapped.type_url == rt.ENDPOINT
    return endpoint_pb2.ClusterLoadAssignment.FromString(wrapped.value)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("draining", [False, True])
@pytest.mark.parametrize("block", [2, assembly.BLOCK])
def test_a_cla_assembled_change_by_change_is_the_one_encoded_from_scratch(
        seed: int, draining: bool, block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Small blocks: a locality's blocks split and empty many times over.
    monkeypatch.setattr(assembly, "BLOCK", block)
    rng = random.Random(seed)
    metadata = ENCODERS[resources.METADATA_PROFILES[seed % 3]]
    ids = [EndpointId(rng.choice(["pod", "address"]), "app", f"e{i}", "IPv4")
           for i in range(30)]
    state: dict[EndpointId, ResolvedEndpoint] = {}
    asm = ClaAssembly(draining, metadata)
    asm.rebuild(state.values(), 0)
    versions: dict[bytes, str] = {}
    for version in range(1, 120):
        added, removed = [], []
        for eid in rng.sample(ids, rng.randint(1, 4)):
            if eid in state and rng.random() < 0.4:
                removed.append(state.pop(eid))
            else:
                state[eid] = random_endpoint(rng, eid)
                added.append(state[eid])
        asm.apply(added, removed, state, version)
        got = asm.resource(NAME)
        body, _ = resources.encode_cla(NAME, state.values(), draining, None, metadata)
        assert got.any_bytes == resources.encode_resource(rt.ENDPOINT, NAME, body).any_bytes
        assert cla_of(got.any_bytes) == endpoint_pb2.ClusterLoadAssignment.FromString(body)
        # The same content has the same version whichever way it was assembled.
        fresh = ClaAssembly(draining, metadata)
        fresh.rebuild(state.values(), version)
        assert fresh.resource(NAME).version == got.version
        assert versions.setdefault(body, got.version) == got.version
    assert len(set(versions.values())) == len(versions)


def test_an_unchanged_endpoint_is_not_encoded_again() -> None:
    rng = random.Random(1)
    ids = [EndpointId("pod", "app", f"p{i}", "IPv4") for i in range(10)]
    state = {eid: random_endpoint(rng, eid) for eid in ids}
    asm = ClaAssembly(False, ENCODERS["linkerd"])
    asm.rebuild(state.values(), 1)
    before = dict(asm.entries)
    state[ids[0]] = random_endpoint(rng, ids[0])
    asm.apply([state[ids[0]]], [], state, 2)
    assert all(asm.entries.get(i) is before[i] for i in ids[1:] if i in before)
