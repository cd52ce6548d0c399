"""A Service port's RouteTable as a RouteConfiguration, for Envoy or for proxyless gRPC
(xDS §3.8, §4.6; the field table is docs/routes.md's).

Pure functions: a table in, the RouteConfiguration and the list of what this client
kind cannot be told out. Envoy is told everything the table says. A gRPC client is
told only what grpc accepts (xDS §3.8): what would make it NACK the whole
RouteConfiguration is never sent, and what it would silently skip is left out and
reported, so that the debug pages and the logs say what that client does not do.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from envoy.config.core.v3 import base_pb2
from envoy.config.route.v3 import route_components_pb2 as rc
from envoy.config.route.v3 import route_pb2
from envoy.type.matcher.v3 import regex_pb2, string_pb2
from envoy.type.v3 import percent_pb2
from google.protobuf import duration_pb2, wrappers_pb2

from bridge.authority import view_authority
from bridge.model import ServiceKey, ViewKey
from bridge.routes.objects import (
    GrpcMatch,
    HeaderModifier,
    HttpMatch,
    Redirect,
    Retry,
    RetrySource,
    Rewrite,
    ValueMatch,
)
from bridge.routes.table import ResolvedBackend, ResolvedRule, RouteTable, TableEntry

GRPC_MAX_RETRIES = 4  # grpc treats more as 4 (xDS §3.8)
_MAX_LISTED_CODES = 100  # a status range wider than this is not listed code by code


class ClientKind(enum.Enum):
    """Who asks for a RouteConfiguration: what it may be sent differs (xDS §3.8)."""

    ENVOY = "envoy"
    GRPC = "grpc"


@dataclass(frozen=True, slots=True)
class Unrepresentable:
    """Something of a route this client kind is not told, and why."""

    route: str  # the route's label
    what: str

    def __str__(self) -> str:
        return f"{self.route}: {self.what}"


def cluster_name(service: ServiceKey, port: int, domain: str) -> str:
    """The CDS cluster (and EDS name) of a Service port: its authority."""
    return view_authority(ViewKey(service, port), domain)


def _ms(ms: int) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def build_default_route(name: str) -> route_pb2.RouteConfiguration:
    """A port no route is attached to: every request goes to the cluster of the same
    name. The listener exists for this one authority, so its one virtual host
    matches all."""
    return route_pb2.RouteConfiguration(
        name=name,
        virtual_hosts=[rc.VirtualHost(
            name=name, domains=["*"],
            routes=[rc.Route(match=rc.RouteMatch(prefix=""),
                             route=rc.RouteAction(cluster=name))])])


def build_route_config(name: str, table: RouteTable, client: ClientKind,
                       domain: str) -> tuple[route_pb2.RouteConfiguration,
                                             tuple[Unrepresentable, ...]]:
    """The port's routes in the table's order (first match wins in both clients);
    no catch-all after them: an unmatched request is a 404 (Envoy) or UNAVAILABLE
    (gRPC), as the Gateway API says (Routes §3.1)."""
    encoder = _Encoder(table, client, domain)
    routes = [r for entry in table.entries if (r := encoder.route(entry)) is not None]
    config = route_pb2.RouteConfiguration(
        name=name, virtual_hosts=[rc.VirtualHost(name=name, domains=["*"], routes=routes)])
    return config, tuple(dict.fromkeys(encoder.left_out))


class _Encoder:
    def __init__(self, table: RouteTable, client: ClientKind, domain: str) -> None:
        self.table = table
        self.client = client
        self.domain = domain
        self.grpc = client is ClientKind.GRPC
        self.left_out: list[Unrepresentable] = []

    def _skip(self, rule: ResolvedRule, what: str) -> None:
        self.left_out.append(Unrepresentable(rule.route.label, what))

    # ------------------------------------------------------------------ a route

    def route(self, entry: TableEntry) -> rc.Route | None:
        rule = entry.rule
        match = self._match(entry.match, rule)
        if match is None:
            return None
        # Named as `meshbridge policy` names a Linkerd rule, so the two read alike.
        out = rc.Route(name=f"{rule.route.label} rule {rule.index}", match=match)
        spec = rule.rule
        if rule.failure:
            # Routes §3.4: a rule that cannot be served answers 500 (gRPC clients fail
            # the call; a direct response is accepted, never NACKed, xDS §3.8).
            out.direct_response.CopyFrom(rc.DirectResponseAction(
                status=500, body=base_pb2.DataSource(inline_string=rule.failure)))
            return out
        if spec.redirect is not None:
            if self.grpc:
                self._skip(rule, "RequestRedirect (a gRPC call cannot follow one): the "
                                 "rule is left out")
                return None
            out.redirect.CopyFrom(_redirect(spec.redirect))
            self._headers(out, rule)
            return out
        out.route.CopyFrom(self._action(rule))
        self._headers(out, rule)
        return out

    # ------------------------------------------------------------------ matching

    def _match(self, m: HttpMatch | GrpcMatch, rule: ResolvedRule) -> rc.RouteMatch | None:
        if isinstance(m, GrpcMatch):
            out = _grpc_path(m)
        else:
            found = self._http_path(m)
            if found is None:
                return None
            out = found
            if m.query_params:
                if self.grpc:
                    # xDS §3.8: grpc ignores a route with query matches; leaving it
                    # out says the same thing without relying on that.
                    self._skip(rule, "a query parameter match: the match is left out")
                    return None
                out.query_parameters.extend(
                    rc.QueryParameterMatcher(name=q.name, string_match=_string(q))
                    for q in m.query_params)
            if m.method:
                if not self.grpc:
                    out.headers.append(rc.HeaderMatcher(
                        name=":method", string_match=string_pb2.StringMatcher(exact=m.method)))
                elif m.method != "POST":
                    self._skip(rule, f"a {m.method} method match (every gRPC call is a "
                                     "POST): the match is left out")
                    return None
        out.headers.extend(rc.HeaderMatcher(name=h.name.lower(), string_match=_string(h))
                           for h in m.headers)
        return out

    def _http_path(self, m: HttpMatch) -> rc.RouteMatch:
        if m.path_type == "Exact":
            return rc.RouteMatch(path=m.path)
        if m.path_type == "RegularExpression":
            return rc.RouteMatch(safe_regex=regex_pb2.RegexMatcher(regex=m.path))
        prefix = m.path.rstrip("/")
        if not prefix:
            return rc.RouteMatch(prefix="/")
        if self.grpc:
            # xDS §3.8: path_separated_prefix makes grpc NACK the configuration; a
            # call's path is /service/method, so a prefix ending in / is the same
            # segment match for every call.
            return rc.RouteMatch(prefix=prefix + "/")
        # Routes §2.2: a prefix matches whole segments, with or without the trailing /.
        return rc.RouteMatch(path_separated_prefix=prefix)

    # ------------------------------------------------------------------ the action

    def _action(self, rule: ResolvedRule) -> rc.RouteAction:
        action = rc.RouteAction()
        backends = [b for b in rule.backends if b.weight > 0 or rule.to_parent]
        names = [self._cluster(b) for b in backends]
        if len(backends) == 1:
            action.cluster = names[0]
        else:
            # Weight-0 entries are left out: grpc drops them and Envoy sends them
            # nothing; the decoder made sure the sum is above zero.
            action.weighted_clusters.clusters.extend(
                rc.WeightedCluster.ClusterWeight(
                    name=n, weight=wrappers_pb2.UInt32Value(value=b.weight))
                for n, b in zip(names, backends, strict=True))
        if any(not b.usable for b in backends):
            if self.grpc:
                pass  # xDS §3.8: grpc fails the calls a missing cluster gets on its own
            else:
                # Routes §3.2: the share of a backend that cannot be served is a 500.
                action.cluster_not_found_response_code = \
                    rc.RouteAction.ClusterNotFoundResponseCode.INTERNAL_SERVER_ERROR
        self._timeouts(action, rule)
        retry = rule.retry
        if retry is not None:
            policy = self._retry(rule, retry)
            if policy is not None:
                action.retry_policy.CopyFrom(policy)
        spec = rule.rule
        if spec.rewrite is not None:
            if self.grpc:
                self._skip(rule, "URLRewrite (grpc ignores rewrites)")
            else:
                _rewrite(action, spec.rewrite)
        for mirror in rule.mirrors:
            if self.grpc:
                self._skip(rule, "RequestMirror (grpc does not mirror)")
                break
            policy = rc.RouteAction.RequestMirrorPolicy(cluster=self._cluster(mirror.backend))
            if mirror.percent < 100:
                policy.runtime_fraction.default_value.CopyFrom(percent_pb2.FractionalPercent(
                    numerator=round(mirror.percent * 10_000),
                    denominator=percent_pb2.FractionalPercent.MILLION))
            action.request_mirror_policies.append(policy)
        return action

    def _cluster(self, b: ResolvedBackend) -> str:
        if b.service is not None and b.port:
            return cluster_name(b.service, b.port, self.domain)
        # A backend that is no Service port has no cluster: a name no cluster has,
        # so that its share fails (Routes §3.2).
        return f"meshbridge-invalid|{b.ref.group or 'core'}/{b.ref.kind}/{b.ref.namespace}/" \
               f"{b.ref.name}"

    def _timeouts(self, action: rc.RouteAction, rule: ResolvedRule) -> None:
        t = rule.timeouts
        request = t.request or t.response  # 0 or unset: none
        if t.backend_request and rule.retry is None:
            # Routes §3.3: without retries one attempt is the whole request.
            request = min(request, t.backend_request) if request else t.backend_request
        if self.grpc:
            # xDS §3.8: grpc reads only max_stream_duration; a call's own deadline
            # still applies when it is shorter.
            if request:
                action.max_stream_duration.max_stream_duration.CopyFrom(_ms(request))
            if t.idle:
                self._skip(rule, "an idle timeout (grpc has none per route)")
            if t.backend_request and rule.retry is not None:
                self._skip(rule, "a per-attempt timeout (grpc ignores per_try_timeout)")
            return
        # Envoy's default route timeout is 15 s; the Gateway API's and Linkerd's is
        # none, so an unset timeout is sent as 0s (disabled).
        action.timeout.CopyFrom(_ms(request or 0))
        if t.idle:
            action.idle_timeout.CopyFrom(_ms(t.idle))

    def _retry(self, rule: ResolvedRule, retry: Retry) -> rc.RetryPolicy | None:
        budget = self.table.retry_budget
        if retry.source is RetrySource.PROFILE and budget is not None:
            self._skip(rule, f"retries within the ServiceProfile's budget ({budget.ratio:.0%} "
                             f"more requests, at least {budget.min_per_second}/s): sent as "
                             f"{retry.limit} retry per failed request")
        if self.grpc:
            if not retry.grpc_codes:
                self._skip(rule, "a retry on HTTP statuses (grpc retries on gRPC status "
                                 "codes only)")
                return None
            policy = rc.RetryPolicy(retry_on=",".join(retry.grpc_codes),
                                    num_retries=wrappers_pb2.UInt32Value(
                                        value=min(retry.limit, GRPC_MAX_RETRIES)))
            if retry.limit > GRPC_MAX_RETRIES:
                self._skip(rule, f"{retry.limit} retries (grpc makes at most "
                                 f"{GRPC_MAX_RETRIES})")
            if retry.timeout_ms or rule.timeouts.backend_request:
                self._skip(rule, "a per-attempt timeout (grpc ignores per_try_timeout)")
        else:
            tokens, codes = _envoy_retry_on(retry)
            if codes:
                tokens.append("retriable-status-codes")
            tokens.extend(retry.grpc_codes)
            policy = rc.RetryPolicy(retry_on=",".join(dict.fromkeys(tokens)),
                                    num_retries=wrappers_pb2.UInt32Value(value=retry.limit),
                                    retriable_status_codes=sorted(set(codes)))
            per_try = retry.timeout_ms or rule.timeouts.backend_request
            if per_try:
                policy.per_try_timeout.CopyFrom(_ms(per_try))
        if retry.backoff_ms:
            policy.retry_back_off.base_interval.CopyFrom(_ms(retry.backoff_ms))
            policy.retry_back_off.max_interval.CopyFrom(_ms(10 * retry.backoff_ms))
        return policy

    def _headers(self, out: rc.Route, rule: ResolvedRule) -> None:
        spec = rule.rule
        for mod, add, remove, what in (
                (spec.request_headers, out.request_headers_to_add,
                 out.request_headers_to_remove, "RequestHeaderModifier"),
                (spec.response_headers, out.response_headers_to_add,
                 out.response_headers_to_remove, "ResponseHeaderModifier")):
            if mod is None:
                continue
            if self.grpc:
                self._skip(rule, f"{what} (grpc ignores header changes)")
                continue
            add.extend(_header_options(mod))
            remove.extend(mod.remove)


# --------------------------------------------------------------------------- helpers


def _envoy_retry_on(retry: Retry) -> tuple[list[str], list[int]]:
    """Envoy's `retry_on` tokens and retriable status codes for a retry policy."""
    if retry.source is RetrySource.PROFILE:
        # Routes §7.3: the proxy retries the responses it classes as failures and
        # nothing else (not a reset, not a refused connection): exactly those codes.
        return [], [c for lo, hi in retry.http_statuses for c in range(lo, hi + 1)]
    tokens = ["connect-failure", "refused-stream"]
    codes: list[int] = []
    for lo, hi in retry.http_statuses:
        if (lo, hi) == (500, 599):
            tokens.append("5xx")
        elif (lo, hi) == (502, 504):
            tokens.append("gateway-error")
        elif hi - lo < _MAX_LISTED_CODES:
            codes.extend(range(lo, hi + 1))
    return tokens, codes



