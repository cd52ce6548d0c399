"""The source's truth, recorded on the server side of `meshbridge compare`.

`TruthRecorder` is a View subscriber like any protocol stream: it joins the View of
every followed target and is called synchronously inside `Cluster.apply`, right
after the sim source emitted the change that caused the new version. So each
version is recorded with the emission time and index of its change: the start of
every latency measured, and the key to attribute bytes to changes.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from bridge.authority import AuthorityError, parse_authority
from bridge.model import EndpointId, ResolvedEndpoint, ViewKey
from bridge.views import View, ViewChange, ViewRegistry
from harness.normalize import NormalEndpoint, State, digest

INITIAL = -1  # the change index of a target's state before any churn


@dataclass(frozen=True, slots=True)
class TruthVersion:
    version: int
    change: int  # index of the sim change that caused it; INITIAL before the churn
    at_ns: int  # monotonic emission time of that change (0 for the initial state)
    digest: str  # address digest of the endpoints clients must hold
    endpoints: int
    added: int = 0
    removed: int = 0


@dataclass(frozen=True, slots=True)
class Emission:
    index: int
    pattern: str
    at_ns: int


def truth_state(snapshot: Mapping[EndpointId, ResolvedEndpoint]) -> State:
    """What every client of the View must hold: its ready endpoints, by address.

    The address is what both protocols agree on by definition; the protocols' own
    readiness policies differ only for terminating endpoints, which the sim never
    makes."""
    return frozenset(
        NormalEndpoint(str(ipaddress.ip_address(r.endpoint.ip)), r.endpoint.port)
        for r in snapshot.values() if r.endpoint.ready
    )


@dataclass(slots=True, eq=False)  # a View keys its subscribers by identity
class TruthRecorder:
    """A View subscriber per followed target, keeping every version's state."""

    cluster_domain: str = "cluster.local"
    versions: dict[str, list[TruthVersion]] = field(default_factory=dict)
    final: dict[str, State] = field(default_factory=dict)
    emissions: list[Emission] = field(default_factory=list)
    _targets: dict[ViewKey, str] = field(default_factory=dict)
    _views: dict[str, View] = field(default_factory=dict)
    _current: Emission | None = None

    # -- the sim source's hook: (change index, pattern, its own clock), called
    # right before the change is applied. We take our own monotonic time, which
    # the client process shares.
    def on_emit(self, index: int, pattern: str, _at: float) -> None:
        emission = Emission(index, pattern, time.monotonic_ns())
        self.emissions.append(emission)
        self._current = emission

    def follow(self, views: ViewRegistry, targets: Iterable[str]) -> None:
        for target in targets:
            try:
                key = parse_authority(target, self.cluster_domain, default_port=None)
            except AuthorityError as e:
                raise ValueError(f"{target}: {e}") from None
            self._targets[key] = target
            view = views.subscribe(key, self, "compare")
            self._views[target] = view
            state = truth_state(view.snapshot)
            self.final[target] = state
            self.versions[target] = [
                TruthVersion(view.version, INITIAL, 0, digest(state), len(state))]

    def unfollow(self, views: ViewRegistry) -> None:
        for key in list(self._targets):
            views.unsubscribe(key, self)
        self._targets.clear()

    def on_view_change(self, view: View, change: ViewChange) -> None:
        target = self._targets.get(view.key)
        if target is None:
            return
        state = truth_state(change.current)
        em = self._current
        self.final[target] = state
        self.versions[target].append(TruthVersion(
            change.version, em.index if em is not None else INITIAL,
            em.at_ns if em is not None else time.monotonic_ns(), digest(state), len(state),
            len(change.added), len(change.removed)))

    def churn_versions(self) -> int:
        return sum(1 for vs in self.versions.values() for v in vs if v.change != INITIAL)
