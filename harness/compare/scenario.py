"""A comparison scenario: the sim source's scenario plus who watches it.

The `clients` section of a scenario file (which the sim source passes through
unread) says which measuring clients `meshbridge compare` starts and what each
follows:

    clients:
      linkerd: 10          # Linkerd proxies: one destination Get stream per target
      sotw: 10             # xDS clients, state of the world: one ADS stream each
      delta: 10            # xDS clients, incremental: one delta ADS stream each
      leds: 10             # xDS clients over LEDS: delta ADS, each endpoint its own
                           # LbEndpoint resource in a per-locality collection
      targets: 5           # services each client follows; "all" for every service
      selection: spread    # spread | same | random: which services those are
      kube_watchers: 100   # Kubernetes watchers of the endpoints API (kube-proxy on
                           # every node, ...) for the Endpoints vs EndpointSlice bytes

Client `i` of every model follows the same targets, so the models see identical
work. Every error is a `ScenarioError` naming the key (exit status 2).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from bridge.authority import format_authority
from bridge.model import ServiceKey
from bridge.sources.sim import Scenario, ScenarioError, load_scenario, parse_scenario

# Every measuring model, in the order they connect and appear in the report; adding
# one is a line here, its client in harness.compare.worker and its layer in run.py.
MODELS = ("linkerd", "sotw", "delta", "leds")
XDS_MODELS = frozenset({"sotw", "delta", "leds"})
MODEL_TITLES = {
    "linkerd": "Linkerd Get (stream per target)",
    "sotw": "xDS SotW (ADS)",
    "delta": "xDS delta (ADS)",
    "leds": "xDS LEDS (delta ADS, endpoint per resource)",
    "envoy": "Envoy (xDS SotW, real proxy)",
}
SELECTIONS = ("spread", "same", "random")
MAX_CLIENTS = 10000
MAX_WATCHERS = 1_000_000
DEFAULT_COUNT = {"linkerd": 1, "sotw": 1, "delta": 1, "leds": 0}
CLIENT_KEYS = {*MODELS, "targets", "selection", "kube_watchers"}


@dataclass(frozen=True, slots=True)
class ClientPlan:
    linkerd: int = 1
    sotw: int = 1
    delta: int = 1
    leds: int = 0  # not in a scenario that predates it: its files keep their meaning
    targets: int | None = 1  # per client; None: every service
    selection: str = "spread"
    kube_watchers: int = 1

    def count(self, model: str) -> int:
        value: int = getattr(self, model)
        return value

    def only(self, model: str) -> ClientPlan:
        """The same plan with every other model's clients left out (`--isolate`)."""
        counts = {m: self.count(m) if m == model else 0 for m in MODELS}
        return ClientPlan(counts["linkerd"], counts["sotw"], counts["delta"], counts["leds"],
                          self.targets, self.selection, self.kube_watchers)


@dataclass(frozen=True, slots=True)
class ClientSpec:
    """One measuring client: its model, its index within the model, its targets."""

    model: str
    index: int
    targets: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.model}-{self.index}"


LINKED_MODES = ("federated", "remote-discovery")
LINKED_KEYS = {"name", "mode", "seed", "cluster", "churn"}
LINKED_POD_NETWORK = 128  # the linked sim's pod IPs: 10.128.0.0 upwards


@dataclass(frozen=True, slots=True)
class LinkedPlan:
    """A second cluster, linked (docs/multicluster.md): its own sim, with its own seed
    and churn, and how the clients' targets are served from it: `federated`, each
    `<svc>-federated` the union of the local and the linked service; or
    `remote-discovery`, each `<svc>-<name>` the linked service alone."""

    name: str
    mode: str
    scenario: Scenario

    def alias(self, service: str) -> str:
        """The local Service the clients ask for, instead of `service` itself."""
        return f"{service}-federated" if self.mode == "federated" else f"{service}-{self.name}"


def parse_linked(base: Scenario) -> LinkedPlan | None:
    raw = base.linked
    if not raw:
        return None
    unknown = sorted(set(raw) - LINKED_KEYS)
    if unknown:
        raise ScenarioError(f"linked: unknown key {unknown[0]!r} (allowed: "
                            f"{', '.join(sorted(LINKED_KEYS))})")
    name = raw.get("name", "east")
    if not isinstance(name, str) or not name.isalnum() or not name.islower():
        raise ScenarioError(f"linked.name: must be a lowercase word, got {name!r}")
    mode = raw.get("mode", "federated")
    if mode not in LINKED_MODES:
        raise ScenarioError(f"linked.mode: must be one of {', '.join(LINKED_MODES)}, "
                            f"got {mode!r}")
    cluster = raw.get("cluster") or {}
    churn = raw.get("churn")
    if not isinstance(cluster, Mapping) or (churn is not None and not isinstance(churn,
                                                                                 Mapping)):
        raise ScenarioError("linked.cluster and linked.churn: must be mappings")
    # The local cluster's shape and churn unless said otherwise, in pod IPs of its own;
    # the same duration (the churns run side by side).
    shape = {k: getattr(base.cluster, k) for k in base.cluster.__slots__}
    shape["pod_network"] = LINKED_POD_NETWORK
    own = {"rate": base.churn.rate, "patterns": dict(base.churn.patterns)}
    try:
        scenario = parse_scenario({"seed": raw.get("seed", base.seed + 1),
                                   "cluster": {**shape, **cluster},
                                   "churn": churn if churn is not None else own,
                                   "duration": base.duration, "name": f"{base.name}-{name}"})
    except ScenarioError as e:
        raise ScenarioError(f"linked.{e}") from None
    return LinkedPlan(name, str(mode), scenario)


