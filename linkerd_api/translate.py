"""View changes -> destination `Update` bytes: a pure converter, like Linkerd's
endpoint translator (§3.2-3.6). Called once per View version, never per stream.

Readiness is the Linkerd layer's own policy: the View keeps endpoints that are ready
or still serving while terminating (so xDS can drain them); Linkerd announces only
ready ones (§4.4), so an endpoint that stops being ready is a `remove` here.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from google.protobuf.json_format import ParseDict, ParseError

from bridge.cluster import Cluster
from bridge.enrich import REMOTE_FQN_ANNOTATION
from bridge.model import MeshConfig, ResolvedEndpoint, ServiceKey
from bridge.views import EndpointSnapshot, ViewChange
from linkerd_api.proto import destination_pb2 as dst
from linkerd_api.proto import net_pb2 as net

MIRROR_CLUSTER_LABEL = "mirror.linkerd.io/cluster-name"

Addr = tuple[str, int]


def tcp_address(ip: str, port: int) -> net.TcpAddress:
    """Linkerd's address encoding (§1.3): IPv4 as a big-endian fixed32, IPv6 as
    two big-endian fixed64 halves. `::ffff:a.b.c.d` stays IPv6, as in Go."""
    parsed = ipaddress.ip_address(ip)
    addr = net.TcpAddress(port=port)
    if parsed.version == 4:
        addr.ip.ipv4 = int(parsed)
    else:
        value = int(parsed)
        addr.ip.ipv6.first = value >> 64
        addr.ip.ipv6.last = value & 0xFFFF_FFFF_FFFF_FFFF
    return addr


def address_text(addr: net.TcpAddress) -> str:
    """`ip:port` (`[ip]:port` for IPv6) of a TcpAddress, for people and JSON."""
    which = addr.ip.WhichOneof("ip")
    if which == "ipv4":
        return f"{ipaddress.IPv4Address(addr.ip.ipv4)}:{addr.port}"
    if which == "ipv6":
        v6 = ipaddress.IPv6Address((addr.ip.ipv6.first << 64) | addr.ip.ipv6.last)
        return f"[{v6}]:{addr.port}"
    return f"<no ip>:{addr.port}"


def http2_params(config: MeshConfig) -> dst.Http2ClientParams | None:
    """The meshed HTTP/2 client parameters, read once. Linkerd decodes its flag with
    Go's encoding/json, so a Duration is an object (`{"seconds": 10}`); proto-JSON's
    `"10s"` is accepted too. Raises ValueError naming the bad field."""
    if config.meshed_http2_params is None:
        return None
    message = dst.Http2ClientParams()
    try:
        ParseDict(_durations_as_text(config.meshed_http2_params, message.DESCRIPTOR),
                  message)
    except ParseError as e:
        raise ValueError(f"meshed HTTP/2 client params: {e}") from None
    return message


def _durations_as_text(value: Any, descriptor: Any) -> Any:
    """Rewrite Go-style Duration objects into proto-JSON duration strings."""
    if not isinstance(value, Mapping):
        return value
    if descriptor.full_name == "google.protobuf.Duration":
        seconds, nanos = value.get("seconds", 0), value.get("nanos", 0)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (seconds, nanos)):
            return dict(value)  # let the parser say what is wrong
        return f"{seconds + nanos / 1e9:.9f}s"
    out = {}
    for name, item in value.items():
        field = descriptor.fields_by_name.get(name)
        if field is not None and field.message_type is not None:
            item = _durations_as_text(item, field.message_type)
        out[name] = item
    return out


def set_labels(cluster: Cluster, service: ServiceKey) -> dict[str, str]:
    """The `metric_labels` of a whole `add` (§3.2): the service, its namespace,
    and for a mirrored service the cluster and service it mirrors."""
    labels = {"service": service.name, "namespace": service.namespace}
    for slice_ in cluster.slices_of(service):
        target = slice_.meta.labels.get(MIRROR_CLUSTER_LABEL, "")
        if not target:
            continue  # the FQN annotation alone names no mirror (Linkerd §3.2)
        labels["target_cluster"] = target
        parts = slice_.meta.annotations.get(REMOTE_FQN_ANNOTATION, "").split(".")
        if len(parts) >= 2:
            labels["target_service"] = parts[0]
            labels["target_service_namespace"] = parts[1]
        break
    return labels


class Translator:
    """Encodes endpoints as `WeightedAddr`s for one mesh configuration."""

    def __init__(self, config: MeshConfig) -> None:
        self.config = config
        self.http2 = http2_params(config)

    def weighted_addr(self, resolved: ResolvedEndpoint, zone_locality: bool = True
                      ) -> dst.WeightedAddr:
        ep = resolved.endpoint
        enr = ep.enrichment
        wa = dst.WeightedAddr(addr=tcp_address(ep.ip, ep.port), weight=resolved.weight)
        wa.metric_labels.update(enr.metric_labels)
        if zone_locality:
            wa.metric_labels["zone_locality"] = resolved.zone_locality
        if enr.identity:
            wa.tls_identity.dns_like_identity.name = enr.identity
            # A gateway identity (no pod) carries no SNI name (§3.5).
            if enr.server_name:
                wa.tls_identity.server_name.name = enr.server_name
        hint = enr.hint
        if hint is not None:
            if ep.id.kind == "pod":
                # A meshed pod port always carries a hint, even an empty one (§3.3).
                wa.protocol_hint.SetInParent()
                if hint.opaque:
                    wa.protocol_hint.opaque.SetInParent()
                elif hint.h2:
                    wa.protocol_hint.h2.SetInParent()
                if hint.opaque_transport_port is not None:
                    wa.protocol_hint.opaque_transport.inbound_port = hint.opaque_transport_port
            elif hint.h2:
                wa.protocol_hint.h2.SetInParent()
        if enr.authority_override:
            wa.authority_override.authority_override = enr.authority_override
        if enr.meshed_http2 and self.http2 is not None:
            wa.http2.CopyFrom(self.http2)
        return wa

    def add(self, endpoints: Iterable[ResolvedEndpoint], labels: Mapping[str, str]) -> bytes:
        update = dst.Update()
        update.add.metric_labels.update(labels)
        update.add.addrs.extend(self.weighted_addr(r) for r in endpoints)
        return update.SerializeToString(deterministic=True)

    @staticmethod
    def remove(endpoints: Iterable[ResolvedEndpoint]) -> bytes:
        update = dst.Update()
        update.remove.addrs.extend(tcp_address(r.endpoint.ip, r.endpoint.port)
                                   for r in endpoints)
        return update.SerializeToString(deterministic=True)

    @staticmethod
    def no_endpoints(exists: bool) -> bytes:
        return dst.Update(no_endpoints=dst.NoEndpoints(exists=exists)).SerializeToString()


def _addr(r: ResolvedEndpoint) -> Addr:
    return (r.endpoint.ip, r.endpoint.port)


def ready_endpoints(snapshot: Mapping[Any, ResolvedEndpoint]) -> list[ResolvedEndpoint]:
    """What Linkerd announces of a View snapshot, in a stable (id) order."""
    return [r for _, r in sorted(snapshot.items()) if r.endpoint.ready]


def ready_diff(change: ViewChange) -> tuple[list[ResolvedEndpoint], list[ResolvedEndpoint]]:
    """The Linkerd projection of one View change: (add, remove).

    O(changed endpoints): the View's own diff, and the snapshot's address index to
    tell whether a removed address is still served. Proxies key endpoints by address, so an address
    is removed only when no ready endpoint still has it, and an endpoint whose
    address changed is removed at its old address (Linkerd 2.20 would leave that
    stale address behind).
    """
    added: list[ResolvedEndpoint] = []
    removed: list[ResolvedEndpoint] = []
    for r in change.added:
        prev = change.previous.get(r.id)
        was_ready = prev is not None and prev.endpoint.ready
        if r.endpoint.ready:
            added.append(r)
            if was_ready and prev is not None and _addr(prev) != _addr(r):
                removed.append(prev)
        elif was_ready and prev is not None:
            removed.append(prev)
    removed.extend(r for r in change.removed if r.endpoint.ready)
    if removed:
        current = change.current
        served: Callable[[str, int], bool]
        if isinstance(current, EndpointSnapshot):
            served = current.holds_ready
        else:
            held = {_addr(r) for r in current.values() if r.endpoint.ready}
            served = lambda ip, port: (ip, port) in held  # noqa: E731
        seen: set[Addr] = set()
        kept = []
        for r in removed:
            a = _addr(r)
            if a not in seen and not served(*a):
                seen.add(a)
                kept.append(r)
        removed = kept
    return added, removed


def has_ready(snapshot: Mapping[Any, ResolvedEndpoint]) -> bool:
    if isinstance(snapshot, EndpointSnapshot):
        return snapshot.ready_count > 0
    return any(r.endpoint.ready for r in snapshot.values())
