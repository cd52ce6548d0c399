"""A ServiceProfile as a Service port's routes (Routes §7): the table every client kind
is routed by when a linkerd2-proxy would follow that profile.

A proxy given a profile with routes or `dstOverrides` routes by it and ignores its
OutboundPolicy's routes (Routes §7.1). So that an Envoy or a gRPC client does what
that proxy does, the profile becomes a `RouteTable`: its routes in their own order
(first match wins), then a catch-all, every one sending to the same distribution
(the `dstOverrides`, else the Service port itself), with each route's timeout and
retry. Each condition is turned into route matches the way the proxy reads it
(Routes §7.2); what no match list can say is reported, never guessed.
"""

from __future__ import annotations

import math

from bridge.authority import AuthorityError, parse_authority
from bridge.model import ServiceKey
from bridge.objects import ServiceProfile
from bridge.routes.objects import (
    BackendRef,
    Effect,
    HttpMatch,
    Problem,
    Retry,
    RetrySource,
    RouteRule,
    Timeouts,
    status_ranges,
)
from bridge.routes.profiles import (
    Profile,
    ProfileRoute,
    RequestCondition,
    decode_profile,
)
from bridge.routes.regex import re2_error
from bridge.routes.resolve import ServiceLookup
from bridge.routes.table import (
    ResolvedBackend,
    ResolvedRoute,
    ResolvedRule,
    RouteRef,
    RouteTable,
    RouteType,
    TableEntry,
    Unhonoured,
)

