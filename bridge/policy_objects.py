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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bridge.decoding import (
    Labels,
    Meta,
    ObjectError,
    as_bool,
    as_list,
    as_map,
    as_port,
    as_str,
    as_str_map,
    decode_meta,
)
from bridge.kinds import Kind

if TYPE_CHECKING:
    from bridge.objects import Server

LINKERD_POLICY_GROUP = "policy.linkerd.io"
GATEWAY_GROUP = "gateway.networking.k8s.io"


# --------------------------------------------------------------------------- routes


@dataclass(frozen=True, slots=True)
class ParentRef:
    """What a route attaches to; only kind Service (group core) matters to us."""

    group: str
    kind: str
    name: str
    namespace: str
    port: int | None


@dataclass(frozen=True, slots=True)
class BackendRef:
    group: str
    kind: str
    name: str
    namespace: str
    port: int | None
    weight: int


@dataclass(frozen=True, slots=True)
class ValueMatch:
    """A header or query parameter condition."""

    name: str
    value: str
    regex: bool = False


@dataclass(frozen=True, slots=True)
class HttpMatch:
    # "Exact" | "PathPrefix" | "RegularExpression"
    path_type: str = "PathPrefix"
    path: str = "/"
    headers: tuple[ValueMatch, ...] = ()
    query_params: tuple[ValueMatch, ...] = ()
    method: str = ""


@dataclass(frozen=True, slots=True)
class GrpcMatch:
    service: str = ""
    method: str = ""
    headers: tuple[ValueMatch, ...] = ()


@dataclass(frozen=True, slots=True)
class RouteRule:
    matches: tuple[HttpMatch | GrpcMatch, ...]
    backends: tuple[BackendRef, ...]


@dataclass(frozen=True, slots=True)
class Route:
    """An HTTPRoute (policy.linkerd.io or gateway.networking.k8s.io) or a GRPCRoute."""

    meta: Meta
    group: str
    route_kind: str  # "HTTPRoute" | "GRPCRoute", as Linkerd names it in metadata
    parents: tuple[ParentRef, ...]
    hostnames: tuple[str, ...]
    rules: tuple[RouteRule, ...]
    created: str = ""  # metadata.creationTimestamp (RFC 3339 sorts as text)
    kind: str = "HTTPRoute"

    def attaches_to(self, namespace: str, service: str, port: int) -> bool:
        return any(
            p.kind == "Service" and p.group in ("", "core") and p.name == service
            and p.namespace == namespace and p.port in (None, port)
            for p in self.parents
        )


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


def _opt_port(raw: Any, kind: str, n: str, path: str) -> int | None:
    return None if raw is None else as_port(raw, kind, n, path)


def _values(raw: Any, kind: str, n: str, path: str) -> tuple[ValueMatch, ...]:
    out = []
    for i, h in enumerate(as_list(raw, kind, n, path)):
        h = as_map(h, kind, n, f"{path}[{i}]")
        kind_of = as_str(h.get("type"), kind, n, f"{path}[{i}].type", "Exact")
        if kind_of not in ("Exact", "RegularExpression"):
            raise ObjectError(kind, n, f"{path}[{i}].type {kind_of!r} is not supported")
        out.append(ValueMatch(as_str(h.get("name"), kind, n, f"{path}[{i}].name"),
                              as_str(h.get("value"), kind, n, f"{path}[{i}].value"),
                              kind_of == "RegularExpression"))
    return tuple(out)


def _http_match(raw: Any, kind: str, n: str, path: str) -> HttpMatch:
    m = as_map(raw, kind, n, path)
    p = as_map(m.get("path"), kind, n, f"{path}.path")
    path_type = as_str(p.get("type"), kind, n, f"{path}.path.type", "PathPrefix")
    if path_type not in ("Exact", "PathPrefix", "RegularExpression"):
        raise ObjectError(kind, n, f"{path}.path.type {path_type!r} is not supported")
    return HttpMatch(
        path_type, as_str(p.get("value"), kind, n, f"{path}.path.value", "/"),
        _values(m.get("headers"), kind, n, f"{path}.headers"),
        _values(m.get("queryParams"), kind, n, f"{path}.queryParams"),
        as_str(m.get("method"), kind, n, f"{path}.method"))


def _grpc_match(raw: Any, kind: str, n: str, path: str) -> GrpcMatch:
    m = as_map(raw, kind, n, path)
    method = as_map(m.get("method"), kind, n, f"{path}.method")
    return GrpcMatch(as_str(method.get("service"), kind, n, f"{path}.method.service"),
                     as_str(method.get("method"), kind, n, f"{path}.method.method"),
                     _values(m.get("headers"), kind, n, f"{path}.headers"))


