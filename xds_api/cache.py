"""The resource cache: one cache per xDS type, behind a mux that routes by type URL.

The cache decides *what* to send; the streams (`stream.py`) decide *how*: nonces,
ACKs, ordering and writing. They reach it through one small seam (`stream.Resources`):
watch and release a subscription's names, and ask what a subscription is due. Each
type's rules live in its own module under `xds_api/caches/`:

* EDS (`caches/endpoints.py`): ClusterLoadAssignments from the shared Views. A watched
  name joins its View as a subscriber; the CLA is kept by the View as a derived
  value, encoded once per View version and handed to every watch of it, whatever
  its stream's protocol variant.
* CDS (`caches/clusters.py`): one Cluster per port of every Service (ExternalName
  excepted), rebuilt only for the services a cluster change touches; the CDS version
  moves only on real change.
* LEDS (`caches/leds.py`): each endpoint its own LbEndpoint resource, in one glob
  collection per locality of a delta client's CLA, from the same CLA assembly as
  EDS (`xds_api/assembly.py`), followed change by change.
* LDS (`caches/listeners.py`): the proxyless Listener of every such service port,
  built on first request (its content is a function of the name).
* RDS (`caches/routes.py`): the RouteConfiguration of every service port, from the
  one route model (`bridge.routes`), per client kind (Envoy, proxyless gRPC) and
  client namespace, each variant encoded once per route change.

The mux owns what the types share: the index of service
ports (`caches/ports.py`) and the one Cluster listener that keeps it, and tells each
type what a change did.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable

from bridge.cluster import Cluster, ClusterChange, ListenerStage
from bridge.model import ServiceKey
from bridge.routes.index import route_index
from bridge.views import View, ViewRegistry
from xds_api import resource_types as rt
from xds_api.caches.clusters import ClusterCache
from xds_api.caches.endpoints import DEFAULT_LEDS_THRESHOLD, EndpointCache
from xds_api.caches.leds import LedsCache
from xds_api.caches.listeners import ListenerCache
from xds_api.caches.ports import PortEntry, ServicePorts
from xds_api.caches.routes import RouteCache
from xds_api.caches.type_cache import (
    Reply,
    TypeCache,
    Watcher,
    delta_reply,
    sotw_reply,
)
from xds_api.metrics import XdsMetrics
from xds_api.resources import LINKERD_ENCODER, EncodedResource, MetadataEncoder
from xds_api.subscription import NameChange, Subscription

__all__ = ["PortEntry", "Reply", "ResourceCache", "Watcher"]

class ResourceCache:
    def __init__(
        self,
        cluster: Cluster,
        views: ViewRegistry,
        cluster_domain: str,
        *,
        draining: bool = False,
        metrics: XdsMetrics | None = None,
        metadata: MetadataEncoder = LINKERD_ENCODER,
        leds_threshold: int = DEFAULT_LEDS_THRESHOLD,
    ) -> None:
        self.cluster = cluster
        self.views = views
        self.cluster_domain = cluster_domain
        self.draining = draining
        self.metrics = metrics or XdsMetrics()
        # Each type's change count names this process (debugging only: what goes on
        # the wire is content-derived, §1.2).
        prefix = secrets.token_hex(3)
        self.ports = ServicePorts(cluster_domain)
        self.endpoints = EndpointCache(views, cluster_domain, prefix, draining=draining,
                                       metrics=self.metrics, metadata=metadata,
                                       leds_threshold=leds_threshold)
        self.leds = LedsCache(self.endpoints, views, cluster_domain, prefix, self.metrics)
        self.clusters = ClusterCache(prefix, self.metrics)
        self.listeners = ListenerCache(self.ports, prefix, self.metrics)
        self.routes = RouteCache(self.ports, route_index(cluster), prefix,
                                 self.metrics)
        # The one table that routes by type URL.
        self._types: dict[str, TypeCache] = {
            rt.CLUSTER: self.clusters, rt.ENDPOINT: self.endpoints,
            rt.LB_ENDPOINT: self.leds, rt.LISTENER: self.listeners, rt.ROUTE: self.routes}
        self._prefix = prefix
        self._refresh(list(cluster.services))
        cluster.add_listener(self._on_cluster_change, ListenerStage.RESOURCES)
        self._closed = False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.cluster.remove_listener(self._on_cluster_change)
            self.routes.close()

    # ------------------------------------------------------------------ reading

    def cache_of(self, type_url: str) -> TypeCache | None:
        return self._types.get(type_url)

    def version(self, type_url: str) -> str:
        cache = self._types.get(type_url)
        return cache.version() if cache is not None else f"{self._prefix}-0"

    def get(self, type_url: str, name: str, node_name: str = "", *,
            delta: bool = False) -> EncodedResource | None:
        """The current resource, or None if it does not exist; EDS resources are the
        View of the client's node (topology hints, internalTrafficPolicy, weights),
        and for a delta client a deleted service's CLA does not exist (§2.1)."""
        if type_url == rt.ENDPOINT:
            return self.endpoints.get(name, node_name, delta=delta)
        cache = self._types.get(type_url)
        return cache.get(name, node_name) if cache is not None else None

    def wildcard_names(self, type_url: str) -> Iterable[str]:
        """What `*` covers for this type (each type's module says)."""
        cache = self._types.get(type_url)
        return cache.wildcard_names() if cache is not None else ()

    def covers(self, type_url: str, name: str) -> bool:
        cache = self._types.get(type_url)
        return cache is not None and cache.covers(name)

    def port_names(self) -> list[str]:
        return self.ports.names()

    def views_of(self, sub: Subscription) -> list[View]:
        """The Views a subscription's names are watched through (EDS, LEDS)."""
        if sub.type_url == rt.ENDPOINT:
            return self.endpoints.views_of(sub)
        if sub.type_url == rt.LB_ENDPOINT:
            return self.leds.views_of(sub)
        return []

    def cla_of(self, view: View) -> EncodedResource:
        """The View's CLA, encoded at most once per View version for every stream."""
        return self.endpoints.cla_of(view)

    # ------------------------------------------------------------------ watching

    def watch(self, sub: Subscription, change: NameChange, watcher: Watcher) -> None:
        """Apply a subscription's change of names to its type's watches."""
        cache = self._types.get(sub.type_url)
        if cache is None:
            return
        if change.removed:
            cache.unwatch(sub, change.removed, watcher)
        if change.added:
            cache.watch(sub, change.added, watcher)
        if change.wildcard_added:
            cache.watch_wildcard(watcher)
        if change.wildcard_removed:
            cache.unwatch_wildcard(watcher)

    def release(self, sub: Subscription, watcher: Watcher) -> None:
        """Drop every watch of a subscription whose stream is over."""
        cache = self._types.get(sub.type_url)
        if cache is None:
            return
        if sub.names:
            cache.unwatch(sub, sub.names, watcher)
        if sub.wildcard:
            cache.unwatch_wildcard(watcher)

    # ------------------------------------------------------------------ deciding

    def sotw_reply(self, sub: Subscription) -> Reply | None:
        """What a SotW subscription is due now, or None if nothing (§1.6, §1.8)."""
        return sotw_reply(self._types[sub.type_url], sub)

    def delta_reply(self, sub: Subscription) -> Reply | None:
        """What a delta subscription is due now (§2; LEDS by collection, §7.3)."""
        if sub.type_url == rt.LB_ENDPOINT:
            return self.leds.delta_reply(sub)
        return delta_reply(self._types[sub.type_url], sub)

    # ------------------------------------------------------------------ changes

    def _on_cluster_change(self, change: ClusterChange) -> None:
        if change.all_services or change.namespaces:
            known = set(self.cluster.services) | set(self.ports.seen)
            touched = [s for s in known if change.touches(s)]
        else:
            touched = list(change.services)
        self._refresh(touched)
        if change.pods:
            self.endpoints.pods_changed(change.pods)
        self.endpoints.services_changed(touched)
        self.leds.services_changed(touched)

    def _refresh(self, services: Iterable[ServiceKey]) -> None:
        ports = self.ports.refresh(services, self.cluster.services)
        # CDS, LDS, RDS: the order their watchers are told in.
        self.clusters.ports_changed(ports)
        self.listeners.ports_changed(ports)
        self.routes.ports_changed(ports)
