"""The sim source: a synthetic cluster with seeded churn, for experiments and benchmarks.

A scenario file fixes the cluster's shape and the churn; the same seed always yields
the same sequence of events (`SimCluster.changes()` is a pure generator), and `run`
only paces that sequence at the configured rate.

Scenario (YAML):

    seed: 7
    cluster:
      namespaces: 2            # ns-0, ns-1, ...
      services: 20             # svc-0 ... spread round-robin over the namespaces
      endpoints_per_service: 10
      zones: 3                 # zone-a, zone-b, ...; one node per zone
      slice_size: 100          # endpoints per EndpointSlice, as the slice controller caps
      port: 8080
      meshed: true             # pods carry a Linkerd proxy
    churn:
      rate: 20                 # changes per second; 0 = a static cluster
      patterns: {rolling_restart: 1, scale: 1, zone_loss: 0.2, flap: 1}   # relative weights
    duration: 30               # seconds of churn; omit to churn until stopped
    clients: {...}             # read by `meshbridge compare`, ignored here
    linked: {...}              # a second, linked cluster (`meshbridge compare`)
"""

from __future__ import annotations

import asyncio
import itertools
import random
import string
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bridge.cluster import Cluster, Event, EventType
from bridge.decoding import Meta, OwnerRef
from bridge.objects import (
    Container,
    ContainerPort,
    EndpointSlice,
    KubeObject,
    Node,
    Pod,
    ReplicaSet,
    Service,
    ServicePort,
    SliceEndpoint,
    SlicePort,
    TargetRef,
)


class ScenarioError(ValueError):
    """A scenario we cannot run; the message names the key or path."""


DEFAULT_RATE = 10.0
PATTERNS = ("rolling_restart", "scale", "zone_loss", "flap")


@dataclass(frozen=True, slots=True)
class ClusterShape:
    namespaces: int = 1
    services: int = 10
    endpoints_per_service: int = 5
    zones: int = 3
    slice_size: int = 100
    port: int = 8080
    meshed: bool = True
    # Pod IPs are 10.<pod_network + n>.x.y: another cluster's sim takes another range.
    pod_network: int = 64


@dataclass(frozen=True, slots=True)
class Churn:
    rate: float = DEFAULT_RATE
    patterns: Mapping[str, float] = field(
        default_factory=lambda: {"rolling_restart": 1.0, "scale": 1.0, "zone_loss": 0.2,
                                 "flap": 1.0}
    )


@dataclass(frozen=True, slots=True)
class Scenario:
    seed: int = 1
    cluster: ClusterShape = field(default_factory=ClusterShape)
    churn: Churn = field(default_factory=Churn)
    duration: float | None = None
    clients: Mapping[str, Any] = field(default_factory=dict)
    name: str = "scenario"
    # A second cluster linked to this one (read by `meshbridge compare`).
    linked: Mapping[str, Any] = field(default_factory=dict)
    # Route edits for `meshbridge compare` (harness.compare.route_edit), passed through
    # unread as `clients` is.
    routes: Mapping[str, Any] = field(default_factory=dict)


_SHAPE_LIMITS = {
    "namespaces": (1, 1000), "services": (1, 100000), "endpoints_per_service": (0, 10000),
    "zones": (1, 26), "slice_size": (1, 1000), "port": (1, 65535), "pod_network": (0, 191),
}


def _check_keys(section: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(section) - allowed)
    if unknown:
        raise ScenarioError(f"{where}: unknown key {unknown[0]!r} (allowed: "
                            f"{', '.join(sorted(allowed))})")


