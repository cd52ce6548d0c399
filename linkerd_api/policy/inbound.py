"""What InboundServerPolicies says about a workload's port (§12.6-12.8): pure
functions of the Cluster cache, encoded as Linkerd 2.20's policy controller does."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from google.protobuf.duration_pb2 import Duration

from bridge.cluster import Cluster
from bridge.enrich import OPAQUE_PORTS_ANNOTATION
from bridge.model import MeshConfig
from bridge.objects import Pod, Server
from bridge.policy_objects import (
    LINKERD_POLICY_GROUP,
    AuthorizationPolicy,
    MeshTLSAuthentication,
    NetworkAuthentication,
    NetworkRule,
    ObjectRef,
    ServerAuthorization,
)
from bridge.port_sets import PortSpecError, parse_port_set
from linkerd_api.policy.outbound import DETECT_TIMEOUT_S, Network, UnknownTarget
from linkerd_api.policy.workload import Workload
from linkerd_api.proto import grpc_route_pb2 as grpc_route
from linkerd_api.proto import http_route_pb2 as http_route
from linkerd_api.proto import http_types_pb2 as http_types
from linkerd_api.proto import inbound_pb2 as ib
from linkerd_api.proto import meta_pb2 as meta
from linkerd_api.proto import net_pb2 as net

DEFAULT_POLICY_ANNOTATION = "config.linkerd.io/default-inbound-policy"
REQUIRE_ID_ANNOTATION = "config.linkerd.io/proxy-require-identity-inbound-ports"
DEFAULT_POLICIES = ("all-unauthenticated", "all-authenticated", "cluster-unauthenticated",
                    "cluster-authenticated", "deny", "audit")
ALL_NETWORKS = ("0.0.0.0/0", "::/0")

# Called when an authorization cannot be used (a missing authentication, say):
# (kind, namespace/name, why). The layer logs each once.
Unusable = Callable[[str, str, str], None]


@dataclass(frozen=True, slots=True)
class InboundSettings:
    default_policy: str
    cluster_networks: tuple[Network, ...]
    # Where kubelet probes come from (Linkerd's --probe-networks; Helm: everywhere).
    probe_networks: tuple[Network, ...] = ()


@dataclass(frozen=True, slots=True)
class _Client:
    """Who an authorization admits: networks (empty: the cluster's), and either
    anyone, any mesh TLS client, or these identities."""

    networks: tuple[NetworkRule, ...]
    mode: str  # "unauthenticated" | "tls" | "identities"
    exact: tuple[str, ...] = ()
    suffixes: tuple[tuple[str, ...], ...] = ()


def _network(cidr: str) -> net.IPNetwork:
    n = ipaddress.ip_network(cidr, strict=False)
    if isinstance(n, ipaddress.IPv4Network):
        ip = net.IPAddress(ipv4=int(n.network_address))
    else:
        packed = n.network_address.packed
        ip = net.IPAddress(ipv6=net.IPv6(first=int.from_bytes(packed[:8], "big"),
                                         last=int.from_bytes(packed[8:], "big")))
    return net.IPNetwork(ip=ip, prefix_len=n.prefixlen)


def _identity_match(text: str) -> tuple[str | None, tuple[str, ...] | None]:
    """(exact, None) or (None, suffix parts), as Linkerd reads an identity string."""
    if text == "*":
        return None, ()
    if text.startswith("*."):
        return None, tuple(text.split(".")[1:])
    return text, None


def sa_identity(config: MeshConfig, namespace: str, sa: str) -> str:
    return (f"{sa}.{namespace}.serviceaccount.identity.{config.controller_namespace}."
            f"{config.trust_domain}")


def _authz(md: meta.Metadata, label_kind: str, group: str, name: str, client: _Client,
           settings: InboundSettings) -> ib.Authz:
    if client.networks:
        networks = [ib.Network(net=_network(r.cidr), **{"except": [_network(e)
                                                                    for e in r.exceptions]})
                    for r in client.networks]
    else:
        networks = [ib.Network(net=_network(str(n))) for n in settings.cluster_networks]
    if client.mode == "unauthenticated":
        authn = ib.Authn(unauthenticated=ib.Authn.PermitUnauthenticated())
    elif client.mode == "tls":
        authn = ib.Authn(meshTLS=ib.Authn.PermitMeshTLS(
            unauthenticated=ib.Authn.PermitUnauthenticated()))
    else:
        authn = ib.Authn(meshTLS=ib.Authn.PermitMeshTLS(
            identities=ib.Authn.PermitMeshTLS.PermitClientIdentities(
                identities=[ib.Identity(name=i) for i in client.exact],
                suffixes=[ib.IdentitySuffix(parts=list(s)) for s in client.suffixes])))
    return ib.Authz(networks=networks, authentication=authn, metadata=md,
                    labels={"group": group, "kind": label_kind, "name": name})


def _default_http_routes(probe_paths: Iterable[str] = (),
                         settings: InboundSettings | None = None) -> list[ib.HttpRoute]:
    """The route that matches everything, and, for the pod's httpGet probe paths on
    this port, the `probe` route that admits the probe networks without TLS (§12.7)."""
    routes = [ib.HttpRoute(
        metadata=meta.Metadata(default="default"),
        rules=[ib.HttpRoute.Rule(
            matches=[http_route.HttpRouteMatch(path=http_route.PathMatch(prefix="/"))])])]
    paths = sorted(set(probe_paths))
    if paths and settings is not None and settings.probe_networks:
        client = _Client(tuple(NetworkRule(str(n)) for n in settings.probe_networks),
                         "unauthenticated")
        routes.append(ib.HttpRoute(
            metadata=meta.Metadata(default="probe"),
            authorizations=[_authz(meta.Metadata(default="probe"), "default", "", "probe",
                                   client, settings)],
            rules=[ib.HttpRoute.Rule(matches=[
                http_route.HttpRouteMatch(path=http_route.PathMatch(exact=p),
                                          method=_GET) for p in paths])]))
    return routes


_GET = http_types.HttpMethod(registered=http_types.HttpMethod.GET)


def probe_paths(pod: Pod, port: int) -> list[str]:
    """The paths of the pod's httpGet probes on `port` (a named port resolved in its
    container)."""
    out = []
    for c in pod.all_containers():
        for target, path in c.http_probes:
            if isinstance(target, str):
                number = next((p.container_port for p in c.ports
                               if p.name.lower() == target.lower()), None)
            else:
                number = target
            if number == port:
                out.append(path)
    return out


def _default_grpc_routes() -> list[ib.GrpcRoute]:
    return [ib.GrpcRoute(
        metadata=meta.Metadata(default="default"),
        rules=[ib.GrpcRoute.Rule(matches=[grpc_route.GrpcRouteMatch(
            rpc=grpc_route.GrpcRpcMatch())])])]


def _detect(routes: list[ib.HttpRoute]) -> ib.ProxyProtocol:
    return ib.ProxyProtocol(detect=ib.ProxyProtocol.Detect(
        timeout=Duration(seconds=DETECT_TIMEOUT_S), http_routes=routes))


def _protocol(proxy_protocol: str, routes: list[ib.HttpRoute]) -> ib.ProxyProtocol:
    match proxy_protocol:
        case "HTTP/1":
            return ib.ProxyProtocol(http1=ib.ProxyProtocol.Http1(routes=routes))
        case "HTTP/2":
            return ib.ProxyProtocol(http2=ib.ProxyProtocol.Http2(routes=routes))
        case "gRPC":
            return ib.ProxyProtocol(grpc=ib.ProxyProtocol.Grpc(routes=_default_grpc_routes()))
        case "opaque":
            return ib.ProxyProtocol(opaque=ib.ProxyProtocol.Opaque())
        case "TLS":
            return ib.ProxyProtocol(tls=ib.ProxyProtocol.Tls())
    return _detect(routes)  # "unknown" or unset


def _ports(pod: Pod, annotation: str, default: frozenset[int]) -> frozenset[int]:
    text = pod.meta.annotations.get(annotation)
    if text is None:
        return default

    try:
        return parse_port_set(text, pod.container_port)
    except PortSpecError:
        return frozenset()


def _serves(server: Server, pod: Pod, port: int) -> bool:
    if not server.selects(pod):
        return False
    if isinstance(server.port, int):
        return server.port == port
    return any(p.name == server.port and p.container_port == port
               for c in pod.all_containers() for p in c.ports)


def find_server(cluster: Cluster, pod: Pod, port: int) -> Server | None:
    """The Server that selects this pod and port; of several, the first by name."""
    matching = [s for s in cluster.servers_in(pod.meta.namespace) if _serves(s, pod, port)]
    return min(matching, key=lambda s: s.meta.name) if matching else None


def default_policy_name(cluster: Cluster, pod: Pod, settings: InboundSettings) -> str:
    for source in (pod.meta.annotations, _namespace_annotations(cluster, pod)):
        value = source.get(DEFAULT_POLICY_ANNOTATION)
        if value in DEFAULT_POLICIES:
            return value
    return settings.default_policy


def _namespace_annotations(cluster: Cluster, pod: Pod) -> dict[str, str]:
    ns = cluster.namespaces.get(pod.meta.namespace)
    return dict(ns.meta.annotations) if ns is not None else {}


def server_policy(cluster: Cluster, config: MeshConfig, settings: InboundSettings,
                  workload: Workload, port: int, unusable: Unusable) -> ib.Server:
    pod = cluster.pods.get((workload.namespace, workload.name))
    if pod is None or workload.kind != "pod":
        raise UnknownTarget("unknown server")
    server = find_server(cluster, pod, port)
    if server is None:
        return _default_server(cluster, config, settings, pod, port)
    routes = _default_http_routes(probe_paths(pod, port), settings)
    return ib.Server(
        protocol=_protocol(server.proxy_protocol, routes),
        authorizations=_server_authorizations(cluster, config, settings, server, unusable),
        labels={"group": LINKERD_POLICY_GROUP, "kind": "server", "name": server.meta.name})


def _default_server(cluster: Cluster, config: MeshConfig, settings: InboundSettings,
                    pod: Pod, port: int) -> ib.Server:
    name = default_policy_name(cluster, pod, settings)
    opaque = port in _ports(pod, OPAQUE_PORTS_ANNOTATION, config.default_opaque_ports)
    protocol = ib.ProxyProtocol(opaque=ib.ProxyProtocol.Opaque()) if opaque else _detect(
        _default_http_routes(probe_paths(pod, port), settings))
    require_id = port in _ports(pod, REQUIRE_ID_ANNOTATION, frozenset())
    return ib.Server(protocol=protocol,
                     authorizations=_default_authorizations(name, require_id, settings),
                     labels={"group": "", "kind": "default", "name": name})


def _default_authorizations(name: str, require_id: bool,
                            settings: InboundSettings) -> list[ib.Authz]:
    """A default policy's one authorization (none for deny); audit admits everyone,
    the proxy only reports what it would have refused."""
    if name == "deny":
        return []
    authenticated = name in ("all-authenticated", "cluster-authenticated") or (
        require_id and name != "audit")
    networks = () if name.startswith("cluster-") else tuple(
        NetworkRule(n) for n in ALL_NETWORKS)
    client = _Client(networks, "identities", suffixes=((),)) if authenticated \
        else _Client(networks, "unauthenticated")
    return [_authz(meta.Metadata(default=name), "default", "", name, client, settings)]


def _server_authorizations(cluster: Cluster, config: MeshConfig, settings: InboundSettings,
                           server: Server, unusable: Unusable) -> list[ib.Authz]:
    ns = server.meta.namespace
    out: list[tuple[tuple[str, str], ib.Authz]] = []
    for obj in cluster.objects("ServerAuthorization"):
        if not isinstance(obj, ServerAuthorization) or obj.meta.namespace != ns \
                or not obj.selects(server):
            continue
        client = _server_authorization_client(config, obj)
        if client is None:
            unusable("ServerAuthorization", f"{ns}/{obj.meta.name}",
                     "spec.client admits no one (neither unauthenticated nor meshTLS)")
            continue
        md = meta.Metadata(resource=meta.Resource(
            group=LINKERD_POLICY_GROUP, kind="serverauthorization", name=obj.meta.name))
        out.append((("serverauthorization", obj.meta.name),
                    _authz(md, "serverauthorization", LINKERD_POLICY_GROUP, obj.meta.name,
                           client, settings)))
    for obj in cluster.objects("AuthorizationPolicy"):
        if not isinstance(obj, AuthorizationPolicy) or obj.meta.namespace != ns \
                or not _targets(obj.target, server):
            continue
        try:
            client = _policy_client(cluster, config, obj)
        except LookupError as e:
            unusable("AuthorizationPolicy", f"{ns}/{obj.meta.name}", str(e))
            continue
        md = meta.Metadata(resource=meta.Resource(
            group=LINKERD_POLICY_GROUP, kind="authorizationpolicy", name=obj.meta.name))
        out.append((("authorizationpolicy", obj.meta.name),
                    _authz(md, "authorizationpolicy", LINKERD_POLICY_GROUP, obj.meta.name,
                           client, settings)))
    authzs = [a for _, a in sorted(out, key=lambda e: e[0])]
    if server.access_policy in DEFAULT_POLICIES:
        authzs += _default_authorizations(server.access_policy, False, settings)
    return authzs


def _targets(target: ObjectRef, server: Server) -> bool:
    if target.kind == "Server" and target.group in ("", LINKERD_POLICY_GROUP):
        return target.name == server.meta.name
    if target.kind == "Namespace" and target.group in ("", "core"):
        return target.name == server.meta.namespace
    return False


def _split(identities: Iterable[str]) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    exact, suffixes = [], []
    for text in identities:
        e, s = _identity_match(text)
        if e is not None:
            exact.append(e)
        elif s is not None:
            suffixes.append(s)
    return tuple(exact), tuple(suffixes)


def _server_authorization_client(config: MeshConfig,
                                 saz: ServerAuthorization) -> _Client | None:
    if saz.unauthenticated:
        return _Client(saz.networks, "unauthenticated")
    if not saz.mesh_tls:
        return None
    if saz.unauthenticated_tls:
        return _Client(saz.networks, "tls")
    ids = list(saz.identities)
    ids += [sa_identity(config, ns or saz.meta.namespace, name)
            for ns, name in saz.service_accounts]
    exact, suffixes = _split(ids)
    return _Client(saz.networks, "identities", exact, suffixes)


def _policy_client(cluster: Cluster, config: MeshConfig, ap: AuthorizationPolicy) -> _Client:
    """An AuthorizationPolicy's clients from its required authentications; LookupError
    when one is missing (the policy is then left out, as Linkerd does)."""
    identities: list[str] | None = None
    networks: tuple[NetworkRule, ...] | None = None
    for ref in ap.required:
        ns = ref.namespace or ap.meta.namespace
        if ref.kind == "MeshTLSAuthentication":
            authn = _find(cluster, "MeshTLSAuthentication", ns, ref.name)
            assert authn is None or isinstance(authn, MeshTLSAuthentication)
            if authn is None:
                raise LookupError(f"could not find MeshTLSAuthentication {ref.name} in "
                                  f"namespace {ns}")
            if identities is not None:
                raise LookupError("policy must not include multiple MeshTLSAuthentications")
            identities = list(authn.identities)
            for r in authn.identity_refs:
                if r.kind == "ServiceAccount":
                    identities.append(sa_identity(config, r.namespace or ns, r.name))
                elif r.kind == "Namespace":
                    identities.append(f"*.{r.name}.serviceaccount.identity."
                                      f"{config.controller_namespace}.{config.trust_domain}")
        elif ref.kind == "ServiceAccount":
            if identities is not None:
                raise LookupError("policy must not include multiple ServiceAccounts")
            identities = [sa_identity(config, ns, ref.name)]
        elif ref.kind == "NetworkAuthentication":
            nauthn = _find(cluster, "NetworkAuthentication", ns, ref.name)
            assert nauthn is None or isinstance(nauthn, NetworkAuthentication)
            if nauthn is None:
                raise LookupError(f"could not find NetworkAuthentication {ref.name} in "
                                  f"namespace {ns}")
            if networks is not None:
                raise LookupError("policy must not include multiple NetworkAuthentications")
            networks = nauthn.networks
        else:
            raise LookupError(f"unsupported authentication kind {ref.kind!r}")
    nets = networks if networks is not None else tuple(NetworkRule(n) for n in ALL_NETWORKS)
    if identities is None:
        return _Client(nets, "unauthenticated")
    exact, suffixes = _split(identities)
    return _Client(nets, "identities", exact, suffixes)


def _find(cluster: Cluster, kind: str, ns: str, name: str) -> object | None:
    for obj in cluster.objects(kind):
        if obj.meta.namespace == ns and obj.meta.name == name:
            return obj
    return None