def _string(v: ValueMatch) -> string_pb2.StringMatcher:
    if v.regex:
        return string_pb2.StringMatcher(safe_regex=regex_pb2.RegexMatcher(regex=v.value))
    return string_pb2.StringMatcher(exact=v.value)


def _grpc_path(m: GrpcMatch) -> rc.RouteMatch:
    """Routes §2.3: a GRPCRoute method match is a path: `/service/method`."""
    if m.regex:
        service = m.service or "[^/]+"
        method = m.method or "[^/]+"
        return rc.RouteMatch(safe_regex=regex_pb2.RegexMatcher(regex=f"/{service}/{method}"))
    if m.service and m.method:
        return rc.RouteMatch(path=f"/{m.service}/{m.method}")
    if m.service:
        return rc.RouteMatch(prefix=f"/{m.service}/")
    if m.method:
        return rc.RouteMatch(safe_regex=regex_pb2.RegexMatcher(
            regex=f"/[^/]+/{_literal(m.method)}"))
    return rc.RouteMatch(prefix="/")


_RE2_SPECIAL = frozenset("\\.+*?()|[]{}^$")


def _literal(text: str) -> str:
    return "".join("\\" + c if c in _RE2_SPECIAL else c for c in text)


def _header_options(mod: HeaderModifier) -> list[base_pb2.HeaderValueOption]:
    Opt = base_pb2.HeaderValueOption
    out = [Opt(header=base_pb2.HeaderValue(key=k, value=v),
               append_action=Opt.OVERWRITE_IF_EXISTS_OR_ADD) for k, v in mod.set]
    out += [Opt(header=base_pb2.HeaderValue(key=k, value=v),
                append_action=Opt.APPEND_IF_EXISTS_OR_ADD) for k, v in mod.add]
    return out


def _redirect(r: Redirect) -> rc.RedirectAction:
    out = rc.RedirectAction(
        response_code=(rc.RedirectAction.MOVED_PERMANENTLY if r.status == 301
                       else rc.RedirectAction.FOUND))
    if r.scheme:
        out.scheme_redirect = r.scheme
    if r.hostname:
        out.host_redirect = r.hostname
    if r.port:
        out.port_redirect = r.port
    if r.path is not None:
        if r.path.kind == "ReplaceFullPath":
            out.path_redirect = r.path.value
        else:
            out.prefix_rewrite = r.path.value
    return out


def _rewrite(action: rc.RouteAction, r: Rewrite) -> None:
    if r.hostname:
        action.host_rewrite_literal = r.hostname
    if r.path is None:
        return
    if r.path.kind == "ReplacePrefixMatch":
        action.prefix_rewrite = r.path.value
    else:
        action.regex_rewrite.pattern.regex = "^/.*$"
        action.regex_rewrite.substitution = r.path.value