def parse_scenario(raw: Any, name: str = "scenario") -> Scenario:
    if not isinstance(raw, Mapping):
        raise ScenarioError("scenario: the top level must be a mapping")
    _check_keys(raw, {"seed", "cluster", "churn", "duration", "clients", "name", "linked",
                      "routes"},
                "scenario")
    seed = raw.get("seed", 1)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ScenarioError(f"seed: must be an integer, got {seed!r}")
    cl = raw.get("cluster") or {}
    if not isinstance(cl, Mapping):
        raise ScenarioError("cluster: must be a mapping")
    _check_keys(cl, set(_SHAPE_LIMITS) | {"meshed"}, "cluster")
    shape_args: dict[str, Any] = {}
    for key, (lo, hi) in _SHAPE_LIMITS.items():
        if key in cl:
            v = cl[key]
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ScenarioError(f"cluster.{key}: must be an integer in {lo}..{hi}, got {v!r}")
            shape_args[key] = v
    if "meshed" in cl:
        if not isinstance(cl["meshed"], bool):
            raise ScenarioError("cluster.meshed: must be true or false")
        shape_args["meshed"] = cl["meshed"]
    ch = raw.get("churn") or {}
    if not isinstance(ch, Mapping):
        raise ScenarioError("churn: must be a mapping")
    _check_keys(ch, {"rate", "patterns"}, "churn")
    rate = ch.get("rate", DEFAULT_RATE)
    if isinstance(rate, bool) or not isinstance(rate, int | float) or rate < 0:
        raise ScenarioError(f"churn.rate: must be a number >= 0, got {rate!r}")
    patterns: dict[str, float] = dict(Churn().patterns)
    if "patterns" in ch:
        pt = ch["patterns"]
        if not isinstance(pt, Mapping):
            raise ScenarioError("churn.patterns: must be a mapping of pattern to weight")
        _check_keys(pt, set(PATTERNS), "churn.patterns")
        patterns = {}
        for k, w in pt.items():
            if isinstance(w, bool) or not isinstance(w, int | float) or w < 0:
                raise ScenarioError(f"churn.patterns.{k}: must be a weight >= 0, got {w!r}")
            patterns[k] = float(w)
        if rate > 0 and not any(patterns.values()):
            raise ScenarioError("churn.patterns: at least one pattern needs a weight > 0")
    duration = raw.get("duration")
    if duration is not None and (
        isinstance(duration, bool) or not isinstance(duration, int | float) or duration <= 0
    ):
        raise ScenarioError(f"duration: must be a number of seconds > 0, got {duration!r}")
    clients = raw.get("clients") or {}
    if not isinstance(clients, Mapping):
        raise ScenarioError("clients: must be a mapping")
    linked = raw.get("linked") or {}
    if not isinstance(linked, Mapping):
        raise ScenarioError("linked: must be a mapping")
    routes = raw.get("routes") or {}
    if not isinstance(routes, Mapping):
        raise ScenarioError("routes: must be a mapping")
    return Scenario(
        seed=seed,
        cluster=ClusterShape(**shape_args),
        churn=Churn(float(rate), patterns),
        duration=float(duration) if duration is not None else None,
        clients=clients,
        name=str(raw.get("name", name)),
        linked=linked,
        routes=routes,
    )


def load_scenario(path: Path) -> Scenario:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ScenarioError(f"{path}: cannot read scenario ({e.strerror or e})") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ScenarioError(f"{path}: not valid YAML: {str(e).splitlines()[0]}") from None
    return parse_scenario(raw, name=path.stem)


# ------------------------------------------------------------------ the synthetic cluster


@dataclass(slots=True)
class _SimPod:
    name: str
    ip: str
    zone_index: int
    ready: bool = True
    slice: int = 0  # which of the service's EndpointSlices holds it (stays put)
    # Its slice entry as last built, and whether it was ready then: a slice is rebuilt
    # from its members' entries, so an unchanged member costs no new object.
    entry: SliceEndpoint | None = None


@dataclass(slots=True)
class _SimService:
    namespace: str
    name: str
    pods: list[_SimPod] = field(default_factory=list)
    restart_cursor: int = 0  # next pod a rolling restart replaces
    generation: int = 0
    # What each of its EndpointSlices last held, so only changed slices are written.
    slices: dict[int, tuple[SliceEndpoint, ...]] = field(default_factory=dict)
    # Each slice's pods, in the order of `pods`: a change rebuilds the slices it
    # touched from these, never the whole service (a one-pod change in a service of
    # 5,000 must cost the harness one slice, as it costs the server).
    members: dict[int, list[_SimPod]] = field(default_factory=dict)

    def place(self, pod: _SimPod) -> None:
        self.members.setdefault(pod.slice, []).append(pod)

    def unplace(self, pod: _SimPod) -> None:
        self.members[pod.slice].remove(pod)


