"""The source's truth, recorded on the server side of `meshbridge compare`.

`TruthRecorder` is a View subscriber like any protocol stream: it joins the View of
every followed target and is called synchronously inside `Cluster.apply`, right
after the sim source emitted the change that caused the new version. It keeps each
target's truth by the version's delta, so that it costs the server's loop what
changed, not the View's size. Each version is recorded with the emission time and
index of its change: the start of every latency measured, and the key to attribute
bytes to changes.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from bridge.authority import AuthorityError, parse_authority
from bridge.model import EndpointId, ResolvedEndpoint, ViewKey
from bridge.views import View, ViewChange, ViewRegistry
from harness.normalize import NormalEndpoint, State, address_term, sum_digest

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


def truth_entry(r: ResolvedEndpoint) -> NormalEndpoint | None:
    """What every client of the View must hold for one of its endpoints: its address,
    if it is ready.

    The address is what both protocols agree on by definition; the protocols' own
    readiness policies differ only for terminating endpoints, which the sim never
    makes."""
    if not r.endpoint.ready:
        return None
    return NormalEndpoint(str(ipaddress.ip_address(r.endpoint.ip)), r.endpoint.port)


def truth_state(snapshot: Mapping[EndpointId, ResolvedEndpoint]) -> State:
    """The whole truth of a View version (what `TargetTruth` keeps change by change)."""
    return frozenset(e for r in snapshot.values() if (e := truth_entry(r)) is not None)


@dataclass(slots=True)
class TargetTruth:
    """One followed target's truth, kept up to date by each version's delta: a change
    costs the recorder what changed, not the View's size (it runs inside
    `Cluster.apply`, on the server's loop, ahead of the clients' updates)."""

    by_id: dict[EndpointId, NormalEndpoint] = field(default_factory=dict)
    # Addresses held, with how many endpoint ids give each (a client holds one).
    counts: dict[NormalEndpoint, int] = field(default_factory=dict)
    total: int = 0  # the address digest's sum (harness.normalize.sum_digest)

    def _add(self, rid: EndpointId, e: NormalEndpoint) -> None:
        self.by_id[rid] = e
        n = self.counts.get(e, 0)
        self.counts[e] = n + 1
        if not n:
            self.total += address_term(e.addr)

    def _drop(self, rid: EndpointId) -> None:
        e = self.by_id.pop(rid, None)
        if e is None:
            return
        n = self.counts[e] - 1
        if n:
            self.counts[e] = n
        else:
            del self.counts[e]
            self.total -= address_term(e.addr)

    def reset(self, snapshot: Mapping[EndpointId, ResolvedEndpoint]) -> None:
        self.by_id.clear()
        self.counts.clear()
        self.total = 0
        for rid, r in snapshot.items():
            e = truth_entry(r)
            if e is not None:
                self._add(rid, e)

    def apply(self, change: ViewChange) -> None:
        for r in change.removed:
            self._drop(r.id)
        for r in change.added:  # new or changed
            self._drop(r.id)
            e = truth_entry(r)
            if e is not None:
                self._add(r.id, e)

    def digest(self) -> str:
        return sum_digest(self.total)

    def state(self) -> State:
        return frozenset(self.counts)


@dataclass(slots=True, eq=False)  # a View keys its subscribers by identity
class TruthRecorder:
    """A View subscriber per followed target, keeping every version's digest."""

    cluster_domain: str = "cluster.local"
    versions: dict[str, list[TruthVersion]] = field(default_factory=dict)
    emissions: list[Emission] = field(default_factory=list)
    _truths: dict[str, TargetTruth] = field(default_factory=dict)
    _targets: dict[ViewKey, str] = field(default_factory=dict)
    _views: dict[str, View] = field(default_factory=dict)
    _current: Emission | None = None
    _final: dict[str, State] | None = None
    # CPU seconds spent recording versions: the harness's share of `Cluster.apply`.
    cpu_seconds: float = 0.0

    # -- the sim source's hook: (change index, pattern, its own clock), called
    # right before the change is applied. We take our own monotonic time, which
    # the client process shares.
    def on_emit(self, index: int, pattern: str, _at: float) -> None:
        emission = Emission(index, pattern, time.monotonic_ns())
        self.emissions.append(emission)
        self._current = emission

    @property
    def final(self) -> dict[str, State]:
        """Each target's truth as it stands (built once per read after a change: at
        the settle and for the report, never per change)."""
        if self._final is None:
            self._final = {t: truth.state() for t, truth in self._truths.items()}
        return self._final

    def final_digests(self) -> dict[str, str]:
        """Each target's address digest as it stands, in O(targets)."""
        return {t: truth.digest() for t, truth in self._truths.items()}

    def follow(self, views: ViewRegistry, targets: Iterable[str]) -> None:
        for target in targets:
            try:
                key = parse_authority(target, self.cluster_domain, default_port=None)
            except AuthorityError as e:
                raise ValueError(f"{target}: {e}") from None
            self._targets[key] = target
            view = views.subscribe(key, self, "compare")
            self._views[target] = view
            truth = self._truths[target] = TargetTruth()
            truth.reset(view.snapshot)
            self._final = None
            self.versions[target] = [
                TruthVersion(view.version, INITIAL, 0, truth.digest(), len(truth.counts))]

    def unfollow(self, views: ViewRegistry) -> None:
        for key in list(self._targets):
            views.unsubscribe(key, self)
        self._targets.clear()

    def on_view_change(self, view: View, change: ViewChange) -> None:
        target = self._targets.get(view.key)
        if target is None:
            return
        t0 = time.process_time()
        truth = self._truths[target]
        truth.apply(change)
        self._final = None
        em = self._current
        self.versions[target].append(TruthVersion(
            change.version, em.index if em is not None else INITIAL,
            em.at_ns if em is not None else time.monotonic_ns(), truth.digest(),
            len(truth.counts), len(change.added), len(change.removed)))
        self.cpu_seconds += time.process_time() - t0

    def churn_versions(self) -> int:
        return sum(1 for vs in self.versions.values() for v in vs if v.change != INITIAL)