@dataclass(frozen=True, slots=True)
class CompareScenario:
    scenario: Scenario
    clients: ClientPlan
    source: str = ""  # the file it came from
    linked: LinkedPlan | None = None

    @property
    def duration(self) -> float:
        assert self.scenario.duration is not None
        return self.scenario.duration

    def only(self, model: str) -> CompareScenario:
        """This scenario with one model's clients only: the same seeded churn."""
        return CompareScenario(self.scenario, self.clients.only(model), self.source,
                               self.linked)

    def services(self) -> list[tuple[str, str]]:
        """(namespace, name) of every sim service, in the sim's order."""
        shape = self.scenario.cluster
        return [(f"ns-{i % shape.namespaces}", f"svc-{i}") for i in range(shape.services)]

    def authority(self, namespace: str, name: str) -> str:
        """What clients ask for to follow the sim service `name` (with a linked
        cluster, the local Service serving it from there)."""
        if self.linked is not None:
            name = self.linked.alias(name)
        return format_authority(ServiceKey(namespace, name), self.scenario.cluster.port,
                                "cluster.local")

    def all_targets(self) -> list[str]:
        return [self.authority(ns, name) for ns, name in self.services()]

    def targets_of(self, index: int) -> tuple[str, ...]:
        """What client `index` (of any model) follows."""
        every = self.all_targets()
        n = len(every) if self.clients.targets is None else min(self.clients.targets,
                                                                 len(every))
        if self.clients.selection == "same":
            picked = every[:n]
        elif self.clients.selection == "random":
            rng = random.Random(self.scenario.seed * 1_000_003 + index)
            picked = sorted(rng.sample(every, n), key=every.index)
        else:  # spread: consecutive services, each client starting further on
            start = (index * n) % len(every)
            picked = [every[(start + k) % len(every)] for k in range(n)]
        return tuple(picked)

    def client_specs(self, models: tuple[str, ...] = MODELS) -> list[ClientSpec]:
        return [ClientSpec(m, i, self.targets_of(i))
                for m in models for i in range(self.clients.count(m))]

    def followed_targets(self) -> list[str]:
        """Every target some client follows, in the sim's order."""
        wanted = {t for s in self.client_specs() for t in s.targets}
        return [t for t in self.all_targets() if t in wanted]


def _int(section: Mapping[str, Any], key: str, lo: int, hi: int, default: int) -> int:
    v = section.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ScenarioError(f"clients.{key}: must be an integer in {lo}..{hi}, got {v!r}")
    return v


def parse_clients(raw: Mapping[str, Any], services: int) -> ClientPlan:
    unknown = sorted(set(raw) - CLIENT_KEYS)
    if unknown:
        raise ScenarioError(f"clients: unknown key {unknown[0]!r} (allowed: "
                            f"{', '.join(sorted(CLIENT_KEYS))})")
    counts = {m: _int(raw, m, 0, MAX_CLIENTS, DEFAULT_COUNT[m]) for m in MODELS}
    if not any(counts.values()):
        raise ScenarioError(f"clients: at least one of {', '.join(MODELS)} must be > 0")
    targets_raw = raw.get("targets", 1)
    targets: int | None
    if targets_raw == "all":
        targets = None
    else:
        targets = _int(raw, "targets", 1, 100000, 1)
        if targets > services:
            raise ScenarioError(f"clients.targets: {targets} is more than the cluster's "
                                f"{services} services (use \"all\")")
    selection = raw.get("selection", "spread")
    if selection not in SELECTIONS:
        raise ScenarioError(f"clients.selection: must be one of {', '.join(SELECTIONS)}, "
                            f"got {selection!r}")
    watchers = _int(raw, "kube_watchers", 1, MAX_WATCHERS, 1)
    return ClientPlan(counts["linkerd"], counts["sotw"], counts["delta"], counts["leds"],
                      targets, str(selection), watchers)


def check_for_compare(scenario: Scenario, duration: float | None = None) -> CompareScenario:
    """What `compare` needs beyond what the sim accepts: a bounded run and clients."""
    if duration is not None:
        if duration <= 0:
            raise ScenarioError(f"--duration: must be > 0, got {duration!r}")
        scenario = _with_duration(scenario, duration)
    if scenario.duration is None and not scenario.routes:
        # A route-edit run (harness.compare.route_edit) is bounded by its edits.
        raise ScenarioError("duration: compare needs a bounded run (seconds of churn)")
    clients = parse_clients(scenario.clients, scenario.cluster.services)
    return CompareScenario(scenario, clients, linked=parse_linked(scenario))


def _with_duration(scenario: Scenario, duration: float) -> Scenario:
    return replace(scenario, duration=float(duration))


def load_compare_scenario(path: Path, duration: float | None = None) -> CompareScenario:
    if path.is_dir():
        raise ScenarioError(f"{path}: is a directory, not a scenario file")
    cs = check_for_compare(load_scenario(path), duration)
    return CompareScenario(cs.scenario, cs.clients, str(path), cs.linked)


def parse_compare_scenario(text: str, name: str = "scenario") -> CompareScenario:
    """From YAML text (for tests)."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ScenarioError(f"{name}: not valid YAML: {str(e).splitlines()[0]}") from None
    return check_for_compare(parse_scenario(raw, name))
