"""One filter key of one service port: its snapshot, its diff, its subscribers.

Linkerd's filtered listener group (Linkerd §4.6): every subscriber whose request filters
the port's endpoints the same way shares one View, so a change is filtered and diffed
once for all of them.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol, TypeVar, cast

from bridge.cluster import Cluster
from bridge.model import BASE_WEIGHT, Endpoint, EndpointId, MeshConfig, ResolvedEndpoint, ViewKey
from bridge.views.derived import Derivation, Derived
from bridge.views.metrics import ViewMetrics
from bridge.views.snapshot import EndpointSnapshot

# What a version of a View is read as; each View's versions are `EndpointSnapshot`s.
Snapshot = Mapping[EndpointId, ResolvedEndpoint]
EMPTY: Snapshot = MappingProxyType({})

D = TypeVar("D", bound=Derived)


@dataclass(frozen=True, slots=True)
class ViewChange:
    """One published version of a View and how it differs from the one before."""

    version: int
    # Both persistent versions (bridge.views.snapshot): nothing was copied to make
    # them; `added` and `removed` are the delta between them.
    previous: Snapshot
    current: Snapshot
    added: tuple[ResolvedEndpoint, ...]  # new or changed, in id order
    removed: tuple[ResolvedEndpoint, ...]  # as last published, in id order
    exists_changed: bool = False


class ViewSubscriber(Protocol):
    def on_view_change(self, view: View, change: ViewChange) -> None:
        """Called on the event loop after each new version; must not block."""


class View:
    """The shared state of every subscriber of one (service, port, filter key)."""

    def __init__(self, key: ViewKey, cluster: Cluster, config: MeshConfig,
                 metrics: ViewMetrics | None = None) -> None:
        self.key = key
        self.cluster = cluster  # where its endpoints come from (its port publisher's)
        self._config = config
        self._metrics = metrics
        self.version = 0
        # When the current version was published (time.monotonic()): the start of every
        # change-to-client latency the protocol layers measure.
        self.published_at = 0.0
        # Its own chain of versions: one View's versions never share a dict with another's.
        self.snapshot: EndpointSnapshot = EndpointSnapshot()
        self.exists = False
        # What the last version was filtered from, and the whole-set rules it was
        # filtered under, so that a change can be filtered alone (`publish`).
        self._available: Mapping[EndpointId, Endpoint] | None = None
        self._rules = _Rules("", False, False)
        self._hints = _HintCounts()
        self.subscribers: dict[ViewSubscriber, str] = {}  # subscriber -> protocol label
        # What the protocol layers derive from this View's versions (their encoded
        # bytes among them), advanced with each version: N subscribers cost one
        # serialization (bridge.views.derived).
        self._derived: dict[Derivation[Any], Derived] = {}
        self.diff_computations = 0
        # False for a View whose endpoints each come filtered already (one served from
        # other clusters' Views, bridge.multicluster): only locality and weight then.
        self.filters = True

    def derived(self, how: Derivation[D]) -> D:
        """The value `how` derives from this View: made on first use, then advanced
        with every version this View publishes, before its subscribers hear of it."""
        value = self._derived.get(how)
        if value is None:
            value = self._derived[how] = how.make(self)
        return cast(D, value)

    # ------------------------------------------------------------- subscribers

    def add_subscriber(self, subscriber: ViewSubscriber, protocol: str) -> None:
        self.subscribers[subscriber] = protocol
        if self._metrics is not None:
            self._metrics.subscribed(self)

    def remove_subscriber(self, subscriber: ViewSubscriber) -> bool:
        """Forget `subscriber`; True when none is left (the View's series are gone)."""
        self.subscribers.pop(subscriber, None)
        if self._metrics is not None:
            self._metrics.subscribed(self)
        if self.subscribers:
            return False
        if self._metrics is not None:
            self._metrics.dropped(self)
        return True

    def subscriber_counts(self) -> dict[str, int]:
        """Client streams by protocol. A subscriber may stand for several (a worker's
        feed stands for that worker's streams: its `weight`)."""
        counts: dict[str, int] = {}
        for sub, proto in self.subscribers.items():
            counts[proto] = counts.get(proto, 0) + getattr(sub, "weight", 1)
        return counts

    def subscriber_total(self) -> int:
        return sum(getattr(sub, "weight", 1) for sub in self.subscribers)

    def reweighed(self) -> None:
        """A subscriber's weight changed: its metrics say so."""
        if self._metrics is not None:
            self._metrics.subscribed(self)

    # ------------------------------------------------------------- publishing

    def publish(self, available: Mapping[EndpointId, Endpoint], exists: bool,
                changed: Collection[EndpointId] | None = None) -> None:
        """Filter, diff against the snapshot, and tell every subscriber (publishDiff).

        `changed` names the ids of `available` that differ from the version last
        published here, when nothing else the filter reads has changed (the service,
        the nodes): then only those are filtered and diffed, unless the change flips
        a whole-set rule (topology hints), which refilters everything. None: refilter
        everything."""
        self.diff_computations += 1
        previous = self.snapshot
        if changed is not None and self._available is not None:
            changes = self._filter_changed(available, changed)
        else:
            changes = None
        if changes is None:
            changes = self._filter_all(available)
        self._available = available
        exists_changed = exists != self.exists
        if not changes and not exists_changed and self.version:
            return
        new: list[tuple[EndpointId, ResolvedEndpoint]] = []
        gone: list[EndpointId] = []
        for i, r in changes.items():
            if r is None:
                gone.append(i)
            else:
                new.append((i, r))
        new.sort(key=_first)
        gone.sort()
        added = tuple(r for _, r in new)
        removed = tuple(previous[i] for i in gone)
        self.version += 1
        self.published_at = time.monotonic()
        self.exists = exists
        self.snapshot = current = previous.evolve(changes)
        change = ViewChange(self.version, previous, current, added, removed, exists_changed)
        for value in list(self._derived.values()):
            value.advance(change)
        if self._metrics is not None:
            self._metrics.published(self)
        for sub in list(self.subscribers):
            sub.on_view_change(self, change)

    def _filter_all(
        self, available: Mapping[EndpointId, Endpoint],
    ) -> dict[EndpointId, ResolvedEndpoint | None]:
        """Every endpoint filtered again: the delta from the snapshot (None removes)."""
        previous = self.snapshot
        filtered = self.filter(available, previous)
        self._rules = self._read_rules()
        self._hints = _HintCounts()
        for e in available.values():
            if self._host_ok(e):
                self._hints.count(e, self._rules.node_zone, 1)
        changes: dict[EndpointId, ResolvedEndpoint | None] = {
            i: r for i, r in filtered.items()
            if (p := previous.get(i)) is not r and p != r
        }
        for i in previous:
            if i not in filtered:
                changes[i] = None
        return changes

    def _filter_changed(
        self, available: Mapping[EndpointId, Endpoint], changed: Collection[EndpointId],
    ) -> dict[EndpointId, ResolvedEndpoint | None] | None:
        """Only `changed` filtered again; None when the change flips the hint rule."""
        rules, hints, last = self._rules, self._hints, self._available
        assert last is not None
        mode = hints.matching()
        for i in changed:
            old, new = last.get(i), available.get(i)
            if old is not None and self._host_ok(old):
                hints.count(old, rules.node_zone, -1)
            if new is not None and self._host_ok(new):
                hints.count(new, rules.node_zone, 1)
        if rules.hinted and hints.matching() != mode:
            return None
        ids = set(changed)
        if self._config.enable_ipv6:
            # A dual-stack pod's IPv4 endpoint is shown only without its IPv6 one.
            ids.update(EndpointId("pod", i.namespace, i.name, "IPv4", i.cluster)
                       for i in changed if i.kind == "pod" and i.family == "IPv6")
        previous = self.snapshot
        changes: dict[EndpointId, ResolvedEndpoint | None] = {}
        for i in ids:
            r = self._resolve(available, i, previous.get(i))
            p = previous.get(i)
            if r is None:
                if p is not None:
                    changes[i] = None
            elif p is not r and p != r:
                changes[i] = r
        return changes

    def _host_ok(self, e: Endpoint) -> bool:
        host = self.key.filter.hostname
        return not host or e.hostname == host

    def _passes(self, e: Endpoint) -> bool:
        """The per-endpoint part of `filter`, under the current whole-set rules."""
        if not self._host_ok(e):
            return False
        rules = self._rules
        if rules.local_only:
            return bool(e.pod_name) and e.node_name == self.key.filter.node_name
        if rules.hinted and self._hints.matching():
            return bool(e.for_zones) and rules.node_zone in (e.for_zones or ())
        return True

    def _resolve(self, available: Mapping[EndpointId, Endpoint], i: EndpointId,
                 prev: ResolvedEndpoint | None) -> ResolvedEndpoint | None:
        e = available.get(i)
        if e is None or not self._passes(e):
            return None
        if i.family == "IPv6" and not self._config.enable_ipv6:
            return None
        if i.kind == "pod" and i.family == "IPv4" and self._config.enable_ipv6:
            v6 = available.get(EndpointId("pod", i.namespace, i.name, "IPv6", i.cluster))
            if v6 is not None and self._passes(v6):
                return None
        return _resolved(e, self._rules.node_zone, self._config, prev)

    def _read_rules(self) -> _Rules:
        fk = self.key.filter
        node_zone = self.cluster.node_zone(fk.node_name) if fk.node_name else ""
        local_only = hinted = False
        if fk.filtering and self.filters:
            svc = self.cluster.services.get(self.key.service)
            local_only = svc is not None and svc.internal_traffic_local
            hinted = not local_only
        return _Rules(node_zone, local_only, hinted)

    def filter(
        self, available: Mapping[EndpointId, Endpoint], previous: Mapping[
            EndpointId, ResolvedEndpoint] = EMPTY,
    ) -> dict[EndpointId, ResolvedEndpoint]:
        """Apply the filter key (Linkerd §4.6, filterAddresses) and resolve what depends on
        the subscriber: zone locality and weight. An endpoint resolved as in `previous`
        is that very object, so the diff can compare by identity."""
        fk = self.key.filter
        cluster, config = self.cluster, self._config
        cands = list(available.values())
        if fk.hostname:
            cands = [e for e in cands if e.hostname == fk.hostname]
        node_zone = cluster.node_zone(fk.node_name) if fk.node_name else ""
        if fk.filtering and self.filters:
            svc = cluster.services.get(self.key.service)
            if svc is not None and svc.internal_traffic_local:
                # No fallback: a client on a node without endpoints gets none.
                cands = [e for e in cands if e.pod_name and e.node_name == fk.node_name]
            else:
                cands = _filter_by_hints(cands, node_zone)
        cands = _select_family(cands, config.enable_ipv6)
        return {e.id: _resolved(e, node_zone, config, previous.get(e.id)) for e in cands}


@dataclass(frozen=True, slots=True)
class _Rules:
    """What the filter reads besides the endpoints, fixed between full refilters
    (a Service or Node change always refilters everything)."""

    node_zone: str
    local_only: bool  # internalTrafficPolicy: Local
    hinted: bool  # topology hints apply


@dataclass(slots=True)
class _HintCounts:
    """Ready candidates (after the hostname filter), so whether hints apply is known
    without looking at every endpoint (`_filter_by_hints`)."""

    ready: int = 0
    unhinted: int = 0  # ready, without hints
    zoned: int = 0  # ready and hinted for the subscriber's zone

    def count(self, e: Endpoint, node_zone: str, sign: int) -> None:
        if not e.ready:
            return
        self.ready += sign
        if not e.for_zones:
            self.unhinted += sign
        elif node_zone in e.for_zones:
            self.zoned += sign

    def matching(self) -> bool:
        return self.ready > 0 and self.unhinted == 0 and self.zoned > 0


def _resolved(e: Endpoint, node_zone: str, config: MeshConfig,
              prev: ResolvedEndpoint | None) -> ResolvedEndpoint:
    locality = "unknown"
    if node_zone and e.zone is not None:
        locality = "local" if e.zone == node_zone else "remote"
    weight = BASE_WEIGHT
    if config.zone_weights and locality == "local":
        weight *= 10
    if (prev is not None and prev.endpoint is e and prev.zone_locality == locality
            and prev.weight == weight):
        return prev
    return ResolvedEndpoint(e, locality, weight)


def _first(pair: tuple[EndpointId, ResolvedEndpoint]) -> EndpointId:
    return pair[0]


def _filter_by_hints(cands: list[Endpoint], node_zone: str) -> list[Endpoint]:
    """Topology-aware hints: only when every ready candidate carries hints; fall back to
    all candidates when none is hinted for the subscriber's zone."""
    ready = [e for e in cands if e.ready]
    if not ready or any(not e.for_zones for e in ready):
        return cands
    matching = [e for e in cands if e.for_zones and node_zone in e.for_zones]
    if not any(e.ready for e in matching):
        return cands
    return matching


def _select_family(cands: list[Endpoint], enable_ipv6: bool) -> list[Endpoint]:
    """IPv4 only, or a dual-stack pod's IPv6 endpoint in place of its IPv4 one."""
    if not enable_ipv6:
        return [e for e in cands if e.id.family != "IPv6"]
    v6_pods = {(e.id.cluster, e.id.namespace, e.id.name) for e in cands
               if e.id.kind == "pod" and e.id.family == "IPv6"}
    return [
        e for e in cands
        if not (e.id.kind == "pod" and e.id.family == "IPv4"
                and (e.id.cluster, e.id.namespace, e.id.name) in v6_pods)
    ]
