"""The resource cache: what exists, at which version, and what a subscription is due.

The cache decides *what* to send; the streams (`stream.py`) decide *how*: nonces,
ACKs, ordering and writing. Resources come from the core:

* ClusterLoadAssignments from the shared Views. A stream watching a name joins that
  name's View as a subscriber; the CLA is encoded once per View version
  (`View.cached`) and reused by every stream, whatever its protocol variant.
* Clusters, one per port of every Service (ExternalName excepted), rebuilt only for
  the services a cluster change touches; the CDS version moves only on real change.
* The proxyless Listener and RouteConfiguration of every such service port, built on
  first request (their content is a function of the name).

A CLA exists for every name that is a service-port authority: a service that has no
endpoints, or does not exist (yet), has an empty one (§1.10: never leave a client
waiting on an EDS name). Clusters, listeners and routes exist while the port does.
"""

from __future__ import annotations

import secrets
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import structlog

from bridge.cluster import Cluster, ClusterChange, ListenerStage
from bridge.model import EndpointId, FilterKey, ServiceKey, ViewKey
from bridge.objects import Service, ServicePort
from bridge.views import InvalidService, View, ViewChange, ViewRegistry
from xds_api import resource_types as rt
from xds_api.metrics import XdsMetrics
from xds_api.names import parse_resource_name
from xds_api.resources import (
    EncodedEndpoint,
    EncodedResource,
    build_cluster,
    build_listener,
    build_route,
    encode_cla_resource,
    encode_named,
)
from xds_api.subscription import ABSENT, Subscription

log = structlog.get_logger("meshbridge.xds")


class Watcher(Protocol):
    """A stream, as the cache sees it: told when a watched resource may have changed."""

    protocol: str  # the View subscriber label: "xds-sotw" or "xds-delta"
    node_name: str  # the client's Kubernetes node, "" if it did not say

    def resource_changed(self, type_url: str, name: str) -> None: ...

    def on_view_change(self, view: View, change: ViewChange) -> None: ...


@dataclass(frozen=True, slots=True)
class PortEntry:
    key: ViewKey
    service: Service
    port: ServicePort


@dataclass(frozen=True, slots=True)
class Reply:
    """What one response of one type carries; the stream adds nonce and framing."""

    type_url: str
    version: str
    resources: tuple[EncodedResource, ...]
    removed: tuple[str, ...] = ()


