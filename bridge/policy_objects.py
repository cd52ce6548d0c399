"""Linkerd's policy objects (and the Gateway API routes Linkerd reads), decoded once
into frozen values like every other kind (bridge.objects).

Protocol neutral: these say what the objects mean (which Service port a route is
attached to, which clients an authorization admits), not how any API encodes it.
Its `KINDS` join the core's in `bridge.objects`' kind registry (`bridge.kinds`), so
every source decodes these kinds without knowing of them.

Store kinds: the Gateway API's HTTPRoute is kept as "GatewayHTTPRoute" because
Linkerd's own policy.linkerd.io HTTPRoute has the same kind name, and the cache keys
objects by (kind, namespace, name).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bridge.decoding import (
    Labels,
    Meta,
    ObjectError,
    as_bool,
    as_list,
    as_map,
    as_str,
    as_str_map,
    decode_meta,
)
from bridge.kinds import Kind
from bridge.routes.objects import (  # the route values, re-exported
    GATEWAY_GROUP,
    LINKERD_POLICY_GROUP,
    ROUTE_KINDS_DECODED,
    BackendRef,
    GrpcMatch,
    HttpMatch,
    ParentRef,
    Route,
    RouteRule,
    ValueMatch,
)

if TYPE_CHECKING:
    from bridge.objects import Server

__all__ = ["GATEWAY_GROUP", "LINKERD_POLICY_GROUP", "BackendRef", "GrpcMatch", "HttpMatch",
           "ParentRef", "Route", "RouteRule", "ValueMatch"]

# --------------------------------------------------------------------------- routes
# The route kinds are decoded in bridge.routes.objects, with their filters, timeouts,
# retries and problems; they are registered below with the other policy kinds.

# --------------------------------------------------------------------------- authorization


@dataclass(frozen=True, slots=True)
class NetworkRule:
    cidr: str
    exceptions: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ObjectRef:
    group: str
    kind: str
    name: str
    namespace: str  # "" when the reference left it to default


@dataclass(frozen=True, slots=True)
class AuthorizationPolicy:
    meta: Meta
    target: ObjectRef
    required: tuple[ObjectRef, ...]
    kind: str = "AuthorizationPolicy"


@dataclass(frozen=True, slots=True)
class ServerAuthorization:
    """policy.linkerd.io/v1beta1: selects Servers by name or labels, admits clients."""

    meta: Meta
    server_name: str
    server_selector: Labels | None
    networks: tuple[NetworkRule, ...]
    unauthenticated: bool
    mesh_tls: bool
    unauthenticated_tls: bool
    identities: tuple[str, ...]
    service_accounts: tuple[tuple[str, str], ...]  # (namespace or "", name)
    kind: str = "ServerAuthorization"

    def selects(self, server: Server) -> bool:
        if self.server_name:
            return self.server_name == server.meta.name
        if self.server_selector is None:
            return False
        labels = server.meta.labels
        return all(labels.get(k) == v for k, v in self.server_selector.items())


@dataclass(frozen=True, slots=True)
class MeshTLSAuthentication:
    meta: Meta
    identities: tuple[str, ...]
    identity_refs: tuple[ObjectRef, ...]
    kind: str = "MeshTLSAuthentication"


@dataclass(frozen=True, slots=True)
class NetworkAuthentication:
    meta: Meta
    networks: tuple[NetworkRule, ...]
    kind: str = "NetworkAuthentication"


PolicyObject = (
    Route | AuthorizationPolicy | ServerAuthorization | MeshTLSAuthentication
    | NetworkAuthentication
)

ROUTE_KINDS = frozenset({"HTTPRoute", "GatewayHTTPRoute", "GRPCRoute"})
AUTH_KINDS = frozenset({"AuthorizationPolicy", "ServerAuthorization",
                        "MeshTLSAuthentication", "NetworkAuthentication"})
POLICY_KINDS = ROUTE_KINDS | AUTH_KINDS


# --------------------------------------------------------------------------- decoding


def _ctx(raw: Mapping[str, Any], kind: str) -> tuple[Meta, str, Mapping[str, Any]]:
    meta = decode_meta(raw, kind, True)
    n = f"{meta.namespace}/{meta.name}"
    return meta, n, as_map(raw.get("spec"), kind, n, "spec")


def _ref(raw: Any, kind: str, n: str, path: str, group: str = "") -> ObjectRef:
    r = as_map(raw, kind, n, path)
    return ObjectRef(as_str(r.get("group"), kind, n, f"{path}.group", group),
                     as_str(r.get("kind"), kind, n, f"{path}.kind"),
                     as_str(r.get("name"), kind, n, f"{path}.name"),
                     as_str(r.get("namespace"), kind, n, f"{path}.namespace"))


def _decode_authorization_policy(raw: Mapping[str, Any]) -> AuthorizationPolicy:
    kind = "AuthorizationPolicy"
    meta, n, spec = _ctx(raw, kind)
    target = _ref(spec.get("targetRef"), kind, n, "spec.targetRef")
    if not target.kind:
        raise ObjectError(kind, n, "spec.targetRef.kind is missing")
    required = tuple(
        _ref(r, kind, n, f"spec.requiredAuthenticationRefs[{i}]")
        for i, r in enumerate(as_list(spec.get("requiredAuthenticationRefs"), kind, n,
                                       "spec.requiredAuthenticationRefs")))
    return AuthorizationPolicy(meta, target, required)


def _cidr(raw: Any, kind: str, n: str, path: str) -> str:
    text = as_str(raw, kind, n, path)
    try:
        return str(ipaddress.ip_network(text, strict=False))
    except ValueError:
        raise ObjectError(kind, n, f"{path} {text!r} is not a CIDR") from None


def _networks(raw: Any, kind: str, n: str, path: str) -> tuple[NetworkRule, ...]:
    out = []
    for i, net in enumerate(as_list(raw, kind, n, path)):
        net = as_map(net, kind, n, f"{path}[{i}]")
        out.append(NetworkRule(
            _cidr(net.get("cidr"), kind, n, f"{path}[{i}].cidr"),
            tuple(_cidr(e, kind, n, f"{path}[{i}].except")
                  for e in as_list(net.get("except"), kind, n, f"{path}[{i}].except"))))
    return tuple(out)


def _decode_server_authorization(raw: Mapping[str, Any]) -> ServerAuthorization:
    kind = "ServerAuthorization"
    meta, n, spec = _ctx(raw, kind)
    server = as_map(spec.get("server"), kind, n, "spec.server")
    selector: dict[str, str] | None = None
    if server.get("selector") is not None:
        selector = as_str_map(
            as_map(server.get("selector"), kind, n, "spec.server.selector").get("matchLabels"),
            kind, n, "spec.server.selector.matchLabels")
    name = as_str(server.get("name"), kind, n, "spec.server.name")
    if not name and selector is None:
        raise ObjectError(kind, n, "spec.server needs a name or a selector")
    client = as_map(spec.get("client"), kind, n, "spec.client")
    mtls_raw = client.get("meshTLS")
    mtls = as_map(mtls_raw, kind, n, "spec.client.meshTLS")
    accounts = []
    for i, sa in enumerate(as_list(mtls.get("serviceAccounts"), kind, n,
                                    "spec.client.meshTLS.serviceAccounts")):
        sa = as_map(sa, kind, n, f"spec.client.meshTLS.serviceAccounts[{i}]")
        accounts.append((as_str(sa.get("namespace"), kind, n, "serviceAccounts.namespace"),
                         as_str(sa.get("name"), kind, n, "serviceAccounts.name")))
    return ServerAuthorization(
        meta, name, selector,
        _networks(client.get("networks"), kind, n, "spec.client.networks"),
        as_bool(client.get("unauthenticated"), kind, n, "spec.client.unauthenticated", False),
        mtls_raw is not None,
        as_bool(mtls.get("unauthenticatedTLS"), kind, n,
                 "spec.client.meshTLS.unauthenticatedTLS", False),
        tuple(as_str(i, kind, n, "spec.client.meshTLS.identities")
              for i in as_list(mtls.get("identities"), kind, n,
                                "spec.client.meshTLS.identities")),
        tuple(accounts))


def _decode_meshtls(raw: Mapping[str, Any]) -> MeshTLSAuthentication:
    kind = "MeshTLSAuthentication"
    meta, n, spec = _ctx(raw, kind)
    identities = tuple(as_str(i, kind, n, "spec.identities")
                       for i in as_list(spec.get("identities"), kind, n, "spec.identities"))
    refs = tuple(_ref(r, kind, n, f"spec.identityRefs[{i}]")
                 for i, r in enumerate(as_list(spec.get("identityRefs"), kind, n,
                                                "spec.identityRefs")))
    if not identities and not refs:
        raise ObjectError(kind, n, "names no identities (spec.identities, spec.identityRefs)")
    return MeshTLSAuthentication(meta, identities, refs)


def _decode_network_authn(raw: Mapping[str, Any]) -> NetworkAuthentication:
    kind = "NetworkAuthentication"
    meta, n, spec = _ctx(raw, kind)
    networks = _networks(spec.get("networks"), kind, n, "spec.networks")
    if not networks:
        raise ObjectError(kind, n, "spec.networks is empty")
    return NetworkAuthentication(meta, networks)


# Each kind's decoder and its tombstone (a key-only object, for deleting what the cache
# holds when an object no longer decodes).
KINDS: tuple[Kind, ...] = (
    *ROUTE_KINDS_DECODED,
    Kind("AuthorizationPolicy", _decode_authorization_policy,
         lambda m: AuthorizationPolicy(m, ObjectRef("", "", "", ""), ())),
    Kind("ServerAuthorization", _decode_server_authorization,
         lambda m: ServerAuthorization(m, "", None, (), False, False, False, (), ())),
    Kind("MeshTLSAuthentication", _decode_meshtls, lambda m: MeshTLSAuthentication(m, (), ())),
    Kind("NetworkAuthentication", _decode_network_authn,
         lambda m: NetworkAuthentication(m, ())),
)