PROFILE_GROUP = "linkerd.io"
PROFILE_KIND = "ServiceProfile"
# The proxy retries a retryable route's failures for as long as the budget allows;
# Envoy and gRPC count retries per request: each failed request is retried once
# (Routes §7.3).
PROFILE_RETRIES = 1
# gRPC statuses the proxy counts as failures that Envoy and gRPC can retry on by name
# (it also counts UNKNOWN and DATA_LOSS, which neither can name).
GRPC_FAILURES = ("deadline-exceeded", "internal", "unavailable")
MAX_ALTERNATIVES = 64  # matches one condition may become (the Gateway API's per rule)
_MAX_WEIGHT_SUM = 2**32 - 1  # grpc refuses a larger sum; Envoy's is a uint32 too
# A method the proxy can read: an HTTP token.
_TOKEN = frozenset("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


class Inexpressible(ValueError):
    """A condition no list of route matches says exactly; the message says why."""


def profile_ref(profile: ServiceProfile) -> RouteRef:
    return RouteRef(PROFILE_GROUP, PROFILE_KIND, profile.meta.namespace, profile.meta.name,
                    PROFILE_KIND)


def profile_table(service: ServiceKey, port: int, obj: ServiceProfile, lookup: ServiceLookup,
                  domain: str) -> RouteTable | None:
    """The table `obj` routes `service`'s `port` by, or None when a proxy would not
    route by it (no route it can read and no override with a weight, Routes §7.1).
    Raises ProfileError when the spec cannot be read (Linkerd drops such a profile)."""
    profile = decode_profile(obj.spec)
    ref = profile_ref(obj)
    problems: list[Unhonoured] = []
    readable = []
    for i, route in enumerate(profile.routes):
        condition = _as_the_proxy_reads(route.condition)
        if condition is not None:
            readable.append((i, route, condition))
            continue
        problems.append(Unhonoured(ref, Problem(
            f"spec.routes[{i}].condition", "a path regex RE2 cannot compile or a method "
            "that is no HTTP token leaves the condition empty: the proxy drops the "
            "route, and so does every client", Effect.RULE_DROPPED)))
    overrides = [d for d in profile.dst_overrides if d.weight > 0]
    if not readable and not overrides:
        return None
    backends, to_parent = _distribution(service, port, profile, lookup, domain, ref, problems)
    rules = []
    for i, route, condition in readable:
        rule = _rule(ref, i, route, condition, backends, to_parent, problems)
        if rule is not None:
            rules.append(rule)
    rules.append(ResolvedRule(ref, len(profile.routes), RouteRule((HttpMatch(),), (),
                                                                  name="default"),
                              backends, to_parent, Timeouts(), None))
    # Routes §7.2: first match wins, in the profile's order, then the catch-all.
    entries = tuple(TableEntry(m, rule) for rule in rules for m in rule.matches)
    return RouteTable(service, port, RouteType.HTTP,
                      (ResolvedRoute(ref, (), tuple(rules)),), entries, tuple(problems),
                      obj.meta.namespace, profile=ref, retry_budget=profile.retry_budget)


def _rule(ref: RouteRef, index: int, route: ProfileRoute, condition: RequestCondition,
          backends: tuple[ResolvedBackend, ...], to_parent: bool,
          problems: list[Unhonoured]) -> ResolvedRule | None:
    path = f"spec.routes[{index}]"
    if route.timeout_problem:
        problems.append(Unhonoured(ref, Problem(f"{path}.timeout", route.timeout_problem,
                                                Effect.IGNORED)))
    try:
        matches = condition_matches(condition)
    except Inexpressible as e:
        problems.append(Unhonoured(ref, Problem(
            f"{path}.condition", f"{e}: Envoy, gRPC and OutboundPolicies clients send its "
            "requests by the routes after it (the same backends, without this route's "
            "timeout and retry); a proxy following the profile applies them",
            Effect.RULE_DROPPED)))
        return None
    if not matches:
        return None  # matches no request: leaving it out changes nothing
    # The proxy's timeout ends the request, retries included (Routes §7.3).
    timeouts = Timeouts(request=math.ceil(route.timeout_ns / 1_000_000)) \
        if route.timeout_ns else Timeouts()
    retry = _retry(route) if route.is_retryable else None
    rule = RouteRule(tuple(matches), (), name=route.name, timeouts=timeouts, retry=retry)
    return ResolvedRule(ref, index, rule, backends, to_parent, timeouts, retry)


def _retry(route: ProfileRoute) -> Retry:
    """Routes §7.3: what the proxy counts as a failure is what is retried: the first
    response class whose condition holds decides, else HTTP 5xx, and for gRPC
    responses (HTTP 200 that no class claims) the failing gRPC statuses."""

    def failure(status: int) -> bool:
        for rc in route.response_classes:
            if rc.condition.matches(status):
                return rc.is_failure
        return status >= 500

    statuses = status_ranges(s for s in range(100, 600) if failure(s))
    grpc = not any(rc.condition.matches(200) for rc in route.response_classes)
    return Retry(PROFILE_RETRIES, statuses, GRPC_FAILURES if grpc else (),
                 source=RetrySource.PROFILE)


# --------------------------------------------------------------------------- backends


def _distribution(service: ServiceKey, port: int, profile: Profile, lookup: ServiceLookup,
                  domain: str, ref: RouteRef, problems: list[Unhonoured]
                  ) -> tuple[tuple[ResolvedBackend, ...], bool]:
    """Every route's backends: the overrides with a weight, else the port itself."""
    chosen = [(i, d) for i, d in enumerate(profile.dst_overrides) if d.weight > 0]
    if not chosen:
        own = BackendRef("", "Service", service.name, service.namespace, port, 1)
        return (ResolvedBackend(own, service, port, 1),), True
    weights = _fit([d.weight for _, d in chosen])
    out = []
    for (i, d), weight in zip(chosen, weights, strict=True):
        authority = d.authority_for(port)
        backend = _override(authority, weight, lookup, domain)
        if not backend.usable:
            problems.append(Unhonoured(ref, Problem(f"spec.dstOverrides[{i}].authority",
                                                    backend.failure, Effect.BACKEND_FAILS,
                                                    backend.reason)))
        out.append(backend)
    return tuple(out), False


def _override(authority: str, weight: int, lookup: ServiceLookup,
              domain: str) -> ResolvedBackend:
    """Routes §7.4: an override is a Service port of this cluster, by its authority;
    anything else keeps its weight and its share is answered 500."""
    try:
        key = parse_authority(authority, domain, None)
    except AuthorityError:
        ref = BackendRef("", "Service", authority, "", None, weight)
        return ResolvedBackend(ref, None, 0, weight,
                               f"{authority} is no Service port of this cluster",
                               "BackendNotFound")
    svc_key, port = key.service, key.port
    ref = BackendRef("", "Service", svc_key.name, svc_key.namespace, port, weight)
    svc = lookup(svc_key)
    why = ""
    if key.filter.hostname:
        why = f"{authority} names one pod, not a Service port"
    elif svc is None:
        why = f"Service not found {svc_key.namespace}/{svc_key.name}"
    elif svc.type == "ExternalName":
        why = f"Service {svc_key.name} is an ExternalName Service"
    elif svc.port(port) is None:
        why = f"Service {svc_key.name} has no port {port}"
    return ResolvedBackend(ref, svc_key, port, weight, why, "BackendNotFound" if why else "")


def _fit(weights: list[int]) -> list[int]:
    """The weights as they are, unless their sum overflows what Envoy and gRPC take:
    then scaled down, each non-zero weight staying at least 1."""
    total = sum(weights)
    if total <= _MAX_WEIGHT_SUM:
        return weights
    scale = (_MAX_WEIGHT_SUM - len(weights)) / total
    return [max(1, int(w * scale)) for w in weights]


# --------------------------------------------------------------------------- conditions


def _as_the_proxy_reads(c: RequestCondition) -> RequestCondition | None:
    """The condition as linkerd2-proxy keeps it (Routes §7.2): a path regex it cannot
    compile, or a method that is no HTTP token, is dropped from its `all`/`any` list
    (a `not` of nothing is nothing); None when nothing is left at the top."""
    if c.kind == "path":
        text = c.value.strip()
        return RequestCondition("path", text) if not re2_error(_anchored(text)) else None
    if c.kind == "method":
        return c if c.value and set(c.value) <= _TOKEN else None
    kept = tuple(x for item in c.items if (x := _as_the_proxy_reads(item)) is not None)
    if c.kind == "not" and not kept:
        return None
    return RequestCondition(c.kind, items=kept)


Literal = tuple[str, str, bool]  # (kind, value, negated)


def condition_matches(c: RequestCondition) -> list[HttpMatch]:
    """The route matches (alternatives, any of which applies) that hold exactly when
    `c` does. Inexpressible when that needs a negation or two path patterns at once."""
    out: list[HttpMatch] = []
    for conj in _alternatives(c, False):
        match = _match(conj)
        if match is not None and match not in out:
            out.append(match)
    return out


def _alternatives(c: RequestCondition, negated: bool) -> list[frozenset[Literal]]:
    """`c` (negated if asked) as a disjunction of conjunctions of literals."""
    if c.kind == "not":
        return _alternatives(c.items[0], not negated)
    if c.kind in ("method", "path"):
        return [frozenset({(c.kind, c.value, negated)})]
    parts = [_alternatives(x, negated) for x in c.items]
    if (c.kind == "all") != negated:  # a conjunction (De Morgan for a negated `any`)
        out: list[frozenset[Literal]] = [frozenset()]
        for part in parts:
            out = [a | b for a in out for b in part]
            _bound(out)
        return out
    flat = [conj for part in parts for conj in part]
    _bound(flat)
    return flat


def _bound(alternatives: list[frozenset[Literal]]) -> None:
    if len(alternatives) > MAX_ALTERNATIVES:
        raise Inexpressible(f"the condition needs more than {MAX_ALTERNATIVES} matches")


def _match(literals: frozenset[Literal]) -> HttpMatch | None:
    """One conjunction as one match; None when no request satisfies it."""
    methods = {v for k, v, neg in literals if k == "method" and not neg}
    not_methods = {v for k, v, neg in literals if k == "method" and neg}
    paths = {v for k, v, neg in literals if k == "path" and not neg}
    if len(methods) > 1 or methods & not_methods:
        return None
    if not_methods and not methods:
        raise Inexpressible("the condition needs a method not to be "
                            + " or ".join(sorted(not_methods)))
    if any(k == "path" and neg for k, _, neg in literals):
        raise Inexpressible("the condition needs a path not to match a pattern")
    if len(paths) > 1:
        raise Inexpressible("the condition needs a path to match two patterns at once")
    method = next(iter(methods), "")
    if not paths:
        return HttpMatch(method=method)
    return HttpMatch("RegularExpression", full_match_regex(next(iter(paths))), method=method)


# --------------------------------------------------------------------------- regexes


def _anchored(text: str) -> str:
    """The regex the proxy compiles: `^` and `$` added where the text has none."""
    return ("" if text.startswith("^") else "^") + text + ("" if text.endswith("$") else "$")


def full_match_regex(text: str) -> str:
    """A regex that matches a whole path exactly when the proxy's finds a match in it
    (every other client matches the whole path, Routes §7.2). The text itself, unless
    an alternation at its top or an escaped final `$` leaves the proxy's unanchored."""
    if not _top_level_alternation(text) and not _escaped_end(text):
        return text
    return f"(?s:.*)(?:{_anchored(text)})(?s:.*)"


def _escaped_end(text: str) -> bool:
    if not text.endswith("$"):
        return False
    slashes = len(text[:-1]) - len(text[:-1].rstrip("\\"))
    return slashes % 2 == 1


def _top_level_alternation(text: str) -> bool:
    depth, i, in_class = 0, 0, False
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if in_class:
            in_class = ch != "]"
        elif ch == "[":
            in_class = True
            # A `]` first in a class (after an optional ^) is a literal.
            if text[i + 1:i + 2] == "^":
                i += 1
            if text[i + 1:i + 2] == "]":
                i += 1
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif ch == "|" and depth == 0:
            return True
        i += 1
    return False