class ResourceCache:
    def __init__(
        self,
        cluster: Cluster,
        views: ViewRegistry,
        cluster_domain: str,
        *,
        draining: bool = False,
        metrics: XdsMetrics | None = None,
    ) -> None:
        self.cluster = cluster
        self.views = views
        self.cluster_domain = cluster_domain
        self.draining = draining
        self.metrics = metrics or XdsMetrics()
        # Versions are per type and per server (§1.2): a prefix unique to this process
        # keeps a reconnecting client's old version from matching a new one.
        self._prefix = secrets.token_hex(3)
        self._counters = dict.fromkeys(rt.ORDER, 0)
        self._ports: dict[str, PortEntry] = {}
        self._ports_by_service: dict[ServiceKey, set[str]] = {}
        self._seen: dict[ServiceKey, Service] = {}
        self._clusters: dict[str, EncodedResource] = {}
        self._by_name: dict[str, dict[str, EncodedResource]] = {rt.LISTENER: {}, rt.ROUTE: {}}
        self._watchers: dict[str, dict[str, set[Watcher]]] = {
            rt.CLUSTER: {}, rt.LISTENER: {}, rt.ROUTE: {}}
        self._wildcard: dict[str, set[Watcher]] = {rt.CLUSTER: set(), rt.LISTENER: set()}
        # EDS names whose service cannot be subscribed to now (ExternalName): retried
        # whenever a change touches the service.
        self._blocked: dict[ServiceKey, dict[str, set[Watcher]]] = {}
        self._endpoint_memos: weakref.WeakKeyDictionary[
            View, dict[EndpointId, EncodedEndpoint]] = weakref.WeakKeyDictionary()
        self._cla_key = ("xds_api.cla", draining)
        self._refresh(list(cluster.services))
        cluster.add_listener(self._on_cluster_change, ListenerStage.RESOURCES)
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.cluster.remove_listener(self._on_cluster_change)

    # ------------------------------------------------------------------ reading

    def version(self, type_url: str) -> str:
        return f"{self._prefix}-{self._counters.get(type_url, 0)}"

    def get(self, type_url: str, name: str, node_name: str = "") -> EncodedResource | None:
        """The current resource, or None if it does not exist; EDS resources are the
        View of the client's node (topology hints, internalTrafficPolicy, weights)."""
        if type_url == rt.ENDPOINT:
            return self._cla(name, node_name)
        if type_url == rt.CLUSTER:
            return self._clusters.get(name)
        if type_url in self._by_name:
            if name not in self._ports:
                return None
            memo = self._by_name[type_url]
            res = memo.get(name)
            if res is None:
                build = build_listener if type_url == rt.LISTENER else build_route
                res = memo[name] = encode_named(type_url, name, build(name))
                self.metrics.serializations[type_url].inc()
            return res
        return None

    def wildcard_names(self, type_url: str) -> Iterable[str]:
        """What `*` covers: every cluster for CDS. For LDS it covers nothing: the only
        listeners are proxyless ones, asked for by name, so Envoy's wildcard LDS gets
        an empty set."""
        if type_url == rt.CLUSTER:
            return self._clusters.keys()
        return ()

    def covers(self, type_url: str, name: str) -> bool:
        return type_url == rt.CLUSTER and name in self._clusters

    def port_names(self) -> list[str]:
        return sorted(self._ports)

    # ------------------------------------------------------------------ watching

    def watch(self, type_url: str, names: Iterable[str], watcher: Watcher) -> None:
        if type_url == rt.ENDPOINT:
            for name in names:
                self._watch_view(name, watcher)
            return
        table = self._watchers.get(type_url)
        if table is not None:
            for name in names:
                table.setdefault(name, set()).add(watcher)

    def unwatch(self, type_url: str, names: Iterable[str], watcher: Watcher) -> None:
        if type_url == rt.ENDPOINT:
            for name in names:
                self._unwatch_view(name, watcher)
            return
        table = self._watchers.get(type_url)
        if table is not None:
            for name in names:
                ws = table.get(name)
                if ws is not None:
                    ws.discard(watcher)
                    if not ws:
                        del table[name]

    def watch_wildcard(self, type_url: str, watcher: Watcher) -> None:
        if type_url in self._wildcard:
            self._wildcard[type_url].add(watcher)

    def unwatch_wildcard(self, type_url: str, watcher: Watcher) -> None:
        if type_url in self._wildcard:
            self._wildcard[type_url].discard(watcher)

    def _view_key(self, name: str, node_name: str) -> ViewKey | None:
        key = parse_resource_name(name, self.cluster_domain)
        if key is None or not node_name:
            return key
        return ViewKey(key.service, key.port,
                       FilterKey(node_name=node_name, hostname=key.filter.hostname))

    def _watch_view(self, name: str, watcher: Watcher) -> None:
        key = self._view_key(name, watcher.node_name)
        if key is None:
            return  # names no service port: never exists, nothing to watch
        try:
            self.views.subscribe(key, watcher, watcher.protocol)
        except InvalidService:
            self._blocked.setdefault(key.service, {}).setdefault(name, set()).add(watcher)

    def _unwatch_view(self, name: str, watcher: Watcher) -> None:
        key = self._view_key(name, watcher.node_name)
        if key is None:
            return
        self.views.unsubscribe(key, watcher)
        blocked = self._blocked.get(key.service)
        if blocked is not None and name in blocked:
            blocked[name].discard(watcher)
            if not blocked[name]:
                del blocked[name]
            if not blocked:
                del self._blocked[key.service]

    # ------------------------------------------------------------------ EDS

    def _cla(self, name: str, node_name: str = "") -> EncodedResource | None:
        key = self._view_key(name, node_name)
        if key is None:
            return None
        view = self.views.view(key)
        if view is None:
            # Not subscribable (ExternalName) or not watched: no endpoints.
            return self._encode_cla(name, None)
        return self.cla_of(view, name)

    def cla_of(self, view: View, name: str) -> EncodedResource:
        """The View's CLA, encoded at most once per View version for every stream."""
        res: EncodedResource = view.cached(self._cla_key, lambda: self._encode_cla(name, view))
        return res

    def _encode_cla(self, name: str, view: View | None) -> EncodedResource:
        if view is None:
            res, _ = encode_cla_resource(name, (), self.draining)
        else:
            res, memo = encode_cla_resource(name, view.snapshot.values(), self.draining,
                                            self._endpoint_memos.get(view))
            self._endpoint_memos[view] = memo
        self._counters[rt.ENDPOINT] += 1
        self.metrics.serializations[rt.ENDPOINT].inc()
        return res

    # ------------------------------------------------------------------ CDS/LDS/RDS

    def _on_cluster_change(self, change: ClusterChange) -> None:
        if change.all_services or change.namespaces:
            known = set(self.cluster.services) | set(self._seen)
            touched = [s for s in known if change.touches(s)]
        else:
            touched = list(change.services)
        self._refresh(touched)
        for svc in touched:
            self._retry_blocked(svc)

    def _refresh(self, services: Iterable[ServiceKey]) -> None:
        changed: dict[str, set[str]] = {rt.CLUSTER: set(), rt.LISTENER: set(), rt.ROUTE: set()}
        for svc_key in services:
            svc = self.cluster.services.get(svc_key)
            if svc is not None and svc.type == "ExternalName":
                svc = None
            if svc is not None and self._seen.get(svc_key) is svc:
                continue
            if svc is None:
                self._seen.pop(svc_key, None)
            else:
                self._seen[svc_key] = svc
            self._refresh_service(svc_key, svc, changed)
        for type_url, names in changed.items():
            if not names:
                continue
            self._counters[type_url] += 1
            watchers = self._watchers[type_url]
            wildcard = self._wildcard.get(type_url, set())
            for name in sorted(names):
                for w in list(watchers.get(name, ())):
                    w.resource_changed(type_url, name)
                for w in list(wildcard):
                    w.resource_changed(type_url, name)

    def _refresh_service(self, svc_key: ServiceKey, svc: Service | None,
                         changed: dict[str, set[str]]) -> None:
        entries: dict[str, PortEntry] = {}
        if svc is not None:
            for sp in svc.ports:
                key = ViewKey(svc_key, sp.port)
                name = key.authority(self.cluster_domain)
                # A port number listed twice (TCP and UDP) is one name: the first wins.
                entries.setdefault(name, PortEntry(key, svc, sp))
        old = self._ports_by_service.pop(svc_key, set())
        for name in old - entries.keys():
            del self._ports[name]
            self._clusters.pop(name, None)
            for type_url, memo in self._by_name.items():
                memo.pop(name, None)
                changed[type_url].add(name)
            changed[rt.CLUSTER].add(name)
        for name, entry in entries.items():
            self._ports[name] = entry
            res = encode_named(rt.CLUSTER, name, build_cluster(name, entry.key, entry.port))
            self.metrics.serializations[rt.CLUSTER].inc()
            old_res = self._clusters.get(name)
            if old_res is None or old_res.version != res.version:
                self._clusters[name] = res
                changed[rt.CLUSTER].add(name)
            if name not in old:
                changed[rt.LISTENER].add(name)
                changed[rt.ROUTE].add(name)
        if entries:
            self._ports_by_service[svc_key] = set(entries)

    def _retry_blocked(self, svc: ServiceKey) -> None:
        blocked = self._blocked.get(svc)
        if not blocked:
            return
        for name, watchers in list(blocked.items()):
            for w in list(watchers):
                key = self._view_key(name, w.node_name)
                assert key is not None
                try:
                    self.views.subscribe(key, w, w.protocol)
                except InvalidService:
                    continue
                watchers.discard(w)
                w.resource_changed(rt.ENDPOINT, name)
            if not watchers:
                del blocked[name]
        if not blocked:
            del self._blocked[svc]

    # ------------------------------------------------------------------ deciding

    def sotw_reply(self, sub: Subscription) -> Reply | None:
        """What a SotW subscription is due now, or None if nothing (§1.6, §1.8)."""
        t = sub.type_url
        if t in rt.FULL_STATE:
            # §1.6: CDS/LDS responses carry the whole subscribed set; one is due when
            # that set, or any member's version, differs from what was last sent.
            scope = set(sub.names)
            if sub.wildcard:
                scope.update(self.wildcard_names(t))
            current = {}
            for name in scope:
                res = self.get(t, name, sub.node_name)
                if res is not None:
                    current[name] = res
            if not sub.must_reply and {n: r.version for n, r in current.items()} == sub.sent:
                return None
            return Reply(t, self.version(t), tuple(current[n] for n in sorted(current)))
        # §1.6: EDS/RDS responses carry only what changed or was newly asked for.
        due = []
        for name in sorted(sub.dirty & sub.names):
            res = self.get(t, name, sub.node_name)
            if res is not None and sub.sent.get(name) != res.version:
                due.append(res)
        if not due and not sub.must_reply:
            return None
        return Reply(t, self.version(t), tuple(due))

    def delta_reply(self, sub: Subscription) -> Reply | None:
        """What a delta subscription is due now (§2): resources whose version differs
        from what the client holds, and names it holds (or asked for) that do not exist."""
        t = sub.type_url
        send: list[EncodedResource] = []
        removed: list[str] = []
        for name in sorted(sub.dirty):
            in_scope = name in sub.names or (sub.wildcard and self.covers(t, name))
            res = self.get(t, name, sub.node_name) if in_scope else None
            held = sub.sent.get(name)
            if res is not None:
                if held != res.version:
                    send.append(res)
            elif in_scope and name in sub.names:
                # §2: a subscribed name that does not exist is reported removed, once.
                if held != ABSENT:
                    removed.append(name)
            elif held is not None and held != ABSENT:
                # Held by the client but gone, or no longer covered by `*`.
                removed.append(name)
        if not send and not removed and not sub.must_reply:
            return None
        return Reply(t, self.version(t), tuple(send), tuple(removed))
