"""EDS: a ClusterLoadAssignment per service-port name, from the shared Views.

* Naming: the service port's authority `<svc>.<ns>.svc.<domain>:<port>`, or
  `<hostname>.<svc>...` for one StatefulSet pod; spelled canonically, so that each
  View has one name. The client's node (node metadata NODE_NAME) picks the View of
  that name, as a Linkerd context token's nodeName does.
* Wildcard: none (§1.5).
* Unknown name: a name that is a service-port authority always has a CLA — empty
  while the service has no endpoints, does not exist (yet) or cannot be watched
  (ExternalName) — so a client is never left waiting on an EDS name (§1.10). A name
  that is no service-port authority never exists: nothing is sent for it.

A watched name is an `EndpointWatch`: the View's subscriber on the stream's behalf,
keeping the View it joined (and is handed on every change), so that what is due is
read from that View and the name is parsed once, when it is first watched.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

from bridge.model import EndpointId, FilterKey, ServiceKey, ViewKey
from bridge.views import InvalidService, View, ViewChange, ViewRegistry
from xds_api import resource_types as rt
from xds_api.caches.type_cache import Version, Watcher
from xds_api.metrics import XdsMetrics
from xds_api.names import parse_resource_name
from xds_api.resources import EncodedEndpoint, EncodedResource, encode_cla_resource
from xds_api.subscription import Subscription


class EndpointWatch:
    """One EDS name watched by one stream: the View's subscriber on its behalf."""

    __slots__ = ("key", "name", "view", "watcher")

    def __init__(self, name: str, key: ViewKey, watcher: Watcher) -> None:
        self.name = name
        self.key = key
        self.watcher = watcher
        # None while the service cannot be watched (ExternalName): retried when a
        # cluster change touches it.
        self.view: View | None = None

    def on_view_change(self, view: View, change: ViewChange) -> None:
        self.view = view
        self.watcher.endpoints_changed(self.name, view)


class EndpointCache:
    type_url = rt.ENDPOINT
    full_state = False

    def __init__(self, views: ViewRegistry, cluster_domain: str, prefix: str, *,
                 draining: bool, metrics: XdsMetrics) -> None:
        self.views = views
        self.cluster_domain = cluster_domain
        self.draining = draining
        self.metrics = metrics
        self._version = Version(prefix)
        # The names each subscription watches, and the View each is watched through.
        self._watches: dict[Subscription, dict[str, EndpointWatch]] = {}
        # Watches whose service cannot be subscribed to now (ExternalName).
        self._blocked: dict[ServiceKey, set[EndpointWatch]] = {}
        self._endpoint_memos: weakref.WeakKeyDictionary[
            View, dict[EndpointId, EncodedEndpoint]] = weakref.WeakKeyDictionary()
        self._cla_key = ("xds_api.cla", draining)

    def version(self) -> str:
        return str(self._version)

    # ------------------------------------------------------------------ reading

    def get(self, name: str, node_name: str = "") -> EncodedResource | None:
        """The CLA of `name` as a client on `node_name` would get it, watched or not."""
        key = self._view_key(name, node_name)
        if key is None:
            return None
        view = self.views.view(key)
        if view is None:
            # Not subscribable (ExternalName) or not watched: no endpoints.
            return self._encode_cla(name, None)
        return self.cla_of(view, name)

    def resource(self, sub: Subscription, name: str) -> EncodedResource | None:
        watch = self._watches.get(sub, {}).get(name)
        if watch is None:
            return self.get(name, sub.node_name)
        if watch.view is None:
            return self._encode_cla(name, None)
        return self.cla_of(watch.view, name)

    def cla_of(self, view: View, name: str) -> EncodedResource:
        """The View's CLA, encoded at most once per View version for every stream."""
        res: EncodedResource = view.cached(self._cla_key, lambda: self._encode_cla(name, view))
        return res

    def wildcard_names(self) -> Iterable[str]:
        return ()

    def covers(self, name: str) -> bool:
        return False

    def _encode_cla(self, name: str, view: View | None) -> EncodedResource:
        if view is None:
            res, _ = encode_cla_resource(name, (), self.draining)
        else:
            res, memo = encode_cla_resource(name, view.snapshot.values(), self.draining,
                                            self._endpoint_memos.get(view))
            self._endpoint_memos[view] = memo
        self._version.bump()
        self.metrics.serializations[rt.ENDPOINT].inc()
        return res

    def _view_key(self, name: str, node_name: str) -> ViewKey | None:
        key = parse_resource_name(name, self.cluster_domain)
        if key is None or not node_name:
            return key
        return ViewKey(key.service, key.port,
                       FilterKey(node_name=node_name, hostname=key.filter.hostname))

    # ------------------------------------------------------------------ watching

    def watch(self, sub: Subscription, names: Iterable[str], watcher: Watcher) -> None:
        watches = self._watches.setdefault(sub, {})
        for name in names:
            key = self._view_key(name, watcher.node_name)
            if key is None or name in watches:
                continue  # names no service port: never exists, nothing to watch
            watch = watches[name] = EndpointWatch(name, key, watcher)
            try:
                watch.view = self.views.subscribe(key, watch, watcher.protocol)
            except InvalidService:
                self._blocked.setdefault(key.service, set()).add(watch)
        if not watches:
            del self._watches[sub]

    def unwatch(self, sub: Subscription, names: Iterable[str], watcher: Watcher) -> None:
        watches = self._watches.get(sub)
        if watches is None:
            return
        for name in names:
            watch = watches.pop(name, None)
            if watch is None:
                continue
            if watch.view is not None:
                self.views.unsubscribe(watch.key, watch)
                continue
            blocked = self._blocked.get(watch.key.service)
            if blocked is not None:
                blocked.discard(watch)
                if not blocked:
                    del self._blocked[watch.key.service]
        if not watches:
            del self._watches[sub]

    def watch_wildcard(self, watcher: Watcher) -> None:
        pass  # no wildcard for EDS: a subscription never asks for one

    def unwatch_wildcard(self, watcher: Watcher) -> None:
        pass

    def services_changed(self, services: Iterable[ServiceKey]) -> None:
        """Retry the blocked watches of these services: one may be watchable now."""
        for svc in services:
            blocked = self._blocked.get(svc)
            if not blocked:
                continue
            for watch in sorted(blocked, key=lambda w: w.name):
                try:
                    watch.view = self.views.subscribe(watch.key, watch,
                                                      watch.watcher.protocol)
                except InvalidService:
                    continue
                blocked.discard(watch)
                watch.watcher.resource_changed(rt.ENDPOINT, watch.name)
            if not blocked:
                del self._blocked[svc]
