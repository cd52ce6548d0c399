"""The route kinds, decoded once into frozen values: the Gateway API's HTTPRoute and
GRPCRoute (`gateway.networking.k8s.io`) and Linkerd's own HTTPRoute
(`policy.linkerd.io`), with their filters, timeouts and retries, and the Linkerd
`timeout.linkerd.io/*` and `retry.linkerd.io/*` annotations.

Two kinds of trouble are told apart. A route that is not even shaped like one (a
rule that is not a mapping, a port that is not a number) raises `ObjectError`, and
the source skips the object. A route that is well formed but asks for something no
client can honour (a regex RE2 refuses, an unknown filter, weights that sum to zero)
is kept, and each such thing is a `Problem`: the field path, the rule it breaks, and
what it does to the route (`Effect`). Resolution answers each one once (Routes §3.4);
`validate_route` lists them for one object, for an admission check.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge.decoding import (
    Meta,
    ObjectError,
    as_list,
    as_map,
    as_port,
    as_str,
    decode_meta,
)
from bridge.kinds import Kind
from bridge.routes.durations import parse_gateway_duration, parse_linkerd_duration
from bridge.routes.regex import re2_error

LINKERD_POLICY_GROUP = "policy.linkerd.io"
GATEWAY_GROUP = "gateway.networking.k8s.io"

# Gateway API limits (Routes §2.2).
MAX_RULES = 16
MAX_MATCHES_PER_RULE = 64
MAX_MATCHES_PER_ROUTE = 128
MAX_WEIGHT = 1_000_000

GRPC_RETRY_CODES = ("cancelled", "deadline-exceeded", "internal", "resource-exhausted",
                    "unavailable")


class Effect(enum.Enum):
    """What a problem does to the route (Routes §3.4)."""

    ROUTE = "route"  # the route is not served at all
    RULE_DROPPED = "rule-dropped"  # the rule is left out; its requests fall through
    RULE_FAILS = "rule-fails"  # the rule's requests are answered 500
    BACKEND_FAILS = "backend-fails"  # that backend's share is answered 500
    IGNORED = "ignored"  # the field is ignored; the rest of the rule is served


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing a route asks for that cannot be honoured as written."""

    path: str  # the field, e.g. spec.rules[0].matches[1].path.value
    rule: str  # the rule it breaks, in words
    effect: Effect
    reason: str = "UnsupportedValue"  # the status condition reason it leads to

    def __str__(self) -> str:
        return f"{self.path}: {self.rule}"


# --------------------------------------------------------------------------- values


@dataclass(frozen=True, slots=True)
class ParentRef:
    """What a route attaches to; only kind Service (group core) matters to us."""

    group: str
    kind: str
    name: str
    namespace: str
    port: int | None
    section: str = ""  # sectionName: a Service port by name


@dataclass(frozen=True, slots=True)
class BackendRef:
    group: str
    kind: str
    name: str
    namespace: str
    port: int | None
    weight: int

    @property
    def is_service(self) -> bool:
        return self.kind == "Service" and self.group in ("", "core")


@dataclass(frozen=True, slots=True)
class ValueMatch:
    """A header or query parameter condition."""

    name: str
    value: str
    regex: bool = False


@dataclass(frozen=True, slots=True)
class HttpMatch:
    # "Exact" | "PathPrefix" | "RegularExpression"
    path_type: str = "PathPrefix"
    path: str = "/"
    headers: tuple[ValueMatch, ...] = ()
    query_params: tuple[ValueMatch, ...] = ()
    method: str = ""


@dataclass(frozen=True, slots=True)
class GrpcMatch:
    service: str = ""
    method: str = ""
    headers: tuple[ValueMatch, ...] = ()
    regex: bool = False  # service and method are RE2 patterns (type RegularExpression)


@dataclass(frozen=True, slots=True)
class HeaderModifier:
    """RequestHeaderModifier / ResponseHeaderModifier: set replaces, add appends."""

    set: tuple[tuple[str, str], ...] = ()
    add: tuple[tuple[str, str], ...] = ()
    remove: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PathModifier:
    kind: str  # "ReplaceFullPath" | "ReplacePrefixMatch"
    value: str


@dataclass(frozen=True, slots=True)
class Redirect:
    scheme: str = ""
    hostname: str = ""
    path: PathModifier | None = None
    port: int | None = None
    status: int = 302


