"""What OutboundPolicies says about a target (§12.2-12.5): pure functions of the
Cluster cache and the mesh configuration, encoded as Linkerd 2.20's policy
controller encodes them."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, replace

from google.protobuf.duration_pb2 import Duration

from bridge.authority import format_authority
from bridge.cluster import Cluster
from bridge.enrich import OPAQUE_PORTS_ANNOTATION
from bridge.model import MeshConfig, ServiceKey
from bridge.objects import Service
from bridge.port_sets import PortSpecError, parse_port_set
from bridge.routes.objects import (
    GrpcMatch,
    HeaderModifier,
    HttpMatch,
    Redirect,
    Retry,
    RetrySource,
    ValueMatch,
)
from bridge.routes.resolve import PortRoutes
from bridge.routes.table import (
    ResolvedBackend,
    ResolvedRoute,
    ResolvedRule,
    RouteRef,
    RouteTable,
    RouteType,
)
from linkerd_api.proto import destination_pb2 as dst
from linkerd_api.proto import grpc_route_pb2 as grpc_route
from linkerd_api.proto import http_route_pb2 as http_route
from linkerd_api.proto import http_types_pb2 as http_types
from linkerd_api.proto import meta_pb2 as meta
from linkerd_api.proto import net_pb2 as net
from linkerd_api.proto import opaque_route_pb2 as opaque_route
from linkerd_api.proto import outbound_pb2 as ob

DETECT_TIMEOUT_S = 10
QUEUE_CAPACITY = 100
FAILFAST_TIMEOUT_S = 3
EWMA_DEFAULT_RTT_MS = 30
EWMA_DECAY_S = 10

# Linkerd's --cluster-networks default: an IP in these that is no Service is NOT_FOUND
# (the proxy forwards it as it is); any other IP is egress and gets the fallback.
DEFAULT_CLUSTER_NETWORKS = ("10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12", "192.168.0.0/16")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
LINKERD_2_20 = "linkerd-2.20"  # --destination-semantics: Linkerd 2.20's answers


@dataclass(frozen=True, slots=True)
class ServiceTarget:
    service: ServiceKey
    port: int
    declared: bool  # the Service declares the port (else: the undefined-port policy)


@dataclass(frozen=True, slots=True)
class EgressTarget:
    ip: str
    port: int


class UnknownTarget(LookupError):
    """NOT_FOUND: the proxy forwards to the original destination without discovery."""


def _seconds(s: int) -> Duration:
    return Duration(seconds=s)


def _millis(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def _queue() -> ob.Queue:
    return ob.Queue(capacity=QUEUE_CAPACITY, failfast_timeout=_seconds(FAILFAST_TIMEOUT_S))


def _peak_ewma() -> ob.Backend.BalanceP2c.PeakEwma:
    return ob.Backend.BalanceP2c.PeakEwma(default_rtt=_millis(EWMA_DEFAULT_RTT_MS),
                                          decay=_seconds(EWMA_DECAY_S))


def tcp_address(ip: str, port: int) -> net.TcpAddress:
    addr = ipaddress.ip_address(ip)
    if isinstance(addr, ipaddress.IPv4Address):
        return net.TcpAddress(ip=net.IPAddress(ipv4=int(addr)), port=port)
    packed = addr.packed
    return net.TcpAddress(ip=net.IPAddress(ipv6=net.IPv6(
        first=int.from_bytes(packed[:8], "big"), last=int.from_bytes(packed[8:], "big"))),
        port=port)


def address_of(addr: net.TcpAddress) -> str:
    """The text of a TcpAddress's IP; ValueError when it has none or it is malformed."""
    which = addr.ip.WhichOneof("ip")
    if which == "ipv4":
        return str(ipaddress.IPv4Address(addr.ip.ipv4))
    if which == "ipv6":
        v6 = addr.ip.ipv6
        return str(ipaddress.IPv6Address(v6.first.to_bytes(8, "big") + v6.last.to_bytes(8, "big")))
    raise ValueError("traffic target must have an IP")


# --------------------------------------------------------------------------- targets