class SimCluster:
    """The synthetic cluster's state and its seeded sequence of changes."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.shape = scenario.cluster
        self.rng = random.Random(scenario.seed)
        self.zones = [f"zone-{string.ascii_lowercase[i]}" for i in range(self.shape.zones)]
        self._ip_counter = 0
        self._resource_version = 0
        self.lost_zone: int | None = None
        self.flap_target: tuple[int, int] | None = None
        self.services: list[_SimService] = []
        for i in range(self.shape.services):
            svc = _SimService(f"ns-{i % self.shape.namespaces}", f"svc-{i}")
            for _ in range(self.shape.endpoints_per_service):
                pod = self._new_pod(svc)
                svc.pods.append(pod)
                svc.place(pod)
            self.services.append(svc)

    # -- building objects

    def _rv(self) -> str:
        self._resource_version += 1
        return str(self._resource_version)

    def _new_pod(self, svc: _SimService) -> _SimPod:
        self._ip_counter += 1
        n = self._ip_counter
        ip = f"10.{self.shape.pod_network + (n >> 16) % 64}.{(n >> 8) & 255}.{n & 255}"
        svc.generation += 1
        suffix = f"{svc.generation:05d}"
        return _SimPod(f"{svc.name}-{suffix}", ip, self.rng.randrange(self.shape.zones),
                       slice=self._slice_of_new_pod(svc))

    def _pod_object(self, svc: _SimService, pod: _SimPod) -> Pod:
        labels = {"app": svc.name, "pod-template-hash": "sim"}
        containers = [Container("app", (ContainerPort("http", self.shape.port),))]
        if self.shape.meshed:
            labels["linkerd.io/control-plane-ns"] = "linkerd"
            containers.append(Container(
                "linkerd-proxy",
                (ContainerPort("linkerd-proxy", 4143), ContainerPort("linkerd-admin", 4191)),
                {"LINKERD2_PROXY_INBOUND_LISTEN_ADDR": "0.0.0.0:4143",
                 "LINKERD2_PROXY_ADMIN_LISTEN_ADDR": "0.0.0.0:4191",
                 "LINKERD2_PROXY_CONTROL_LISTEN_ADDR": "0.0.0.0:4190"},
            ))
        return Pod(
            meta=Meta(pod.name, svc.namespace, self._rv(), labels,
                      owners=(OwnerRef("ReplicaSet", f"{svc.name}-sim"),)),
            service_account=svc.name,
            node_name=f"node-{self.zones[pod.zone_index]}",
            containers=tuple(containers),
            phase="Running",
            pod_ips=(pod.ip,),
        )

    def _slice_of_new_pod(self, svc: _SimService) -> int:
        """Like the EndpointSlice controller: fill the first slice with room; existing
        endpoints never move between slices."""
        k = 0
        while len(svc.members.get(k, ())) >= self.shape.slice_size:
            k += 1
        return k

    def _entry(self, svc: _SimService, p: _SimPod) -> SliceEndpoint:
        ready = p.ready and p.zone_index != self.lost_zone
        entry = p.entry
        if entry is None or entry.ready != ready:
            entry = p.entry = SliceEndpoint(
                addresses=(p.ip,),
                ready=ready,
                serving=ready,
                terminating=False,
                node_name=f"node-{self.zones[p.zone_index]}",
                zone=self.zones[p.zone_index],
                target=TargetRef("Pod", p.name, svc.namespace),
            )
        return entry

    def _slice_events(self, svc: _SimService, touched: Iterable[int] | None = None,
                      ) -> list[Event]:
        """ADDED/MODIFIED for each slice whose endpoints changed, DELETED for slices that
        emptied (slice 0 stays, empty, as the controller's placeholder). Only the slices
        `touched` are looked at (every slice when None)."""
        keys = sorted(set(svc.members) | set(svc.slices) | {0} if touched is None
                      else set(touched))
        events: list[Event] = []
        for k in keys:
            pods = svc.members.get(k)
            if not pods and k != 0:
                svc.members.pop(k, None)
                if svc.slices.pop(k, None) is not None:
                    events.append(Event(EventType.DELETED, self._slice(svc, k, ())))
                continue
            eps = tuple(self._entry(svc, p) for p in pods or ())
            if svc.slices.get(k) == eps:
                continue
            kind = EventType.MODIFIED if k in svc.slices else EventType.ADDED
            svc.slices[k] = eps
            events.append(Event(kind, self._slice(svc, k, eps)))
        return events

    def _slice(self, svc: _SimService, k: int,
               endpoints: tuple[SliceEndpoint, ...]) -> EndpointSlice:
        return EndpointSlice(
            meta=Meta(f"{svc.name}-{k}", svc.namespace, self._rv(),
                      {"kubernetes.io/service-name": svc.name}),
            service_name=svc.name,
            address_type="IPv4",
            ports=(SlicePort("http", self.shape.port),),
            endpoints=endpoints,
        )

    def initial_objects(self) -> list[KubeObject]:
        objs: list[KubeObject] = []
        for z in self.zones:
            objs.append(Node(Meta(f"node-{z}", "", self._rv(),
                                  {"topology.kubernetes.io/zone": z,
                                   "topology.kubernetes.io/region": "sim"})))
        for svc in self.services:
            objs.append(ReplicaSet(Meta(f"{svc.name}-sim", svc.namespace, self._rv(),
                                        owners=(OwnerRef("Deployment", svc.name),))))
            objs.append(Service(
                meta=Meta(svc.name, svc.namespace, self._rv()),
                ports=(ServicePort("http", self.shape.port, "http", app_protocol="http"),),
            ))
            objs.extend(self._pod_object(svc, p) for p in svc.pods)
            objs.extend(e.obj for e in self._slice_events(svc))
        return objs

    # -- churn

    def changes(self) -> Iterator[tuple[str, list[Event]]]:
        """The endless, seeded sequence of (pattern, events) changes."""
        names = [p for p in PATTERNS if self.scenario.churn.patterns.get(p, 0) > 0]
        weights = [self.scenario.churn.patterns[p] for p in names]
        while names:
            pattern = self.rng.choices(names, weights)[0]
            yield pattern, getattr(self, f"_step_{pattern}")()

    def _changed(self, svc: _SimService, pods: list[Event], slice_: int) -> list[Event]:
        return pods + self._slice_events(svc, (slice_,))

    def _step_rolling_restart(self) -> list[Event]:
        svc = self.rng.choice(self.services)
        if not svc.pods:
            return self._step_scale(svc, up=True)
        i = svc.restart_cursor % len(svc.pods)
        svc.restart_cursor += 1
        old = svc.pods[i]
        new = self._new_pod(svc)
        new.slice = old.slice  # the replacement takes the old pod's place
        svc.pods[i] = new
        members = svc.members[old.slice]
        members[members.index(old)] = new
        added = Event(EventType.ADDED, self._pod_object(svc, new))
        deleted = Event(EventType.DELETED, self._pod_object(svc, old))
        return [*self._changed(svc, [added], old.slice), deleted]

    def _step_scale(self, svc: _SimService | None = None, up: bool | None = None) -> list[Event]:
        svc = svc or self.rng.choice(self.services)
        n = self.shape.endpoints_per_service
        if up is None:
            up = len(svc.pods) <= max(1, n // 2) or (
                len(svc.pods) < 2 * max(1, n) and self.rng.random() < 0.5
            )
        if up:
            pod = self._new_pod(svc)
            svc.pods.append(pod)
            svc.place(pod)
            return self._changed(svc, [Event(EventType.ADDED, self._pod_object(svc, pod))],
                                 pod.slice)
        gone = svc.pods.pop(self.rng.randrange(len(svc.pods)))
        svc.unplace(gone)
        return self._changed(svc, [Event(EventType.DELETED, self._pod_object(svc, gone))],
                             gone.slice)

    def _step_zone_loss(self) -> list[Event]:
        self.lost_zone = self.rng.randrange(self.shape.zones) if self.lost_zone is None else None
        events: list[Event] = []
        for svc in self.services:  # every endpoint of a zone: every slice may change
            events.extend(self._slice_events(svc))
        return events

    def _step_flap(self) -> list[Event]:
        if self.flap_target is None or not self.services[self.flap_target[0]].pods:
            candidates = [i for i, s in enumerate(self.services) if s.pods]
            if not candidates:
                return self._step_scale(self.services[0], up=True)
            self.flap_target = (candidates[0], 0)
        svc = self.services[self.flap_target[0]]
        pod = svc.pods[self.flap_target[1] % len(svc.pods)]
        pod.ready = not pod.ready
        return self._changed(svc, [], pod.slice)


EmitHook = Callable[[int, str, float], None]  # (change index, pattern, emit time)


class SimSource:
    def __init__(self, scenario: Scenario, on_emit: EmitHook | None = None,
                 start_churn: asyncio.Event | None = None) -> None:
        self.scenario = scenario
        # Churn waits for this (e.g. until every measuring client holds its snapshot).
        self.start_churn = start_churn
        self.name = f"sim:{scenario.name}"
        self.sim = SimCluster(scenario)
        self.on_emit = on_emit
        self.emitted = 0
        # CPU seconds this source spent making its changes (not applying them), so that
        # a measurement can tell the harness's share from the server's.
        self.cpu_seconds = 0.0
        self.finished = asyncio.Event()

    @property
    def stale(self) -> bool:
        return False

    async def run(self, cluster: Cluster, synced: asyncio.Event) -> None:
        cluster.apply(Event(EventType.ADDED, o) for o in self.sim.initial_objects())
        synced.set()
        rate = self.scenario.churn.rate
        if rate <= 0:
            self.finished.set()
            return
        if self.start_churn is not None:
            await self.start_churn.wait()
        interval = 1.0 / rate
        start = time.monotonic()
        deadline = start + self.scenario.duration if self.scenario.duration else None
        changes = self.sim.changes()
        for index in itertools.count():
            t0 = time.process_time()
            pattern, events = next(changes)
            self.cpu_seconds += time.process_time() - t0
            due = start + index * interval
            if deadline is not None and due >= deadline:
                break
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # pacing the churn rate, not synchronisation
            emitted_at = time.perf_counter()
            if self.on_emit is not None:
                self.on_emit(index, pattern, emitted_at)
            cluster.apply(events)
            self.emitted = index + 1
        self.finished.set()
