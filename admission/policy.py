"""Linkerd's policy kinds and the routes meshbridge serves, at admission.

Each object is first decoded by the code that decodes it for serving
(`bridge.objects.decode_object`): what it cannot use would be logged and skipped
once stored, so it is refused here. Then the rules Linkerd's policy controller
applies at admission, which the decoders do not need to serve but which keep
policies meaningful:

* Server: a port name that no container port could have; another Server in the
  namespace already covers the same port for pods this one selects (the same pod
  selector, or either selects every pod); an `accessPolicy` that is not a default
  policy name;
* AuthorizationPolicy: a target that is a Server, an HTTPRoute, a GRPCRoute or its
  own Namespace; at most one MeshTLSAuthentication, at most one ServiceAccount (and
  not both), at most one NetworkAuthentication, and no other kind, among the
  required authentications;
* MeshTLSAuthentication: identity references to ServiceAccounts or (cluster-scoped)
  Namespaces; identities that are names, `*`, or `*.` and a suffix;
* NetworkAuthentication (and ServerAuthorization's networks): every exception
  inside its CIDR and smaller than it;
* routes (Linkerd's HTTPRoute, the Gateway API's HTTPRoute and GRPCRoute): every
  problem the route model finds in one route (`bridge.routes`: what it would not
  serve as written), and a Service parent's port that the Service has.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from admission.problems import Problem, from_reason
from bridge.cluster import Cluster
from bridge.model import ServiceKey
from bridge.objects import KubeObject, ObjectError, Server, decode_object
from bridge.policy_objects import (
    AuthorizationPolicy,
    MeshTLSAuthentication,
    NetworkAuthentication,
    NetworkRule,
    Route,
    ServerAuthorization,
)

# Linkerd's default authorization policies (Server.spec.accessPolicy, and the proxy's).
ACCESS_POLICIES = frozenset({"all-unauthenticated", "all-authenticated",
                             "cluster-unauthenticated", "cluster-authenticated", "deny",
                             "audit"})
_POLICY_TARGETS = frozenset({"Server", "HTTPRoute", "GRPCRoute", "Namespace"})
# An identity: a DNS-like name, `*`, or `*.` followed by one.
_IDENTITY = re.compile(r"^(\*|(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*"
                       r"[a-z0-9])?)*)$")

# A container port name (IANA service name): what a Server's named port must be.
_PORT_NAME = re.compile(r"^(?=.{1,15}$)(?=.*[a-z])[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

Check = Callable[[Any, Mapping[str, Any], Cluster], list[Problem]]


def decoded(raw: Mapping[str, Any], kind: str) -> tuple[KubeObject | None, list[Problem]]:
    """The object as serving decodes it, or the problem that stops it."""
    try:
        return decode_object(raw, kind), []
    except ObjectError as e:
        return None, [from_reason(e.reason)]


def validate_policy(raw: Mapping[str, Any], store_kind: str, cluster: Cluster) -> list[Problem]:
    """Decode `raw` as `store_kind` (bridge's name for the kind), then its rules."""
    obj, problems = decoded(raw, store_kind)
    if obj is None:
        return problems
    check = _CHECKS.get(type(obj))
    return check(obj, raw, cluster) if check is not None else []


# ---------------------------------------------------------------------- Server


def _server(server: Server, raw: Mapping[str, Any], cluster: Cluster) -> list[Problem]:
    out = []
    if isinstance(server.port, str) and not _PORT_NAME.match(server.port):
        out.append(Problem("spec.port", f"{server.port!r} is not a port name (at most 15 "
                           "lower-case letters, digits and '-', with a letter)", "port"))
    if server.access_policy and server.access_policy not in ACCESS_POLICIES:
        out.append(Problem("spec.accessPolicy", f"{server.access_policy!r} is not one of "
                           f"{', '.join(sorted(ACCESS_POLICIES))}", "access_policy"))
    ns = server.meta.namespace
    for other in sorted(cluster.servers_in(ns), key=lambda s: s.meta.name):
        if other.meta.name == server.meta.name or other.port != server.port:
            continue
        if _overlaps(other.pod_selector, server.pod_selector):
            out.append(Problem("spec.podSelector", f"Server {ns}/{other.meta.name} already "
                               f"covers port {server.port} for pods this Server selects",
                               "conflict"))
    return out


def _overlaps(left: Mapping[str, str] | None, right: Mapping[str, str] | None) -> bool:
    # As Linkerd decides it: the same selector, or one that selects every pod.
    if left is None or right is None:
        return False
    return not left or not right or dict(left) == dict(right)


# ---------------------------------------------------------------------- authorization


def _authorization_policy(policy: AuthorizationPolicy, raw: Mapping[str, Any],
                          cluster: Cluster) -> list[Problem]:
    out = []
    target = policy.target
    if target.kind not in _POLICY_TARGETS:
        out.append(Problem("spec.targetRef.kind", f"{target.kind!r}: a policy targets a "
                           "Server, an HTTPRoute, a GRPCRoute or its Namespace", "target"))
    elif target.kind == "Namespace" and target.name != policy.meta.namespace:
        out.append(Problem("spec.targetRef.name", f"cannot target another namespace "
                           f"({target.name})", "target"))
    kinds = [r.kind for r in policy.required]
    counts = {k: kinds.count(k) for k in set(kinds)}
    path = "spec.requiredAuthenticationRefs"
    for kind in ("MeshTLSAuthentication", "ServiceAccount", "NetworkAuthentication"):
        if counts.get(kind, 0) > 1:
            out.append(Problem(path, f"only a single {kind} may be set", "authentication"))
    if counts.get("MeshTLSAuthentication") and counts.get("ServiceAccount"):
        out.append(Problem(path, "a MeshTLSAuthentication and a ServiceAccount may not be "
                           "set together", "authentication"))
    other = sorted(set(kinds) - {"MeshTLSAuthentication", "ServiceAccount",
                                 "NetworkAuthentication"})
    if other:
        out.append(Problem(path, f"unsupported authentication kind(s): {', '.join(other)}",
                           "authentication"))
    return out


def _meshtls(authn: MeshTLSAuthentication, raw: Mapping[str, Any],
             cluster: Cluster) -> list[Problem]:
    out = []
    for i, identity in enumerate(authn.identities):
        if not _IDENTITY.match(identity):
            out.append(Problem(f"spec.identities[{i}]", f"{identity!r} is not an identity "
                               "(a DNS-like name, '*', or '*.' and a suffix)", "identity"))
    for i, ref in enumerate(authn.identity_refs):
        where = f"spec.identityRefs[{i}]"
        if ref.kind == "Namespace" and ref.namespace:
            out.append(Problem(f"{where}.namespace", "a Namespace is cluster-scoped and "
                               "takes no namespace", "identity"))
        elif ref.kind not in ("ServiceAccount", "Namespace"):
            out.append(Problem(f"{where}.kind", f"{ref.kind!r}: an identity reference names "
                               "a ServiceAccount or a Namespace", "identity"))
    return out


def _networks(rules: Iterable[NetworkRule], path: str) -> list[Problem]:
    out = []
    for i, rule in enumerate(rules):
        net = ipaddress.ip_network(rule.cidr)
        for j, text in enumerate(rule.exceptions):
            exception = ipaddress.ip_network(text)
            where = f"{path}[{i}].except[{j}]"
            if exception.version != net.version or not exception.subnet_of(net):  # type: ignore[arg-type]
                out.append(Problem(where, f"{text} is not inside {rule.cidr}", "network"))
            elif exception == net:
                out.append(Problem(where, f"{text} negates the whole of {rule.cidr}",
                                   "network"))
    return out


def _network_authn(authn: NetworkAuthentication, raw: Mapping[str, Any],
                   cluster: Cluster) -> list[Problem]:
    return _networks(authn.networks, "spec.networks")


def _server_authz(authz: ServerAuthorization, raw: Mapping[str, Any],
                  cluster: Cluster) -> list[Problem]:
    return _networks(authz.networks, "spec.client.networks")


# ---------------------------------------------------------------------- routes


def _route(route: Route, raw: Mapping[str, Any], cluster: Cluster) -> list[Problem]:
    # What the route model refuses to serve as written (bridge/routes: RE2 regexes,
    # filters, weights, timeouts, ...: its `validate_route` list), then a parent
    # Service's port, which only the cluster's state can tell.
    out = [Problem(p.path, p.rule, p.reason) for p in route.all_problems()]
    for i, parent in enumerate(route.parents):
        if parent.kind != "Service" or parent.group not in ("", "core"):
            continue
        service = cluster.services.get(ServiceKey(parent.namespace, parent.name))
        # A route may be applied before its Service: only a port the Service lacks is
        # refused.
        if service is not None and parent.port is not None and all(
                p.port != parent.port for p in service.ports):
            ports = ", ".join(str(p.port) for p in service.ports) or "none"
            out.append(Problem(f"spec.parentRefs[{i}].port", f"Service {parent.namespace}/"
                               f"{parent.name} has no port {parent.port} (its ports: {ports})",
                               "parent_port"))
    return out


_CHECKS: dict[type, Check] = {
    Server: _server,
    AuthorizationPolicy: _authorization_policy,
    MeshTLSAuthentication: _meshtls,
    NetworkAuthentication: _network_authn,
    ServerAuthorization: _server_authz,
    Route: _route,
}
