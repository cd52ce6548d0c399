"""Enrichment: what both protocols need to know about an endpoint beyond its address.

The rules follow Linkerd 2.20's destination controller (Linkerd §3.3-3.6, §4.4, §4.8),
computed once per endpoint and per change, never per subscriber. Everything here is
protocol-neutral: the Linkerd layer turns it into `WeightedAddr` fields, the xDS layer
into endpoint metadata.
"""

from __future__ import annotations

from bridge.cluster import Cluster
from bridge.model import EndpointId, Enrichment, MeshConfig, ProtocolHint
from bridge.objects import EndpointSlice, Pod, Server, SliceEndpoint
from bridge.pod_fields import ENV_ADMIN, ENV_CONTROL, ENV_INBOUND, PROXY_CONTAINER
from bridge.port_sets import PortSpecError, parse_port_set, port_of_listen_addr

CONTROL_PLANE_NS_LABEL = "linkerd.io/control-plane-ns"
OPAQUE_PORTS_ANNOTATION = "config.linkerd.io/opaque-ports"
SKIP_INBOUND_ANNOTATION = "config.linkerd.io/skip-inbound-ports"
GATEWAY_IDENTITY_ANNOTATION = "mirror.linkerd.io/remote-gateway-identity"
REMOTE_FQN_ANNOTATION = "mirror.linkerd.io/remote-svc-fq-name"

# Owners a ReplicaSet or Job is looked through to (Linkerd §3.3).
_GRANDPARENT_KINDS = frozenset({"Deployment", "StatefulSet", "DaemonSet", "Job"})


class EnrichError(ValueError):
    """This endpoint cannot be served as Linkerd would; it is logged and skipped."""


def resolve_owner(pod: Pod, cluster: Cluster) -> tuple[str, str]:
    """(kind, name) of the workload that owns a pod, looking through ReplicaSets to their
    Deployment (etc.) and Jobs to their CronJob."""
    if len(pod.meta.owners) != 1:
        return ("pod", pod.meta.name)
    owner = pod.meta.owners[0]
    if owner.kind == "ReplicaSet":
        rs = cluster.replicasets.get((pod.meta.namespace, owner.name))
        if rs is None:
            return ("replicaset", owner.name)
        if len(rs.meta.owners) == 1 and rs.meta.owners[0].kind in _GRANDPARENT_KINDS:
            return (rs.meta.owners[0].kind.lower(), rs.meta.owners[0].name)
        return ("replicaset", owner.name)
    if owner.kind == "Job":
        job = cluster.jobs.get((pod.meta.namespace, owner.name))
        if job is not None and len(job.meta.owners) == 1:
            return (job.meta.owners[0].kind.lower(), job.meta.owners[0].name)
        return ("job", owner.name)
    return (owner.kind.lower(), owner.name)


def owner_label(kind: str) -> str:
    # Prometheus reserves `job`, so Linkerd names the owner label `k8s_job`.
    return "k8s_job" if kind == "job" else kind


def pod_opaque_ports(pod: Pod, config: MeshConfig) -> frozenset[int]:
    """The pod's opaque ports: its annotation (numbers, ranges, container port names),
    else the controller defaults. An empty annotation means no opaque ports."""
    value = pod.meta.annotations.get(OPAQUE_PORTS_ANNOTATION)
    if value is None:
        return config.default_opaque_ports

    try:
        return parse_port_set(value, pod.container_port)
    except PortSpecError as e:
        raise EnrichError(f"pod {pod.meta.namespace}/{pod.meta.name}: {e}") from None


def server_marks_opaque(servers: list[Server], pod: Pod, port: int) -> bool:
    """Whether any Server in the pod's namespace makes this pod port opaque (§4.8)."""
    for s in servers:
        if s.proxy_protocol != "opaque" or not s.selects(pod):
            continue
        if isinstance(s.port, int):
            if s.port == port:
                return True
            continue
        for c in pod.all_containers():
            for cp in c.ports:
                if cp.name == s.port and port in (cp.container_port, cp.host_port):
                    return True
    return False


def _proxy_env(pod: Pod) -> dict[str, str] | None:
    # Native sidecars live in initContainers, so look there first.
    for c in pod.all_containers():
        if c.name == PROXY_CONTAINER:
            return dict(c.env)
    return None


