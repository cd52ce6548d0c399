"""ServiceProfiles and workloads -> `DestinationProfile`: pure converters (§2.8, §2.9).

A ServiceProfile arrives as the raw `spec` mapping its manifest had; it is read by
bridge.routes.profiles (the one reader, which the route model shares) and encoded
here. A conversion error drops the whole profile (Linkerd sends nothing rather than
half a profile); the caller logs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog
from google.protobuf.duration_pb2 import Duration

from bridge.cluster import Cluster
from bridge.enrich import (
    OPAQUE_PORTS_ANNOTATION,
    EnrichError,
    enrich_pod_endpoint,
    pod_opaque_ports,
    server_marks_opaque,
)
from bridge.model import (
    BASE_WEIGHT,
    Endpoint,
    EndpointId,
    MeshConfig,
    ResolvedEndpoint,
    ServiceKey,
)
from bridge.objects import Pod, Service, ServiceProfile
from bridge.port_sets import PortSpecError, parse_port_set
from bridge.routes.profiles import (
    DEFAULT_RETRY_BUDGET,
    ProfileError,
    ProfileRoute,
    RequestCondition,
    ResponseCondition,
    RetryBudget,
    decode_profile,
    go_split_host_port_ok,
    parse_go_duration,
    quantity_milli_value,
    request_condition,
    response_condition,
)
from linkerd_api.proto import destination_pb2 as dst
from linkerd_api.proto import http_types_pb2 as http
from linkerd_api.proto import meta_pb2 as meta
from linkerd_api.translate import Translator, tcp_address

log = structlog.get_logger("meshbridge.linkerd.profiles")


def default_retry_budget() -> dst.RetryBudget:
    return _retry_budget(DEFAULT_RETRY_BUDGET)


def duration(nanos: int) -> Duration:
    return Duration(seconds=nanos // 1_000_000_000, nanos=nanos % 1_000_000_000)


def service_opaque_ports(svc: Service, config: MeshConfig) -> frozenset[int]:
    """The Service's opaque ports (§2.8): its annotation, whose entries are port
    numbers, ranges or Service port names, else the controller defaults. A bad entry
    is logged and skipped, as Linkerd does; an empty value is an empty set."""
    value = svc.meta.annotations.get(OPAQUE_PORTS_ANNOTATION)
    if value is None:
        return config.default_opaque_ports
    by_name = {p.name: p.port for p in svc.ports if p.name}
    ports: set[int] = set()
    for item in value.split(","):
        try:
            ports |= parse_port_set(item, by_name.get)
        except PortSpecError as e:
            log.warning("bad opaque-ports entry skipped", namespace=svc.meta.namespace,
                        service=svc.meta.name, entry=item.strip(), reason=str(e))
    return frozenset(ports)


# ----------------------------------------------------------------- matches


def request_match(raw: Any, where: str = "condition") -> dst.RequestMatch:
    """A request condition as Linkerd encodes it (bridge.routes.profiles reads it)."""
    return _request_match(request_condition(raw, where))


def response_match(raw: Any, where: str = "condition") -> dst.ResponseMatch:
    return _response_match(response_condition(raw, where))


def _request_match(c: RequestCondition) -> dst.RequestMatch:
    if c.kind in ("all", "any"):
        out = dst.RequestMatch()
        getattr(out, c.kind).SetInParent()  # an empty list is still that field
        getattr(out, c.kind).matches.extend(_request_match(x) for x in c.items)
        return out
    if c.kind == "method":
        return dst.RequestMatch(method=http_method(c.value))
    if c.kind == "path":
        return dst.RequestMatch(path=dst.PathMatch(regex=c.value))
    negated = dst.RequestMatch()
    # `not` is a Python keyword, so the field is reached with getattr.
    getattr(negated, "not").CopyFrom(_request_match(c.items[0]))
    return negated


def _response_match(c: ResponseCondition) -> dst.ResponseMatch:
    if c.kind in ("all", "any"):
        out = dst.ResponseMatch()
        getattr(out, c.kind).SetInParent()
        getattr(out, c.kind).matches.extend(_response_match(x) for x in c.items)
        return out
    if c.kind == "status":
        return dst.ResponseMatch(status=dst.HttpStatusRange(min=c.low, max=c.high))
    negated = dst.ResponseMatch()
    getattr(negated, "not").CopyFrom(_response_match(c.items[0]))
    return negated


def http_method(name: str) -> http.HttpMethod:
    upper = name.upper()
    if upper in http.HttpMethod.Registered.keys():  # noqa: SIM118 (an enum wrapper)
        return http.HttpMethod(registered=upper)
    return http.HttpMethod(unregistered=upper)


# ----------------------------------------------------------------- profiles


def service_profile(
    profile: ServiceProfile | None, *, fqn: str, service: ServiceKey, port: int, opaque: bool,
    kind_in_ref: bool = True,
) -> dst.DestinationProfile:
    """The profile of a service port (createDestinationProfile). `profile` is the
    ServiceProfile that won the client/server lookup, or None for the default.
    `kind_in_ref=False` leaves `profile_ref.resource.kind` empty, as Linkerd 2.20 does:
    it copies the object's TypeMeta kind, which its informer cache never fills in."""
    out = dst.DestinationProfile(fully_qualified_name=fqn, opaque_protocol=opaque)
    out.parent_ref.resource.CopyFrom(meta.Resource(
        group="core", kind="Service", name=service.name, namespace=service.namespace,
        port=port))
    # Set even for the implicit default profile, as Linkerd does (§2.8).
    out.profile_ref.resource.group = "linkerd.io"
    spec: Mapping[str, Any] = {}
    if profile is not None:
        out.profile_ref.resource.kind = profile.kind if kind_in_ref else ""
        out.profile_ref.resource.name = profile.meta.name
        out.profile_ref.resource.namespace = profile.meta.namespace
        spec = profile.spec
    decoded = decode_profile(spec)
    out.routes.extend(_route(r, fqn) for r in decoded.routes)
    out.retry_budget.CopyFrom(_retry_budget(decoded.retry_budget))
    out.dst_overrides.extend(dst.WeightedDst(authority=d.authority_for(port), weight=d.weight)
                             for d in decoded.dst_overrides)
    return out


