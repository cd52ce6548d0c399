"""The kinds the kube source watches, and how each is asked for: what the kube source,
its start-up checks and the Pod relay (`kube_relay`, started before the rest of the
kube source is imported) share, with nothing heavier than a dataclass."""

from __future__ import annotations

from dataclasses import dataclass

JSON = "application/json"
PROTOBUF = "application/vnd.kubernetes.protobuf"
# The built-in kinds read in the API's protobuf (kube_wire.PROTO_KINDS decodes them).
PROTOBUF_KINDS = frozenset({"Pod", "Service", "EndpointSlice", "Endpoints", "Node",
                            "ReplicaSet", "Job"})


def accept(kind: str) -> str:
    """The `Accept` header for a kind: protobuf where the API has it, JSON besides."""
    return f"{PROTOBUF}, {JSON}" if kind in PROTOBUF_KINDS else JSON


@dataclass(frozen=True, slots=True)
class KindSpec:
    kind: str
    path: str
    lag_metric: str  # Linkerd's `<kind>_informer_lag_seconds` name (Linkerd §4.9)
    cache_metric: str  # Linkerd's `<kind>_cache_size` name; "" for a kind Linkerd has none of
    optional: bool = False  # a CRD that may not be installed
    # Query parameters every list and watch carries (a label or field selector), for a
    # watch narrowed to what is needed; `path` may then be a namespaced one.
    params: tuple[tuple[str, str], ...] = ()
    # For a kind only some deployments grant (linked clusters' Secrets): a denial is
    # this one info line, not an error.
    denied_hint: str = ""


KINDS = {
    "Service": KindSpec("Service", "/api/v1/services", "services", "service"),
    "EndpointSlice": KindSpec("EndpointSlice", "/apis/discovery.k8s.io/v1/endpointslices",
                              "endpointslices", "endpointslices"),
    "Endpoints": KindSpec("Endpoints", "/api/v1/endpoints", "endpoints", "endpoints"),
    "Pod": KindSpec("Pod", "/api/v1/pods", "pods", "pod"),
    "Node": KindSpec("Node", "/api/v1/nodes", "nodes", "node"),
    "ReplicaSet": KindSpec("ReplicaSet", "/apis/apps/v1/replicasets", "replicasets",
                           "replicaset"),
    "Job": KindSpec("Job", "/apis/batch/v1/jobs", "jobs", "job"),
    "Server": KindSpec("Server", "/apis/policy.linkerd.io/v1beta3/servers", "servers",
                       "server", optional=True),
    "ServiceProfile": KindSpec("ServiceProfile", "/apis/linkerd.io/v1alpha2/serviceprofiles",
                               "serviceprofiles", "serviceprofile", optional=True),
    **{k: KindSpec(k, path, metric, metric, optional=True) for k, path, metric in (
        ("HTTPRoute", "/apis/policy.linkerd.io/v1beta3/httproutes", "httproute"),
        ("GatewayHTTPRoute", "/apis/gateway.networking.k8s.io/v1/httproutes",
         "gateway_httproute"),
        ("GRPCRoute", "/apis/gateway.networking.k8s.io/v1/grpcroutes", "grpcroute"),
        ("AuthorizationPolicy", "/apis/policy.linkerd.io/v1alpha1/authorizationpolicies",
         "authorizationpolicy"),
        ("ServerAuthorization", "/apis/policy.linkerd.io/v1beta1/serverauthorizations",
         "serverauthorization"),
        ("MeshTLSAuthentication", "/apis/policy.linkerd.io/v1alpha1/meshtlsauthentications",
         "meshtlsauthentication"),
        ("NetworkAuthentication", "/apis/policy.linkerd.io/v1alpha1/networkauthentications",
         "networkauthentication"),
    )},
}
# Which kinds' watches open first (the rest after): a big cluster's state is mostly these.
START_ORDER = {"Pod": 0, "EndpointSlice": 1, "Endpoints": 1, "ReplicaSet": 2, "Service": 3}
POLICY_KINDS = ("HTTPRoute", "GatewayHTTPRoute", "GRPCRoute", "AuthorizationPolicy",
                "ServerAuthorization", "MeshTLSAuthentication", "NetworkAuthentication")
