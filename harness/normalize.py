"""Both protocols' answers in one form, so that differences are about endpoints.

A Linkerd `WeightedAddr` and an xDS `LbEndpoint` (with meshbridge's
`io.linkerd.destination` metadata) normalise to the same `NormalEndpoint`; a target's
state is a frozenset of them. Used by `meshbridge compare` (is every client's state the
truth?) and `meshbridge shadow` (do two control planes agree?).
"""

from __future__ import annotations

import hashlib
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format

METADATA_NAMESPACE = "io.linkerd.destination"


@dataclass(frozen=True, slots=True, order=True)
class NormalEndpoint:
    address: str
    port: int
    weight: int = 0
    identity: str = ""
    hint: str = ""  # opaque | h2 | ""
    opaque_transport: int = 0
    zone: str = ""
    locality: str = ""
    health: str = "HEALTHY"

    @property
    def addr(self) -> str:
        return f"[{self.address}]:{self.port}" if ":" in self.address else \
            f"{self.address}:{self.port}"

    def differences(self, other: NormalEndpoint) -> list[str]:
        return [f"{name}: {getattr(self, name)!r} != {getattr(other, name)!r}"
                for name in self.__slots__ if getattr(self, name) != getattr(other, name)]


State = frozenset[NormalEndpoint]


_DIGEST_MASK = (1 << 64) - 1


def address_term(addr: str) -> int:
    """One address's share of an address digest (64 bits of BLAKE2b)."""
    return int.from_bytes(hashlib.blake2b(addr.encode(), digest_size=8).digest(), "little")


def sum_digest(total: int) -> str:
    """The address digest whose terms add up to `total`."""
    return f"{total & _DIGEST_MASK:016x}"


def digest(state: Iterable[NormalEndpoint], fields: str = "addr") -> str:
    """A short stable hash of a state: by address only (`addr`) or every field (`all`).

    The address digest is the sum of its addresses' terms mod 2^64, so that whoever
    keeps a state up to date change by change (the compare's truth recorder, a Linkerd
    client) keeps its digest in O(change) too (`address_term`, `sum_digest`)."""
    if fields == "addr":
        return sum_digest(sum(address_term(e.addr) for e in state))
    items = sorted(repr(e) for e in state)
    return hashlib.sha1("\n".join(items).encode()).hexdigest()[:16]


def tcp_address(addr: Any) -> tuple[str, int]:
    """Decode a Linkerd `net.TcpAddress`: IPv4 is a big-endian fixed32, IPv6 two fixed64."""
    ip = addr.ip
    if ip.HasField("ipv6"):
        value = (ip.ipv6.first << 64) | ip.ipv6.last
        return str(ipaddress.IPv6Address(value)), int(addr.port)
    # What str(IPv4Address(n)) gives, a tenth of the cost: the measuring clients
    # decode tens of thousands of addresses in a connect storm.
    return socket.inet_ntoa(ip.ipv4.to_bytes(4, "big")), int(addr.port)


def from_weighted_addr(wa: Any) -> NormalEndpoint:
    address, port = tcp_address(wa.addr)
    identity = ""
    if wa.HasField("tls_identity"):
        tls = wa.tls_identity
        identity = (tls.dns_like_identity.name if tls.HasField("dns_like_identity")
                    else tls.uri_like_identity.uri)
    hint, transport = "", 0
    if wa.HasField("protocol_hint"):
        ph = wa.protocol_hint
        hint = "opaque" if ph.HasField("opaque") else "h2" if ph.HasField("h2") else ""
        if ph.HasField("opaque_transport"):
            transport = int(ph.opaque_transport.inbound_port)
    labels = wa.metric_labels
    return NormalEndpoint(address, port, int(wa.weight), identity, hint, transport,
                          labels.get("zone", ""), labels.get("zone_locality", ""))


# The metadata fields a NormalEndpoint reads.
METADATA_READ = ("weight", "identity", "protocol_hint", "opaque_transport_port", "zone",
                 "zone_locality")


def plain_value(value: Any) -> Any:
    """A `google.protobuf.Value` as `json_format.MessageToDict` gives it."""
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "number_value":
        return value.number_value
    if kind == "bool_value":
        return value.bool_value
    if kind is None or kind == "null_value":
        return None
    return json_format.MessageToDict(value)


def from_lb_endpoint(lb: Any) -> NormalEndpoint:
    sa = lb.endpoint.address.socket_address
    meta: dict[str, Any] = {}
    fm = lb.metadata.filter_metadata
    if METADATA_NAMESPACE in fm:
        # Only the fields read below, without json_format's walk over the whole
        # Struct (which was most of the measuring clients' decoding time).
        fields = fm[METADATA_NAMESPACE].fields
        meta = {k: plain_value(fields[k]) for k in METADATA_READ if k in fields}
    health = lb.DESCRIPTOR.fields_by_name["health_status"].enum_type.values_by_number[
        lb.health_status].name
    return NormalEndpoint(
        address=str(ipaddress.ip_address(sa.address)),
        port=int(sa.port_value),
        weight=int(meta.get("weight", lb.load_balancing_weight.value or 1)),
        identity=str(meta.get("identity", "")),
        hint=str(meta.get("protocol_hint", "")),
        opaque_transport=int(meta.get("opaque_transport_port", 0)),
        zone=str(meta.get("zone", "")),
        locality=str(meta.get("zone_locality", "")),
        health="HEALTHY" if health == "UNKNOWN" else health,
    )


def from_cla(cla: Any) -> State:
    return frozenset(from_lb_endpoint(lb) for loc in cla.endpoints for lb in loc.lb_endpoints)


def carries_metadata(cla: Any) -> bool | None:
    """Whether a CLA's endpoints carry meshbridge's `io.linkerd.destination` metadata
    (None when it has no endpoints to tell by). A foreign xDS server's do not."""
    seen: bool | None = None
    for loc in cla.endpoints:
        for lb in loc.lb_endpoints:
            if METADATA_NAMESPACE in lb.metadata.filter_metadata:
                return True
            seen = False
    return seen


def from_cla_as_envoy(cla: Any) -> State:
    """A CLA as Envoy reads it, so that any two xDS servers compare: the weight is the
    `load_balancing_weight` (what Envoy balances by, default 1) and the zone is the
    locality's. What only meshbridge's metadata carries (identity, protocol hint,
    opaque transport, zone locality) is added when present, empty otherwise."""
    out = []
    for loc in cla.endpoints:
        for lb in loc.lb_endpoints:
            ep = from_lb_endpoint(lb)
            out.append(NormalEndpoint(
                address=ep.address, port=ep.port,
                weight=int(lb.load_balancing_weight.value or 1),
                identity=ep.identity, hint=ep.hint, opaque_transport=ep.opaque_transport,
                zone=str(loc.locality.zone) or ep.zone, locality=ep.locality, health=ep.health))
    return frozenset(out)