def lookup_addr(cluster: Cluster, ip: str, port: int,
                cluster_networks: Iterable[Network]) -> ServiceTarget | EgressTarget:
    """A ClusterIP:port's Service port; an address outside the cluster networks is
    egress (§12.3)."""
    services = sorted(cluster.services_with_cluster_ip(ip),
                      key=lambda s: (s.meta.namespace, s.meta.name))
    if services:
        svc = services[0]
        return ServiceTarget(ServiceKey(svc.meta.namespace, svc.meta.name), port,
                             svc.port(port) is not None)
    addr = ipaddress.ip_address(ip)
    if any(addr in n for n in cluster_networks if n.version == addr.version):
        raise UnknownTarget("No such service")
    return EgressTarget(ip, port)


def lookup_authority(cluster: Cluster, authority: str, cluster_domain: str) -> ServiceTarget:
    """`<svc>.<ns>.svc.<domain>[:port]` (no port means 80). ValueError: not an authority
    at all (INVALID_ARGUMENT); UnknownTarget: not a Service we know (§12.3)."""
    host, sep, port_text = authority.rpartition(":")
    if not sep:
        host, port_text = authority, ""
    if not host or any(c in host for c in "/@?# "):
        raise ValueError("invalid authority")
    if port_text and not (port_text.isascii() and port_text.isdigit()):
        raise ValueError("invalid authority")
    port = int(port_text) if port_text else 80
    if not 1 <= port <= 65535:
        raise ValueError("invalid authority")
    host = host.rstrip(".")
    if host.endswith("." + cluster_domain):
        host = host[: -len(cluster_domain) - 1]
    parts = host.split(".")
    if len(parts) < 3 or parts[2] != "svc" or len(parts) != 3:
        raise UnknownTarget(
            f"authority must be of the form <name>.<namespace>.svc.{cluster_domain}")
    key = ServiceKey(parts[1], parts[0])
    if key not in cluster.services:
        raise UnknownTarget("unknown target")
    return ServiceTarget(key, port, True)


# --------------------------------------------------------------------------- policies


def _resource(group: str, kind: str, name: str, namespace: str, port: int = 0) -> meta.Metadata:
    return meta.Metadata(resource=meta.Resource(group=group, kind=kind, name=name,
                                                namespace=namespace, port=port))


def _service_meta(key: ServiceKey, port: int) -> meta.Metadata:
    return _resource("core", "Service", key.name, key.namespace, port)


def _balancer(metadata: meta.Metadata, authority: str) -> ob.Backend:
    return ob.Backend(
        metadata=metadata, queue=_queue(),
        balancer=ob.Backend.BalanceP2c(
            discovery=ob.Backend.EndpointDiscovery(
                dst=ob.Backend.EndpointDiscovery.DestinationGet(path=authority)),
            peak_ewma=_peak_ewma()))


def _opaque_route(name: str, backend: ob.Backend) -> ob.OpaqueRoute:
    return ob.OpaqueRoute(
        metadata=meta.Metadata(default=name),
        rules=[ob.OpaqueRoute.Rule(backends=ob.OpaqueRoute.Distribution(
            first_available=ob.OpaqueRoute.Distribution.FirstAvailable(
                backends=[ob.OpaqueRoute.RouteBackend(backend=backend)])))])


def _default_http_route(backend: ob.Backend) -> ob.HttpRoute:
    return ob.HttpRoute(
        metadata=meta.Metadata(default="http"),
        rules=[ob.HttpRoute.Rule(
            matches=[http_route.HttpRouteMatch(path=http_route.PathMatch(prefix="/"))],
            backends=ob.HttpRoute.Distribution(
                first_available=ob.HttpRoute.Distribution.FirstAvailable(
                    backends=[ob.HttpRoute.RouteBackend(backend=backend)])),
            timeouts=http_route.Timeouts())])


def _detect(opaque: ob.OpaqueRoute, http: list[ob.HttpRoute]) -> ob.ProxyProtocol:
    return ob.ProxyProtocol(detect=ob.ProxyProtocol.Detect(
        timeout=_seconds(DETECT_TIMEOUT_S),
        opaque=ob.ProxyProtocol.Opaque(routes=[opaque]),
        http1=ob.ProxyProtocol.Http1(routes=http),
        http2=ob.ProxyProtocol.Http2(routes=http)))