def _route(r: ProfileRoute, fqn: str) -> dst.Route:
    route = dst.Route(metrics_labels={"route": r.name}, condition=_request_match(r.condition),
                      is_retryable=r.is_retryable)
    route.response_classes.extend(
        dst.ResponseClass(condition=_response_match(rc.condition), is_failure=rc.is_failure)
        for rc in r.response_classes)
    if r.timeout_problem:
        log.warning("route timeout ignored", profile=fqn, route=r.name,
                    reason=r.timeout_problem)
    if r.timeout_ns:
        route.timeout.CopyFrom(duration(r.timeout_ns))
    return route


def _retry_budget(b: RetryBudget) -> dst.RetryBudget:
    return dst.RetryBudget(retry_ratio=b.ratio, min_retries_per_second=b.min_per_second,
                           ttl=duration(b.ttl_ns))


def endpoint_profile(
    ip: str, port: int, pod: Pod | None, cluster: Cluster, config: MeshConfig,
    translator: Translator,
) -> dst.DestinationProfile:
    """The profile of one workload address (§2.9): the endpoint as Get would
    describe it, plus its namespace label, and whether the port is opaque. `pod` is
    the running pod behind the address, or None. Raises EnrichError when the pod is
    meshed but cannot be described (no proxy container)."""
    out = dst.DestinationProfile(retry_budget=default_retry_budget())
    if pod is None:
        out.endpoint.CopyFrom(dst.WeightedAddr(addr=tcp_address(ip, port), weight=BASE_WEIGHT))
        out.opaque_protocol = port in config.default_opaque_ports
        return out
    enr = enrich_pod_endpoint(pod, port, None, cluster, config)
    ep = Endpoint(
        id=EndpointId("pod", pod.meta.namespace, pod.meta.name), ip=ip, port=port,
        node_name=pod.node_name, pod_name=pod.meta.name,
        pod_resource_version=pod.meta.resource_version, enrichment=enr,
    )
    wa = translator.weighted_addr(ResolvedEndpoint(ep), zone_locality=False)
    # Get leaves the namespace to the set-level labels; a lone endpoint carries it.
    wa.metric_labels["namespace"] = pod.meta.namespace
    out.endpoint.CopyFrom(wa)
    out.opaque_protocol = port in pod_opaque_ports(pod, config) or server_marks_opaque(
        list(cluster.servers_in(pod.meta.namespace)), pod, port)
    return out


__all__ = ["EnrichError", "ProfileError", "endpoint_profile", "go_split_host_port_ok",
           "parse_go_duration", "quantity_milli_value", "service_profile"]
