"""One filter key of one service port: its snapshot, its diff, its subscribers.

Linkerd's filtered listener group (Linkerd §4.6): every subscriber whose request filters
the port's endpoints the same way shares one View, so a change is filtered and diffed
once for all of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from bridge.cluster import Cluster
from bridge.model import BASE_WEIGHT, Endpoint, EndpointId, MeshConfig, ResolvedEndpoint, ViewKey
from bridge.view_metrics import ViewMetrics

Snapshot = Mapping[EndpointId, ResolvedEndpoint]
EMPTY: Snapshot = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ViewChange:
    """One published version of a View and how it differs from the one before."""

    version: int
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
        self._cluster = cluster
        self._config = config
        self._metrics = metrics
        self.version = 0
        # When the current version was published (time.monotonic()): the start of every
        # change-to-client latency the protocol layers measure.
        self.published_at = 0.0
        self.snapshot: Snapshot = EMPTY
        self.exists = False
        self.subscribers: dict[ViewSubscriber, str] = {}  # subscriber -> protocol label
        # Per-version scratch space for the protocol layers' encoded bytes, cleared on
        # every new version, so N subscribers cost one serialization.
        self.cache: dict[Hashable, Any] = {}
        self.diff_computations = 0

    def cached(self, key: Hashable, build: Callable[[], Any]) -> Any:
        try:
            return self.cache[key]
        except KeyError:
            value = self.cache[key] = build()
            return value

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
        counts: dict[str, int] = {}
        for proto in self.subscribers.values():
            counts[proto] = counts.get(proto, 0) + 1
        return counts

    # ------------------------------------------------------------- publishing

    def publish(self, available: Mapping[EndpointId, Endpoint], exists: bool) -> None:
        """Filter, diff against the snapshot, and tell every subscriber (publishDiff)."""
        previous = self.snapshot
        filtered = self.filter(available, previous)
        self.diff_computations += 1
        # Unchanged endpoints are the very objects of the previous snapshot (see
        # filter), so `is` settles most comparisons without looking inside.
        added = tuple(r for i, r in sorted(filtered.items())
                      if (p := previous.get(i)) is not r and p != r)
        removed = tuple(r for i, r in sorted(previous.items()) if i not in filtered)
        exists_changed = exists != self.exists
        if not added and not removed and not exists_changed and self.version:
            return
        self.version += 1
        self.published_at = time.monotonic()
        self.exists = exists
        self.snapshot = MappingProxyType(filtered)
        self.cache = {}
        change = ViewChange(self.version, previous, self.snapshot, added, removed,
                            exists_changed)
        if self._metrics is not None:
            self._metrics.published(self)
        for sub in list(self.subscribers):
            sub.on_view_change(self, change)

    def filter(
        self, available: Mapping[EndpointId, Endpoint], previous: Snapshot = EMPTY,
    ) -> dict[EndpointId, ResolvedEndpoint]:
        """Apply the filter key (Linkerd §4.6, filterAddresses) and resolve what depends on
        the subscriber: zone locality and weight. An endpoint resolved as in `previous`
        is that very object, so the diff can compare by identity."""
        fk = self.key.filter
        cluster, config = self._cluster, self._config
        cands = list(available.values())
        if fk.hostname:
            cands = [e for e in cands if e.hostname == fk.hostname]
        node_zone = cluster.node_zone(fk.node_name) if fk.node_name else ""
        if fk.filtering:
            svc = cluster.services.get(self.key.service)
            if svc is not None and svc.internal_traffic_local:
                # No fallback: a client on a node without endpoints gets none.
                cands = [e for e in cands if e.pod_name and e.node_name == fk.node_name]
            else:
                cands = _filter_by_hints(cands, node_zone)
        cands = _select_family(cands, config.enable_ipv6)
        out: dict[EndpointId, ResolvedEndpoint] = {}
        for e in cands:
            locality = "unknown"
            if node_zone and e.zone is not None:
                locality = "local" if e.zone == node_zone else "remote"
            weight = BASE_WEIGHT
            if config.zone_weights and locality == "local":
                weight *= 10
            prev = previous.get(e.id)
            if (prev is not None and prev.endpoint is e and prev.zone_locality == locality
                    and prev.weight == weight):
                out[e.id] = prev
            else:
                out[e.id] = ResolvedEndpoint(e, locality, weight)
        return out


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
    v6_pods = {(e.id.namespace, e.id.name) for e in cands
               if e.id.kind == "pod" and e.id.family == "IPv6"}
    return [
        e for e in cands
        if not (e.id.kind == "pod" and e.id.family == "IPv4"
                and (e.id.namespace, e.id.name) in v6_pods)
    ]
