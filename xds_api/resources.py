"""Pure converters from the core's values to xDS resources (xDS §3.4, §4.3, §5.3).

Nothing here knows about streams or subscribers. A ClusterLoadAssignment is built
from a View's snapshot; a Cluster from a Service port; the proxyless Listener and
RouteConfiguration from the name alone. Each comes out as an `EncodedResource`: its
serialized bytes, wrapped once in `Any`, with a content hash as its version.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import (
    base_pb2,
    config_source_pb2,
    health_check_pb2,
    protocol_pb2,
)
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.listener.v3 import api_listener_pb2, listener_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2, duration_pb2

from bridge.model import BASE_WEIGHT, EndpointId, ResolvedEndpoint, ViewKey
from bridge.objects import ServicePort
from xds_api import resource_types as rt
from xds_api import wire

METADATA_NAMESPACE = "io.linkerd.destination"
UINT32_MAX = 0xFFFFFFFF

_ANY_TYPE_URL = wire.field_number(any_pb2.Any.DESCRIPTOR, "type_url")
_ANY_VALUE = wire.field_number(any_pb2.Any.DESCRIPTOR, "value")
_CLA_NAME = wire.field_number(endpoint_pb2.ClusterLoadAssignment.DESCRIPTOR, "cluster_name")
_CLA_ENDPOINTS = wire.field_number(endpoint_pb2.ClusterLoadAssignment.DESCRIPTOR, "endpoints")
_LOC = endpoint_components_pb2.LocalityLbEndpoints.DESCRIPTOR
_LOC_LOCALITY = wire.field_number(_LOC, "locality")
_LOC_ENDPOINTS = wire.field_number(_LOC, "lb_endpoints")
_LOC_WEIGHT = wire.field_number(_LOC, "load_balancing_weight")
_LOC_LEDS = wire.field_number(_LOC, "leds_cluster_locality_config")

HEALTHY: int = health_check_pb2.HealthStatus.HEALTHY
DRAINING: int = health_check_pb2.HealthStatus.DRAINING

# App protocols (Service port `appProtocol`, or the port name, Istio-style
# `<protocol>[-<suffix>]`) that mean the upstream speaks HTTP/2.
_H2_PROTOCOLS = frozenset({"grpc", "h2", "h2c", "http2", "kubernetes.io/h2c"})


@dataclass(frozen=True, slots=True)
class EncodedResource:
    """One resource as every stream sends it: encoded once, shared by all.

    The few bytes that frame it in a response are computed here too, so that a push
    to thousands of streams only joins bytes: a SotW response carries
    `sotw_prefix + any_bytes`, a delta one `delta_head + any_bytes + delta_tail`.
    The Any comes in pieces (`any_parts`) that each stream's response joins: a large
    CLA is its assembly's blocks (`xds_api.assembly`), never copied whole but into
    the responses themselves.
    """

    name: str
    version: str  # content hash: the delta per-resource version (xDS §2)
    # The resource wrapped in google.protobuf.Any, serialized: these concatenated.
    any_parts: tuple[bytes, ...]
    sotw_prefix: bytes  # DiscoveryResponse.resources: tag and length
    delta_head: bytes  # DeltaDiscoveryResponse.resources: tag, length, Resource.version..
    delta_tail: bytes  # ..and Resource.name after the Any

    @property
    def any_bytes(self) -> bytes:
        """The Any in one piece (joined on each call for a resource in many)."""
        parts = self.any_parts
        return parts[0] if len(parts) == 1 else b"".join(parts)


_SOTW_RESOURCES = wire.field_number(discovery_pb2.DiscoveryResponse.DESCRIPTOR, "resources")
_DELTA_RESOURCES = wire.field_number(discovery_pb2.DeltaDiscoveryResponse.DESCRIPTOR,
                                     "resources")
_RES_VERSION = wire.field_number(discovery_pb2.Resource.DESCRIPTOR, "version")
_RES_RESOURCE = wire.field_number(discovery_pb2.Resource.DESCRIPTOR, "resource")
_RES_NAME = wire.field_number(discovery_pb2.Resource.DESCRIPTOR, "name")


def encode_resource(type_url: str, name: str, body: bytes) -> EncodedResource:
    any_bytes = (wire.string_field(_ANY_TYPE_URL, type_url)
                 + wire.length_delimited(_ANY_VALUE, body))
    return wrap_resource(name, hashlib.sha256(body).hexdigest()[:24], (any_bytes,),
                         len(any_bytes))


def wrap_resource(name: str, version: str, any_parts: tuple[bytes, ...],
                  any_size: int) -> EncodedResource:
    """A resource already wrapped in Any (`any_parts`, `any_size` bytes in all), at
    `version`, framed."""
    # A discovery.v3.Resource: version (1), resource (2), name (3), in field order.
    head = (wire.string_field(_RES_VERSION, version)
            + wire.length_delimited_prefix(_RES_RESOURCE, any_size))
    tail = wire.string_field(_RES_NAME, name)
    size = len(head) + any_size + len(tail)
    return EncodedResource(
        name, version, any_parts,
        sotw_prefix=wire.length_delimited_prefix(_SOTW_RESOURCES, any_size),
        delta_head=wire.length_delimited_prefix(_DELTA_RESOURCES, size) + head,
        delta_tail=tail)


def serialize(message: object) -> bytes:
    data: bytes = message.SerializeToString(deterministic=True)  # type: ignore[attr-defined]
    return data


# ---------------------------------------------------------------------- endpoints


def health_status(resolved: ResolvedEndpoint, draining: bool) -> int | None:
    """EndpointSlice conditions -> Envoy health (xDS §5.3), or None to leave it out.

    Ready endpoints are HEALTHY. Terminating endpoints that still serve are DRAINING
    only when asked for: Envoy would count them in its panic threshold and gRPC keeps
    them only for session affinity. Anything else the View keeps is left out.
    """
    ep = resolved.endpoint
    if ep.ready:
        return HEALTHY
    if draining and ep.serving and ep.terminating:
        return DRAINING
    return None


def lb_weight(resolved: ResolvedEndpoint) -> int:
    """The core's weights are multiples of BASE_WEIGHT; xDS wants small positive ones
    (gRPC NACKs 0, and a locality's sum must fit in uint32)."""
    return max(1, round(resolved.weight / BASE_WEIGHT))


# The per-endpoint metadata profiles (`--xds-endpoint-metadata`): what each LbEndpoint
# carries beside its address, health and weight.
NO_METADATA = "none"
ISTIO_METADATA = "istio"
LINKERD_METADATA = "linkerd"
METADATA_PROFILES = (NO_METADATA, ISTIO_METADATA, LINKERD_METADATA)
DEFAULT_METADATA_PROFILE = ISTIO_METADATA
# istiod's default cluster id (its CLUSTER_ID), the last field of `workload`.
DEFAULT_ISTIO_CLUSTER_ID = "Kubernetes"

# What istiod puts on an Envoy sidecar's endpoint (xDS §5.4).
ISTIO_NAMESPACE = "istio"
TRANSPORT_SOCKET_MATCH = "envoy.transport_socket_match"
ISTIO_TLS_MODE_LABEL = "security.istio.io/tlsMode"
# The one tlsMode istiod sends: "disabled", no label or any other value means the
# pod takes no Istio mTLS, and istiod sends no transport socket match for it.
ISTIO_MUTUAL_TLS = "istio"
_CANONICAL_NAME_LABELS = ("service.istio.io/canonical-name", "app.kubernetes.io/name", "app")
_CANONICAL_REVISION_LABELS = ("service.istio.io/canonical-revision",
                              "app.kubernetes.io/version", "version")

Labels = Mapping[str, str]
_NO_LABELS: Labels = {}


def _metadata_fields(resolved: ResolvedEndpoint) -> dict[str, object]:
    """The Linkerd enrichment, carried as endpoint metadata for whoever wants it."""
    ep = resolved.endpoint
    enr = ep.enrichment
    fields: dict[str, object] = {"zone_locality": resolved.zone_locality,
                                 "weight": resolved.weight}
    optional: dict[str, object] = {
        "identity": enr.identity, "server_name": enr.server_name, "zone": ep.zone or "",
        "pod": ep.pod_name, "hostname": ep.hostname, "node": ep.node_name,
        "authority_override": enr.authority_override,
    }
    fields.update((k, v) for k, v in optional.items() if v)
    if enr.hint is not None:
        fields["protocol_hint"] = "opaque" if enr.hint.opaque else "h2" if enr.hint.h2 else ""
        if enr.hint.opaque_transport_port is not None:
            fields["opaque_transport_port"] = enr.hint.opaque_transport_port
    if enr.metric_labels:
        fields["labels"] = dict(enr.metric_labels)
    return fields


@dataclass(frozen=True, slots=True)
class IstioEndpointMetadata:
    """The two things istiod tells a sidecar about a Kubernetes endpoint (xDS §5.4)."""

    tls_mode: str  # "istio", or "" when the pod is not in the mesh's mTLS
    workload: str  # "name;namespace;canonical-name;canonical-revision;cluster-id"


def istio_endpoint_metadata(resolved: ResolvedEndpoint, pod_labels: Labels,
                            cluster_id: str) -> IstioEndpointMetadata:
    ep = resolved.endpoint
    enr = ep.enrichment
    tls = pod_labels.get(ISTIO_TLS_MODE_LABEL, "")
    # The workload is the pod's owner as Linkerd resolves it (a ReplicaSet's
    # Deployment, a Job's CronJob), the pod itself without one; none for an address.
    workload = enr.owner_name if enr.owner_name else ep.pod_name
    # The first label present wins, even with an empty value, as istiod reads them.
    name = next((pod_labels[k] for k in _CANONICAL_NAME_LABELS if k in pod_labels),
                workload)
    revision = next((pod_labels[k] for k in _CANONICAL_REVISION_LABELS
                     if k in pod_labels), "latest")
    if revision == "latest":
        revision = ""  # istiod leaves its default out
    # The 5th field is the cluster the endpoint is in: a linked cluster's own name.
    return IstioEndpointMetadata(
        ISTIO_MUTUAL_TLS if tls == ISTIO_MUTUAL_TLS else "",
        f"{workload};{ep.id.namespace};{name};{revision};{ep.id.cluster or cluster_id}")


@dataclass(frozen=True, slots=True)
class MetadataEncoder:
    """One metadata profile, and what it reads beyond the endpoint itself.

    `key` is what the metadata depends on besides the ResolvedEndpoint: an endpoint is
    encoded again only when that or the endpoint changes.
    """

    profile: str = LINKERD_METADATA
    cluster_id: str = DEFAULT_ISTIO_CLUSTER_ID
    # The labels of an endpoint's pod (istio reads them); none for an address.
    pod_labels: Callable[[ResolvedEndpoint], Labels] = lambda _r: _NO_LABELS

    def __post_init__(self) -> None:
        if self.profile not in METADATA_PROFILES:
            raise ValueError(f"unknown xDS endpoint metadata profile {self.profile!r}; "
                             f"choose one of {', '.join(METADATA_PROFILES)}")

    def key(self, resolved: ResolvedEndpoint) -> Hashable:
        if self.profile != ISTIO_METADATA:
            return None
        return istio_endpoint_metadata(resolved, self.pod_labels(resolved), self.cluster_id)

    def apply(self, msg: endpoint_components_pb2.LbEndpoint, resolved: ResolvedEndpoint,
              key: Hashable) -> None:
        if self.profile == LINKERD_METADATA:
            msg.metadata.filter_metadata[METADATA_NAMESPACE].update(_metadata_fields(resolved))
        elif isinstance(key, IstioEndpointMetadata):
            if key.tls_mode:
                msg.metadata.filter_metadata[TRANSPORT_SOCKET_MATCH].update(
                    {"tlsMode": key.tls_mode})
            msg.metadata.filter_metadata[ISTIO_NAMESPACE].update({"workload": key.workload})


LINKERD_ENCODER = MetadataEncoder()


def encode_lb_endpoint(resolved: ResolvedEndpoint, health: int,
                       metadata: MetadataEncoder = LINKERD_ENCODER,
                       key: Hashable = None) -> bytes:
    ep = resolved.endpoint
    msg = endpoint_components_pb2.LbEndpoint(health_status=health)
    msg.endpoint.address.socket_address.address = ep.ip
    msg.endpoint.address.socket_address.port_value = ep.port
    if ep.hostname:
        msg.endpoint.hostname = ep.hostname
    msg.load_balancing_weight.value = lb_weight(resolved)
    metadata.apply(msg, resolved, key if key is not None else metadata.key(resolved))
    return serialize(msg)


@dataclass(frozen=True, slots=True)
class EncodedEndpoint:
    """One endpoint's LbEndpoint bytes and what the CLA needs to place it."""

    source: ResolvedEndpoint  # reused for the next version while this is unchanged
    locality: tuple[str, str]  # (region, zone)
    sort_key: tuple[int, int, int]  # (ip version, ip, port): deterministic order
    ready: bool
    weight: int
    data: bytes
    metadata_key: Hashable = None  # what the metadata was built from, beyond `source`
    # `data` as a LocalityLbEndpoints.lb_endpoints field, and a hash of that, which is
    # what a CLA is assembled and versioned from (xds_api.assembly).
    field: bytes = b""
    digest: int = 0


SortKey = tuple[int, int, int]
EndpointMemo = Mapping[EndpointId, EncodedEndpoint]
Locality = tuple[str, str]  # (region, zone)
Localities = Mapping[Locality, Sequence[EncodedEndpoint]]


def encode_endpoint(resolved: ResolvedEndpoint, draining: bool,
                    metadata: MetadataEncoder = LINKERD_ENCODER,
                    key: Hashable = None) -> EncodedEndpoint | None:
    health = health_status(resolved, draining)
    if health is None:
        return None
    ep = resolved.endpoint
    ip = ipaddress.ip_address(ep.ip)
    if key is None:
        key = metadata.key(resolved)
    data = encode_lb_endpoint(resolved, health, metadata, key)
    chunk = wire.length_delimited(_LOC_ENDPOINTS, data)
    digest = int.from_bytes(hashlib.blake2b(chunk, digest_size=16).digest(), "little")
    return EncodedEndpoint(resolved, (ep.region, ep.zone or ""),
                           (ip.version, int(ip), ep.port), ep.ready, lb_weight(resolved),
                           data, key, chunk, digest)


def group_endpoints(
    endpoints: Iterable[ResolvedEndpoint],
    draining: bool,
    previous: EndpointMemo | None = None,
    metadata: MetadataEncoder = LINKERD_ENCODER,
) -> tuple[dict[Locality, list[EncodedEndpoint]], dict[EndpointId, EncodedEndpoint]]:
    """The endpoints a CLA carries, encoded, by locality (sorted), plus the per-endpoint
    encodings to reuse next time.

    Endpoints are deduplicated by address (gRPC NACKs a CLA with a duplicate, xDS
    §3.7) and sorted by address, so identical inputs give identical bytes and so
    identical versions. An endpoint unchanged since `previous` (itself and what its
    metadata is built from) is not encoded again: a one-endpoint change costs one
    endpoint's encoding.
    """
    memo: dict[EndpointId, EncodedEndpoint] = {}
    for resolved in endpoints:
        old = previous.get(resolved.id) if previous else None
        key = metadata.key(resolved)
        if old is not None and old.source == resolved and old.metadata_key == key:
            enc: EncodedEndpoint | None = old
        else:
            enc = encode_endpoint(resolved, draining, metadata, key)
        if enc is not None:
            memo[resolved.id] = enc
    by_address: dict[tuple[int, int, int], EncodedEndpoint] = {}
    # Of two endpoints at one address, the ready one wins, then the pod (it carries
    # the enrichment), then the first by id: the choice never depends on arrival order.
    for eid in sorted(memo, key=lambda i: (not memo[i].ready, i.kind != "pod", i)):
        by_address.setdefault(memo[eid].sort_key, memo[eid])
    localities: dict[Locality, list[EncodedEndpoint]] = {}
    for key in sorted(by_address):
        enc = by_address[key]
        localities.setdefault(enc.locality, []).append(enc)
    return {loc: localities[loc] for loc in sorted(localities)}, memo


def locality_field(region: str, zone: str) -> bytes:
    return wire.length_delimited(_LOC_LOCALITY,
                                 serialize(base_pb2.Locality(region=region, zone=zone)))


def encode_cla_body(name: str, localities: Localities) -> bytes:
    """One LocalityLbEndpoints per (region, zone), in order, each with its weight set
    (gRPC skips a locality without one, xDS §3.4), priority 0."""
    parts = [wire.string_field(_CLA_NAME, name)]
    for (region, zone), members in localities.items():
        body = [locality_field(region, zone)]
        body.extend(m.field for m in members)
        weight = min(UINT32_MAX, sum(m.weight for m in members))
        body.append(wire.length_delimited(_LOC_WEIGHT, wire.uint_field(1, weight)))
        parts.append(wire.length_delimited(_CLA_ENDPOINTS, b"".join(body)))
    return b"".join(parts)


def encode_leds_cla_body(name: str, localities: Iterable[Locality],
                         collection: Callable[[Locality], str]) -> bytes:
    """A CLA whose localities name their LEDS collections instead of listing endpoints
    (xDS §7.2). No locality weight: it would be the sum of the endpoints' weights and
    so change with every endpoint, which is what LEDS exists to avoid; Envoy reads it
    only under locality-weighted balancing, and gRPC does not speak LEDS."""
    parts = [wire.string_field(_CLA_NAME, name)]
    for locality in localities:
        config = endpoint_components_pb2.LedsClusterLocalityConfig(
            leds_config=_ads(), leds_collection_name=collection(locality))
        body = locality_field(*locality) + wire.length_delimited(_LOC_LEDS, serialize(config))
        parts.append(wire.length_delimited(_CLA_ENDPOINTS, body))
    return b"".join(parts)


def encode_cla(
    name: str,
    endpoints: Iterable[ResolvedEndpoint],
    draining: bool,
    previous: EndpointMemo | None = None,
    metadata: MetadataEncoder = LINKERD_ENCODER,
) -> tuple[bytes, dict[EndpointId, EncodedEndpoint]]:
    """A ClusterLoadAssignment's bytes, plus the per-endpoint encodings to reuse next
    time (see `group_endpoints` and `encode_cla_body`). The server keeps each View's
    CLA assembled instead (`xds_api.assembly`), to these very bytes; this is the
    from-scratch reference its tests compare with."""
    localities, memo = group_endpoints(endpoints, draining, previous, metadata)
    return encode_cla_body(name, localities), memo


# ---------------------------------------------------------------------- clusters


def is_http2(port: ServicePort) -> bool:
    """An explicit appProtocol decides; without one, the port name's protocol prefix."""
    if port.app_protocol:
        return port.app_protocol.lower() in _H2_PROTOCOLS
    return port.name.lower().split("-", 1)[0] in _H2_PROTOCOLS


def _ads() -> config_source_pb2.ConfigSource:
    return config_source_pb2.ConfigSource(
        ads=config_source_pb2.AggregatedConfigSource(),
        resource_api_version=config_source_pb2.ApiVersion.V3,
    )


def build_cluster(name: str, key: ViewKey, port: ServicePort) -> cluster_pb2.Cluster:
    """An EDS cluster fed over ADS; what both Envoy and gRPC accept (xDS §3.4, §4.3).

    No service_name: the CLA's cluster_name is the cluster name, one name everywhere.
    No health checks: meshbridge never makes a client probe an endpoint.
    """
    cluster = cluster_pb2.Cluster(
        name=name,
        type=cluster_pb2.Cluster.DiscoveryType.EDS,
        lb_policy=cluster_pb2.Cluster.LbPolicy.ROUND_ROBIN,
        connect_timeout=duration_pb2.Duration(seconds=5),
    )
    cluster.eds_cluster_config.eds_config.CopyFrom(_ads())
    meta = {"namespace": key.service.namespace, "service": key.service.name,
            "port": key.port}
    if port.name:
        meta["port_name"] = port.name
    if port.app_protocol:
        meta["app_protocol"] = port.app_protocol
    cluster.metadata.filter_metadata[METADATA_NAMESPACE].update(meta)
    if is_http2(port):
        options = http_protocol_options_pb2.HttpProtocolOptions()
        options.explicit_http_config.http2_protocol_options.CopyFrom(
            protocol_pb2.Http2ProtocolOptions())
        cluster.typed_extension_protocol_options[
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"].Pack(options)
    return cluster


# ---------------------------------------------------------------------- proxyless


def build_listener(name: str) -> listener_pb2.Listener:
    """The client-side Listener a gRPC channel to `xds:///<name>` asks for (xDS §3.4):
    an api_listener HttpConnectionManager, routes over RDS (ADS), router filter last."""
    manager = hcm_pb2.HttpConnectionManager(
        stat_prefix=name,
        rds=hcm_pb2.Rds(config_source=_ads(), route_config_name=name),
    )
    router = manager.http_filters.add(name="envoy.filters.http.router")
    router.typed_config.Pack(router_pb2.Router())
    listener = listener_pb2.Listener(name=name, api_listener=api_listener_pb2.ApiListener())
    listener.api_listener.api_listener.Pack(manager)
    return listener


def encode_named(type_url: str, name: str, message: object) -> EncodedResource:
    return encode_resource(type_url, name, serialize(message))


def encode_cla_resource(
    name: str, endpoints: Iterable[ResolvedEndpoint], draining: bool,
    previous: EndpointMemo | None = None, metadata: MetadataEncoder = LINKERD_ENCODER,
) -> tuple[EncodedResource, dict[EndpointId, EncodedEndpoint]]:
    body, memo = encode_cla(name, endpoints, draining, previous, metadata)
    return encode_resource(rt.ENDPOINT, name, body), memo
