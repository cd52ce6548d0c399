"""Kubernetes objects, decoded once from their JSON/YAML shape into frozen values.

Every source (files, demo, sim, kube) hands plain Kubernetes-shaped mappings to
`decode_object`; everything downstream sees only the values below, so no part of
the system can tell the sources apart. Decoding is strict about what we use and
lenient about everything else: a field we rely on that is missing or mistyped
raises `ObjectError` naming the object, and the caller logs it and skips it.

What is not read is not kept: of a Pod, only what `bridge/pod_fields.py` names of its
annotations and environment; of a ReplicaSet or Job, its owners. Equal values that
many objects carry (a workload's labels, containers, owners) are kept once.
"""

from __future__ import annotations

import base64
import binascii
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from bridge import pod_fields
from bridge.decoding import Labels as Labels
from bridge.decoding import Meta as Meta
from bridge.decoding import ObjectError as ObjectError
from bridge.decoding import (
    Predecoded,
    SharedRaw,
    as_bool,
    as_ip,
    as_list,
    as_map,
    as_port,
    as_str,
    as_str_map,
    decode_meta,
    shared,
    shared_lookup,
    shared_map,
)
from bridge.decoding import display_name as display_name
from bridge.kinds import Kind, KindRegistry
from bridge.policy_objects import KINDS as POLICY_KINDS_DECODED
from bridge.policy_objects import PolicyObject


@dataclass(frozen=True, slots=True)
class ServicePort:
    name: str
    port: int
    target_port: int | str | None
    protocol: str = "TCP"
    app_protocol: str = ""


@dataclass(frozen=True, slots=True)
class Service:
    meta: Meta
    type: str = "ClusterIP"
    ports: tuple[ServicePort, ...] = ()
    cluster_ips: tuple[str, ...] = ()
    external_name: str = ""
    internal_traffic_local: bool = False
    # spec.selector; None when the Service has none or an empty one (its endpoints are
    # managed by hand).
    selector: Labels | None = None
    kind: str = "Service"

    def port(self, number: int) -> ServicePort | None:
        for p in self.ports:
            if p.port == number:
                return p
        return None


@dataclass(frozen=True, slots=True)
class SlicePort:
    name: str
    port: int
    app_protocol: str = ""


@dataclass(frozen=True, slots=True)
class TargetRef:
    kind: str
    name: str
    namespace: str


@dataclass(frozen=True, slots=True)
class SliceEndpoint:
    addresses: tuple[str, ...]
    ready: bool
    serving: bool
    terminating: bool
    hostname: str = ""
    node_name: str = ""
    zone: str | None = None
    for_zones: frozenset[str] | None = None
    target: TargetRef | None = None


@dataclass(frozen=True, slots=True)
class EndpointSlice:
    """An EndpointSlice; a v1 Endpoints object is decoded into one of these too."""

    meta: Meta
    service_name: str
    address_type: str  # IPv4 | IPv6 | "" (from the v1 Endpoints API: no family)
    ports: tuple[SlicePort, ...] | None
    endpoints: tuple[SliceEndpoint, ...]
    kind: str = "EndpointSlice"


@dataclass(frozen=True, slots=True)
class ContainerPort:
    name: str
    container_port: int
    host_port: int = 0


