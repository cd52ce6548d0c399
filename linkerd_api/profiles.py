"""ServiceProfiles and workloads -> `DestinationProfile`: pure converters (§2.8, §2.9).

A ServiceProfile arrives as the raw `spec` mapping its manifest had; it is checked
and converted here, the only place that reads it. A conversion error drops the
whole profile (Linkerd sends nothing rather than half a profile); the caller logs it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import ROUND_CEILING, Decimal, InvalidOperation
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
from linkerd_api.proto import destination_pb2 as dst
from linkerd_api.proto import http_types_pb2 as http
from linkerd_api.proto import meta_pb2 as meta
from linkerd_api.translate import Translator, tcp_address

log = structlog.get_logger("meshbridge.linkerd.profiles")

# Linkerd's default retry budget (§2.8): 20% extra load, 10 retries/s, 10 s window.
DEFAULT_RETRY_RATIO = 0.2
DEFAULT_MIN_RETRIES_PER_SECOND = 10
DEFAULT_RETRY_TTL_SECONDS = 10


class ProfileError(ValueError):
    """A ServiceProfile that cannot be converted; the message names the field."""


def default_retry_budget() -> dst.RetryBudget:
    return dst.RetryBudget(retry_ratio=DEFAULT_RETRY_RATIO,
                           min_retries_per_second=DEFAULT_MIN_RETRIES_PER_SECOND,
                           ttl=Duration(seconds=DEFAULT_RETRY_TTL_SECONDS))


# ----------------------------------------------------------------- value parsers

_GO_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "μs": 1_000, "ms": 1_000_000,
             "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000}
_GO_COMPONENT = re.compile(r"([0-9]*(?:\.[0-9]*)?)([a-zµμ]+)")


def parse_go_duration(text: str) -> int:
    """Nanoseconds of a Go duration string (`300ms`, `1.5s`, `1h30m`, `0`).

    Go's time.ParseDuration grammar; a negative duration is refused, because no
    timeout or retry window can be negative.
    """
    s = text.strip()
    if s == "0":
        return 0
    if s.startswith("-"):
        raise ProfileError(f"duration {text!r} is negative")
    s = s.removeprefix("+")
    if not s:
        raise ProfileError(f"invalid duration {text!r}")
    total = Decimal(0)
    pos = 0
    while pos < len(s):
        m = _GO_COMPONENT.match(s, pos)
        if m is None or m.group(1) in ("", "."):
            raise ProfileError(f"invalid duration {text!r}")
        unit = _GO_UNITS.get(m.group(2))
        if unit is None:
            raise ProfileError(f"unknown unit {m.group(2)!r} in duration {text!r}")
        total += Decimal(m.group(1)) * unit
        pos = m.end()
    return int(total)


def duration(nanos: int) -> Duration:
    return Duration(seconds=nanos // 1_000_000_000, nanos=nanos % 1_000_000_000)


_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
                       r"(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?")
_SUFFIX = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": Decimal(1),
           "k": Decimal("1e3"), "M": Decimal("1e6"), "G": Decimal("1e9"),
           "T": Decimal("1e12"), "P": Decimal("1e15"), "E": Decimal("1e18"),
           "Ki": Decimal(2**10), "Mi": Decimal(2**20), "Gi": Decimal(2**30),
           "Ti": Decimal(2**40), "Pi": Decimal(2**50), "Ei": Decimal(2**60)}


def quantity_milli_value(raw: Any) -> int:
    """A Kubernetes quantity (`1`, `500m`, `0.5`, `1k`) in thousandths, rounded up as
    resource.Quantity.MilliValue rounds."""
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ProfileError(f"weight {raw!r} is not a quantity")
    text = str(raw).strip()
    m = _QUANTITY.fullmatch(text)
    if m is None:
        raise ProfileError(f"weight {raw!r} is not a quantity")
    try:
        number = Decimal(m.group(1))
        suffix = m.group(2) or ""
        if suffix[:1] in ("e", "E"):
            number = number.scaleb(int(suffix[1:]))
        else:
            number *= _SUFFIX[suffix]
        milli = (number * 1000).to_integral_value(rounding=ROUND_CEILING)
    except (InvalidOperation, ValueError):
        raise ProfileError(f"weight {raw!r} is not a quantity") from None
    return int(milli)


def go_split_host_port_ok(text: str) -> bool:
    """Whether Go's net.SplitHostPort accepts `text` (the port need not be numeric)."""
    if text.startswith("["):
        end = text.find("]")
        return end > 0 and text[end + 1:end + 2] == ":" and ":" not in text[end + 2:]
    return text.count(":") == 1 and "[" not in text and "]" not in text


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