def egress_fallback(ip: str, port: int) -> ob.OutboundPolicy:
    """The policy for an address outside the cluster: forward it as it is (§12.3)."""
    md = meta.Metadata(default="egress-fallback")
    backend = ob.Backend(metadata=md, queue=_queue(),
                         forward=dst.WeightedAddr(addr=tcp_address(ip, port), weight=1))
    http = ob.HttpRoute(
        metadata=md,
        rules=[ob.HttpRoute.Rule(
            matches=[http_route.HttpRouteMatch()],
            backends=ob.HttpRoute.Distribution(
                first_available=ob.HttpRoute.Distribution.FirstAvailable(
                    backends=[ob.HttpRoute.RouteBackend(backend=backend)])))])
    return ob.OutboundPolicy(metadata=md,
                             protocol=_detect(_opaque_route("egress-fallback", backend), [http]))


def undefined_port(target: ServiceTarget) -> ob.OutboundPolicy:
    """A ClusterIP with a port its Service does not declare: every connection is refused
    (§12.3)."""
    return ob.OutboundPolicy(
        metadata=_service_meta(target.service, target.port),
        protocol=ob.ProxyProtocol(opaque=ob.ProxyProtocol.Opaque(routes=[ob.OpaqueRoute(
            metadata=meta.Metadata(default="undefined-port"),
            rules=[ob.OpaqueRoute.Rule(
                backends=ob.OpaqueRoute.Distribution(empty=ob.OpaqueRoute.Distribution.Empty()),
                filters=[ob.OpaqueRoute.Filter(forbidden=opaque_route.Forbidden())])])])))


def app_protocol(svc: Service, port: int, config: MeshConfig) -> str:
    """"http1", "http2", "opaque" or "" (detect), from the port's appProtocol, else the
    Service's opaque-ports annotation, else the default opaque ports (§12.4)."""
    sp = svc.port(port)
    if sp is not None and sp.app_protocol:
        return {"http": "http1", "kubernetes.io/h2c": "http2"}.get(sp.app_protocol, "opaque")
    text = svc.meta.annotations.get(OPAQUE_PORTS_ANNOTATION)
    opaque = config.default_opaque_ports
    if text is not None:
        try:
            opaque = parse_port_set(text, lambda name: next(
                (p.port for p in svc.ports if p.name == name), None))
        except PortSpecError:
            opaque = frozenset()
    return "opaque" if port in opaque else ""


def service_policy(cluster: Cluster, config: MeshConfig, target: ServiceTarget,
                   routes: PortRoutes | None, source_ns: str,
                   semantics: str = "proto") -> ob.OutboundPolicy:
    """The policy of a Service port (§12.4), routed by the table its client namespace
    reads (`routes`, from the one route model; None when no route is attached)."""
    if not target.declared:
        return undefined_port(target)
    key, port = target.service, target.port
    svc = cluster.services.get(key)
    domain = config.cluster_domain
    backend = _balancer(_service_meta(key, port), format_authority(key, port, domain))
    protocol_name = app_protocol(svc, port, config) if svc is not None else ""
    linkerd_2_20 = semantics == LINKERD_2_20
    table = _table_for(routes, source_ns, linkerd_2_20)
    convert = _RouteEncoder(domain, backend, linkerd_2_20)
    opaque = convert.opaque(table) or _opaque_route("opaq", backend)
    if protocol_name == "opaque":
        return ob.OutboundPolicy(
            metadata=_service_meta(key, port),
            protocol=ob.ProxyProtocol(opaque=ob.ProxyProtocol.Opaque(routes=[opaque])))
    protocol: ob.ProxyProtocol
    if table is not None and table.route_type is RouteType.GRPC and protocol_name != "http1":
        protocol = ob.ProxyProtocol(grpc=ob.ProxyProtocol.Grpc(
            routes=[convert.grpc(r) for r in table.routes if convert.serves(r)]))
    else:
        http = [] if table is None or table.route_type is not RouteType.HTTP else [
            convert.http(r) for r in table.routes if convert.serves(r)]
        http = http or [_default_http_route(backend)]
        if protocol_name == "http1":
            protocol = ob.ProxyProtocol(http1=ob.ProxyProtocol.Http1(routes=http))
        elif protocol_name == "http2":
            protocol = ob.ProxyProtocol(http2=ob.ProxyProtocol.Http2(routes=http))
        else:
            protocol = _detect(opaque, http)
    return ob.OutboundPolicy(metadata=_service_meta(key, port), protocol=protocol)


