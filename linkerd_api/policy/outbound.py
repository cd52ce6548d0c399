"""What OutboundPolicies says about a target (§12.2-12.5): pure functions of the
Cluster cache and the mesh configuration, encoded as Linkerd 2.20's policy
controller encodes them."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from google.protobuf.duration_pb2 import Duration

from bridge.authority import format_authority
from bridge.cluster import Cluster
from bridge.enrich import OPAQUE_PORTS_ANNOTATION
from bridge.model import MeshConfig, ServiceKey
from bridge.objects import Service
from bridge.policy_objects import BackendRef, GrpcMatch, HttpMatch, Route, RouteRule, ValueMatch
from bridge.port_sets import PortSpecError, parse_port_set
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
# Called once for each backend reference that names no Service (route, backend).
MissingBackend = Callable[[Route, BackendRef], None]


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


def attached_routes(cluster: Cluster, target: ServiceTarget, source_ns: str,
                    kinds: Iterable[str]) -> list[Route]:
    """Routes attached to the Service port: the client namespace's own (consumer)
    routes if it has any, else the Service namespace's (producer) ones, oldest first
    (§12.4)."""
    svc = target.service
    routes = [r for kind in kinds for r in cluster.objects(kind)
              if isinstance(r, Route) and r.attaches_to(svc.namespace, svc.name, target.port)]
    consumer = [r for r in routes if r.meta.namespace == source_ns != svc.namespace]
    chosen = consumer or [r for r in routes if r.meta.namespace == svc.namespace]
    # Routes with a timestamp come before routes without; then by name.
    return sorted(chosen, key=lambda r: (not r.created, r.created, r.meta.name))


def service_policy(cluster: Cluster, config: MeshConfig, target: ServiceTarget,
                   source_ns: str, missing: MissingBackend) -> ob.OutboundPolicy:
    """The policy of a Service port (§12.4)."""
    if not target.declared:
        return undefined_port(target)
    key, port = target.service, target.port
    svc = cluster.services.get(key)
    domain = config.cluster_domain
    backend = _balancer(_service_meta(key, port), format_authority(key, port, domain))
    protocol_name = app_protocol(svc, port, config) if svc is not None else ""
    opaque = _opaque_route("opaq", backend)
    if protocol_name == "opaque":
        return ob.OutboundPolicy(
            metadata=_service_meta(key, port),
            protocol=ob.ProxyProtocol(opaque=ob.ProxyProtocol.Opaque(routes=[opaque])))
    grpc_routes = attached_routes(cluster, target, source_ns, ("GRPCRoute",))
    http_routes = attached_routes(cluster, target, source_ns,
                                  ("HTTPRoute", "GatewayHTTPRoute"))
    convert = _RouteConverter(cluster, domain, backend, missing)
    protocol: ob.ProxyProtocol
    if grpc_routes and protocol_name != "http1":
        protocol = ob.ProxyProtocol(grpc=ob.ProxyProtocol.Grpc(
            routes=[convert.grpc(r) for r in grpc_routes]))
    else:
        http = [convert.http(r) for r in http_routes] or [_default_http_route(backend)]
        if protocol_name == "http1":
            protocol = ob.ProxyProtocol(http1=ob.ProxyProtocol.Http1(routes=http))
        elif protocol_name == "http2":
            protocol = ob.ProxyProtocol(http2=ob.ProxyProtocol.Http2(routes=http))
        else:
            protocol = _detect(opaque, http)
    return ob.OutboundPolicy(metadata=_service_meta(key, port), protocol=protocol)


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


class _RouteConverter:
    """Turns one route's rules into proto rules; a backend that names no Service is
    served as a failure (HTTP 500 / gRPC code 500), as Linkerd does (§12.5)."""

    def __init__(self, cluster: Cluster, domain: str, default: ob.Backend,
                 missing: MissingBackend) -> None:
        self.cluster = cluster
        self.domain = domain
        self.default = default
        self.missing = missing

    def _route_meta(self, route: Route) -> meta.Metadata:
        return meta.Metadata(resource=meta.Resource(
            group=route.group, kind=route.route_kind, namespace=route.meta.namespace,
            name=route.meta.name))

    def _backend(self, route: Route, ref: BackendRef) -> tuple[ob.Backend, str | None]:
        """The proto backend and, for an unusable one, the failure message."""
        if ref.kind != "Service" or ref.group not in ("", "core"):
            return (ob.Backend(metadata=meta.Metadata(default="invalid"), queue=_queue()),
                    f"unsupported backend type {ref.group or 'core'} {ref.kind}")
        if ref.port is None:
            return (ob.Backend(metadata=meta.Metadata(default="invalid"), queue=_queue()),
                    f"missing port for backend Service {ref.name}")
        key = ServiceKey(ref.namespace, ref.name)
        md = _service_meta(key, ref.port)
        if key not in self.cluster.services:
            self.missing(route, ref)
            return ob.Backend(metadata=md, queue=_queue()), f"Service not found {ref.name}"
        return _balancer(md, format_authority(key, ref.port, self.domain)), None

    def http(self, route: Route) -> ob.HttpRoute:
        rules = []
        for rule in route.rules:
            rules.append(ob.HttpRoute.Rule(
                matches=[http_match(m) for m in rule.matches if isinstance(m, HttpMatch)],
                backends=self._http_distribution(route, rule),
                timeouts=http_route.Timeouts()))
        return ob.HttpRoute(metadata=self._route_meta(route),
                            hosts=[_host_match(h) for h in route.hostnames], rules=rules)

    def _http_distribution(self, route: Route, rule: RouteRule) -> ob.HttpRoute.Distribution:
        if not rule.backends:
            return ob.HttpRoute.Distribution(
                first_available=ob.HttpRoute.Distribution.FirstAvailable(
                    backends=[ob.HttpRoute.RouteBackend(backend=self.default)]))
        out = []
        for ref in rule.backends:
            backend, failure = self._backend(route, ref)
            rb = ob.HttpRoute.RouteBackend(backend=backend)
            if failure is not None:
                rb.filters.append(ob.HttpRoute.Filter(
                    failure_injector=http_route.HttpFailureInjector(status=500,
                                                                    message=failure)))
            out.append(ob.HttpRoute.WeightedRouteBackend(backend=rb, weight=ref.weight))
        return ob.HttpRoute.Distribution(
            random_available=ob.HttpRoute.Distribution.RandomAvailable(backends=out))

    def grpc(self, route: Route) -> ob.GrpcRoute:
        rules = []
        for rule in route.rules:
            rules.append(ob.GrpcRoute.Rule(
                matches=[grpc_match(m) for m in rule.matches if isinstance(m, GrpcMatch)],
                backends=self._grpc_distribution(route, rule),
                timeouts=http_route.Timeouts()))
        return ob.GrpcRoute(metadata=self._route_meta(route),
                            hosts=[_host_match(h) for h in route.hostnames], rules=rules)

    def _grpc_distribution(self, route: Route, rule: RouteRule) -> ob.GrpcRoute.Distribution:
        if not rule.backends:
            return ob.GrpcRoute.Distribution(
                first_available=ob.GrpcRoute.Distribution.FirstAvailable(
                    backends=[ob.GrpcRoute.RouteBackend(backend=self.default)]))
        out = []
        for ref in rule.backends:
            backend, failure = self._backend(route, ref)
            rb = ob.GrpcRoute.RouteBackend(backend=backend)
            if failure is not None:
                rb.filters.append(ob.GrpcRoute.Filter(
                    failure_injector=grpc_route.GrpcFailureInjector(code=500, message=failure)))
            out.append(ob.GrpcRoute.WeightedRouteBackend(backend=rb, weight=ref.weight))
        return ob.GrpcRoute.Distribution(
            random_available=ob.GrpcRoute.Distribution.RandomAvailable(backends=out))
