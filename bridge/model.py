"""The protocol-neutral values the core hands to both wire protocols.

Everything here is frozen: a published snapshot is shared by every subscriber of a
View, whichever protocol it speaks, so nothing may change it after publication.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

# Linkerd's Helm default for `-default-opaque-ports` (Linkerd §4.10).
DEFAULT_OPAQUE_PORTS = "25,587,3306,4444,5432,6379,9300,11211"

# The meshed HTTP/2 client parameters Linkerd's Helm chart passes (Linkerd §3.7), as the
# proto-JSON (snake_case) mapping the destination controller reads.
DEFAULT_MESHED_HTTP2_PARAMS: Mapping[str, Any] = MappingProxyType(
    {"keep_alive": {"interval": {"seconds": 10}, "timeout": {"seconds": 3}, "while_idle": True}}
)

BASE_WEIGHT = 10000


@dataclass(frozen=True, slots=True, order=True)
class ServiceKey:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class FilterKey:
    """What makes two subscribers of one service port see different endpoint sets.

    Linkerd keys its shared filtered listener groups the same way (Linkerd §4.6): the
    subscriber's node (for topology hints and internalTrafficPolicy=Local), the
    StatefulSet instance it asked for, and whether filtering applies at all.
    """

    node_name: str = ""
    hostname: str = ""
    filtering: bool = True


@dataclass(frozen=True, slots=True)
class ViewKey:
    service: ServiceKey
    port: int
    filter: FilterKey = field(default_factory=FilterKey)


@dataclass(frozen=True, slots=True, order=True)
class EndpointId:
    """The identity of an endpoint across slices (Linkerd §4.4): a pod plus its address
    family, so a dual-stack pod is one endpoint per family and a pod moving between
    slices keeps its identity; addresses with no pod are named after the address."""

    kind: str  # "pod" or "address"
    namespace: str
    name: str
    family: str = ""
    # The linked cluster it comes from ("": the local one), so that one pod name in
    # two clusters is two endpoints of a service served from both.
    cluster: str = ""


@dataclass(frozen=True, slots=True)
class ProtocolHint:
    """What a meshed endpoint tells its clients about the protocol it accepts."""

    opaque: bool = False
    h2: bool = False
    # Port of the destination proxy's inbound listener, when connections should be
    # sent there with a transport header (Linkerd's opaque transport).
    opaque_transport_port: int | None = None


@dataclass(frozen=True, slots=True)
class Enrichment:
    """What Linkerd adds to an address (bridge.enrich), protocol-neutral: the Linkerd
    layer encodes it natively, the xDS layer carries it as endpoint metadata."""

    identity: str = ""
    server_name: str = ""
    hint: ProtocolHint | None = None
    meshed_http2: bool = False
    opaque: bool = False
    authority_override: str = ""
    owner_kind: str = ""
    owner_name: str = ""
    metric_labels: tuple[tuple[str, str], ...] = ()


NO_ENRICHMENT = Enrichment()


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One address of one service port, merged across slices and enriched once.

    Nothing here depends on who asks; what does (zone locality, weight) is added by
    the View as a `ResolvedEndpoint`.
    """

    id: EndpointId
    ip: str
    port: int
    ready: bool = True
    serving: bool = True
    terminating: bool = False
    hostname: str = ""
    node_name: str = ""
    zone: str | None = None
    region: str = ""
    for_zones: frozenset[str] | None = None
    pod_name: str = ""
    # Which pod object it was read from, for people; not part of the endpoint's value,
    # so a pod change that changes nothing served (a label no one reads) is no change.
    pod_resource_version: str = field(default="", compare=False)
    enrichment: Enrichment = NO_ENRICHMENT

    @property
    def family(self) -> str:
        return "IPv6" if ":" in self.ip else "IPv4"


@dataclass(frozen=True, slots=True)
class ResolvedEndpoint:
    """An endpoint as one View's subscribers see it."""

    endpoint: Endpoint
    zone_locality: str = "unknown"  # local | remote | unknown, relative to the subscriber
    weight: int = BASE_WEIGHT

    @property
    def id(self) -> EndpointId:
        return self.endpoint.id


LOCAL_CLUSTER = "local"  # the name Linkerd gives the cluster it runs in (its metrics' label)


@dataclass(frozen=True, slots=True)
class ClusterIdentity:
    """Which cluster a Cluster's objects come from: its name (`local` for the one the
    process runs in, a link's name for another), the DNS domain of its services and
    the trust domain of its workloads' identities."""

    name: str = LOCAL_CLUSTER
    domain: str = "cluster.local"
    trust_domain: str = "cluster.local"


@dataclass(frozen=True, slots=True)
class MeshConfig:
    """The knobs that shape enrichment, named after Linkerd's controller flags."""

    cluster_domain: str = "cluster.local"
    trust_domain: str = "cluster.local"
    controller_namespace: str = "linkerd"
    default_opaque_ports: frozenset[int] = frozenset(
        int(p) for p in DEFAULT_OPAQUE_PORTS.split(",")
    )
    enable_h2_upgrade: bool = True
    # Helm's default outbound transport mode is transport-header (Linkerd §4.10).
    force_opaque_transport: bool = True
    enable_ipv6: bool = True
    zone_weights: bool = False
    meshed_http2_params: Mapping[str, Any] | None = field(
        default_factory=lambda: DEFAULT_MESHED_HTTP2_PARAMS
    )

    def local_cluster(self) -> ClusterIdentity:
        """The identity of the cluster the process runs in, as these flags name it."""
        return ClusterIdentity(LOCAL_CLUSTER, self.cluster_domain, self.trust_domain)
