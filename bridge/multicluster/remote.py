"""A linked cluster's watches, narrowed to what is served from it.

Linkerd's destination controller caches every Pod, Service, EndpointSlice and Server
of every linked cluster (docs/multicluster.md, "What a linked cluster costs"). Here a
linked cluster is watched only where something local wants it: the services named by
the local mirror and federated Services (`want`), namespace by namespace:

  * Services of the namespace, kept only when wanted;
  * EndpointSlices selected on the server by `kubernetes.io/service-name in (...)`;
  * Pods and ReplicaSets selected on the server by the wanted Services' selectors
    (a label key they all share, `key in (values)`), then kept only when one of those
    selectors matches; a wanted Service without a selector keeps its namespace's pods;
  * Linkerd's Servers of the namespace (few, and they decide opaque ports).

So what a linked cluster costs grows with what is served from it, not with its size.

Make-before-break: a source lists into a staging cache of its own; only when every
watch has listed is that state moved into the live cache as the real difference (a
rotated kubeconfig that sees the same objects changes nothing) and the watches
continue there. Until then the live cache keeps what it had, from the source before.

Failures are told to the owner (`report`) by category, so the owner logs once per
cause: a start is retried with backoff until the API server answers, accepts the
credentials and lets them list pods (what Linkerd checks before it watches).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import structlog

from bridge.cluster import Cluster, Event, EventType
from bridge.model import ServiceKey
from bridge.objects import (
    EndpointSlice,
    KubeObject,
    Labels,
    Pod,
    ReplicaSet,
    Service,
    object_key,
)
from bridge.sources.kube import KINDS, KindSpec, KindWatcher, LagObserver, backoff_delay
from bridge.sources.kube_api import ApiClient, ApiError, Credentials

log = structlog.get_logger("meshbridge.multicluster")

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
# What a linked cluster's cache may hold, and so what a promotion moves.
REMOTE_KINDS = ("Service", "EndpointSlice", "Pod", "ReplicaSet", "Server")
_NAMESPACED_PATHS = {
    "Service": "/api/v1/namespaces/{ns}/services",
    "EndpointSlice": "/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices",
    "Pod": "/api/v1/namespaces/{ns}/pods",
    "ReplicaSet": "/apis/apps/v1/namespaces/{ns}/replicasets",
    "Server": "/apis/policy.linkerd.io/v1beta3/namespaces/{ns}/servers",
}
# Which of them are selected by the wanted Services' pod selectors.
_SELECTED_KINDS = ("Pod", "ReplicaSet")

# `report(category, detail)`: unreachable | credentials_refused | access_denied | missing
Report = Callable[[str, str], None]


@dataclass(frozen=True, slots=True)
class PodScope:
    """Which pods (and ReplicaSets) of a namespace are kept: those one of `selectors`
    matches, or all of them. `server_selector` is what the API server is asked for."""

    selectors: tuple[Mapping[str, str], ...] = ()
    everything: bool = False

    @property
    def empty(self) -> bool:
        return not self.everything and not self.selectors

    def keeps(self, labels: Labels) -> bool:
        if self.everything:
            return True
        return any(all(labels.get(k) == v for k, v in s.items()) for s in self.selectors)

    @property
    def server_selector(self) -> str:
        """`key in (v1,v2)` on a key every selector sets, so the server sends only
        candidates; "" when there is none (every pod of the namespace is sent)."""
        if self.everything or not self.selectors:
            return ""
        common = set.intersection(*(set(s) for s in self.selectors))
        if not common:
            return ""
        key = min(common, key=lambda k: (len({s[k] for s in self.selectors}), k))
        values = sorted({s[key] for s in self.selectors})
        return f"{key} in ({','.join(values)})"


def pod_scope(services: Iterable[Service | None]) -> PodScope:
    """The pods the wanted Services select. A wanted Service that does not exist (yet)
    selects nothing; one without a selector, or with an empty one, selects every pod
    of its namespace (its slices may name any of them)."""
    selectors: list[Mapping[str, str]] = []
    for svc in services:
        if svc is None or svc.type == "ExternalName":
            continue
        if not svc.selector:
            return PodScope(everything=True)
        if svc.selector not in selectors:
            selectors.append(svc.selector)
    return PodScope(tuple(sorted(selectors, key=lambda s: sorted(s.items()))))


@dataclass(slots=True)
class _Watch:
    """One running watch of one kind in one namespace."""

    watcher: KindWatcher
    listed: bool = False


@dataclass(slots=True)
class _Namespace:
    """The watches of one namespace and what they keep."""

    name: str
    services: frozenset[str]
    pods: PodScope = field(default_factory=PodScope)
    watches: dict[str, _Watch] = field(default_factory=dict)  # by kind


class RemoteKubeSource:
    """The watches of one linked cluster's API server. `run` applies them to a live
    Cluster (after staging, see the module docstring); `want` says what to watch."""

    def __init__(self, name: str, credentials: Credentials, report: Report,
                 lag: Callable[[KindSpec], LagObserver | None] | None = None) -> None:
        self.name = name
        self.credentials = credentials
        self.report = report
        self.lag = lag
        # Called once the staged state is in the live cache, before anything else is
        # applied there: the owner stops the source this one replaces.
        self.on_promote: Callable[[], None] | None = None
        self._wanted: frozenset[ServiceKey] = frozenset()
        self._namespaces: dict[str, _Namespace] = {}
        self._client: ApiClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._live: Cluster | None = None
        self._staging: Cluster | None = None
        self._synced: asyncio.Event | None = None
        self._lock = threading.Lock()
        self._items: list[tuple[KindWatcher, Any]] = []
        self._scheduled = False
        self._closed = False
        self._failed: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ state

    @property
    def target(self) -> Cluster | None:
        """Where what the watches see goes now: the staging cache, then the live one."""
        return self._staging if self._staging is not None else self._live

    @property
    def promoted(self) -> bool:
        return self._live is not None and self._staging is None

    @property
    def stale(self) -> bool:
        """Something listed before and is cut off now: its last state is served."""
        return any(w.watcher.synced and not w.watcher.connected and not w.watcher.unavailable
                   for ns in self._namespaces.values() for w in ns.watches.values())

    def watch_count(self) -> int:
        return sum(len(ns.watches) for ns in self._namespaces.values())

    # ------------------------------------------------------------------ running

    async def run(self, cluster: Cluster, synced: asyncio.Event) -> None:
        """Check access (retrying with backoff), watch what is wanted, promote once
        listed; runs until cancelled (or `close`)."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._failed = loop.create_future()
        self._live = cluster
        self._staging = Cluster(cluster.identity)
        self._synced = synced
        self._client = ApiClient(self.credentials)
        await self._until_accessible(self._client)
        try:
            self._reconcile()
            self._maybe_promote()
            await self._failed
        finally:
            self.close()

    def close(self) -> None:
        """Stop every watch; nothing more is applied anywhere."""
        self._closed = True
        for ns in self._namespaces.values():
            for w in ns.watches.values():
                w.watcher.stop()
            ns.watches.clear()

    async def _until_accessible(self, client: ApiClient) -> None:
        attempt = 0
        while True:
            try:
                allowed = await asyncio.to_thread(_may_list_pods, client)
            except ApiError as e:
                category = "credentials_refused" if e.status == 401 else "unreachable"
                self.report(category, f"access review: HTTP {e.status}: {e.reason}")
            except Exception as e:  # not reachable: connection refused, timeouts, TLS
                self.report("unreachable", f"access review: {type(e).__name__}: {e}")
            else:
                if allowed:
                    return
                self.report("access_denied", "RBAC does not let these credentials list pods")
            await asyncio.sleep(backoff_delay(attempt))
            attempt += 1

    def want(self, services: Iterable[ServiceKey]) -> None:
        """Watch these services (and what serving them needs) from now on. Called on
        the loop; a change costs what it changes (only affected namespaces relist)."""
        wanted = frozenset(services)
        if wanted == self._wanted:
            return
        self._wanted = wanted
        if self._live is not None and not self._closed and self._failed is not None:
            self._reconcile()
            self._maybe_promote()

    def _reconcile(self) -> None:
        by_ns: dict[str, set[str]] = {}
        for key in self._wanted:
            by_ns.setdefault(key.namespace, set()).add(key.name)
        for name in list(self._namespaces):
            if name not in by_ns:
                self._drop_namespace(name)
        for name, services in sorted(by_ns.items()):
            ns = self._namespaces.get(name)
            if ns is None:
                ns = self._namespaces[name] = _Namespace(name, frozenset(services))
                for kind in ("Service", "EndpointSlice", "Server"):
                    self._start(ns, kind)
            elif ns.services != services:
                ns.services = frozenset(services)
                # Services and slices of a service no longer wanted go; one newly
                # wanted may have been left out by the last list: list again.
                self._trim(ns, ("Service", "EndpointSlice"))
                self._start(ns, "Service")
                self._start(ns, "EndpointSlice")
            self._rescope_pods(ns)

    def _drop_namespace(self, name: str) -> None:
        ns = self._namespaces.pop(name)
        for w in ns.watches.values():
            w.watcher.stop()
        target = self.target
        if target is not None:
            target.apply(Event(EventType.DELETED, o) for kind in REMOTE_KINDS
                         for o in target.objects(kind) if o.meta.namespace == name)

    def _rescope_pods(self, ns: _Namespace) -> None:
        """Pods and ReplicaSets follow the wanted Services' selectors: watched anew when
        those change, the ones no longer selected dropped at once."""
        target = self.target
        if target is None or "Service" not in ns.watches or not ns.watches["Service"].listed:
            return  # the selectors are not known before the Services are listed
        scope = pod_scope(target.services.get(ServiceKey(ns.name, s)) for s in ns.services)
        if scope == ns.pods and all(k in ns.watches for k in _SELECTED_KINDS) != scope.empty:
            return
        ns.pods = scope
        self._trim(ns, _SELECTED_KINDS)
        for kind in _SELECTED_KINDS:
            if scope.empty:
                old = ns.watches.pop(kind, None)
                if old is not None:
                    old.watcher.stop()
            else:
                self._start(ns, kind)

    def _start(self, ns: _Namespace, kind: str) -> None:
        """(Re)start the watch of `kind` in `ns` with its current selector."""
        old = ns.watches.pop(kind, None)
        if old is not None:
            old.watcher.stop()
        assert self._client is not None
        spec = self._spec(ns, kind)
        watcher = KindWatcher(spec, self._client, _nowhere,
                              self.lag(spec) if self.lag is not None else None,
                              self._report_from_thread)
        # What a watcher emits is applied only while it is the namespace's watch of its
        # kind (`_apply`), so each item carries the watcher it came from.
        watcher.emit = functools.partial(self._emit, watcher)
        ns.watches[kind] = _Watch(watcher)
        watcher.start()

    def _spec(self, ns: _Namespace, kind: str) -> KindSpec:
        params: tuple[tuple[str, str], ...] = ()
        if kind == "EndpointSlice":
            params = (("labelSelector",
                       f"{SERVICE_NAME_LABEL} in ({','.join(sorted(ns.services))})"),)
        elif kind in _SELECTED_KINDS and ns.pods.server_selector:
            params = (("labelSelector", ns.pods.server_selector),)
        return replace(KINDS[kind], path=_NAMESPACED_PATHS[kind].format(ns=ns.name),
                       params=params)

    # ------------------------------------------------------------------ applying

    def _report_from_thread(self, category: str, detail: str) -> None:
        """A watch thread's failure, told to the owner on the loop."""
        loop = self._loop
        if loop is not None and not self._closed:
            with contextlib.suppress(RuntimeError):  # the loop is closed: shutting down
                loop.call_soon_threadsafe(self.report, category, detail)

    def _emit(self, watcher: KindWatcher, item: Any) -> None:
        """Called on a watch thread: batch, and wake the loop once per burst."""
        with self._lock:
            self._items.append((watcher, item))
            if self._scheduled:
                return
            self._scheduled = True
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: shutting down
                loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            batch, self._items, self._scheduled = self._items, [], False
        if self._closed:
            return
        try:
            self._apply(batch)
        except Exception as e:  # the owner of the source's task sees it
            if self._failed is not None and not self._failed.done():
                self._failed.set_exception(e)

    def _apply(self, batch: list[tuple[KindWatcher, Any]]) -> None:
        target = self.target
        assert target is not None
        current = {id(w.watcher): (ns, kind, w) for ns in self._namespaces.values()
                   for kind, w in ns.watches.items()}
        events: list[Event] = []
        rescope: set[str] = set()
        for watcher, item in batch:
            entry = current.get(id(watcher))
            if entry is None or entry[2].watcher is not watcher:
                continue  # a watch since stopped or replaced: what it says is old
            ns, kind, watch = entry
            if item[0] == "event":
                event = self._kept_event(ns, item[1], target)
                if event is not None:
                    events.append(event)
                    if kind == "Service":
                        rescope.add(ns.name)
                continue
            if events:
                target.apply(events)
                events = []
            self._replace(ns, kind, item[2], target)
            watch.listed = True
            if kind == "Service":
                rescope.add(ns.name)
        if events:
            target.apply(events)
        for name in sorted(rescope):
            ns_state = self._namespaces.get(name)
            if ns_state is not None:
                self._rescope_pods(ns_state)
        self._maybe_promote()

    @staticmethod
    def _keeps(ns: _Namespace, obj: KubeObject) -> bool:
        if isinstance(obj, Service):
            return obj.meta.name in ns.services
        if isinstance(obj, EndpointSlice):
            return obj.service_name in ns.services
        if isinstance(obj, Pod | ReplicaSet):
            return ns.pods.keeps(obj.meta.labels)
        return True

    def _kept_event(self, ns: _Namespace, event: Event, target: Cluster) -> Event | None:
        """The event as the cache should see it: an object that is no longer kept (its
        labels changed) leaves the cache, one never kept is no event."""
        if event.type is EventType.DELETED or self._keeps(ns, event.obj):
            return event
        # Deleting what is not held changes nothing, so no lookup is needed first.
        return Event(EventType.DELETED, event.obj)

    def _replace(self, ns: _Namespace, kind: str, objs: list[KubeObject],
                 target: Cluster) -> None:
        """A relist of one kind in one namespace, applied as the real difference."""
        fresh = {o.meta.name: o for o in objs if self._keeps(ns, o)}
        events = [Event(EventType.DELETED, old) for old in target.objects(kind)
                  if old.meta.namespace == ns.name and old.meta.name not in fresh]
        events.extend(Event(EventType.MODIFIED, o) for o in fresh.values())
        target.apply(events)

    def _trim(self, ns: _Namespace, kinds: Iterable[str]) -> None:
        """Drop what the namespace no longer keeps, now (not at the next relist)."""
        target = self.target
        if target is None:
            return
        gone = [Event(EventType.DELETED, o) for kind in kinds for o in target.objects(kind)
                if o.meta.namespace == ns.name and not self._keeps(ns, o)]
        if gone:
            target.apply(gone)

    def _maybe_promote(self) -> None:
        """Once every watch has listed, move the staged state into the live cache as
        its real difference, and continue there."""
        live, staging = self._live, self._staging
        if live is None or staging is None:
            return
        if not all(w.listed for ns in self._namespaces.values() for w in ns.watches.values()):
            return
        if self.on_promote is not None:
            self.on_promote()
        # One batch, every kind at once: a slice never arrives before the pods it
        # names, so no version in between lacks an endpoint both states have.
        events: list[Event] = []
        for kind in REMOTE_KINDS:
            fresh = {object_key(o): o for o in staging.objects(kind)}
            events.extend(Event(EventType.DELETED, old) for old in live.objects(kind)
                          if object_key(old) not in fresh)
            events.extend(Event(EventType.MODIFIED, o) for o in fresh.values())
        live.apply(events)
        self._staging = None
        if self._synced is not None:
            self._synced.set()


def _nowhere(_item: Any) -> None:
    pass


def _may_list_pods(client: ApiClient) -> bool:
    """A SelfSubjectAccessReview for listing pods in every namespace, as Linkerd makes
    before it watches a linked cluster; ApiError on 401 and the like."""
    review = client.post_json("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": "list", "resource": "pods"}}})
    status = review.get("status")
    return isinstance(status, dict) and status.get("allowed") is True