@dataclass(frozen=True, slots=True)
class Rewrite:
    hostname: str = ""
    path: PathModifier | None = None


@dataclass(frozen=True, slots=True)
class Mirror:
    backend: BackendRef
    percent: float = 100.0  # of the requests the rule matches


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Milliseconds; None where not set (0 means "no timeout" where a field allows it)."""

    request: int | None = None
    backend_request: int | None = None  # Gateway API: one attempt
    response: int | None = None  # Linkerd annotation: until the response headers
    idle: int | None = None  # Linkerd annotation: stream inactivity

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.request, self.backend_request,
                                           self.response, self.idle))


class RetrySource(enum.Enum):
    GATEWAY = "gateway"  # the rule's `retry` stanza (GEP-1731)
    ANNOTATION = "annotation"  # retry.linkerd.io/* on the route or the Service
    PROFILE = "profile"  # a ServiceProfile route's isRetryable (Routes §7.3)


@dataclass(frozen=True, slots=True)
class Retry:
    limit: int  # retries after the first attempt
    http_statuses: tuple[tuple[int, int], ...] = ()  # inclusive ranges
    grpc_codes: tuple[str, ...] = ()  # GRPC_RETRY_CODES names
    backoff_ms: int | None = None
    timeout_ms: int | None = None  # each attempt's
    source: RetrySource = RetrySource.GATEWAY


@dataclass(frozen=True, slots=True)
class RouteRule:
    matches: tuple[HttpMatch | GrpcMatch, ...]
    backends: tuple[BackendRef, ...]
    name: str = ""
    request_headers: HeaderModifier | None = None
    response_headers: HeaderModifier | None = None
    redirect: Redirect | None = None
    rewrite: Rewrite | None = None
    mirrors: tuple[Mirror, ...] = ()
    timeouts: Timeouts = Timeouts()
    retry: Retry | None = None
    problems: tuple[Problem, ...] = ()


@dataclass(frozen=True, slots=True)
class RoutePolicy:
    """Timeouts and retries from the Linkerd annotations of a route or a Service."""

    timeouts: Timeouts = Timeouts()
    retry: Retry | None = None
    problems: tuple[Problem, ...] = ()


@dataclass(frozen=True, slots=True)
class Route:
    """An HTTPRoute (policy.linkerd.io or gateway.networking.k8s.io) or a GRPCRoute."""

    meta: Meta
    group: str
    route_kind: str  # "HTTPRoute" | "GRPCRoute", as Linkerd names it in metadata
    parents: tuple[ParentRef, ...]
    hostnames: tuple[str, ...]
    rules: tuple[RouteRule, ...]
    created: str = ""  # metadata.creationTimestamp (RFC 3339 sorts as text)
    kind: str = "HTTPRoute"
    policy: RoutePolicy = RoutePolicy()  # from its annotations
    problems: tuple[Problem, ...] = ()  # about the route as a whole
    generation: int = 0  # metadata.generation, for status' observedGeneration

    def attaches_to(self, namespace: str, service: str, port: int,
                    port_name: str = "") -> bool:
        return any(parent_selects(p, namespace, service, port, port_name)
                   for p in self.parents)

    @property
    def label(self) -> str:
        """How logs and pages name it: `HTTPRoute emojivoto/web-canary`."""
        prefix = "" if self.group == GATEWAY_GROUP else f"{self.group} "
        return f"{prefix}{self.route_kind} {self.meta.namespace}/{self.meta.name}"

    def all_problems(self) -> list[Problem]:
        out = list(self.problems) + list(self.policy.problems)
        for rule in self.rules:
            out.extend(rule.problems)
        return out


def parent_selects(p: ParentRef, namespace: str, service: str, port: int,
                   port_name: str = "") -> bool:
    """Routes §1.1: a Service parent, this Service, and this port (by number or by
    sectionName; both must agree when both are set; neither means every port)."""
    return (p.kind == "Service" and p.group in ("", "core") and p.name == service
            and p.namespace == namespace and p.port in (None, port)
            and (not p.section or p.section == port_name))


# --------------------------------------------------------------------------- decoding


@dataclass
class _Reader:
    """The object being decoded: its kind and name for errors, and its problems."""

    kind: str
    name: str
    problems: list[Problem] = field(default_factory=list)

    def mapping(self, raw: Any, path: str) -> Mapping[str, Any]:
        return as_map(raw, self.kind, self.name, path)

    def items(self, raw: Any, path: str) -> list[Any]:
        return as_list(raw, self.kind, self.name, path)

    def text(self, raw: Any, path: str, default: str = "") -> str:
        return as_str(raw, self.kind, self.name, path, default)

    def number(self, raw: Any, path: str, low: int, high: int) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
            raise ObjectError(self.kind, self.name,
                              f"{path} must be a whole number from {low} to {high}, "
                              f"got {raw!r}")
        return raw

    def port(self, raw: Any, path: str) -> int | None:
        return None if raw is None else as_port(raw, self.kind, self.name, path)

    def problem(self, path: str, rule: str, effect: Effect,
                reason: str = "UnsupportedValue") -> None:
        self.problems.append(Problem(path, rule, effect, reason))

    def take(self) -> tuple[Problem, ...]:
        out, self.problems = tuple(self.problems), []
        return out

    def regex(self, pattern: str, path: str, effect: Effect) -> None:
        error = re2_error(pattern)
        if error:
            self.problem(path, f"RE2 cannot compile {pattern!r}: {error}", effect)


def _values(r: _Reader, raw: Any, path: str) -> tuple[ValueMatch, ...]:
    out = []
    seen: set[str] = set()
    for i, h in enumerate(r.items(raw, path)):
        p = f"{path}[{i}]"
        h = r.mapping(h, p)
        kind_of = r.text(h.get("type"), f"{p}.type", "Exact")
        name = r.text(h.get("name"), f"{p}.name")
        value = r.text(h.get("value"), f"{p}.value")
        if not name:
            raise ObjectError(r.kind, r.name, f"{p}.name is missing")
        if kind_of not in ("Exact", "RegularExpression"):
            r.problem(f"{p}.type", f"match type {kind_of!r} is not Exact or "
                      "RegularExpression", Effect.RULE_DROPPED)
            continue
        if kind_of == "RegularExpression":
            r.regex(value, f"{p}.value", Effect.RULE_DROPPED)
        # Routes §2.2: names are case-insensitive and the first of a name wins.
        if name.lower() in seen:
            continue
        seen.add(name.lower())
        out.append(ValueMatch(name, value, kind_of == "RegularExpression"))
    return tuple(out)


def _http_match(r: _Reader, raw: Any, path: str) -> HttpMatch:
    m = r.mapping(raw, path)
    p = r.mapping(m.get("path"), f"{path}.path")
    path_type = r.text(p.get("type"), f"{path}.path.type", "PathPrefix")
    value = r.text(p.get("value"), f"{path}.path.value", "/")
    if path_type not in ("Exact", "PathPrefix", "RegularExpression"):
        r.problem(f"{path}.path.type", f"path match type {path_type!r} is not Exact, "
                  "PathPrefix or RegularExpression", Effect.RULE_DROPPED)
    elif path_type == "RegularExpression":
        r.regex(value, f"{path}.path.value", Effect.RULE_DROPPED)
    elif not value.startswith("/"):
        r.problem(f"{path}.path.value", f"path {value!r} does not start with /",
                  Effect.RULE_DROPPED)
    return HttpMatch(path_type, value, _values(r, m.get("headers"), f"{path}.headers"),
                     _values(r, m.get("queryParams"), f"{path}.queryParams"),
                     r.text(m.get("method"), f"{path}.method").upper())


def _grpc_match(r: _Reader, raw: Any, path: str) -> GrpcMatch:
    m = r.mapping(raw, path)
    method = r.mapping(m.get("method"), f"{path}.method")
    kind_of = r.text(method.get("type"), f"{path}.method.type", "Exact")
    service = r.text(method.get("service"), f"{path}.method.service")
    name = r.text(method.get("method"), f"{path}.method.method")
    if kind_of not in ("Exact", "RegularExpression"):
        r.problem(f"{path}.method.type", f"method match type {kind_of!r} is not Exact or "
                  "RegularExpression", Effect.RULE_DROPPED)
    elif kind_of == "RegularExpression":
        for text, sub in ((service, "service"), (name, "method")):
            if text:
                r.regex(text, f"{path}.method.{sub}", Effect.RULE_DROPPED)
    return GrpcMatch(service, name, _values(r, m.get("headers"), f"{path}.headers"),
                     kind_of == "RegularExpression")


def _backend(r: _Reader, raw: Any, ns: str, path: str) -> BackendRef:
    b = r.mapping(raw, path)
    weight = b.get("weight", 1)
    if isinstance(weight, bool) or not isinstance(weight, int) or weight < 0:
        raise ObjectError(r.kind, r.name, f"{path}.weight must be a whole number >= 0")
    if weight > MAX_WEIGHT:
        r.problem(f"{path}.weight", f"weight {weight} is above {MAX_WEIGHT}",
                  Effect.IGNORED)
        weight = MAX_WEIGHT
    ref = BackendRef(r.text(b.get("group"), f"{path}.group"),
                     r.text(b.get("kind"), f"{path}.kind", "Service"),
                     r.text(b.get("name"), f"{path}.name"),
                     r.text(b.get("namespace"), f"{path}.namespace") or ns,
                     r.port(b.get("port"), f"{path}.port"), weight)
    if not ref.name:
        raise ObjectError(r.kind, r.name, f"{path}.name is missing")
    if not ref.is_service:
        r.problem(f"{path}.kind", f"backend kind {ref.group or 'core'}/{ref.kind} is not "
                  "a Service", Effect.BACKEND_FAILS, "InvalidKind")
    elif ref.port is None:
        r.problem(f"{path}.port", "a Service backend needs a port", Effect.BACKEND_FAILS,
                  "UnsupportedValue")
    if b.get("filters"):
        r.problem(f"{path}.filters", "filters on a backend are not supported",
                  Effect.BACKEND_FAILS, "UnsupportedValue")
    return ref


def _header_modifier(r: _Reader, raw: Any, path: str) -> HeaderModifier:
    m = r.mapping(raw, path)

    def pairs(key: str) -> tuple[tuple[str, str], ...]:
        out = []
        for i, h in enumerate(r.items(m.get(key), f"{path}.{key}")):
            h = r.mapping(h, f"{path}.{key}[{i}]")
            out.append((r.text(h.get("name"), f"{path}.{key}[{i}].name"),
                        r.text(h.get("value"), f"{path}.{key}[{i}].value")))
        return tuple(out)

    remove = tuple(r.text(x, f"{path}.remove") for x in r.items(m.get("remove"),
                                                              f"{path}.remove"))
    return HeaderModifier(pairs("set"), pairs("add"), remove)


def _path_modifier(r: _Reader, raw: Any, path: str) -> PathModifier | None:
    if raw is None:
        return None
    m = r.mapping(raw, path)
    kind_of = r.text(m.get("type"), f"{path}.type")
    if kind_of == "ReplaceFullPath":
        return PathModifier(kind_of, r.text(m.get("replaceFullPath"),
                                           f"{path}.replaceFullPath"))
    if kind_of == "ReplacePrefixMatch":
        return PathModifier(kind_of, r.text(m.get("replacePrefixMatch"),
                                           f"{path}.replacePrefixMatch"))
    r.problem(f"{path}.type", f"path modifier {kind_of!r} is not ReplaceFullPath or "
              "ReplacePrefixMatch", Effect.RULE_DROPPED)
    return None


@dataclass
class _Filters:
    request: HeaderModifier | None = None
    response: HeaderModifier | None = None
    redirect: Redirect | None = None
    rewrite: Rewrite | None = None
    mirrors: list[Mirror] = field(default_factory=list)


_HTTP_FILTERS = frozenset({"RequestHeaderModifier", "ResponseHeaderModifier",
                           "RequestRedirect", "URLRewrite", "RequestMirror"})
_GRPC_FILTERS = frozenset({"RequestHeaderModifier", "ResponseHeaderModifier",
                           "RequestMirror"})


def _filters(r: _Reader, raw: Any, path: str, ns: str, grpc: bool) -> _Filters:
    out = _Filters()
    allowed = _GRPC_FILTERS if grpc else _HTTP_FILTERS
    for i, f in enumerate(r.items(raw, path)):
        p = f"{path}[{i}]"
        f = r.mapping(f, p)
        kind_of = r.text(f.get("type"), f"{p}.type")
        if kind_of not in allowed:
            # Routes §2.2: a filter that cannot be applied answers the rule's
            # requests with an error rather than serve them unfiltered.
            r.problem(f"{p}.type", f"filter {kind_of!r} is not supported"
                      + (" on a GRPCRoute" if grpc and kind_of in _HTTP_FILTERS else ""),
                      Effect.RULE_FAILS, "UnsupportedValue")
            continue
        if kind_of == "RequestHeaderModifier":
            out.request = _header_modifier(r, f.get("requestHeaderModifier"),
                                           f"{p}.requestHeaderModifier")
        elif kind_of == "ResponseHeaderModifier":
            out.response = _header_modifier(r, f.get("responseHeaderModifier"),
                                            f"{p}.responseHeaderModifier")
        elif kind_of == "RequestRedirect":
            m = r.mapping(f.get("requestRedirect"), f"{p}.requestRedirect")
            status = m.get("statusCode", 302)
            if status not in (301, 302):
                r.problem(f"{p}.requestRedirect.statusCode",
                          f"redirect status {status!r} is not 301 or 302", Effect.IGNORED)
                status = 302
            out.redirect = Redirect(
                r.text(m.get("scheme"), f"{p}.requestRedirect.scheme"),
                r.text(m.get("hostname"), f"{p}.requestRedirect.hostname"),
                _path_modifier(r, m.get("path"), f"{p}.requestRedirect.path"),
                r.port(m.get("port"), f"{p}.requestRedirect.port"), int(status))
        elif kind_of == "URLRewrite":
            m = r.mapping(f.get("urlRewrite"), f"{p}.urlRewrite")
            out.rewrite = Rewrite(r.text(m.get("hostname"), f"{p}.urlRewrite.hostname"),
                                  _path_modifier(r, m.get("path"), f"{p}.urlRewrite.path"))
        else:
            m = r.mapping(f.get("requestMirror"), f"{p}.requestMirror")
            backend = _backend(r, m.get("backendRef"), ns, f"{p}.requestMirror.backendRef")
            percent = 100.0
            if m.get("percent") is not None:
                percent = float(r.number(m.get("percent"), f"{p}.requestMirror.percent", 0, 100))
            elif m.get("fraction") is not None:
                fr = r.mapping(m.get("fraction"), f"{p}.requestMirror.fraction")
                num = r.number(fr.get("numerator"), f"{p}.requestMirror.fraction.numerator",
                            0, 2**31)
                den = r.number(fr.get("denominator", 100),
                            f"{p}.requestMirror.fraction.denominator", 1, 2**31)
                percent = min(100.0, 100.0 * num / den)
            out.mirrors.append(Mirror(backend, percent))
    return out


def _check_filters(r: _Reader, flt: _Filters, matches: tuple[HttpMatch | GrpcMatch, ...],
                   backends: tuple[BackendRef, ...], path: str) -> None:
    """Routes §2.2: the combinations the Gateway API forbids drop the rule."""
    if flt.redirect is not None and flt.rewrite is not None:
        r.problem(f"{path}.filters", "RequestRedirect cannot be combined with URLRewrite",
                  Effect.RULE_DROPPED, "IncompatibleFilters")
    if flt.redirect is not None and backends:
        r.problem(f"{path}.filters", "RequestRedirect cannot be combined with backendRefs",
                  Effect.RULE_DROPPED, "IncompatibleFilters")
    for which, mod in (("requestRedirect", flt.redirect), ("urlRewrite", flt.rewrite)):
        if mod is None or mod.path is None or mod.path.kind != "ReplacePrefixMatch":
            continue
        prefixes = [m for m in matches if isinstance(m, HttpMatch)
                    and m.path_type == "PathPrefix"]
        if len(matches) != 1 or len(prefixes) != 1:
            r.problem(f"{path}.filters", f"{which} ReplacePrefixMatch needs exactly one "
                      "PathPrefix match", Effect.RULE_DROPPED, "IncompatibleFilters")


def _timeouts(r: _Reader, raw: Any, path: str) -> Timeouts:
    if raw is None:
        return Timeouts()
    m = r.mapping(raw, path)
    got: dict[str, int | None] = {}
    for key in ("request", "backendRequest"):
        text = r.text(m.get(key), f"{path}.{key}")
        if not text:
            got[key] = None
            continue
        try:
            ms = parse_gateway_duration(text)
        except ValueError as e:
            r.problem(f"{path}.{key}", str(e), Effect.IGNORED)
            got[key] = None
            continue
        if text not in ("0s", "0ms") and ms < 1:
            r.problem(f"{path}.{key}", "a timeout must be 0s or at least 1ms", Effect.IGNORED)
            ms = 1
        got[key] = ms
    request, backend = got["request"], got["backendRequest"]
    if request and backend and backend > request:
        r.problem(f"{path}.backendRequest", "backendRequest must not exceed request",
                  Effect.IGNORED)
        backend = request
    return Timeouts(request=request, backend_request=backend)


def _retry(r: _Reader, raw: Any, path: str) -> Retry | None:
    if raw is None:
        return None
    m = r.mapping(raw, path)
    attempts = m.get("attempts")
    limit = 2 if attempts is None else r.number(attempts, f"{path}.attempts", 0, 2**31)
    codes = []
    for i, c in enumerate(r.items(m.get("codes"), f"{path}.codes")):
        if isinstance(c, bool) or not isinstance(c, int) or not 400 <= c <= 599:
            r.problem(f"{path}.codes[{i}]", f"retry code {c!r} is not an HTTP status from "
                      "400 to 599", Effect.IGNORED)
            continue
        codes.append((c, c))
    backoff = None
    text = r.text(m.get("backoff"), f"{path}.backoff")
    if text:
        try:
            backoff = parse_gateway_duration(text)
        except ValueError as e:
            r.problem(f"{path}.backoff", str(e), Effect.IGNORED)
    if limit == 0:
        return None  # no retries asked for
    return Retry(limit, tuple(codes), (), backoff, None, RetrySource.GATEWAY)


def _rules(r: _Reader, spec: Mapping[str, Any], ns: str, grpc: bool) -> tuple[RouteRule, ...]:
    rules = []
    matcher = _grpc_match if grpc else _http_match
    raw_rules = r.items(spec.get("rules"), "spec.rules")
    if len(raw_rules) > MAX_RULES:
        r.problem("spec.rules", f"{len(raw_rules)} rules: at most {MAX_RULES} are served",
                  Effect.IGNORED)
        raw_rules = raw_rules[:MAX_RULES]
    total_matches = 0
    route_problems = r.take()
    for i, raw in enumerate(raw_rules):
        path = f"spec.rules[{i}]"
        rule = r.mapping(raw, path)
        raw_matches = r.items(rule.get("matches"), f"{path}.matches")
        if len(raw_matches) > MAX_MATCHES_PER_RULE:
            r.problem(f"{path}.matches", f"{len(raw_matches)} matches: at most "
                      f"{MAX_MATCHES_PER_RULE} are served", Effect.IGNORED)
            raw_matches = raw_matches[:MAX_MATCHES_PER_RULE]
        left = max(0, MAX_MATCHES_PER_ROUTE - total_matches)
        if len(raw_matches) > left:
            r.problem(f"{path}.matches", f"more than {MAX_MATCHES_PER_ROUTE} matches in the "
                      "route: the rest are not served", Effect.IGNORED)
            raw_matches = raw_matches[:left]
        total_matches += len(raw_matches)
        matches = tuple(matcher(r, m, f"{path}.matches[{j}]")
                        for j, m in enumerate(raw_matches))
        backends = tuple(_backend(r, b, ns, f"{path}.backendRefs[{j}]")
                         for j, b in enumerate(r.items(rule.get("backendRefs"),
                                                      f"{path}.backendRefs")))
        if backends and not any(b.weight for b in backends):
            r.problem(f"{path}.backendRefs", "the backends' weights sum to zero",
                      Effect.RULE_FAILS, "UnsupportedValue")
        flt = _filters(r, rule.get("filters"), f"{path}.filters", ns, grpc)
        _check_filters(r, flt, matches, backends, path)
        timeouts = Timeouts() if grpc else _timeouts(r, rule.get("timeouts"),
                                                     f"{path}.timeouts")
        retry = None if grpc else _retry(r, rule.get("retry"), f"{path}.retry")
        rules.append(RouteRule(
            matches, backends, r.text(rule.get("name"), f"{path}.name"), flt.request,
            flt.response, flt.redirect, flt.rewrite, tuple(flt.mirrors), timeouts, retry,
            r.take()))
    r.problems = list(route_problems)
    return tuple(rules)


def _parents(r: _Reader, spec: Mapping[str, Any], ns: str) -> tuple[ParentRef, ...]:
    parents = []
    for i, p in enumerate(r.items(spec.get("parentRefs"), "spec.parentRefs")):
        path = f"spec.parentRefs[{i}]"
        p = r.mapping(p, path)
        parents.append(ParentRef(
            r.text(p.get("group"), f"{path}.group", GATEWAY_GROUP),
            r.text(p.get("kind"), f"{path}.kind", "Gateway"),
            r.text(p.get("name"), f"{path}.name"),
            r.text(p.get("namespace"), f"{path}.namespace") or ns,
            r.port(p.get("port"), f"{path}.port"),
            r.text(p.get("sectionName"), f"{path}.sectionName")))
    return tuple(parents)


# --------------------------------------------------------------------------- annotations

TIMEOUT_ANNOTATION = "timeout.linkerd.io/"
RETRY_ANNOTATION = "retry.linkerd.io/"


def status_ranges(codes: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Status codes as inclusive ranges of consecutive codes: 500 501 503 -> (500, 501),
    (503, 503)."""
    out: list[tuple[int, int]] = []
    for code in sorted(codes):
        if out and out[-1][1] == code - 1:
            out[-1] = (out[-1][0], code)
        else:
            out.append((code, code))
    return tuple(out)