def left_out(routes: PortRoutes | None, source_ns: str, semantics: str) -> list[str]:
    """What a proxy in `source_ns` is not told of the port's routes (Routes §5.2)."""
    table = _table_for(routes, source_ns, semantics == LINKERD_2_20)
    if table is None:
        return []
    out = []
    if table.profile is not None:
        # Routes §7.2: a proxy given the profile (GetProfile) tries its routes in
        # order; one that reads only this policy picks the best match among them.
        out.append(f"{table.profile.label}: the routes' order (a proxy that follows the "
                   "ServiceProfile tries them first to last; these routes are ranked "
                   "best match first)")
        budget = table.retry_budget
        if budget is not None and any(r.retry is not None for r in table.routes[0].rules):
            out.append(f"{table.profile.label}: the retry budget ({budget.ratio:.0%} more "
                       f"requests, at least {budget.min_per_second}/s; sent as a retry "
                       "limit per request)")
    for route in table.routes:
        if semantics == LINKERD_2_20 and route.linkerd_2_20_drops:
            out.append(f"{route.ref.label}: the whole route ({route.linkerd_2_20_drops}, "
                       "Linkerd 2.20 leaves it out)")
            continue
        for rule in route.rules:
            spec = rule.rule
            if spec.rewrite is not None:
                out.append(f"{rule.label}: URLRewrite (the proxy has no rewrite)")
            if spec.mirrors:
                out.append(f"{rule.label}: RequestMirror (the proxy does not mirror)")
    return out


def _table_for(routes: PortRoutes | None, source_ns: str,
               linkerd_2_20: bool) -> RouteTable | None:
    """The client namespace's table. Where a ServiceProfile routes the port, its
    table, which the proxy follows whatever its policy says (Routes §7.1); Linkerd
    2.20 answers from the routes alone. Linkerd 2.20 gives a consumer namespace the
    producer's routes as well as its own (Routes §5.1); the spec, its own only."""
    if routes is None:
        return None
    table = routes.table_for(source_ns, profiles=not linkerd_2_20)
    if (linkerd_2_20 and table is not None and routes.producer is not None
            and table is not routes.producer
            and table.route_type is routes.producer.route_type):
        merged = sorted((*routes.producer.routes, *table.routes),
                        key=lambda r: (not r.created, r.created, r.ref.name))
        return replace(table, routes=tuple(merged))
    return table


# --------------------------------------------------------------------------- routes


def _header(m: ValueMatch) -> http_route.HeaderMatch:
    if m.regex:
        return http_route.HeaderMatch(name=m.name, regex=m.value)
    return http_route.HeaderMatch(name=m.name, exact=m.value.encode())


def _method(name: str) -> http_types.HttpMethod:
    if name in http_types.HttpMethod.Registered.keys():  # noqa: SIM118 - an EnumTypeWrapper
        return http_types.HttpMethod(registered=name)
    return http_types.HttpMethod(unregistered=name)


def http_match(m: HttpMatch) -> http_route.HttpRouteMatch:
    path = {"Exact": http_route.PathMatch(exact=m.path),
            "PathPrefix": http_route.PathMatch(prefix=m.path),
            "RegularExpression": http_route.PathMatch(regex=m.path)}[m.path_type]
    out = http_route.HttpRouteMatch(path=path, headers=[_header(h) for h in m.headers])
    for q in m.query_params:
        out.query_params.append(
            http_route.QueryParamMatch(name=q.name, regex=q.value) if q.regex
            else http_route.QueryParamMatch(name=q.name, exact=q.value))
    if m.method:
        out.method.CopyFrom(_method(m.method))
    return out


