"""The cluster store: every linked cluster, each a Cluster cache of its own with its
own watches, kept in step with the Secrets (and `--link` flags) that name them.

Linkerd's cluster store, done as docs/multicluster.md says and where it says why:
  * a Secret added links its cluster; one whose add fails is retried (backoff while
    the API server does not answer or refuses, again whenever the Secret changes);
  * a Secret changed is applied make-before-break: the new watches sync beside the
    old ones and take over only once listed, as the real difference (a rotation that
    sees the same objects changes nothing);
  * a Secret deleted unlinks its cluster: its cache is emptied, so its endpoints leave
    every stream and ClusterLoadAssignment (`keep_on_unlink`, Linkerd 2.20's
    behaviour, leaves them with whoever has them);
  * what cannot be used is logged once per cause, naming the Secret or flag and what
    is wrong, and counted (`meshbridge_cluster_link_errors`); nothing else is affected.

What each linked cluster watches is what the local cluster wants from it (`Demand`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import prometheus_client
import structlog
from prometheus_client.core import GaugeMetricFamily

from bridge.cluster import Cluster, ClusterChange, Event, EventType, ListenerStage
from bridge.model import ClusterIdentity, ServiceKey
from bridge.multicluster import DEFAULT_SYNC_TIMEOUT
from bridge.multicluster.demand import Demand
from bridge.multicluster.links import Link, LinkError, link_credentials, link_from_secret
from bridge.multicluster.remote import REMOTE_KINDS, RemoteKubeSource, Report
from bridge.objects import Secret
from bridge.sources.kube import KINDS, KindSpec, LagObserver, cache_size_gauge, lag_histogram
from bridge.sources.kube_api import Credentials

log = structlog.get_logger("meshbridge.multicluster")

LAG_BUCKETS = (0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 1000)

# A linked cluster's state, as /debug and meshbridge_cluster_sync_state show it.
SYNCING, SYNCED, STALE = "syncing", "synced", "stale"
UNREACHABLE, REFUSED, DENIED = "unreachable", "credentials_refused", "access_denied"
STATES = (SYNCING, SYNCED, STALE, UNREACHABLE, REFUSED, DENIED)
RECOVERED = "recovered"  # reported when the API answers again after failures
MISSING = "missing"  # a CRD not installed there (Linkerd's Servers): not a failure


class LinkSource(Protocol):
    """What runs a linked cluster's watches: `RemoteKubeSource`, or for development a
    files or sim source (which watch everything and have no `want`)."""

    async def run(self, cluster: Cluster, synced: asyncio.Event) -> None: ...

    @property
    def stale(self) -> bool: ...


@dataclass(slots=True)
class _Run:
    """One source of a linked cluster and the task running it."""

    link: Link
    source: LinkSource
    task: asyncio.Task[None]
    synced: asyncio.Event

    def stop(self) -> None:
        close = getattr(self.source, "close", None)
        if close is not None:
            close()
        self.task.cancel()


@dataclass(slots=True)
class LinkedCluster:
    """A linked cluster: its link, its live cache, what runs it."""

    link: Link
    cluster: Cluster
    added_at: float
    run: _Run | None = None
    replacing: _Run | None = None  # a changed link syncing beside `run`
    problem: str = ""  # the last failure category while not synced
    problem_detail: str = ""
    failures: int = 0  # failures reported by its watches (each retry is one)
    synced_at: float | None = None
    # Held /ready since it was linked before the process was first ready (see ready()).
    holds_ready: bool = False

    @property
    def name(self) -> str:
        return self.link.name

    @property
    def state(self) -> str:
        if self.synced_at is None:
            return self.problem or SYNCING
        if self.run is not None and self.run.source.stale:
            return STALE
        return SYNCED


ChangeListener = Callable[[str, "LinkedCluster | None"], None]
# Makes the source of a kubeconfig link (its credentials are loaded already).
KubeSourceFactory = Callable[[Link, Credentials, Report], LinkSource]


@dataclass(slots=True)
class _Reported:
    """What was last logged for one Secret, flag or cluster: logged again only when
    the cause changes."""

    causes: dict[str, str] = field(default_factory=dict)

    def first(self, subject: str, cause: str) -> bool:
        if self.causes.get(subject) == cause:
            return False
        self.causes[subject] = cause
        return True

    def clear(self, subject: str) -> None:
        self.causes.pop(subject, None)


class ClusterStore:
    """Every linked cluster, by name. Listens to the local Cluster for the Secrets in
    `namespace` and for what its Services want from linked clusters."""

    def __init__(self, local: Cluster, namespace: str,
                 registry: prometheus_client.CollectorRegistry | None = None, *,
                 flag_links: Iterable[Link] = (), sync_timeout: float = DEFAULT_SYNC_TIMEOUT,
                 keep_on_unlink: bool = False,
                 make_dev_source: Callable[[str], LinkSource] | None = None,
                 make_kube_source: KubeSourceFactory | None = None) -> None:
        self.local = local
        self.namespace = namespace
        # Held weakly: the store is reachable from the local Cluster (its listener),
        # and what outlives a Cluster must not keep a stopped process's registry, and
        # with it every collector's server and layer, alive.
        self._registry = weakref.ref(registry) if registry is not None else None
        self.sync_timeout = sync_timeout
        self.keep_on_unlink = keep_on_unlink
        self.flag_links = {link.name: link for link in flag_links}
        self.make_dev_source = make_dev_source or _dev_source
        self.make_kube_source = make_kube_source or self._remote_source
        self.linked: dict[str, LinkedCluster] = {}
        self.demand = Demand()
        self.listeners: list[ChangeListener] = []
        self._reported = _Reported()
        self._started = False
        self._ready_once = False
        self._errors: prometheus_client.Counter | None = None
        self._lag: prometheus_client.Histogram | None = None
        if registry is not None:
            self._errors = prometheus_client.Counter(
                "meshbridge_cluster_link_errors",
                "Linked-cluster Secrets, flags and connections that could not be used, by "
                "cause (each cause counted once until it changes)", ["cluster", "reason"],
                registry=registry)
            self._lag = prometheus_client.Histogram(
                "meshbridge_cluster_informer_lag_seconds",
                "Delay between an update in a linked cluster and its watch seeing it",
                ["cluster"], buckets=LAG_BUCKETS, registry=registry)
            registry.register(_StoreCollector(self))

    # ------------------------------------------------------------------ lifecycle

    @property
    def registry(self) -> prometheus_client.CollectorRegistry | None:
        return self._registry() if self._registry is not None else None

    def start(self) -> None:
        """Link the flags' clusters and follow the local cluster from now on (on the
        loop: the sources run as tasks of their own)."""
        self._started = True
        self.local.add_listener(self._on_local_change, ListenerStage.VIEWS)
        self.demand.rebuild(self.local.services.values())
        self._reconcile_links()

    def stop(self) -> None:
        if self._started:
            with contextlib.suppress(ValueError):
                self.local.remove_listener(self._on_local_change)
        self._started = False
        for lc in list(self.linked.values()):
            for run in (lc.run, lc.replacing):
                if run is not None:
                    run.stop()

    def set_flag_links(self, links: Iterable[Link]) -> None:
        """Replace the links made by flag (or by a tool, at run time): added, changed
        and removed as Secrets are."""
        self.flag_links = {link.name: link for link in links}
        if self._started:
            self._reconcile_links()

    def get(self, name: str) -> LinkedCluster | None:
        return self.linked.get(name)

    def describe(self) -> list[dict[str, Any]]:
        """Every linked cluster as /debug/clusters shows it."""
        now = time.monotonic()
        out = []
        for name, lc in sorted(self.linked.items()):
            out.append({
                "cluster": name, "source": lc.link.origin,
                "cluster_domain": lc.link.cluster_domain,
                "trust_domain": lc.link.trust_domain, "state": lc.state,
                "problem": lc.problem_detail, "failures": lc.failures,
                "linked_seconds_ago": round(now - lc.added_at, 1),
                "synced_seconds_ago": (round(now - lc.synced_at, 1)
                                       if lc.synced_at is not None else None),
                "new_credentials_syncing": lc.replacing is not None,
                "wanted": sorted(str(s) for s in self.demand.of(name)),
                "cache": lc.cluster.counts()})
        return out

    def ready(self) -> list[str]:
        """The linked clusters /ready waits for: those linked before the process was
        first ready that have not synced, each for at most `sync_timeout` from when it
        was linked (a cluster linked later never takes a ready process out of rotation)."""
        now = time.monotonic()
        waiting = [lc.name for lc in self.linked.values()
                   if lc.holds_ready and lc.synced_at is None
                   and now - lc.added_at < self.sync_timeout]
        if not waiting:
            self._ready_once = True
        return sorted(waiting)

    # ------------------------------------------------------------------ following

    def _on_local_change(self, change: ClusterChange) -> None:
        if "Secret" in change.kinds:
            self._reconcile_links()
        if change.service_objects or change.all_services or change.namespaces:
            touched = self.demand.update(self.local.services, change.service_objects)
            for name in touched:
                self._want(name)

    def _want(self, name: str) -> None:
        lc = self.linked.get(name)
        if lc is None:
            return
        wanted = self.demand.of(name)
        for run in (lc.run, lc.replacing):
            want = getattr(run.source, "want", None) if run is not None else None
            if want is not None:
                want(wanted)

    def add_interest(self, cluster: str, services: Iterable[ServiceKey]) -> None:
        """Services a layer wants from a linked cluster beyond what the local Services
        name (istiod-style merging: the same service in every cluster)."""
        if self.demand.add_extra(cluster, services):
            self._want(cluster)

    def remove_interest(self, cluster: str, services: Iterable[ServiceKey]) -> None:
        if self.demand.remove_extra(cluster, services):
            self._want(cluster)

    # ------------------------------------------------------------------ links

    def _secrets(self) -> Iterator[Secret]:
        for obj in self.local.objects("Secret"):
            if isinstance(obj, Secret) and obj.meta.namespace == self.namespace:
                yield obj

    def _reconcile_links(self) -> None:
        wanted: dict[str, Link] = dict(self.flag_links)
        seen_secrets: set[str] = set()
        for secret in sorted(self._secrets(), key=lambda s: s.meta.name):
            origin = f"Secret {secret.meta.namespace}/{secret.meta.name}"
            seen_secrets.add(origin)
            try:
                link = link_from_secret(secret)
            except LinkError as e:
                self._bad_link(e)
                continue
            other = wanted.get(link.name)
            if other is not None:
                # Two Secrets (or a Secret and a flag) for one cluster: the first keeps
                # it, as istiod does; Linkerd 2.20 would leak the first one's watches.
                self._bad_link(LinkError(origin, "duplicate", f"cluster {link.name} is "
                                         f"already linked by {other.origin}", link.name))
                continue
            wanted[link.name] = link
        for subject in [s for s in self._reported.causes if s.startswith("Secret ")]:
            if subject not in seen_secrets:
                self._reported.clear(subject)
        for name in list(self.linked):
            if name not in wanted:
                self._unlink(name)
        for name, link in sorted(wanted.items()):
            lc = self.linked.get(name)
            if lc is None:
                self._link(link)
            elif lc.link.fingerprint == link.fingerprint:
                if lc.replacing is not None:  # changed, then changed back before it synced
                    lc.replacing.stop()
                    lc.replacing = None
            elif lc.replacing is None or lc.replacing.link.fingerprint != link.fingerprint:
                self._relink(lc, link)

    def _bad_link(self, error: LinkError) -> None:
        if self._reported.first(error.origin, error.detail):
            log.error("linked cluster not usable", source=error.origin, reason=error.detail)
            if self._errors is not None:
                self._errors.labels(error.cluster, error.reason).inc()

    def _start(self, lc: LinkedCluster, link: Link) -> _Run | None:
        """A source for `link` feeding `lc`'s cache; None (logged) when it cannot be made."""
        try:
            source = self._make_source(link)
        except LinkError as e:
            self._bad_link(e)
            return None
        self._reported.clear(link.origin)
        synced = asyncio.Event()
        task = asyncio.create_task(self._run_source(lc, link, source, synced),
                                   name=f"link-{link.name}")
        return _Run(link, source, task, synced)

    def _make_source(self, link: Link) -> LinkSource:
        if link.dev_source:
            try:
                return self.make_dev_source(link.dev_source)
            except ValueError as e:
                raise LinkError(link.origin, "bad_source", str(e), link.name) from None
        return self.make_kube_source(link, link_credentials(link),
                                     functools.partial(self._report, link.name))

    def _remote_source(self, link: Link, credentials: Credentials,
                       report: Report) -> LinkSource:
        """The destination's watches: narrowed to what the local Services want."""
        source = RemoteKubeSource(link.name, credentials, report,
                                  lag=functools.partial(self._lag_of, link.name))
        source.want(self.demand.of(link.name))
        return source

    def _lag_of(self, cluster: str, spec: KindSpec) -> LagObserver | None:
        registry = self.registry
        if registry is None or self._lag is None:
            return None
        return _Observers(lag_histogram(registry, spec), self._lag.labels(cluster))

    async def _run_source(self, lc: LinkedCluster, link: Link, source: LinkSource,
                          synced: asyncio.Event) -> None:
        waiter = asyncio.create_task(self._on_synced(lc, link, synced))
        try:
            await source.run(lc.cluster, synced)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a source that dies is reported, and its cluster kept
            log.error("linked cluster's watches failed", cluster=link.name,
                      reason=f"{type(e).__name__}: {e}")
        finally:
            waiter.cancel()

    async def _on_synced(self, lc: LinkedCluster, link: Link, synced: asyncio.Event) -> None:
        await synced.wait()
        replacing = lc.replacing
        if replacing is not None and replacing.link is link:
            # Make-before-break: the old source was stopped as the new state went in
            # (RemoteKubeSource.on_promote), so nothing old is applied after it.
            old, lc.run, lc.replacing = lc.run, replacing, None
            if old is not None:
                old.stop()
            lc.link = link
            lc.cluster.identity = identity_of(link)
            log.info("linked cluster's new credentials took over", cluster=link.name,
                     source=link.origin)
        elif lc.run is None or lc.run.link is not link:
            return
        first = lc.synced_at is None
        lc.synced_at = time.monotonic()
        lc.problem = lc.problem_detail = ""
        self._reported.clear(link.name)
        if first:
            log.info("linked cluster synced", cluster=link.name, source=link.origin,
                     **lc.cluster.counts())
        self._notify(link.name, lc)

    def _report(self, cluster: str, category: str, detail: str) -> None:
        """A linked cluster's watches failing: logged once per cause, counted."""
        lc = self.linked.get(cluster)
        if lc is None:
            return
        if category == MISSING:
            if self._reported.first(f"{cluster} {detail}", MISSING):
                log.info("linked cluster lacks a kind; served without it", cluster=cluster,
                         reason=detail)
            return
        if category == RECOVERED:
            if self._reported.causes.get(cluster) not in (None, RECOVERED):
                self._reported.first(cluster, RECOVERED)
                log.info("linked cluster reachable again", cluster=cluster,
                         stale=lc.state == STALE)
            return
        lc.failures += 1
        if lc.synced_at is None and category in STATES:
            lc.problem, lc.problem_detail = category, detail
        if self._reported.first(cluster, category):
            what = ("cannot be reached" if category == UNREACHABLE else
                    "refused the credentials" if category == REFUSED else
                    "denied access" if category == DENIED else category)
            log.warning(f"linked cluster {what}; retrying with backoff", cluster=cluster,
                        reason=detail,
                        serving=("its last state" if lc.synced_at is not None else "nothing yet"))
            if self._errors is not None:
                self._errors.labels(cluster, category).inc()

    def _link(self, link: Link) -> None:
        lc = LinkedCluster(link, Cluster(identity_of(link)), time.monotonic(),
                           holds_ready=not self._ready_once)
        self.linked[link.name] = lc
        lc.run = self._start(lc, link)
        if lc.run is None:
            del self.linked[link.name]
            return
        self._cache_gauges(lc)
        log.info("cluster linked", cluster=link.name, source=link.origin,
                 cluster_domain=link.cluster_domain, trust_domain=link.trust_domain)
        self._notify(link.name, lc)

    def _relink(self, lc: LinkedCluster, link: Link) -> None:
        if lc.replacing is not None:
            lc.replacing.stop()
            lc.replacing = None
        if lc.synced_at is None or lc.run is None or link.dev_source:
            # Nothing served yet, or a development source (which only adds what it
            # reads): start again from an empty cache.
            if lc.run is not None:
                lc.run.stop()
            _empty(lc.cluster)
            lc.link = link
            lc.cluster.identity = identity_of(link)
            lc.synced_at = None
            lc.run = self._start(lc, link)
            return
        run = self._start(lc, link)
        if run is None:
            return  # logged; the old credentials keep serving
        if isinstance(run.source, RemoteKubeSource) and lc.run is not None:
            old = lc.run
            run.source.on_promote = lambda: _close(old.source)
        lc.replacing = run
        log.info("linked cluster's Secret changed; syncing the new credentials beside the "
                 "old", cluster=link.name, source=link.origin)

    def _unlink(self, name: str) -> None:
        lc = self.linked.pop(name)
        for run in (lc.run, lc.replacing):
            if run is not None:
                run.stop()
        self._reported.clear(name)
        registry = self.registry
        if registry is not None:
            for kind in REMOTE_KINDS:
                gauge = cache_size_gauge(registry, KINDS[kind])
                if gauge is not None:
                    with contextlib.suppress(KeyError):
                        gauge.remove(name)
        if not self.keep_on_unlink:
            # Its endpoints leave every stream and CLA now (docs/multicluster.md).
            _empty(lc.cluster)
        log.info("cluster unlinked", cluster=name, source=lc.link.origin,
                 endpoints=("kept on open streams (linkerd-2.20)" if self.keep_on_unlink
                            else "removed"))
        self._notify(name, None)

    def _cache_gauges(self, lc: LinkedCluster) -> None:
        registry = self.registry
        if registry is None:
            return
        for kind in REMOTE_KINDS:
            gauge = cache_size_gauge(registry, KINDS[kind])
            if gauge is not None:
                gauge.labels(lc.name).set_function(
                    functools.partial(_count, lc.cluster, kind))

    def _notify(self, name: str, lc: LinkedCluster | None) -> None:
        for listener in list(self.listeners):
            listener(name, lc)


