"""Whatever a client subscribes to and whatever changes in the cluster, a client that
applies each response by the protocol's rules and ACKs it ends up holding exactly the
server's current resources, and is then sent nothing more (xDS §1.6, §2).

A model client per variant: SotW replaces the whole set for CDS/LDS and updates named
entries for EDS/RDS; delta adds, replaces and removes per resource.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from testkit.xds_model import (
    CDS,
    EDS,
    LDS,
    RDS,
    DeltaClient,
    SotwClient,
    World,
    name,
    resource_name,
    unpack,
)

SERVICES = ["a", "b", "c"]
TYPES = [CDS, EDS, LDS, RDS]
NAMES = [name(s) for s in SERVICES] + ["not-a-service"]

# One step: ("subscribe", type, names) | ("set", service, endpoints) | ("delete", service)
steps = st.one_of(
    st.tuples(st.just("subscribe"), st.sampled_from(TYPES),
              st.lists(st.sampled_from([*NAMES, "*"]), max_size=4)),
    st.tuples(st.just("set"), st.sampled_from(SERVICES),
              st.lists(st.integers(1, 4), max_size=3, unique=True)),
    st.tuples(st.just("delete"), st.sampled_from(SERVICES)),
    st.tuples(st.just("protocol"), st.sampled_from(SERVICES), st.sampled_from(["", "grpc"])),
)


def apply_step(world: World, step: tuple[Any, ...]) -> None:
    if step[0] == "set":
        _, svc, hosts = step
        world.add_service(svc, [f"10.1.{SERVICES.index(svc)}.{h}" for h in hosts])
    elif step[0] == "delete":
        world.delete_service(step[1])
    elif step[0] == "protocol" and step[1] in {k.name for k in world.cluster.services}:
        world.set_port_protocol(step[1], step[2])


def truth(world: World, type_url: str, wanted: AbstractSet[str], wildcard: bool,
          delta: bool = False) -> dict[str, bytes]:
    names = set(wanted)
    if wildcard:
        names |= set(world.cache.wildcard_names(type_url))
    out = {}
    for n in names:
        # §2.1: to a delta client a deleted service has no CLA; SotW keeps an empty one.
        res = world.cache.get(type_url, n, delta=delta)
        if res is not None:
            out[n] = res.any_bytes
    return out


class ClientModel:
    """What a client holds, kept from every response it reads (and ACKs)."""

    def take(self, resp: Any) -> None:
        raise NotImplementedError

    def responses(self) -> list[Any]:
        raise NotImplementedError

    def drain(self) -> int:
        count = 0
        for _ in range(10):
            got = self.responses()
            if not got:
                return count
            count += len(got)
            for resp in got:
                self.take(resp)
        raise AssertionError("responses never stopped")


class SotwModel(ClientModel):
    def __init__(self, client: SotwClient) -> None:
        self.client = client
        self.held: dict[str, dict[str, bytes]] = {t: {} for t in TYPES}
        self.asked: dict[str, list[str]] = {}

    def subscribe(self, type_url: str, names: list[str]) -> None:
        self.asked[type_url] = names
        self.client.request(type_url, names)
        sub = self.client.stream.subs[type_url]
        if not sub.wildcard:
            # A client forgets what it no longer subscribes to; the server owes it no
            # response for that (§1.8), full-state type or not.
            self.held[type_url] = {n: v for n, v in self.held[type_url].items()
                                   if n in sub.names}

    def responses(self) -> list[Any]:
        return list(self.client.responses())

    def take(self, resp: Any) -> None:
        t = resp.type_url
        entries = {resource_name(unpack(a)): a.SerializeToString() for a in resp.resources}
        if t in (CDS, LDS):
            self.held[t] = entries
        else:
            self.held[t].update(entries)
        self.client.ack(t, self.asked.get(t, []))

    def check(self, world: World) -> None:
        for t in self.asked:
            sub = self.client.stream.subs[t]
            want = truth(world, t, sub.names, sub.wildcard)
            have = {n: v for n, v in self.held[t].items() if n in want or t in (CDS, LDS)}
            assert have == want, (t, sorted(have), sorted(want))


class DeltaModel(ClientModel):
    def __init__(self, client: DeltaClient) -> None:
        self.client = client
        self.held: dict[str, dict[str, bytes]] = {t: {} for t in TYPES}
        self.wanted: dict[str, set[str]] = {}
        self.wildcard: dict[str, bool] = {}

    def subscribe(self, type_url: str, names: list[str]) -> None:
        old = self.wanted.get(type_url, set())
        new = set(names)
        sub, unsub = sorted(new - old), sorted(old - new)
        if type_url not in self.wanted and not sub:
            sub = ["*"] if type_url in (CDS, LDS) else []
        self.wanted[type_url] = new
        if type_url not in (CDS, LDS):
            new.discard("*")
        self.wildcard[type_url] = "*" in new or (not old and not names
                                                 and type_url in (CDS, LDS))
        for n in unsub:
            self.held[type_url].pop(n, None)
        if not self.wildcard[type_url] and "*" in old:
            self.held[type_url] = {n: v for n, v in self.held[type_url].items() if n in new}
        self.client.request(type_url, sub, unsub)

    def responses(self) -> list[Any]:
        return list(self.client.responses())

    def take(self, resp: Any) -> None:
        held = self.held[resp.type_url]
        for r in resp.resources:
            held[r.name] = r.resource.SerializeToString()
        for n in resp.removed_resources:
            held.pop(n, None)
        self.client.ack(resp.type_url)

    def check(self, world: World) -> None:
        for t in self.wanted:
            sub = self.client.stream.subs[t]
            want = truth(world, t, sub.names, sub.wildcard, delta=True)
            assert self.held[t] == want, (t, sorted(self.held[t]), sorted(want))


def play(world: World, model: SotwModel | DeltaModel, script: list[tuple[Any, ...]]) -> None:
    """Every step of `script`, the client checked against the truth after each."""
    for step in script:
        if step[0] == "subscribe":
            model.subscribe(step[1], step[2])
        else:
            apply_step(world, step)
        model.drain()
        model.check(world)


@settings(max_examples=150, deadline=None)
@given(st.lists(steps, min_size=1, max_size=12))
def test_a_sotw_client_converges_to_the_truth_and_then_hears_nothing(
        script: list[tuple[Any, ...]]) -> None:
    world = World(with_services=False)
    model = SotwModel(world.sotw())
    play(world, model, script)
    for t in list(model.asked):
        model.client.ack(t, model.asked[t])
    assert model.drain() == 0


@settings(max_examples=150, deadline=None)
@given(st.lists(steps, min_size=1, max_size=12))
def test_a_delta_client_converges_to_the_truth_and_then_hears_nothing(
        script: list[tuple[Any, ...]]) -> None:
    world = World(with_services=False)
    model = DeltaModel(world.delta())
    play(world, model, script)
    for t in list(model.wanted):
        model.client.ack(t)
    assert model.drain() == 0