def _http_statuses(text: str) -> tuple[tuple[int, int], ...]:
    """`retry.linkerd.io/http`: comma-separated `5xx`, `gateway-error`, a code or a
    range `a-b` (Routes §2.6). ValueError on anything else."""
    out = []
    for item in (t.strip() for t in text.split(",")):
        if item == "5xx":
            out.append((500, 599))
        elif item == "gateway-error":
            out.append((502, 504))
        else:
            lo, _, hi = item.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise ValueError(f"{item!r} is not 5xx, gateway-error, a status or a range")
            a, b = int(lo), int(hi or lo)
            if not 100 <= a <= b <= 599:
                raise ValueError(f"{item!r} is not a status range within 100-599")
            out.append((a, b))
    return tuple(out)


def annotation_policy(annotations: Mapping[str, str], where: str = "metadata") -> RoutePolicy:
    """Timeouts and retry from Linkerd's annotations (Routes §2.6); a bad value is a
    problem and is ignored."""
    problems: list[Problem] = []

    def path(key: str) -> str:
        return f"{where}.annotations[{key}]"

    timeouts: dict[str, int | None] = {"request": None, "response": None, "idle": None}
    for which in timeouts:
        key = TIMEOUT_ANNOTATION + which
        text = annotations.get(key)
        if text is None:
            continue
        try:
            ms = parse_linkerd_duration(text)
        except ValueError as e:
            problems.append(Problem(path(key), str(e), Effect.IGNORED))
            continue
        timeouts[which] = ms or None  # 0 means none
    limit_text = annotations.get(RETRY_ANNOTATION + "limit")
    http_text = annotations.get(RETRY_ANNOTATION + "http")
    grpc_text = annotations.get(RETRY_ANNOTATION + "grpc")
    timeout_text = annotations.get(RETRY_ANNOTATION + "timeout")
    retry = None
    if any(t is not None for t in (limit_text, http_text, grpc_text, timeout_text)):
        limit = 1  # another retry annotation without a limit means one retry
        if limit_text is not None:
            if limit_text.strip().isdigit():
                limit = int(limit_text.strip())
            else:
                problems.append(Problem(path(RETRY_ANNOTATION + "limit"),
                                        f"{limit_text!r} is not a whole number",
                                        Effect.IGNORED))
        statuses: tuple[tuple[int, int], ...] = ()
        if http_text is not None:
            try:
                statuses = _http_statuses(http_text)
            except ValueError as e:
                problems.append(Problem(path(RETRY_ANNOTATION + "http"), str(e),
                                        Effect.IGNORED))
        codes: list[str] = []
        for code in (c.strip().lower() for c in (grpc_text or "").split(",") if c.strip()):
            if code in GRPC_RETRY_CODES:
                codes.append(code)
            else:
                problems.append(Problem(path(RETRY_ANNOTATION + "grpc"),
                                        f"{code!r} is not one of {', '.join(GRPC_RETRY_CODES)}",
                                        Effect.IGNORED))
        per_try = None
        if timeout_text is not None:
            try:
                per_try = parse_linkerd_duration(timeout_text) or None
            except ValueError as e:
                problems.append(Problem(path(RETRY_ANNOTATION + "timeout"), str(e),
                                        Effect.IGNORED))
        if limit > 0:  # a limit of 0 means no retries
            retry = Retry(limit, statuses, tuple(codes), None, per_try,
                          RetrySource.ANNOTATION)
    return RoutePolicy(Timeouts(request=timeouts["request"], response=timeouts["response"],
                                idle=timeouts["idle"]), retry, tuple(problems))