def grpc_match(m: GrpcMatch) -> grpc_route.GrpcRouteMatch:
    return grpc_route.GrpcRouteMatch(
        rpc=grpc_route.GrpcRpcMatch(service=m.service, method=m.method),
        headers=[_header(h) for h in m.headers])


def _host_match(host: str) -> http_route.HostMatch:
    if host.startswith("*."):
        return http_route.HostMatch(suffix=http_route.HostMatch.Suffix(
            reverse_labels=list(reversed(host[2:].split(".")))))
    return http_route.HostMatch(exact=host)


# The proxy's fixed retry settings under Linkerd 2.20 (Routes §5.3).
RETRY_MAX_REQUEST_BYTES = 64 * 1024
RETRY_MIN_BACKOFF_MS = 25
RETRY_MAX_BACKOFF_MS = 250
_GRPC_CONDITIONS = {"cancelled": "cancelled", "deadline-exceeded": "deadine_exceeded",
                    "resource-exhausted": "resource_exhausted", "internal": "internal",
                    "unavailable": "unavailable"}


def _headers(pairs: tuple[tuple[str, str], ...]) -> http_types.Headers:
    return http_types.Headers(headers=[http_types.Headers.Header(name=n, value=v.encode())
                                       for n, v in pairs])


def _request_headers(mod: HeaderModifier) -> http_route.RequestHeaderModifier:
    return http_route.RequestHeaderModifier(add=_headers(mod.add), set=_headers(mod.set),
                                            remove=list(mod.remove))


def _response_headers(mod: HeaderModifier) -> http_route.ResponseHeaderModifier:
    return http_route.ResponseHeaderModifier(add=_headers(mod.add), set=_headers(mod.set),
                                             remove=list(mod.remove))


def _redirect(r: Redirect) -> http_route.RequestRedirect:
    out = http_route.RequestRedirect(host=r.hostname, port=r.port or 0, status=r.status)
    if r.scheme:
        scheme = r.scheme.upper()
        if scheme in http_types.Scheme.Registered.keys():  # noqa: SIM118 - an EnumTypeWrapper
            out.scheme.registered = http_types.Scheme.Registered.Value(scheme)  # type: ignore[assignment]
        else:
            out.scheme.unregistered = r.scheme
    if r.path is not None:
        if r.path.kind == "ReplaceFullPath":
            out.path.full = r.path.value
        else:
            out.path.prefix = r.path.value
    return out


def _timeouts(rule: ResolvedRule, linkerd_2_20: bool) -> http_route.Timeouts:
    t = rule.timeouts
    out = http_route.Timeouts()
    request = t.request
    if not linkerd_2_20 and t.backend_request and rule.retry is None:
        # Routes §3.3: one attempt, so its bound is the request's too.
        request = min(request, t.backend_request) if request else t.backend_request
    for field_name, ms in (("request", request), ("response", t.response),
                           ("idle", t.idle)):
        if ms:
            getattr(out, field_name).CopyFrom(_millis(ms))
    return out