# Whatever a development source may fill a linked cluster's cache with.
_CACHED_KINDS = (*REMOTE_KINDS, "Node", "Job", "ServiceProfile", "Namespace")


def _empty(cluster: Cluster) -> None:
    cluster.apply(Event(EventType.DELETED, o) for kind in _CACHED_KINDS
                  for o in cluster.objects(kind))


def _close(source: LinkSource) -> None:
    close = getattr(source, "close", None)
    if close is not None:
        close()


def identity_of(link: Link) -> ClusterIdentity:
    """A linked Cluster's identity: its link's name and domains (its Views' metrics and
    endpoint ids name it)."""
    return ClusterIdentity(link.name, link.cluster_domain, link.trust_domain)


def _count(cluster: Cluster, kind: str) -> float:
    return len(cluster.objects(kind))


def _dev_source(spec: str) -> LinkSource:
    from bridge.sources.base import SourceSpecError
    from bridge.sources.catalog import make_source

    try:
        return make_source(spec)
    except SourceSpecError as e:
        raise ValueError(str(e)) from None


class _Observers:
    """Records one lag in Linkerd's per-kind histogram and in the cluster's own."""

    __slots__ = ("first", "second")

    def __init__(self, first: LagObserver, second: LagObserver) -> None:
        self.first, self.second = first, second

    def observe(self, amount: float) -> None:
        self.first.observe(amount)
        self.second.observe(amount)


class _StoreCollector:
    """`cluster_store_size` as Linkerd names it, and each linked cluster's state."""

    def __init__(self, store: ClusterStore) -> None:
        self.store = store

    def describe(self) -> list[Any]:
        return []  # computed when scraped

    def collect(self) -> Iterator[GaugeMetricFamily]:
        linked = self.store.linked
        yield GaugeMetricFamily("cluster_store_size",
                                "Number of linked clusters in the cluster store",
                                value=len(linked))
        state = GaugeMetricFamily("meshbridge_cluster_sync_state",
                                  "1 for the state each linked cluster is in",
                                  labels=["cluster", "state"])
        stale = GaugeMetricFamily("meshbridge_cluster_stale",
                                  "1 while a synced linked cluster cannot be reached and "
                                  "its last state is served", labels=["cluster"])
        for name, lc in sorted(linked.items()):
            current = lc.state
            for s in STATES:
                state.add_metric([name, s], 1.0 if s == current else 0.0)
            stale.add_metric([name], 1.0 if current == STALE else 0.0)
        yield state
        yield stale