def _backend(raw: Any, kind: str, n: str, ns: str, path: str) -> BackendRef:
    b = as_map(raw, kind, n, path)
    weight = b.get("weight", 1)
    if isinstance(weight, bool) or not isinstance(weight, int) or weight < 0:
        raise ObjectError(kind, n, f"{path}.weight must be a whole number >= 0")
    return BackendRef(
        as_str(b.get("group"), kind, n, f"{path}.group"),
        as_str(b.get("kind"), kind, n, f"{path}.kind", "Service"),
        as_str(b.get("name"), kind, n, f"{path}.name"),
        as_str(b.get("namespace"), kind, n, f"{path}.namespace") or ns,
        _opt_port(b.get("port"), kind, n, f"{path}.port"), weight)


def _route(raw: Mapping[str, Any], store_kind: str, group: str, route_kind: str) -> Route:
    meta, n, spec = _ctx(raw, route_kind)
    parents = []
    for i, p in enumerate(as_list(spec.get("parentRefs"), route_kind, n, "spec.parentRefs")):
        p = as_map(p, route_kind, n, f"spec.parentRefs[{i}]")
        parents.append(ParentRef(
            as_str(p.get("group"), route_kind, n, f"spec.parentRefs[{i}].group",
                    GATEWAY_GROUP),
            as_str(p.get("kind"), route_kind, n, f"spec.parentRefs[{i}].kind", "Gateway"),
            as_str(p.get("name"), route_kind, n, f"spec.parentRefs[{i}].name"),
            as_str(p.get("namespace"), route_kind, n, f"spec.parentRefs[{i}].namespace")
            or meta.namespace,
            _opt_port(p.get("port"), route_kind, n, f"spec.parentRefs[{i}].port")))
    matcher = _grpc_match if route_kind == "GRPCRoute" else _http_match
    rules = []
    for i, r in enumerate(as_list(spec.get("rules"), route_kind, n, "spec.rules")):
        r = as_map(r, route_kind, n, f"spec.rules[{i}]")
        path = f"spec.rules[{i}]"
        rules.append(RouteRule(
            tuple(matcher(m, route_kind, n, f"{path}.matches[{j}]")
                  for j, m in enumerate(as_list(r.get("matches"), route_kind, n,
                                                 f"{path}.matches"))),
            tuple(_backend(b, route_kind, n, meta.namespace, f"{path}.backendRefs[{j}]")
                  for j, b in enumerate(as_list(r.get("backendRefs"), route_kind, n,
                                                 f"{path}.backendRefs")))))
    hostnames = tuple(as_str(h, route_kind, n, "spec.hostnames")
                      for h in as_list(spec.get("hostnames"), route_kind, n, "spec.hostnames"))
    md = as_map(raw.get("metadata"), route_kind, n, "metadata")
    created = md.get("creationTimestamp")
    return Route(meta, group, route_kind, tuple(parents), hostnames, tuple(rules),
                 str(created) if created else "", kind=store_kind)


def _decode_http_route(raw: Mapping[str, Any]) -> Route:
    # One kind name, two API groups: the apiVersion says which (list items from the
    # API server carry none, so the kube source asks for "GatewayHTTPRoute" itself).
    api_version = raw.get("apiVersion")
    if isinstance(api_version, str) and api_version.startswith(GATEWAY_GROUP + "/"):
        return _route(raw, "GatewayHTTPRoute", GATEWAY_GROUP, "HTTPRoute")
    return _route(raw, "HTTPRoute", LINKERD_POLICY_GROUP, "HTTPRoute")


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


def _route_stub(kind: str, group: str, route_kind: str) -> Callable[[Meta], PolicyObject]:
    return lambda meta: Route(meta, group, route_kind, (), (), (), kind=kind)


# Each kind's decoder and its tombstone (a key-only object, for deleting what the cache
# holds when an object no longer decodes).
KINDS: tuple[Kind, ...] = (
    Kind("HTTPRoute", _decode_http_route,
         _route_stub("HTTPRoute", LINKERD_POLICY_GROUP, "HTTPRoute")),
    Kind("GatewayHTTPRoute",
         lambda raw: _route(raw, "GatewayHTTPRoute", GATEWAY_GROUP, "HTTPRoute"),
         _route_stub("GatewayHTTPRoute", GATEWAY_GROUP, "HTTPRoute")),
    Kind("GRPCRoute", lambda raw: _route(raw, "GRPCRoute", GATEWAY_GROUP, "GRPCRoute"),
         _route_stub("GRPCRoute", GATEWAY_GROUP, "GRPCRoute")),
    Kind("AuthorizationPolicy", _decode_authorization_policy,
         lambda m: AuthorizationPolicy(m, ObjectRef("", "", "", ""), ())),
    Kind("ServerAuthorization", _decode_server_authorization,
         lambda m: ServerAuthorization(m, "", None, (), False, False, False, (), ())),
    Kind("MeshTLSAuthentication", _decode_meshtls, lambda m: MeshTLSAuthentication(m, (), ())),
    Kind("NetworkAuthentication", _decode_network_authn,
         lambda m: NetworkAuthentication(m, ())),
)
