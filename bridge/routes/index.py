"""The route tables of every Service port, kept up to date as the cluster changes.

Incremental like the Views: a route edit recomputes the ports of the Services it
attaches to (before and after the edit), a ServiceProfile edit the ports of the
Service it is named after, a Service edit its own ports and the ports whose routes
send to it, and nothing else (Routes §4). Those who read the tables
(the xDS route cache, the Linkerd policy service) are told which ports changed; those
who follow routes themselves (the status writer) which routes a change may concern:
the routes that changed and every route attached to a Service whose ports were redone.

The cluster cache is read through `Cluster.objects(kind)` and `Cluster.services`, and
route edits are found by comparing the cached route objects with those last seen
(objects are immutable values, so an unchanged one is the very same object).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import structlog

from bridge.authority import AuthorityError, parse_service_host
from bridge.cluster import Cluster, ClusterChange, ListenerStage
from bridge.model import ServiceKey
from bridge.objects import Service, ServiceProfile
from bridge.routes.objects import Route
from bridge.routes.profile_routes import profile_ref, profile_table
from bridge.routes.profiles import ProfileError
from bridge.routes.resolve import PortRoutes, ServiceLookup, resolve_port
from bridge.routes.table import RouteTable

log = structlog.get_logger("meshbridge.routes")

# The cache kinds routes are stored under (bridge.policy_objects.ROUTE_KINDS).
ROUTE_STORE_KINDS = ("GRPCRoute", "GatewayHTTPRoute", "HTTPRoute")

PortKey = tuple[ServiceKey, int]
RouteKey = tuple[str, str, str]  # (store kind, namespace, name)
ProfileKey = tuple[str, str]  # (namespace, name), as the cluster keys ServiceProfiles
PortsListener = Callable[[frozenset[PortKey]], None]
RoutesListener = Callable[[frozenset[RouteKey]], None]


@dataclass(frozen=True, slots=True)
class RouteRecord:
    """A route as the index holds it, with the Services it attaches to."""

    route: Route
    parents: frozenset[ServiceKey]


class RouteIndex:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.cluster_domain = cluster.identity.domain  # ServiceProfiles are named in it
        self.ports: dict[PortKey, PortRoutes] = {}
        self._routes: dict[RouteKey, RouteRecord] = {}
        self._by_parent: dict[ServiceKey, set[RouteKey]] = {}
        # ServiceProfiles by the Service their name is (any namespace may hold one).
        self._profiles_of: dict[ServiceKey, set[ProfileKey]] = {}
        self._profile_service: dict[ProfileKey, ServiceKey] = {}
        # Ports whose tables resolve a backend to this Service (or fail to find it).
        self._by_backend: dict[ServiceKey, set[PortKey]] = {}
        self._backends_of: dict[PortKey, frozenset[ServiceKey]] = {}
        self._ports_of: dict[ServiceKey, set[int]] = {}
        self._listeners: list[PortsListener] = []
        self._route_listeners: list[RoutesListener] = []
        self._logged: set[tuple[object, ...]] = set()
        self.recomputed = 0  # ports resolved since start (tests read it)
        touched: set[ServiceKey] = set()
        self._sync(ROUTE_STORE_KINDS, touched, set())
        self._sync_profiles(list(cluster.profiles), touched)
        self._recompute(touched)
        cluster.add_listener(self._on_change, ListenerStage.VIEWS)

    def close(self) -> None:
        self.cluster.remove_listener(self._on_change)

    # ------------------------------------------------------------------ reading

    def port(self, service: ServiceKey, port: int) -> PortRoutes | None:
        return self.ports.get((service, port))

    def table(self, service: ServiceKey, port: int, client_namespace: str
              ) -> RouteTable | None:
        """The table a client in `client_namespace` is routed by; None when no route
        is attached (the port keeps its default behaviour)."""
        found = self.ports.get((service, port))
        return found.table_for(client_namespace) if found is not None else None

    def routes(self) -> list[Route]:
        return [rec.route for _, rec in sorted(self._routes.items())]

    def route(self, key: RouteKey) -> Route | None:
        rec = self._routes.get(key)
        return rec.route if rec is not None else None

    def route_keys(self) -> frozenset[RouteKey]:
        return frozenset(self._routes)

    def add_listener(self, listener: PortsListener) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: PortsListener) -> None:
        self._listeners.remove(listener)

    def add_routes_listener(self, listener: RoutesListener) -> None:
        """`listener` is told, once per cluster change, the routes it may concern."""
        self._route_listeners.append(listener)

    def remove_routes_listener(self, listener: RoutesListener) -> None:
        self._route_listeners.remove(listener)

    # ------------------------------------------------------------------ changes

    def _on_change(self, change: ClusterChange) -> None:
        touched: set[ServiceKey] = set()
        routes: set[RouteKey] = set()
        kinds = [k for k in ROUTE_STORE_KINDS if k in change.kinds]
        if kinds:
            self._sync(kinds, touched, routes)
        if change.profiles:
            self._sync_profiles(change.profiles, touched)
        services = set(change.service_objects)
        if change.all_services or change.namespaces:
            services |= {s for s in self._known_services() if change.touches(s)}
        for svc in services:
            touched.add(svc)
            for port_key in self._by_backend.get(svc, ()):
                touched.add(port_key[0])
        if touched:
            self._recompute(touched)
        if self._route_listeners:
            for svc in touched:
                routes |= self._by_parent.get(svc, set())
            if routes:
                frozen = frozenset(routes)
                for listener in list(self._route_listeners):
                    listener(frozen)

    def _known_services(self) -> set[ServiceKey]:
        return set(self._by_parent) | set(self._ports_of) | set(self._profiles_of)

    def _sync_profiles(self, keys: Iterable[ProfileKey], touched: set[ServiceKey]) -> None:
        """Routes §7.1: a ServiceProfile is about the Service its name is."""
        for key in keys:
            old = self._profile_service.pop(key, None)
            if old is not None:
                touched.add(old)
                self._profiles_of[old].discard(key)
                if not self._profiles_of[old]:
                    del self._profiles_of[old]
            if key not in self.cluster.profiles:
                continue
            try:
                svc, instance = parse_service_host(key[1], self.cluster_domain)
            except AuthorityError:
                continue  # not named after a Service: no proxy asks for it
            if instance:
                continue
            self._profile_service[key] = svc
            self._profiles_of.setdefault(svc, set()).add(key)
            touched.add(svc)

    def _sync(self, kinds: Iterable[str], touched: set[ServiceKey],
              routes: set[RouteKey]) -> None:
        """Find the route objects that came, went or changed since last seen (their
        keys into `routes`)."""
        current: dict[RouteKey, Route] = {}
        for kind in kinds:
            for obj in self.cluster.objects(kind):
                if isinstance(obj, Route):
                    current[(kind, obj.meta.namespace, obj.meta.name)] = obj
        kinds = set(kinds)
        for key in [k for k in self._routes if k[0] in kinds and k not in current]:
            self._forget(key, touched)
            routes.add(key)
        for key, route in current.items():
            old = self._routes.get(key)
            if old is not None and old.route is route:
                continue
            routes.add(key)
            if old is not None:
                self._forget(key, touched)
            parents = frozenset(ServiceKey(p.namespace, p.name) for p in route.parents
                                if p.kind == "Service" and p.group in ("", "core"))
            self._routes[key] = RouteRecord(route, parents)
            for svc in parents:
                self._by_parent.setdefault(svc, set()).add(key)
            touched |= parents
            if not parents:
                self._log_once(("no-parent", key), "route attaches to no Service; it is "
                               "not served", route=route.label)

    def _forget(self, key: RouteKey, touched: set[ServiceKey]) -> None:
        rec = self._routes.pop(key)
        for svc in rec.parents:
            keys = self._by_parent.get(svc)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_parent[svc]
        touched |= rec.parents

    def _recompute(self, services: Iterable[ServiceKey]) -> None:
        changed: set[PortKey] = set()
        lookup: ServiceLookup = self.cluster.services.get
        for svc_key in services:
            svc = self.cluster.services.get(svc_key)
            attached = [self._routes[k].route for k in sorted(self._by_parent.get(svc_key, ()))]
            profiles = [p for k in sorted(self._profiles_of.get(svc_key, ()))
                        if (p := self.cluster.profiles.get(k)) is not None]
            old_ports = {(svc_key, port) for port in self._ports_of.get(svc_key, ())}
            new: dict[PortKey, PortRoutes] = {}
            if svc is not None and svc.type != "ExternalName" and (attached or profiles):
                for sp in svc.ports:
                    mine = [r for r in attached
                            if r.attaches_to(svc_key.namespace, svc_key.name, sp.port, sp.name)]
                    by_profile = {p.meta.namespace: self._profile_table(svc_key, sp.port, p)
                                  for p in profiles}
                    if mine or any(t is not None for t in by_profile.values()):
                        new[(svc_key, sp.port)] = resolve_port(svc, sp.port, mine, lookup,
                                                               by_profile)
                        self.recomputed += 1
            elif attached:
                self._log_missing_parent(svc_key, svc, attached)
            if new:
                self._ports_of[svc_key] = {port for _, port in new}
            else:
                self._ports_of.pop(svc_key, None)
            for port_key in old_ports - new.keys():
                del self.ports[port_key]
                self._set_backends(port_key, frozenset())
                changed.add(port_key)
            for port_key, routes in new.items():
                if self.ports.get(port_key) != routes:
                    self.ports[port_key] = routes
                    changed.add(port_key)
                    self._report(routes)
                self._set_backends(port_key, frozenset().union(
                    *(t.backends for t in routes.tables())))
        if changed:
            frozen = frozenset(changed)
            for listener in list(self._listeners):
                listener(frozen)

    def _profile_table(self, service: ServiceKey, port: int,
                       profile: ServiceProfile) -> RouteTable | None:
        try:
            return profile_table(service, port, profile, self.cluster.services.get,
                                 self.cluster_domain)
        except ProfileError as e:
            # Linkerd drops such a profile whole; so does the route model (GetProfile
            # keeps the last good one it sent, Routes §7.1).
            self._log_once(("profile", profile_ref(profile), str(e)),
                           "ServiceProfile cannot be read; the port is routed as if it "
                           "had none", route=profile_ref(profile).label, reason=str(e))
            return None

    def _set_backends(self, port_key: PortKey, backends: frozenset[ServiceKey]) -> None:
        old = self._backends_of.get(port_key, frozenset())
        for svc in old - backends:
            ports = self._by_backend.get(svc)
            if ports is not None:
                ports.discard(port_key)
                if not ports:
                    del self._by_backend[svc]
        for svc in backends - old:
            self._by_backend.setdefault(svc, set()).add(port_key)
        if backends:
            self._backends_of[port_key] = backends
        else:
            self._backends_of.pop(port_key, None)

    # ------------------------------------------------------------------ logging

    def _report(self, routes: PortRoutes) -> None:
        """Routes §3.4: each thing a route asks for that is not served as written is
        logged once, naming the route and the field."""
        for table in routes.tables():
            for item in table.problems:
                self._log_once(("problem", item.route, item.problem.path, item.problem.rule),
                               "route rule not served as written", route=item.route.label,
                               field=item.problem.path, reason=item.problem.rule,
                               effect=item.problem.effect.value)
        for group, ref, winner in routes.conflicted:
            self._log_once(("conflict", ref, routes.service, routes.port),
                           f"route not used: a {winner.name} route is attached to the same "
                           "Service port", route=ref.label,
                           service=f"{routes.service.namespace}/{routes.service.name}",
                           port=routes.port, clients=group or "all")

    def _log_missing_parent(self, key: ServiceKey, svc: Service | None,
                            attached: list[Route]) -> None:
        why = "no such Service" if svc is None else "an ExternalName Service"
        for route in attached:
            self._log_once(("parent", route.label, key), f"route parent is {why}; not served",
                           route=route.label, service=f"{key.namespace}/{key.name}")

    def _log_once(self, key: tuple[object, ...], message: str, **fields: object) -> None:
        if key in self._logged or len(self._logged) > 100_000:
            return
        self._logged.add(key)
        log.warning(message, **fields)


_SHARED: weakref.WeakKeyDictionary[Cluster, RouteIndex] = weakref.WeakKeyDictionary()


def route_index(cluster: Cluster) -> RouteIndex:
    """The one RouteIndex of `cluster`, made on first use: every protocol layer reads
    the same tables, computed once."""
    index = _SHARED.get(cluster)
    if index is None:
        index = _SHARED[cluster] = RouteIndex(cluster)
    return index
