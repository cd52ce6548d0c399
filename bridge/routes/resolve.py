"""From the routes attached to one Service port to its `RouteTable`s: pure functions.

Routes §1 says which routes apply (attachment, producer and consumer routes, route
types), §1.4 in which order their matches are tried, §3 how each rule is served and
what is answered for what cannot be.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from bridge.model import ServiceKey
from bridge.objects import Service
from bridge.routes.objects import (
    BackendRef,
    Effect,
    GrpcMatch,
    HttpMatch,
    Problem,
    Retry,
    Route,
    RoutePolicy,
    RouteRule,
    Timeouts,
    annotation_policy,
)
from bridge.routes.table import (
    ResolvedBackend,
    ResolvedMirror,
    ResolvedRoute,
    ResolvedRule,
    RouteRef,
    RouteTable,
    RouteType,
    TableEntry,
    Unhonoured,
)

ServiceLookup = Callable[[ServiceKey], Service | None]


@dataclass(frozen=True, slots=True)
class PortRoutes:
    """Every table of one Service port: the producer's, one per namespace that has
    consumer routes for it (Routes §1.2), and one per ServiceProfile that routes it
    (Routes §7.1)."""

    service: ServiceKey
    port: int
    producer: RouteTable | None
    consumers: Mapping[str, RouteTable]
    # Routes attached here that lost to a route type of higher precedence, by group
    # ("" for the producer's), with the type that won (Routes §1.3).
    conflicted: tuple[tuple[str, RouteRef, RouteType], ...] = ()
    # The ServiceProfiles of the Service, by their namespace: the table each routes
    # the port by, or None for one a proxy would not route by (no route, no override).
    profiles: Mapping[str, RouteTable | None] = field(default_factory=dict)

    def group_of(self, client_namespace: str, profiles: bool = True) -> str:
        """Which table a client in `client_namespace` is routed by, as a key that
        clients routed alike share: a ServiceProfile's (the client's own namespace's
        if it has one, else the Service's, Routes §7.1) when it routes, else its
        namespace's consumer routes if there are any, else the producer's (Routes
        §1.2). `profiles=False`: as if there were no ServiceProfiles."""
        if profiles:
            ns = client_namespace if client_namespace in self.profiles \
                else self.service.namespace
            if self.profiles.get(ns) is not None:
                return PROFILE_GROUP_PREFIX + ns
        return client_namespace if client_namespace in self.consumers else ""

    def table_of(self, group: str) -> RouteTable | None:
        """The table of a group `group_of` named."""
        if group.startswith(PROFILE_GROUP_PREFIX):
            return self.profiles.get(group.removeprefix(PROFILE_GROUP_PREFIX))
        return self.consumers.get(group) if group else self.producer

    def table_for(self, client_namespace: str, profiles: bool = True) -> RouteTable | None:
        """The table a client in `client_namespace` is routed by."""
        return self.table_of(self.group_of(client_namespace, profiles))

    def overriding_profile(self, route_namespace: str) -> RouteTable | None:
        """The ServiceProfile table that replaces the routes of `route_namespace`'s
        group for the clients that group serves (its own namespace's profile, else
        the Service's), if any routes."""
        ns = route_namespace if route_namespace in self.profiles else self.service.namespace
        return self.profiles.get(ns)

    def tables(self) -> list[RouteTable]:
        out = [] if self.producer is None else [self.producer]
        out += [self.consumers[ns] for ns in sorted(self.consumers)]
        return out + [t for ns in sorted(self.profiles) if (t := self.profiles[ns]) is not None]


# A group key (PortRoutes.group_of) naming a ServiceProfile's table; no namespace of
# consumer routes can be spelled so.
PROFILE_GROUP_PREFIX = "profile:"


def ref_of(route: Route) -> RouteRef:
    return RouteRef(route.group, route.route_kind, route.meta.namespace, route.meta.name,
                    route.kind)


def route_type(route: Route) -> RouteType:
    return RouteType.GRPC if route.route_kind == "GRPCRoute" else RouteType.HTTP


def resolve_port(service: Service, port: int, attached: Iterable[Route],
                 lookup: ServiceLookup,
                 profiles: Mapping[str, RouteTable | None] | None = None) -> PortRoutes:
    """The tables of `service`'s `port`, from the routes attached to it (and the
    tables its ServiceProfiles give it, by their namespace)."""
    key = ServiceKey(service.meta.namespace, service.meta.name)
    groups: dict[str, list[Route]] = {}
    for route in attached:
        ns = "" if route.meta.namespace == key.namespace else route.meta.namespace
        groups.setdefault(ns, []).append(route)
    svc_policy = annotation_policy(service.meta.annotations)
    tables: dict[str, RouteTable] = {}
    conflicted: list[tuple[str, RouteRef, RouteType]] = []
    for ns, routes in groups.items():
        # Routes §1.3: one route type per Service port, GRPCRoute over HTTPRoute.
        winner = (RouteType.GRPC if any(route_type(r) is RouteType.GRPC for r in routes)
                  else RouteType.HTTP)
        conflicted.extend((ns, ref_of(r), winner) for r in routes
                          if route_type(r) is not winner)
        chosen = [r for r in routes if route_type(r) is winner]
        tables[ns] = resolve_table(key, port, winner, chosen, lookup, svc_policy, ns)
    producer = tables.pop("", None)
    return PortRoutes(key, port, producer, tables, tuple(conflicted), dict(profiles or {}))


def _order(route: Route) -> tuple[bool, str, str, str]:
    # Routes §1.4: oldest first (a route without a timestamp after those with one),
    # then by namespace and name.
    return (not route.created, route.created, route.meta.namespace, route.meta.name)


def resolve_table(service: ServiceKey, port: int, kind: RouteType, routes: Iterable[Route],
                  lookup: ServiceLookup, svc_policy: RoutePolicy | None = None,
                  consumer_namespace: str = "") -> RouteTable:
    svc_policy = svc_policy or RoutePolicy()
    resolved: list[ResolvedRoute] = []
    problems: list[Unhonoured] = []
    for route in sorted(routes, key=_order):
        ref = ref_of(route)
        problems.extend(Unhonoured(ref, p) for p in (*route.problems, *route.policy.problems))
        if any(p.effect is Effect.ROUTE for p in route.problems):
            continue
        rules = []
        for index, rule in enumerate(route.rules):
            problems.extend(Unhonoured(ref, p) for p in rule.problems)
            out = _resolve_rule(service, port, route, ref, index, rule, lookup, svc_policy,
                                problems)
            if out is not None:
                rules.append(out)
        resolved.append(ResolvedRoute(ref, route.hostnames, tuple(rules), route.created,
                                      _linkerd_drops(route)))
    entries = [TableEntry(m, rule) for r in resolved for rule in r.rules
               for m in (rule.matches or (_match_all(kind),))]
    entries.sort(key=_grpc_precedence if kind is RouteType.GRPC else _http_precedence)
    return RouteTable(service, port, kind, tuple(resolved), tuple(entries), tuple(problems),
                      consumer_namespace)


def _match_all(kind: RouteType) -> HttpMatch | GrpcMatch:
    # Routes §2.2: a rule without matches matches every request (prefix `/`).
    return GrpcMatch() if kind is RouteType.GRPC else HttpMatch()


def _linkerd_drops(route: Route) -> str:
    for rule in route.rules:
        if rule.rewrite is not None:
            return "URLRewrite"
        if rule.mirrors:
            return "RequestMirror"
    return ""


def _resolve_rule(service: ServiceKey, port: int, route: Route, ref: RouteRef, index: int,
                  rule: RouteRule, lookup: ServiceLookup, svc_policy: RoutePolicy,
                  problems: list[Unhonoured]) -> ResolvedRule | None:
    if any(p.effect is Effect.RULE_DROPPED for p in rule.problems):
        return None  # Routes §3.4: its requests fall through to the rules after it
    failure = next((p.rule for p in rule.problems if p.effect is Effect.RULE_FAILS), "")
    timeouts, retry = _effective_policy(rule, route.policy, svc_policy)
    backends: tuple[ResolvedBackend, ...] = ()
    to_parent = False
    if not failure:
        if rule.backends:
            backends = tuple(_backend(service, route, b, lookup, problems, ref,
                                      f"spec.rules[{index}].backendRefs[{j}]")
                             for j, b in enumerate(rule.backends))
        elif rule.redirect is None:
            # Routes §3.2: a rule that names no backend keeps the parent Service port.
            to_parent = True
            backends = (ResolvedBackend(
                BackendRef("", "Service", service.name, service.namespace, port, 1),
                service, port, 1),)
    mirrors = tuple(
        ResolvedMirror(_backend(service, route, m.backend, lookup, problems, ref,
                                f"spec.rules[{index}].filters (RequestMirror {j})"),
                       m.percent)
        for j, m in enumerate(rule.mirrors))
    return ResolvedRule(ref, index, rule, backends, to_parent, timeouts, retry, mirrors,
                        failure, route.created)


def _effective_policy(rule: RouteRule, route: RoutePolicy,
                      svc: RoutePolicy) -> tuple[Timeouts, Retry | None]:
    """Routes §3.3: a route's annotations win over the rule's Gateway API fields; the
    Service's annotations apply only where the route sets no timeout (resp. retry)."""
    own = Timeouts(
        request=route.timeouts.request if route.timeouts.request is not None
        else rule.timeouts.request,
        backend_request=rule.timeouts.backend_request,
        response=route.timeouts.response, idle=route.timeouts.idle)
    timeouts = own if own else svc.timeouts
    retry = route.retry or rule.retry or svc.retry
    return timeouts, retry


def _backend(parent: ServiceKey, route: Route, ref: BackendRef, lookup: ServiceLookup,
             problems: list[Unhonoured], route_ref: RouteRef, path: str) -> ResolvedBackend:
    """Routes §3.2: a backendRef that cannot be served keeps its weight and answers
    its share 500, with the reason status reports."""

    def fail(message: str, reason: str) -> ResolvedBackend:
        problems.append(Unhonoured(route_ref, Problem(path, message, Effect.BACKEND_FAILS,
                                                      reason)))
        key = ServiceKey(ref.namespace, ref.name) if ref.is_service else None
        return ResolvedBackend(ref, key, ref.port or 0, ref.weight, message, reason)

    if not ref.is_service:
        # Already a problem of the route itself (decoding found it).
        return ResolvedBackend(ref, None, ref.port or 0, ref.weight,
                               f"unsupported backend type {ref.group or 'core'} {ref.kind}",
                               "InvalidKind")
    if ref.port is None:
        return ResolvedBackend(ref, ServiceKey(ref.namespace, ref.name), 0, ref.weight,
                               f"missing port for backend Service {ref.name}",
                               "UnsupportedValue")
    if ref.namespace not in (route.meta.namespace, parent.namespace):
        return fail(f"backend {ref.namespace}/{ref.name} is neither in the route's nor in "
                    "the parent Service's namespace", "RefNotPermitted")
    key = ServiceKey(ref.namespace, ref.name)
    svc = lookup(key)
    if svc is None:
        return fail(f"Service not found {ref.name}", "BackendNotFound")
    if svc.type == "ExternalName":
        return fail(f"Service {ref.name} is an ExternalName Service", "BackendNotFound")
    if svc.port(ref.port) is None:
        return fail(f"Service {ref.name} has no port {ref.port}", "BackendNotFound")
    return ResolvedBackend(ref, key, ref.port, ref.weight)


# --------------------------------------------------------------------------- precedence

_PATH_RANK = {"Exact": 0, "PathPrefix": 1, "RegularExpression": 2}


def _tie_break(entry: TableEntry) -> tuple[bool, str, str, str, int, int]:
    rule = entry.rule
    return (not rule.created, rule.created, rule.route.namespace, rule.route.name,
            rule.index, _match_index(entry))


def _match_index(entry: TableEntry) -> int:
    for i, m in enumerate(entry.rule.matches):
        if m is entry.match:
            return i
    return 0


def _http_precedence(entry: TableEntry) -> tuple[object, ...]:
    """Routes §1.4: exact path, longest prefix (then regex, longest pattern), method,
    most headers, most query parameters, then the tie-breaks."""
    m = entry.match
    assert isinstance(m, HttpMatch)
    # A prefix counts without its trailing slash: /a and /a/ are the same prefix.
    length = len(m.path.rstrip("/")) if m.path_type == "PathPrefix" else len(m.path)
    return (_PATH_RANK.get(m.path_type, 3), -length, not m.method, -len(m.headers),
            -len(m.query_params), *_tie_break(entry))


def _grpc_precedence(entry: TableEntry) -> tuple[object, ...]:
    """Routes §1.4: exact service and method before patterns, most service characters,
    most method characters, most headers, then the tie-breaks."""
    m = entry.match
    assert isinstance(m, GrpcMatch)
    return (m.regex, -len(m.service), -len(m.method), -len(m.headers), *_tie_break(entry))
