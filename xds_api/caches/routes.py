"""RDS: the RouteConfiguration each service port's listener names, built from the one
route model (bridge.routes) for the client kind and namespace that asks.

* Naming: the service port's authority, as its Listener and Cluster.
* Wildcard: none; §1.5 gives RDS no wildcard, so `*` is an ordinary (unknown) name.
* Unknown name: nothing is sent for it (SotW sends only what exists; delta reports
  it removed, once).
* Content: a port without routes sends everything to its own cluster. A port with
  routes gets its table (Routes §1.2: the client namespace's consumer routes, else
  the producer's; a ServiceProfile's where one routes the port, Routes §7) as Envoy is
  told it, or restricted to what grpc accepts (§3.8).
  Each variant is encoded once per route change, whatever the number of streams.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog

from bridge.authority import view_authority
from bridge.model import ViewKey
from bridge.routes.index import PortKey, RouteIndex
from xds_api import resource_types as rt
from xds_api.caches.ports import PortsChange, ServicePorts
from xds_api.caches.type_cache import NamedWatchers, Version, Watcher
from xds_api.metrics import XdsMetrics
from xds_api.resources import EncodedResource, encode_named
from xds_api.route_config import (
    ClientKind,
    Unrepresentable,
    build_default_route,
    build_route_config,
)
from xds_api.subscription import Subscription

log = structlog.get_logger("meshbridge.xds.routes")

# A subscription's client kind (its node's, xds_api.node_identity) as a ClientKind.
_KINDS = {kind.value: kind for kind in ClientKind}
# (name, client kind, table group: PortRoutes.group_of's key)
VariantKey = tuple[str, ClientKind, str]
# (name, a subscription's client kind, its namespace): what such a subscription is sent.
ClientKey = tuple[str, str, str]
# Entries kept in the per-client-key memo before it is emptied: a bound on what
# clients presenting ever new namespaces can make it hold between route changes.
MAX_CLIENT_KEYS = 100_000


class RouteCache:
    type_url = rt.ROUTE
    full_state = False

    def __init__(self, ports: ServicePorts, routes: RouteIndex, prefix: str,
                 metrics: XdsMetrics) -> None:
        self.ports = ports
        self.routes = routes
        self.metrics = metrics
        self._version = Version(prefix)
        self._built: dict[VariantKey, EncodedResource] = {}
        # The variant each (name, client kind, client namespace) is sent, found in one
        # look-up per stream when a change fans out to thousands (the variant itself is
        # built once, in `_built`); forgotten with the variants of its name.
        self._by_client: dict[ClientKey, EncodedResource] = {}
        # What each variant could not tell its client kind (for the debug pages).
        self.left_out: dict[VariantKey, tuple[Unrepresentable, ...]] = {}
        self._logged: set[tuple[object, ...]] = set()
        self.watchers = NamedWatchers(self.type_url)
        routes.add_listener(self._routes_changed)

    def close(self) -> None:
        self.routes.remove_listener(self._routes_changed)

    def version(self) -> str:
        return str(self._version)

    def get(self, name: str, node_name: str = "") -> EncodedResource | None:
        return self.variant(name, ClientKind.ENVOY, "")

    def resource(self, sub: Subscription, name: str) -> EncodedResource | None:
        key = (name, sub.client, sub.namespace)
        res = self._by_client.get(key)
        if res is None:
            res = self.variant(name, _KINDS.get(sub.client, ClientKind.ENVOY), sub.namespace)
            if res is not None:
                if len(self._by_client) >= MAX_CLIENT_KEYS:
                    self._by_client.clear()
                self._by_client[key] = res
        return res

    def variant(self, name: str, client: ClientKind,
                client_namespace: str) -> EncodedResource | None:
        """The RouteConfiguration `name` as a client of this kind in this namespace is
        sent it; None if the name is no service port."""
        built = self._variant(name, client, client_namespace)
        if built is None:
            return None
        key, res, left_out = built
        kept = self._built.get(key)
        if kept is not None:
            return kept
        self._built[key] = res
        self.left_out[key] = left_out
        self.metrics.serializations[self.type_url].inc()
        for item in left_out:
            self._log_once(client, item)
        return res

    def preview(self, name: str, client: ClientKind, client_namespace: str
                ) -> tuple[EncodedResource, tuple[Unrepresentable, ...]] | None:
        """`variant` and what it leaves out, for debug pages: what is kept if it was
        built, else built afresh and kept nowhere, so a read counts and logs nothing."""
        built = self._variant(name, client, client_namespace)
        if built is None:
            return None
        key, res, left_out = built
        kept = self._built.get(key)
        return (kept, self.left_out.get(key, ())) if kept is not None else (res, left_out)

    def _variant(self, name: str, client: ClientKind, client_namespace: str
                 ) -> tuple[tuple[str, ClientKind, str], EncodedResource,
                            tuple[Unrepresentable, ...]] | None:
        entry = self.ports.entries.get(name)
        if entry is None:
            return None
        port_routes = self.routes.port(entry.key.service, entry.key.port)
        group = port_routes.group_of(client_namespace) if port_routes is not None else ""
        key = (name, client, group)
        res = self._built.get(key)
        if res is not None:
            return key, res, self.left_out.get(key, ())
        table = port_routes.table_of(group) if port_routes is not None else None
        if table is None:
            message = build_default_route(name)
            left_out: tuple[Unrepresentable, ...] = ()
        else:
            message, left_out = build_route_config(name, table, client,
                                                   self.ports.cluster_domain)
        return key, encode_named(self.type_url, name, message), left_out

    def _log_once(self, client: ClientKind, item: Unrepresentable) -> None:
        key = (client, item.route, item.what)
        if key in self._logged or len(self._logged) > 100_000:
            return
        self._logged.add(key)
        log.warning("route not fully representable for this client kind; left out of its "
                    "RouteConfiguration", client=client.value, route=item.route,
                    left_out=item.what)

    def wildcard_names(self) -> Iterable[str]:
        return ()

    def covers(self, name: str) -> bool:
        return False

    def watch(self, sub: Subscription, names: Iterable[str], watcher: Watcher) -> None:
        self.watchers.watch(names, watcher)

    def unwatch(self, sub: Subscription, names: Iterable[str], watcher: Watcher) -> None:
        self.watchers.unwatch(names, watcher)

    def watch_wildcard(self, watcher: Watcher) -> None:
        pass  # no wildcard for RDS: a subscription never asks for one

    def unwatch_wildcard(self, watcher: Watcher) -> None:
        pass

    def _forget(self, names: Iterable[str]) -> None:
        names = set(names)
        for key in [k for k in self._built if k[0] in names]:
            del self._built[key]
            self.left_out.pop(key, None)
        for client_key in [k for k in self._by_client if k[0] in names]:
            del self._by_client[client_key]

    def ports_changed(self, change: PortsChange) -> None:
        # Only a port appearing or going changes a name's existence; its content is
        # the route index's to change (`_routes_changed`).
        self._forget(change.removed)
        changed = change.added | change.removed
        if changed:
            self._version.bump()
            self.watchers.notify(changed)

    def _routes_changed(self, ports: frozenset[PortKey]) -> None:
        names = {view_authority(ViewKey(svc, port), self.ports.cluster_domain)
                 for svc, port in ports}
        self._forget(names)
        self._version.bump()
        self.watchers.notify(names)