# --------------------------------------------------------------------------- routes


def decode_route(raw: Mapping[str, Any], store_kind: str, group: str,
                 route_kind: str) -> Route:
    meta = decode_meta(raw, route_kind, True)
    r = _Reader(route_kind, f"{meta.namespace}/{meta.name}")
    spec = r.mapping(raw.get("spec"), "spec")
    grpc = route_kind == "GRPCRoute"
    parents = _parents(r, spec, meta.namespace)
    rules = _rules(r, spec, meta.namespace, grpc)
    hostnames = tuple(r.text(h, "spec.hostnames")
                      for h in r.items(spec.get("hostnames"), "spec.hostnames"))
    md = r.mapping(raw.get("metadata"), "metadata")
    created = md.get("creationTimestamp")
    generation = md.get("generation")
    return Route(meta, group, route_kind, parents, hostnames, rules,
                 str(created) if created else "", kind=store_kind,
                 policy=annotation_policy(meta.annotations), problems=r.take(),
                 generation=generation if isinstance(generation, int) else 0)


def decode_http_route(raw: Mapping[str, Any]) -> Route:
    # One kind name, two API groups: the apiVersion says which (list items from the
    # API server carry none, so the kube source asks for "GatewayHTTPRoute" itself).
    api_version = raw.get("apiVersion")
    if isinstance(api_version, str) and api_version.startswith(GATEWAY_GROUP + "/"):
        return decode_route(raw, "GatewayHTTPRoute", GATEWAY_GROUP, "HTTPRoute")
    return decode_route(raw, "HTTPRoute", LINKERD_POLICY_GROUP, "HTTPRoute")


