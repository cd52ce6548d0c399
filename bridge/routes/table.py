"""The resolved routes of one Service port: immutable values every encoder reads.

A `RouteTable` is what one group of clients of a Service port is routed by (the
producer table for every client, or a consumer table for clients in one namespace,
Routes §1.2): the routes that apply, each rule with its backends resolved, its
effective timeouts and retry, and the table's entries (one per match) in the
precedence order of Routes §1.4. What could not be honoured is listed once, with
the route and the reason (`problems`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from bridge.model import ServiceKey
from bridge.routes.objects import (
    BackendRef,
    GrpcMatch,
    HttpMatch,
    Problem,
    Retry,
    RouteRule,
    Timeouts,
)
from bridge.routes.profiles import RetryBudget


class RouteType(enum.Enum):
    HTTP = "http"
    GRPC = "grpc"


@dataclass(frozen=True, slots=True)
class RouteRef:
    """Which route a rule comes from (what Linkerd's metadata and status name)."""

    group: str
    route_kind: str  # "HTTPRoute" | "GRPCRoute"
    namespace: str
    name: str
    store_kind: str = "HTTPRoute"  # how the cluster cache keys it

    @property
    def label(self) -> str:
        return f"{self.route_kind} {self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class ResolvedBackend:
    """A backendRef as served: a Service port, or a failure with its reason."""

    ref: BackendRef
    service: ServiceKey | None  # None when the ref is not a Service
    port: int
    weight: int
    failure: str = ""  # why this share is answered 500 ("" when usable)
    reason: str = ""  # the ResolvedRefs reason (BackendNotFound, InvalidKind, ...)

    @property
    def usable(self) -> bool:
        return not self.failure


@dataclass(frozen=True, slots=True)
class ResolvedMirror:
    backend: ResolvedBackend
    percent: float


@dataclass(frozen=True, slots=True)
class ResolvedRule:
    route: RouteRef
    index: int  # the rule's position in its route
    rule: RouteRule  # matches and filters as written
    backends: tuple[ResolvedBackend, ...]  # empty only for a redirect or a failed rule
    to_parent: bool  # no backendRefs: the parent Service port itself (Routes §3.2)
    timeouts: Timeouts  # effective: the rule's, its route's annotations, the Service's
    retry: Retry | None  # effective, likewise
    mirrors: tuple[ResolvedMirror, ...] = ()
    failure: str = ""  # why every request of this rule is answered 500 ("" if served)
    created: str = ""

    @property
    def matches(self) -> tuple[HttpMatch | GrpcMatch, ...]:
        return self.rule.matches

    @property
    def label(self) -> str:
        name = f" ({self.rule.name})" if self.rule.name else ""
        return f"{self.route.label} rule {self.index}{name}"


@dataclass(frozen=True, slots=True)
class ResolvedRoute:
    ref: RouteRef
    hostnames: tuple[str, ...]
    rules: tuple[ResolvedRule, ...]  # the served ones, in the route's order
    created: str = ""
    # Routes Linkerd 2.20 would leave out whole (a URLRewrite or RequestMirror it
    # cannot convert, Routes §5.2): kept for the spec's answer, marked for 2.20's.
    linkerd_2_20_drops: str = ""


@dataclass(frozen=True, slots=True)
class TableEntry:
    """One match of one rule: what Envoy and gRPC try in order, first match wins."""

    match: HttpMatch | GrpcMatch
    rule: ResolvedRule


@dataclass(frozen=True, slots=True)
class Unhonoured:
    """Something a route asks for that the table does not serve as written."""

    route: RouteRef
    problem: Problem

    def __str__(self) -> str:
        return f"{self.route.label}: {self.problem}"


@dataclass(frozen=True, slots=True)
class RouteTable:
    service: ServiceKey
    port: int
    route_type: RouteType
    routes: tuple[ResolvedRoute, ...]  # Linkerd's order: oldest first, then by name
    entries: tuple[TableEntry, ...]  # Gateway API precedence (Routes §1.4)
    problems: tuple[Unhonoured, ...] = ()
    consumer_namespace: str = ""  # "" for the producer table
    # Set when a ServiceProfile routes this port (Routes §7): its routes are tried in
    # their own order, not by precedence, and every retry spends this budget.
    profile: RouteRef | None = None
    retry_budget: RetryBudget | None = None

    @property
    def backends(self) -> frozenset[ServiceKey]:
        """Every Service a rule sends to or mirrors to (a change to one can change
        how this table resolves)."""
        out: set[ServiceKey] = set()
        for route in self.routes:
            for rule in route.rules:
                out.update(b.service for b in rule.backends if b.service is not None)
                out.update(m.backend.service for m in rule.mirrors
                           if m.backend.service is not None)
        return frozenset(out)