@dataclass(frozen=True, slots=True)
class Container:
    name: str
    ports: tuple[ContainerPort, ...] = ()
    env: Labels = field(default_factory=dict)
    # (port number or name, path) of each httpGet probe: the policy API authorizes them.
    http_probes: tuple[tuple[int | str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Pod:
    meta: Meta
    service_account: str = "default"
    node_name: str = ""
    host_network: bool = False
    containers: tuple[Container, ...] = ()
    init_containers: tuple[Container, ...] = ()
    phase: str = ""
    pod_ips: tuple[str, ...] = ()
    host_ip: str = ""
    kind: str = "Pod"

    def all_containers(self) -> tuple[Container, ...]:
        return self.init_containers + self.containers

    def container_port(self, name: str) -> int | None:
        """The number of the container port called `name` (port-list names resolve
        through it), if any container declares one."""
        for c in self.all_containers():
            for p in c.ports:
                if p.name == name:
                    return p.container_port
        return None


@dataclass(frozen=True, slots=True)
class Node:
    meta: Meta
    kind: str = "Node"

    @property
    def zone(self) -> str:
        return self.meta.labels.get("topology.kubernetes.io/zone", "")

    @property
    def region(self) -> str:
        return self.meta.labels.get("topology.kubernetes.io/region", "")


@dataclass(frozen=True, slots=True)
class ReplicaSet:
    meta: Meta
    kind: str = "ReplicaSet"


@dataclass(frozen=True, slots=True)
class Job:
    """Only its owner matters: a CronJob's pods are labelled after the CronJob."""

    meta: Meta
    kind: str = "Job"


@dataclass(frozen=True, slots=True)
class Server:
    """Linkerd's policy.linkerd.io Server: only what decides opaque protocol."""

    meta: Meta
    pod_selector: Labels | None
    port: int | str
    proxy_protocol: str = ""
    kind: str = "Server"
    access_policy: str = ""  # v1beta3: default authorizations added to the Server's own

    def selects(self, pod: Pod) -> bool:
        if self.pod_selector is None:
            return False
        return all(pod.meta.labels.get(k) == v for k, v in self.pod_selector.items())


@dataclass(frozen=True, slots=True)
class ServiceProfile:
    """Linkerd's linkerd.io/v1alpha2 ServiceProfile; the spec stays a mapping and is
    converted by the Linkerd layer, the only one that uses it."""

    meta: Meta
    spec: Mapping[str, Any]
    kind: str = "ServiceProfile"


@dataclass(frozen=True, slots=True)
class Namespace:
    meta: Meta
    kind: str = "Namespace"


# The one Secret type meshbridge reads: a linked cluster's credentials, as
# `linkerd multicluster link` writes them (docs/multicluster.md).
REMOTE_KUBECONFIG_SECRET_TYPE = "mirror.linkerd.io/remote-kubeconfig"


@dataclass(frozen=True, slots=True)
class Secret:
    """A Secret of type `mirror.linkerd.io/remote-kubeconfig`; Secrets of any other type
    are not decoded (nothing else is read, so nothing else is kept)."""

    meta: Meta
    data: Mapping[str, bytes]
    kind: str = "Secret"


KubeObject = (
    Service | EndpointSlice | Pod | Node | ReplicaSet | Job | Server | ServiceProfile
    | Namespace | Secret | PolicyObject
)

# Kinds we recognise but have no use for (logged at debug only).
IGNORED_KINDS = frozenset(
    {"Deployment", "StatefulSet", "DaemonSet", "CronJob", "ConfigMap",
     "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
)


def object_key(obj: KubeObject) -> tuple[str, str, str]:
    """(kind, namespace, name): the identity of an object within a source."""
    return (obj.kind, obj.meta.namespace, obj.meta.name)


# --------------------------------------------------------------------------- decoders


def _decode_service(raw: Mapping[str, Any]) -> Service:
    meta = decode_meta(raw, "Service", True)
    n = f"{meta.namespace}/{meta.name}"
    spec = as_map(raw.get("spec"), "Service", n, "spec")
    stype = as_str(spec.get("type"), "Service", n, "spec.type", "ClusterIP")
    ports = []
    # Kubernetes allows one port number once per protocol (kube-dns: 53/UDP and 53/TCP).
    seen: set[tuple[int, str]] = set()
    for i, p in enumerate(as_list(spec.get("ports"), "Service", n, "spec.ports")):
        p = as_map(p, "Service", n, f"spec.ports[{i}]")
        number = as_port(p.get("port"), "Service", n, f"spec.ports[{i}].port")
        proto = as_str(p.get("protocol"), "Service", n, "protocol", "TCP")
        if (number, proto) in seen:
            raise ObjectError("Service", n,
                              f"spec.ports[{i}].port {number}/{proto} is declared twice")
        seen.add((number, proto))
        tp = p.get("targetPort")
        if (tp is not None and not isinstance(tp, int | str)) or isinstance(tp, bool):
            raise ObjectError("Service", n, f"spec.ports[{i}].targetPort is not a port")
        ports.append(ServicePort(
            name=as_str(p.get("name"), "Service", n, f"spec.ports[{i}].name"),
            port=number,
            target_port=tp,
            protocol=proto,
            app_protocol=as_str(p.get("appProtocol"), "Service", n, "appProtocol"),
        ))
    ips = [x for x in as_list(spec.get("clusterIPs"), "Service", n, "spec.clusterIPs")]
    if not ips and spec.get("clusterIP"):
        ips = [spec.get("clusterIP")]
    cluster_ips = tuple(as_ip(x, "Service", n, "spec.clusterIPs") for x in ips if x != "None")
    return Service(
        meta=meta,
        type=stype,
        ports=tuple(ports),
        cluster_ips=cluster_ips,
        external_name=as_str(spec.get("externalName"), "Service", n, "spec.externalName"),
        internal_traffic_local=spec.get("internalTrafficPolicy") == "Local",
        # An empty selector is none (as the API's protobuf, which has no empty map).
        selector=(as_str_map(spec["selector"], "Service", n, "spec.selector")
                  if spec.get("selector") else None),
    )


def _decode_slice(raw: Mapping[str, Any]) -> EndpointSlice:
    meta = decode_meta(raw, "EndpointSlice", True)
    n = f"{meta.namespace}/{meta.name}"
    svc = meta.labels.get("kubernetes.io/service-name", "")
    if not svc:
        svc = next((o.name for o in meta.owners if o.kind == "Service"), "")
    if not svc:
        raise ObjectError("EndpointSlice", n,
                          "no kubernetes.io/service-name label or Service owner")
    family = as_str(raw.get("addressType"), "EndpointSlice", n, "addressType")
    if family not in ("IPv4", "IPv6"):
        raise ObjectError("EndpointSlice", n, f"addressType {family!r} is not served (IPv4/IPv6)")
    ports: tuple[SlicePort, ...] | None = None
    if raw.get("ports") is not None:
        plist = []
        for i, p in enumerate(as_list(raw.get("ports"), "EndpointSlice", n, "ports")):
            p = as_map(p, "EndpointSlice", n, f"ports[{i}]")
            plist.append(SlicePort(
                name=as_str(p.get("name"), "EndpointSlice", n, f"ports[{i}].name"),
                port=as_port(p.get("port"), "EndpointSlice", n, f"ports[{i}].port"),
                app_protocol=as_str(p.get("appProtocol"), "EndpointSlice", n, "appProtocol"),
            ))
        ports = tuple(plist)
    endpoints = []
    for i, e in enumerate(as_list(raw.get("endpoints"), "EndpointSlice", n, "endpoints")):
        where = f"endpoints[{i}]"
        e = as_map(e, "EndpointSlice", n, where)
        addrs = tuple(
            as_ip(a, "EndpointSlice", n, f"{where}.addresses")
            for a in as_list(e.get("addresses"), "EndpointSlice", n, f"{where}.addresses")
        )
        if not addrs:
            raise ObjectError("EndpointSlice", n, f"{where} has no addresses")
        for a in addrs:  # canonical (as_ip): an IPv6 address has a colon, IPv4 none
            if (":" in a) != (family == "IPv6"):
                raise ObjectError("EndpointSlice", n, f"{where} address {a} is not {family}")
        cond = as_map(e.get("conditions"), "EndpointSlice", n, f"{where}.conditions")
        # EndpointSlice API: ready and serving default to true, terminating to false.
        ready = as_bool(cond.get("ready"), "EndpointSlice", n, f"{where}.conditions.ready", True)
        terminating = as_bool(cond.get("terminating"), "EndpointSlice", n, "terminating", False)
        serving = as_bool(cond.get("serving"), "EndpointSlice", n, "serving", ready)
        hints = e.get("hints")
        for_zones: frozenset[str] | None = None
        if hints is not None:
            fz = as_list(as_map(hints, "EndpointSlice", n, "hints").get("forZones"),
                       "EndpointSlice", n, f"{where}.hints.forZones")
            for_zones = frozenset(
                as_str(as_map(z, "EndpointSlice", n, "forZones").get("name"),
                     "EndpointSlice", n, "forZones.name") for z in fz
            )
        target = None
        if e.get("targetRef") is not None:
            t = as_map(e.get("targetRef"), "EndpointSlice", n, f"{where}.targetRef")
            target = TargetRef(
                kind=sys.intern(as_str(t.get("kind"), "EndpointSlice", n, "targetRef.kind")),
                name=as_str(t.get("name"), "EndpointSlice", n, "targetRef.name"),
                namespace=sys.intern(as_str(t.get("namespace"), "EndpointSlice", n,
                                            "targetRef.namespace", meta.namespace)),
            )
        zone = e.get("zone")
        endpoints.append(SliceEndpoint(
            addresses=addrs,
            ready=ready,
            serving=serving,
            terminating=terminating,
            hostname=as_str(e.get("hostname"), "EndpointSlice", n, f"{where}.hostname"),
            node_name=sys.intern(as_str(e.get("nodeName"), "EndpointSlice", n,
                                        f"{where}.nodeName")),
            zone=(sys.intern(as_str(zone, "EndpointSlice", n, f"{where}.zone"))
                  if zone is not None else None),
            for_zones=for_zones,
            target=target,
        ))
    return EndpointSlice(meta, svc, family, ports, tuple(endpoints))


def _decode_endpoints(raw: Mapping[str, Any]) -> EndpointSlice:
    """v1 Endpoints, decoded as one slice of unknown family (Linkerd's slice-less mode).

    Each subset becomes its own group of endpoints sharing the subset's ports; since a
    slice carries one port list, multi-subset objects with differing ports are merged
    into the union of ports only when all subsets agree, otherwise rejected.
    """
    meta = decode_meta(raw, "Endpoints", True)
    n = f"{meta.namespace}/{meta.name}"
    subsets = as_list(raw.get("subsets"), "Endpoints", n, "subsets")
    ports: tuple[SlicePort, ...] | None = None
    endpoints: list[SliceEndpoint] = []
    for si, s in enumerate(subsets):
        s = as_map(s, "Endpoints", n, f"subsets[{si}]")
        sp = tuple(
            SlicePort(
                name=as_str(as_map(p, "Endpoints", n, "ports").get("name"), "Endpoints", n, "name"),
                port=as_port(p.get("port"), "Endpoints", n, f"subsets[{si}].ports.port"),
                app_protocol=as_str(p.get("appProtocol"), "Endpoints", n, "appProtocol"),
            )
            for p in as_list(s.get("ports"), "Endpoints", n, f"subsets[{si}].ports")
        )
        if ports is not None and set(sp) != set(ports):
            raise ObjectError("Endpoints", n, "subsets with different ports are not supported")
        ports = sp
        for ready, key in ((True, "addresses"), (False, "notReadyAddresses")):
            for ai, a in enumerate(as_list(s.get(key), "Endpoints", n, f"subsets[{si}].{key}")):
                a = as_map(a, "Endpoints", n, f"subsets[{si}].{key}[{ai}]")
                target = None
                if a.get("targetRef") is not None:
                    t = as_map(a.get("targetRef"), "Endpoints", n, "targetRef")
                    target = TargetRef(as_str(t.get("kind"), "Endpoints", n, "targetRef.kind"),
                                       as_str(t.get("name"), "Endpoints", n, "targetRef.name"),
                                       as_str(t.get("namespace"), "Endpoints", n,
                                            "targetRef.namespace", meta.namespace))
                node = a.get("nodeName")
                endpoints.append(SliceEndpoint(
                    addresses=(as_ip(a.get("ip"), "Endpoints", n, f"subsets[{si}].{key}.ip"),),
                    ready=ready,
                    serving=ready,
                    terminating=False,
                    hostname=as_str(a.get("hostname"), "Endpoints", n, "hostname"),
                    node_name=as_str(node, "Endpoints", n, "nodeName"),
                    target=target,
                ))
    return EndpointSlice(meta, meta.name, "", ports, tuple(endpoints), kind="Endpoints")


def decode_containers(raw: Any, n: str, path: str) -> tuple[Container, ...]:
    """A pod's containers (or init containers), each shared with equal ones."""
    out = []
    for i, c in enumerate(as_list(raw, "Pod", n, path)):
        if type(c) is SharedRaw and (known := getattr(c, "decoded", None)) is not None:
            out.append(known)
            continue
        # (Error paths are formatted only for an error: thousands of pods pass here.)
        where = f"{path}[{i}]"
        c = as_map(c, "Pod", n, where)
        name = as_str(c.get("name"), "Pod", n, where + ".name")
        ports: list[tuple[str, int, int]] = []
        for j, p in enumerate(as_list(c.get("ports"), "Pod", n, where + ".ports")):
            p = as_map(p, "Pod", n, where + ".ports[]")
            number, host = p.get("containerPort"), p.get("hostPort", 0)
            if type(number) is not int or not 0 < number < 65536:
                as_port(number, "Pod", n, f"{where}.ports[{j}].containerPort")
            if type(host) is not int or not 0 <= host < 65536:
                as_port(host, "Pod", n, f"{where}.ports[{j}].hostPort", allow_zero=True)
            ports.append((as_str(p.get("name"), "Pod", n, "ports.name"), cast(int, number),
                          cast(int, host)))
        env = []
        if name == pod_fields.PROXY_CONTAINER:  # no other container's is read
            for e in as_list(c.get("env"), "Pod", n, where + ".env"):
                e = as_map(e, "Pod", n, "env")
                if (isinstance(e.get("name"), str) and isinstance(e.get("value"), str)
                        and pod_fields.keeps_env(name, e["name"])):
                    env.append((e["name"], e["value"]))
        probes = []
        for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
            get = as_map(as_map(c.get(kind), "Pod", n, kind).get("httpGet"), "Pod", n, kind)
            if isinstance(get.get("port"), int | str) and not isinstance(get.get("port"), bool):
                probes.append((get["port"], str(get.get("path") or "/").split("?")[0]))
        # Looked up by its plain values first: a workload's next pod builds nothing.
        key = ("container", name, *ports, "env", *env, "probes", *probes)
        container = shared_lookup(key)
        if container is None:
            container = shared(Container(
                sys.intern(name), tuple(ContainerPort(*p) for p in ports),
                shared_map(dict(env)), tuple(probes)), key)
        if type(c) is SharedRaw:
            c.decoded = container
        out.append(container)
    return shared(tuple(out), ("containers", *map(id, out)))


def _decode_pod(raw: Mapping[str, Any]) -> Pod:
    meta = decode_meta(raw, "Pod", True, pod_fields.keeps_annotation)
    n = f"{meta.namespace}/{meta.name}"
    spec = as_map(raw.get("spec"), "Pod", n, "spec")
    status = as_map(raw.get("status"), "Pod", n, "status")
    ips = [
        as_map(x, "Pod", n, "status.podIPs").get("ip")
        for x in as_list(status.get("podIPs"), "Pod", n, "status.podIPs")
    ]
    return make_pod(
        meta,
        service_account=as_str(spec.get("serviceAccountName"), "Pod", n,
                               "spec.serviceAccountName"),
        node_name=as_str(spec.get("nodeName"), "Pod", n, "spec.nodeName"),
        host_network=as_bool(spec.get("hostNetwork"), "Pod", n, "spec.hostNetwork", False),
        containers=decode_containers(spec.get("containers"), n, "spec.containers"),
        init_containers=decode_containers(spec.get("initContainers"), n,
                                          "spec.initContainers"),
        phase=as_str(status.get("phase"), "Pod", n, "status.phase"),
        pod_ips=ips, pod_ip=status.get("podIP"), host_ip=status.get("hostIP"))


def make_pod(meta: Meta, *, service_account: str, node_name: str, host_network: bool,
             containers: tuple[Container, ...], init_containers: tuple[Container, ...],
             phase: str, pod_ips: list[Any], pod_ip: Any, host_ip: Any) -> Pod:
    """A Pod from its parts, however a source read them (a manifest's mapping, the
    API's protobuf: bridge/sources/kube_wire.py): the one place a Pod's rules live."""
    n = f"{meta.namespace}/{meta.name}"
    ips = pod_ips
    if not ips and pod_ip:
        ips = [pod_ip]
    if not ips:
        raise ObjectError("Pod", n, "has no IP (status.podIP/podIPs unset)")
    return Pod(
        meta=meta,
        service_account=sys.intern(service_account or "default"),
        node_name=sys.intern(node_name),
        host_network=host_network,
        containers=containers,
        init_containers=init_containers,
        phase=sys.intern(phase),
        pod_ips=tuple(as_ip(x, "Pod", n, "status.podIPs") for x in ips),
        host_ip=sys.intern(as_ip(host_ip, "Pod", n, "status.hostIP")) if host_ip else "",
    )


def _owners_only(meta: Meta) -> Meta:
    return Meta(meta.name, meta.namespace, meta.resource_version, owners=meta.owners,
                deleting=meta.deleting)


def _decode_server(raw: Mapping[str, Any]) -> Server:
    meta = decode_meta(raw, "Server", True)
    n = f"{meta.namespace}/{meta.name}"
    spec = as_map(raw.get("spec"), "Server", n, "spec")
    port = spec.get("port")
    if isinstance(port, bool) or not isinstance(port, int | str) or port in ("", 0):
        raise ObjectError("Server", n, f"spec.port must be a port number or name, got {port!r}")
    if isinstance(port, int):
        port = as_port(port, "Server", n, "spec.port")
    sel = spec.get("podSelector")
    selector: dict[str, str] | None = None
    if sel is not None:
        selector = as_str_map(as_map(sel, "Server", n, "spec.podSelector").get("matchLabels"),
                            "Server", n, "spec.podSelector.matchLabels")
    return Server(meta, selector, port,
                  as_str(spec.get("proxyProtocol"), "Server", n, "spec.proxyProtocol"),
                  access_policy=as_str(spec.get("accessPolicy"), "Server", n, "spec.accessPolicy"))


def _decode_profile(raw: Mapping[str, Any]) -> ServiceProfile:
    meta = decode_meta(raw, "ServiceProfile", True)
    spec = as_map(raw.get("spec"), "ServiceProfile", f"{meta.namespace}/{meta.name}", "spec")
    return ServiceProfile(meta, spec)


def _decode_secret(raw: Mapping[str, Any]) -> Secret | None:
    meta = decode_meta(raw, "Secret", True)
    n = f"{meta.namespace}/{meta.name}"
    if raw.get("type") != REMOTE_KUBECONFIG_SECRET_TYPE:
        return None
    data: dict[str, bytes] = {}
    for key, value in as_str_map(raw.get("data"), "Secret", n, "data").items():
        try:
            data[key] = base64.b64decode(value, validate=True)
        except binascii.Error:
            raise ObjectError("Secret", n, f"data.{key} is not base64") from None
    # stringData: what a manifest may carry instead (the API server folds it into data).
    for key, text in as_str_map(raw.get("stringData"), "Secret", n, "stringData").items():
        data[key] = text.encode()
    return Secret(meta, data)


def _cluster_scoped(meta: Meta) -> Meta:
    return Meta(name=meta.name, namespace="")


CORE_KINDS: tuple[Kind, ...] = (
    Kind("Service", _decode_service, lambda meta: Service(meta)),
    Kind("EndpointSlice", _decode_slice, lambda meta: EndpointSlice(meta, "", "", None, ())),
    Kind("Endpoints", _decode_endpoints,
         lambda meta: EndpointSlice(meta, "", "", None, (), kind="Endpoints")),
    Kind("Pod", _decode_pod, lambda meta: Pod(meta)),
    Kind("Node", lambda raw: Node(decode_meta(raw, "Node", False)),
         lambda meta: Node(_cluster_scoped(meta))),
    # Read for their owners only (a pod's workload): no labels, no annotations kept.
    Kind("ReplicaSet",
         lambda raw: ReplicaSet(_owners_only(decode_meta(raw, "ReplicaSet", True))),
         lambda meta: ReplicaSet(meta)),
    Kind("Job", lambda raw: Job(_owners_only(decode_meta(raw, "Job", True))),
         lambda meta: Job(meta)),
    Kind("Server", _decode_server, lambda meta: Server(meta, None, 0)),
    Kind("ServiceProfile", _decode_profile, lambda meta: ServiceProfile(meta, {})),
    Kind("Namespace", lambda raw: Namespace(decode_meta(raw, "Namespace", False)),
         lambda meta: Namespace(_cluster_scoped(meta))),
    Kind("Secret", _decode_secret, lambda meta: Secret(meta, {})),
)

# Every kind any source may send: the core's and Linkerd's policy kinds.
KINDS = KindRegistry(CORE_KINDS, POLICY_KINDS_DECODED)
SUPPORTED_KINDS = KINDS.names()


def decode_object(raw: Any, kind: str | None = None) -> KubeObject | None:
    """Decode one Kubernetes object; None for a known kind we deliberately ignore.

    `kind` overrides `raw["kind"]` (list responses of the API omit it on items).
    Raises ObjectError for anything we cannot use.
    """
    if type(raw) is Predecoded:  # decoded by its source already (kube_wire's Pods)
        decoded: KubeObject | None = raw.result()
        return decoded
    if not isinstance(raw, Mapping):
        raise ObjectError("<unknown>", "<unnamed>", f"not a mapping but {type(raw).__name__}")
    k = kind or raw.get("kind")
    if not isinstance(k, str) or not k:
        raise ObjectError("<unknown>", display_name(raw), "kind is missing")
    known = KINDS.get(k)
    if known is None:
        if k in IGNORED_KINDS:
            return None
        md = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
        assert isinstance(md, Mapping)
        raise ObjectError(k, str(md.get("name", "<unnamed>")), f"unsupported kind {k!r}")
    try:
        obj: KubeObject = known.decode(raw)
    except ObjectError:
        raise
    except (TypeError, ValueError, AttributeError) as e:  # defensive: never crash a source
        raise ObjectError(k, display_name(raw), f"malformed: {e}") from None
    return obj


def tombstone(kind: str, namespace: str, name: str) -> KubeObject | None:
    """A key-only object of `kind`, enough for the cache to delete what it holds under
    that key when the real object can no longer be decoded."""
    known = KINDS.get(kind)
    if known is None:
        return None
    made: KubeObject = known.tombstone(Meta(name=name, namespace=namespace))
    return made