class _RouteEncoder:
    """Turns resolved routes into the proxy's routes (§12.5). A backend that cannot be
    served keeps its weight and carries a failure filter (HTTP 500, gRPC code 500);
    a rule that cannot be served at all answers every request so."""

    def __init__(self, domain: str, default: ob.Backend, linkerd_2_20: bool) -> None:
        self.domain = domain
        self.default = default
        self.linkerd_2_20 = linkerd_2_20

    def serves(self, route: ResolvedRoute) -> bool:
        # Routes §5.2: Linkerd 2.20 leaves out a route it cannot convert whole (a
        # URLRewrite, a RequestMirror, a filter it does not know).
        if not self.linkerd_2_20:
            return True
        return not route.linkerd_2_20_drops and not any(
            r.failure for r in route.rules)

    def _route_meta(self, ref: RouteRef) -> meta.Metadata:
        return meta.Metadata(resource=meta.Resource(
            group=ref.group, kind=ref.route_kind, namespace=ref.namespace, name=ref.name))

    def _hosts(self, route: ResolvedRoute) -> list[http_route.HostMatch]:
        # Routes §1.1: a mesh route's hostnames are not matched; Linkerd 2.20 does.
        return [_host_match(h) for h in route.hostnames] if self.linkerd_2_20 else []

    def _backend(self, b: ResolvedBackend) -> ob.Backend:
        if b.service is None or b.ref.port is None:
            return ob.Backend(metadata=meta.Metadata(default="invalid"), queue=_queue())
        md = _service_meta(b.service, b.ref.port)
        if not b.usable:
            return ob.Backend(metadata=md, queue=_queue())
        return _balancer(md, format_authority(b.service, b.port, self.domain))

    def _failed(self) -> ob.Backend:
        return ob.Backend(metadata=meta.Metadata(default="invalid"), queue=_queue())

    def _retry_backoff(self, ms: int | None) -> ob.ExponentialBackoff:
        low = RETRY_MIN_BACKOFF_MS if self.linkerd_2_20 or not ms else ms
        high = RETRY_MAX_BACKOFF_MS if self.linkerd_2_20 or not ms else 10 * ms
        return ob.ExponentialBackoff(min_backoff=_millis(low), max_backoff=_millis(high),
                                     jitter_ratio=1.0)

    def _retry_of(self, rule: ResolvedRule) -> Retry | None:
        retry = rule.retry
        if retry is None or (self.linkerd_2_20 and retry.source is RetrySource.GATEWAY):
            return None  # Routes §5.3: 2.20 reads only the annotations
        return retry

    def _per_try(self, rule: ResolvedRule, retry: Retry) -> int | None:
        if retry.timeout_ms or self.linkerd_2_20:
            return retry.timeout_ms
        return rule.timeouts.backend_request

    # ------------------------------------------------------------------ opaque

    def opaque(self, table: RouteTable | None) -> ob.OpaqueRoute | None:
        """Routes §7.4: a connection the proxy does not read as HTTP is still split by
        its ServiceProfile's dstOverrides; None where there is no such split."""
        if table is None or table.profile is None:
            return None
        rule = table.routes[0].rules[-1]  # the catch-all: every route's distribution
        if rule.to_parent:
            return None
        backends = []
        for b in rule.backends:
            rb = ob.OpaqueRoute.RouteBackend(backend=self._backend(b))
            if not b.usable:
                rb.filters.append(ob.OpaqueRoute.Filter(
                    invalid=opaque_route.Invalid(message=b.failure)))
            backends.append(ob.OpaqueRoute.WeightedRouteBackend(backend=rb, weight=b.weight))
        return ob.OpaqueRoute(
            metadata=self._route_meta(table.profile),
            rules=[ob.OpaqueRoute.Rule(backends=ob.OpaqueRoute.Distribution(
                random_available=ob.OpaqueRoute.Distribution.RandomAvailable(
                    backends=backends)))])

    # ------------------------------------------------------------------ HTTP

    def http(self, route: ResolvedRoute) -> ob.HttpRoute:
        return ob.HttpRoute(metadata=self._route_meta(route.ref), hosts=self._hosts(route),
                            rules=[self._http_rule(r) for r in route.rules])

    def _http_rule(self, rule: ResolvedRule) -> ob.HttpRoute.Rule:
        out = ob.HttpRoute.Rule(
            matches=[http_match(m) for m in rule.matches if isinstance(m, HttpMatch)],
            backends=self._http_distribution(rule), timeouts=_timeouts(rule, self.linkerd_2_20))
        spec = rule.rule
        if spec.request_headers is not None:
            out.filters.add(request_header_modifier=_request_headers(spec.request_headers))
        if spec.response_headers is not None:
            out.filters.add(response_header_modifier=_response_headers(spec.response_headers))
        if spec.redirect is not None:
            out.filters.add(redirect=_redirect(spec.redirect))
        retry = self._retry_of(rule)
        if retry is not None:
            out.retry.CopyFrom(ob.HttpRoute.Retry(
                max_retries=retry.limit, max_request_bytes=RETRY_MAX_REQUEST_BYTES,
                conditions=ob.HttpRoute.Retry.Conditions(status_ranges=[
                    ob.HttpRoute.Retry.Conditions.StatusRange(start=a, end=b)
                    for a, b in retry.http_statuses]),
                backoff=self._retry_backoff(retry.backoff_ms)))
            per_try = self._per_try(rule, retry)
            if per_try:
                out.retry.timeout.CopyFrom(_millis(per_try))
        return out

    def _http_distribution(self, rule: ResolvedRule) -> ob.HttpRoute.Distribution:
        D = ob.HttpRoute.Distribution
        if rule.failure:
            return D(first_available=D.FirstAvailable(backends=[ob.HttpRoute.RouteBackend(
                backend=self._failed(), filters=[ob.HttpRoute.Filter(
                    failure_injector=http_route.HttpFailureInjector(
                        status=500, message=rule.failure))])]))
        if rule.to_parent or not rule.backends:
            return D(first_available=D.FirstAvailable(
                backends=[ob.HttpRoute.RouteBackend(backend=self.default)]))
        out = []
        for b in rule.backends:
            rb = ob.HttpRoute.RouteBackend(backend=self._backend(b))
            if not b.usable:
                rb.filters.append(ob.HttpRoute.Filter(
                    failure_injector=http_route.HttpFailureInjector(status=500,
                                                                    message=b.failure)))
            out.append(ob.HttpRoute.WeightedRouteBackend(backend=rb, weight=b.weight))
        return D(random_available=D.RandomAvailable(backends=out))

    # ------------------------------------------------------------------ gRPC

    def grpc(self, route: ResolvedRoute) -> ob.GrpcRoute:
        return ob.GrpcRoute(metadata=self._route_meta(route.ref), hosts=self._hosts(route),
                            rules=[self._grpc_rule(r) for r in route.rules])

    def _grpc_rule(self, rule: ResolvedRule) -> ob.GrpcRoute.Rule:
        out = ob.GrpcRoute.Rule(
            matches=[grpc_match(m) for m in rule.matches if isinstance(m, GrpcMatch)],
            backends=self._grpc_distribution(rule),
            timeouts=_timeouts(rule, self.linkerd_2_20))
        if rule.rule.request_headers is not None:
            out.filters.add(request_header_modifier=_request_headers(rule.rule.request_headers))
        retry = self._retry_of(rule)
        if retry is not None and retry.grpc_codes:
            conditions = ob.GrpcRoute.Retry.Conditions(
                **{_GRPC_CONDITIONS[c]: True for c in retry.grpc_codes})
            out.retry.CopyFrom(ob.GrpcRoute.Retry(
                max_retries=retry.limit, max_request_bytes=RETRY_MAX_REQUEST_BYTES,
                conditions=conditions, backoff=self._retry_backoff(retry.backoff_ms)))
            if retry.timeout_ms:
                out.retry.timeout.CopyFrom(_millis(retry.timeout_ms))
        return out

    def _grpc_distribution(self, rule: ResolvedRule) -> ob.GrpcRoute.Distribution:
        D = ob.GrpcRoute.Distribution
        if rule.failure:
            return D(first_available=D.FirstAvailable(backends=[ob.GrpcRoute.RouteBackend(
                backend=self._failed(), filters=[ob.GrpcRoute.Filter(
                    failure_injector=grpc_route.GrpcFailureInjector(
                        code=500, message=rule.failure))])]))
        if rule.to_parent or not rule.backends:
            return D(first_available=D.FirstAvailable(
                backends=[ob.GrpcRoute.RouteBackend(backend=self.default)]))
        out = []
        for b in rule.backends:
            rb = ob.GrpcRoute.RouteBackend(backend=self._backend(b))
            if not b.usable:
                rb.filters.append(ob.GrpcRoute.Filter(
                    failure_injector=grpc_route.GrpcFailureInjector(code=500,
                                                                    message=b.failure)))
            out.append(ob.GrpcRoute.WeightedRouteBackend(backend=rb, weight=b.weight))
        return D(random_available=D.RandomAvailable(backends=out))