def _mapping(raw: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ProfileError(f"{where} must be a mapping, got {raw!r}")
    return raw


def _seq(raw: Any, where: str) -> list[Any]:
    if not isinstance(raw, list):
        raise ProfileError(f"{where} must be a list, got {raw!r}")
    return raw


def _string(raw: Any, where: str) -> str:
    if not isinstance(raw, str):
        raise ProfileError(f"{where} must be a string, got {raw!r}")
    return raw


def request_match(raw: Any, where: str = "condition") -> dst.RequestMatch:
    """Linkerd's ToRequestMatch: sub-matches in the order all, any, method, not,
    pathRegex; one is returned as itself, several are wrapped in `all`."""
    rm = _mapping(raw, where)
    matches: list[dst.RequestMatch] = []
    if rm.get("all") is not None:
        seq = [request_match(m, f"{where}.all[{i}]")
               for i, m in enumerate(_seq(rm["all"], f"{where}.all"))]
        matches.append(dst.RequestMatch(all=dst.RequestMatch.Seq(matches=seq)))
    if rm.get("any") is not None:
        seq = [request_match(m, f"{where}.any[{i}]")
               for i, m in enumerate(_seq(rm["any"], f"{where}.any"))]
        matches.append(dst.RequestMatch(any=dst.RequestMatch.Seq(matches=seq)))
    if rm.get("method"):
        matches.append(dst.RequestMatch(method=http_method(
            _string(rm["method"], f"{where}.method"))))
    if rm.get("not") is not None:
        negated = dst.RequestMatch()
        # `not` is a Python keyword, so the field is reached with getattr.
        getattr(negated, "not").CopyFrom(request_match(rm["not"], f"{where}.not"))
        matches.append(negated)
    if rm.get("pathRegex"):
        matches.append(dst.RequestMatch(path=dst.PathMatch(
            regex=_string(rm["pathRegex"], f"{where}.pathRegex"))))
    _require_one(matches, where)
    if len(matches) == 1:
        return matches[0]
    return dst.RequestMatch(all=dst.RequestMatch.Seq(matches=matches))


def response_match(raw: Any, where: str = "condition") -> dst.ResponseMatch:
    """Linkerd's ToResponseMatch: all, any, status, not; statuses are 0 or 100..599."""
    rm = _mapping(raw, where)
    matches: list[dst.ResponseMatch] = []
    if rm.get("all") is not None:
        seq = [response_match(m, f"{where}.all[{i}]")
               for i, m in enumerate(_seq(rm["all"], f"{where}.all"))]
        matches.append(dst.ResponseMatch(all=dst.ResponseMatch.Seq(matches=seq)))
    if rm.get("any") is not None:
        seq = [response_match(m, f"{where}.any[{i}]")
               for i, m in enumerate(_seq(rm["any"], f"{where}.any"))]
        matches.append(dst.ResponseMatch(any=dst.ResponseMatch.Seq(matches=seq)))
    if rm.get("status") is not None:
        status = _mapping(rm["status"], f"{where}.status")
        lo, hi = (_status(status.get(k, 0), f"{where}.status.{k}") for k in ("min", "max"))
        if lo and hi and hi < lo:
            raise ProfileError(f"{where}.status: max {hi} is below min {lo}")
        matches.append(dst.ResponseMatch(status=dst.HttpStatusRange(min=lo, max=hi)))
    if rm.get("not") is not None:
        negated = dst.ResponseMatch()
        getattr(negated, "not").CopyFrom(response_match(rm["not"], f"{where}.not"))
        matches.append(negated)
    _require_one(matches, where)
    if len(matches) == 1:
        return matches[0]
    return dst.ResponseMatch(all=dst.ResponseMatch.Seq(matches=matches))


def _require_one(matches: list[Any], where: str) -> None:
    if not matches:
        raise ProfileError(f"{where} must set at least one field")


def _status(raw: Any, where: str) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ProfileError(f"{where} must be an HTTP status, got {raw!r}")
    if raw != 0 and not 100 <= raw <= 599:
        raise ProfileError(f"{where} {raw} is not an HTTP status (100-599)")
    return raw


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
    for i, raw in enumerate(_seq(spec.get("routes") or [], "spec.routes")):
        out.routes.append(_route(raw, f"spec.routes[{i}]", fqn))
    out.retry_budget.CopyFrom(_retry_budget(spec.get("retryBudget")))
    for i, raw in enumerate(_seq(spec.get("dstOverrides") or [], "spec.dstOverrides")):
        out.dst_overrides.append(_dst_override(raw, f"spec.dstOverrides[{i}]", port))
    return out


def _route(raw: Any, where: str, fqn: str) -> dst.Route:
    r = _mapping(raw, where)
    name = _string(r.get("name", ""), f"{where}.name")
    route = dst.Route(metrics_labels={"route": name})
    if r.get("condition") is None:
        raise ProfileError(f"{where}.condition is missing")
    route.condition.CopyFrom(request_match(r["condition"], f"{where}.condition"))
    for i, rc_raw in enumerate(_seq(r.get("responseClasses") or [],
                                    f"{where}.responseClasses")):
        rc = _mapping(rc_raw, f"{where}.responseClasses[{i}]")
        if rc.get("condition") is None:
            raise ProfileError(f"{where}.responseClasses[{i}].condition is missing")
        route.response_classes.append(dst.ResponseClass(
            condition=response_match(rc["condition"],
                                     f"{where}.responseClasses[{i}].condition"),
            is_failure=_flag(rc.get("isFailure"), f"{where}.responseClasses[{i}].isFailure"),
        ))
    route.is_retryable = _flag(r.get("isRetryable"), f"{where}.isRetryable")
    timeout = r.get("timeout")
    if timeout not in (None, ""):
        # A bad timeout is logged and left unset; the rest of the route stands (§2.8).
        try:
            nanos = parse_go_duration(_string(timeout, f"{where}.timeout"))
        except ProfileError as e:
            log.warning("route timeout ignored", profile=fqn, route=name, reason=str(e))
        else:
            if nanos:
                route.timeout.CopyFrom(duration(nanos))
    return route


def _flag(raw: Any, where: str) -> bool:
    if raw is None:
        return False
    if not isinstance(raw, bool):
        raise ProfileError(f"{where} must be true or false, got {raw!r}")
    return raw


def _retry_budget(raw: Any) -> dst.RetryBudget:
    if raw is None:
        return default_retry_budget()
    rb = _mapping(raw, "spec.retryBudget")
    ratio = rb.get("retryRatio", 0)
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or ratio < 0:
        raise ProfileError(f"spec.retryBudget.retryRatio must be a number >= 0, got {ratio!r}")
    per_second = rb.get("minRetriesPerSecond", 0)
    if isinstance(per_second, bool) or not isinstance(per_second, int) \
            or not 0 <= per_second < 2**32:
        raise ProfileError("spec.retryBudget.minRetriesPerSecond must be a whole number >= 0,"
                           f" got {per_second!r}")
    ttl = parse_go_duration(_string(rb.get("ttl", ""), "spec.retryBudget.ttl"))
    return dst.RetryBudget(retry_ratio=float(ratio), min_retries_per_second=per_second,
                           ttl=duration(ttl))


def _dst_override(raw: Any, where: str, port: int) -> dst.WeightedDst:
    d = _mapping(raw, where)
    authority = _string(d.get("authority"), f"{where}.authority")
    if not go_split_host_port_ok(authority):
        authority = f"{authority}:{port}"
    weight = quantity_milli_value(d.get("weight")) * 10
    if not 0 <= weight < 2**32:
        raise ProfileError(f"{where}.weight {d.get('weight')!r} is out of range")
    return dst.WeightedDst(authority=authority, weight=weight)


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


__all__ = ["EnrichError", "ProfileError", "endpoint_profile", "service_profile"]