def enrich_pod_endpoint(
    pod: Pod, port: int, zone: str | None, cluster: Cluster, config: MeshConfig
) -> Enrichment:
    kind, name = resolve_owner(pod, cluster)
    labels: dict[str, str] = {"pod": pod.meta.name, owner_label(kind): name}
    labels["serviceaccount"] = pod.service_account or "default"
    cp_ns = pod.meta.labels.get(CONTROL_PLANE_NS_LABEL, "")
    if cp_ns:
        labels["control_plane_ns"] = cp_ns
    if pth := pod.meta.labels.get("pod-template-hash", ""):
        labels["pod_template_hash"] = pth
    labels["zone"] = zone or ""
    metric_labels = tuple(sorted(labels.items()))

    try:
        skipped = port in parse_port_set(pod.meta.annotations.get(SKIP_INBOUND_ANNOTATION, ""))
    except PortSpecError as e:
        raise EnrichError(f"pod {pod.meta.namespace}/{pod.meta.name}: {e}") from None
    if not cp_ns or skipped:
        return Enrichment(owner_kind=kind, owner_name=name, metric_labels=metric_labels,
                          opaque=port in pod_opaque_ports(pod, config))

    env = _proxy_env(pod)
    if env is None:
        raise EnrichError(f"meshed pod {pod.meta.namespace}/{pod.meta.name} has no "
                          f"{PROXY_CONTAINER} container")
    meta_ports: set[int] = set()
    for var in (ENV_ADMIN, ENV_CONTROL):
        p = port_of_listen_addr(env.get(var, ""))
        if p is None:
            raise EnrichError(f"meshed pod {pod.meta.namespace}/{pod.meta.name}: proxy env "
                              f"{var} is missing or unparsable")
        meta_ports.add(p)
    opaque = port in pod_opaque_ports(pod, config) or server_marks_opaque(
        list(cluster.servers_in(pod.meta.namespace)), pod, port
    )
    transport: int | None = None
    if port not in meta_ports and (config.force_opaque_transport or opaque):
        transport = port_of_listen_addr(env.get(ENV_INBOUND, ""))
        if transport is None:
            raise EnrichError(f"meshed pod {pod.meta.namespace}/{pod.meta.name}: proxy env "
                              f"{ENV_INBOUND} is missing or unparsable")
    hint = ProtocolHint(
        opaque=opaque,
        h2=not opaque and config.enable_h2_upgrade,
        opaque_transport_port=transport,
    )
    identity = ""
    if config.trust_domain and cp_ns == config.controller_namespace:
        identity = (
            f"{pod.service_account or 'default'}.{pod.meta.namespace or 'default'}"
            f".serviceaccount.identity.{config.controller_namespace}.{config.trust_domain}"
        )
    return Enrichment(
        identity=identity,
        server_name=identity,
        hint=hint,
        meshed_http2=config.meshed_http2_params is not None,
        opaque=opaque,
        owner_kind=kind,
        owner_name=name,
        metric_labels=metric_labels,
    )


def enrich_address_endpoint(
    slice_: EndpointSlice, requested_port: int, config: MeshConfig
) -> Enrichment:
    """An address with no pod behind it (a mirrored or gateway endpoint, a VM): its
    identity and authority override come from the slice's annotations (§3.5)."""
    identity = slice_.meta.annotations.get(GATEWAY_IDENTITY_ANNOTATION, "")
    fq = slice_.meta.annotations.get(REMOTE_FQN_ANNOTATION)
    hint = ProtocolHint(h2=config.enable_h2_upgrade) if identity else None
    return Enrichment(
        identity=identity,
        hint=hint,
        meshed_http2=bool(identity) and config.meshed_http2_params is not None,
        authority_override=f"{fq}:{requested_port}" if fq else "",
    )


def address_endpoint_id(
    slice_: EndpointSlice, ep: SliceEndpoint, ip: str, port: int
) -> EndpointId:
    name = f"{slice_.service_name}-{ip}-{port}" + (f"-{ep.hostname}" if ep.hostname else "")
    return EndpointId("address", slice_.meta.namespace, name)