def decode_grpc_route(raw: Mapping[str, Any]) -> Route:
    return decode_route(raw, "GRPCRoute", GATEWAY_GROUP, "GRPCRoute")


def _route_stub(kind: str, group: str, route_kind: str) -> Callable[[Meta], Route]:
    return lambda meta: Route(meta, group, route_kind, (), (), (), kind=kind)


# The route kinds, with their tombstones (key-only objects, for deleting what the cache
# holds when an object no longer decodes), for the kind registry (bridge.kinds).
ROUTE_KINDS_DECODED: tuple[Kind, ...] = (
    Kind("HTTPRoute", decode_http_route,
         _route_stub("HTTPRoute", LINKERD_POLICY_GROUP, "HTTPRoute")),
    Kind("GatewayHTTPRoute",
         lambda raw: decode_route(raw, "GatewayHTTPRoute", GATEWAY_GROUP, "HTTPRoute"),
         _route_stub("GatewayHTTPRoute", GATEWAY_GROUP, "HTTPRoute")),
    Kind("GRPCRoute", decode_grpc_route, _route_stub("GRPCRoute", GATEWAY_GROUP, "GRPCRoute")),
)


def validate_route(raw: Mapping[str, Any]) -> list[Problem]:
    """Every problem of one route object, as (field path, rule): what an admission
    check refuses. Decoded by the very code that serves routes, so that what is
    accepted here is what is served. Empty when the route is served as written."""
    kind = raw.get("kind")
    decoder = decode_grpc_route if kind == "GRPCRoute" else decode_http_route
    try:
        route = decoder(raw)
    except ObjectError as e:
        return [Problem(_field_of(str(e)), str(e), Effect.ROUTE, "Invalid")]
    return route.all_problems()


def _field_of(message: str) -> str:
    """The field path an ObjectError's message names (`Kind ns/name: spec.x ...`)."""
    _, _, rest = message.partition(": ")
    head = rest.split(" ", 1)[0]
    return head if head.startswith(("spec", "metadata")) else ""
