"""Linkerd's policy objects (and the Gateway API routes Linkerd reads), decoded once
into frozen values like every other kind (bridge.objects).

Protocol neutral: these say what the objects mean (which Service port a route is
attached to, which clients an authorization admits), not how any API encodes it.
`bridge.objects` registers `DECODERS` and `TOMBSTONES` with its own, so every source
decodes these kinds without knowing of them.

Store kinds: the Gateway API's HTTPRoute is kept as "GatewayHTTPRoute" because
Linkerd's own policy.linkerd.io HTTPRoute has the same kind name, and the cache keys
objects by (kind, namespace, name).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# Imported first, this module has bridge.objects import it back (partly initialised,
# which is enough: bridge.objects reads this module's names only when it decodes).
from bridge import objects as _o
from bridge.objects import Labels, Meta, ObjectError
from bridge.routes.objects import (  # the route values, re-exported
    GATEWAY_GROUP,
    LINKERD_POLICY_GROUP,
    ROUTE_DECODERS,
    ROUTE_TOMBSTONES,
    BackendRef,
    GrpcMatch,
    HttpMatch,
    ParentRef,
    Route,
    RouteRule,
    ValueMatch,
)

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

    def selects(self, server: _o.Server) -> bool:
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
    meta = _o._meta(raw, kind, True)
    n = f"{meta.namespace}/{meta.name}"
    return meta, n, _o._map(raw.get("spec"), kind, n, "spec")


def _ref(raw: Any, kind: str, n: str, path: str, group: str = "") -> ObjectRef:
    r = _o._map(raw, kind, n, path)
    return ObjectRef(_o._str(r.get("group"), kind, n, f"{path}.group", group),
                     _o._str(r.get("kind"), kind, n, f"{path}.kind"),
                     _o._str(r.get("name"), kind, n, f"{path}.name"),
                     _o._str(r.get("namespace"), kind, n, f"{path}.namespace"))


def _decode_authorization_policy(raw: Mapping[str, Any]) -> AuthorizationPolicy:
    kind = "AuthorizationPolicy"
    meta, n, spec = _ctx(raw, kind)
    target = _ref(spec.get("targetRef"), kind, n, "spec.targetRef")
    if not target.kind:
        raise ObjectError(kind, n, "spec.targetRef.kind is missing")
    required = tuple(
        _ref(r, kind, n, f"spec.requiredAuthenticationRefs[{i}]")
        for i, r in enumerate(_o._list(spec.get("requiredAuthenticationRefs"), kind, n,
                                       "spec.requiredAuthenticationRefs")))
    return AuthorizationPolicy(meta, target, required)


def _cidr(raw: Any, kind: str, n: str, path: str) -> str:
    text = _o._str(raw, kind, n, path)
    try:
        return str(ipaddress.ip_network(text, strict=False))
    except ValueError:
        raise ObjectError(kind, n, f"{path} {text!r} is not a CIDR") from None


def _networks(raw: Any, kind: str, n: str, path: str) -> tuple[NetworkRule, ...]:
    out = []
    for i, net in enumerate(_o._list(raw, kind, n, path)):
        net = _o._map(net, kind, n, f"{path}[{i}]")
        out.append(NetworkRule(
            _cidr(net.get("cidr"), kind, n, f"{path}[{i}].cidr"),
            tuple(_cidr(e, kind, n, f"{path}[{i}].except")
                  for e in _o._list(net.get("except"), kind, n, f"{path}[{i}].except"))))
    return tuple(out)


def _decode_server_authorization(raw: Mapping[str, Any]) -> ServerAuthorization:
    kind = "ServerAuthorization"
    meta, n, spec = _ctx(raw, kind)
    server = _o._map(spec.get("server"), kind, n, "spec.server")
    selector: dict[str, str] | None = None
    if server.get("selector") is not None:
        selector = _o._str_map(
            _o._map(server.get("selector"), kind, n, "spec.server.selector").get("matchLabels"),
            kind, n, "spec.server.selector.matchLabels")
    name = _o._str(server.get("name"), kind, n, "spec.server.name")
    if not name and selector is None:
        raise ObjectError(kind, n, "spec.server needs a name or a selector")
    client = _o._map(spec.get("client"), kind, n, "spec.client")
    mtls_raw = client.get("meshTLS")
    mtls = _o._map(mtls_raw, kind, n, "spec.client.meshTLS")
    accounts = []
    for i, sa in enumerate(_o._list(mtls.get("serviceAccounts"), kind, n,
                                    "spec.client.meshTLS.serviceAccounts")):
        sa = _o._map(sa, kind, n, f"spec.client.meshTLS.serviceAccounts[{i}]")
        accounts.append((_o._str(sa.get("namespace"), kind, n, "serviceAccounts.namespace"),
                         _o._str(sa.get("name"), kind, n, "serviceAccounts.name")))
    return ServerAuthorization(
        meta, name, selector,
        _networks(client.get("networks"), kind, n, "spec.client.networks"),
        _o._bool(client.get("unauthenticated"), kind, n, "spec.client.unauthenticated", False),
        mtls_raw is not None,
        _o._bool(mtls.get("unauthenticatedTLS"), kind, n,
                 "spec.client.meshTLS.unauthenticatedTLS", False),
        tuple(_o._str(i, kind, n, "spec.client.meshTLS.identities")
              for i in _o._list(mtls.get("identities"), kind, n,
                                "spec.client.meshTLS.identities")),
        tuple(accounts))


def _decode_meshtls(raw: Mapping[str, Any]) -> MeshTLSAuthentication:
    kind = "MeshTLSAuthentication"
    meta, n, spec = _ctx(raw, kind)
    identities = tuple(_o._str(i, kind, n, "spec.identities")
                       for i in _o._list(spec.get("identities"), kind, n, "spec.identities"))
    refs = tuple(_ref(r, kind, n, f"spec.identityRefs[{i}]")
                 for i, r in enumerate(_o._list(spec.get("identityRefs"), kind, n,
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


DECODERS: dict[str, Callable[[Mapping[str, Any]], PolicyObject]] = {
    **ROUTE_DECODERS,
    "AuthorizationPolicy": _decode_authorization_policy,
    "ServerAuthorization": _decode_server_authorization,
    "MeshTLSAuthentication": _decode_meshtls,
    "NetworkAuthentication": _decode_network_authn,
}


# Key-only objects, for deleting what the cache holds when an object no longer decodes.
TOMBSTONES: dict[str, Callable[[Meta], PolicyObject]] = {
    **ROUTE_TOMBSTONES,
    "AuthorizationPolicy": lambda m: AuthorizationPolicy(m, ObjectRef("", "", "", ""), ()),
    "ServerAuthorization": lambda m: ServerAuthorization(m, "", None, (), False, False, False,
                                                          (), ()),
    "MeshTLSAuthentication": lambda m: MeshTLSAuthentication(m, (), ()),
    "NetworkAuthentication": lambda m: NetworkAuthentication(m, ()),
}
