"""Kubernetes objects, decoded once from their JSON/YAML shape into frozen values.

Every source (files, demo, sim, kube) hands plain Kubernetes-shaped mappings to
`decode_object`; everything downstream sees only the values below, so no part of
the system can tell the sources apart. Decoding is strict about what we use and
lenient about everything else: a field we rely on that is missing or mistyped
raises `ObjectError` naming the object, and the caller logs it and skips it.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Union

Labels = Mapping[str, str]


class ObjectError(ValueError):
    """An object we cannot use; the message names the field that is wrong."""

    def __init__(self, kind: str, name: str, reason: str) -> None:
        super().__init__(f"{kind} {name}: {reason}")
        self.kind = kind
        self.name = name
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Meta:
    name: str
    namespace: str
    resource_version: str = ""
    labels: Labels = field(default_factory=dict)
    annotations: Labels = field(default_factory=dict)
    owners: tuple[OwnerRef, ...] = ()
    deleting: bool = False


@dataclass(frozen=True, slots=True)
class OwnerRef:
    kind: str
    name: str


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
    # spec.selector; None when the Service has none (its endpoints are managed by hand).
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


# Linkerd's policy kinds are decoded in their own module (its DECODERS and TOMBSTONES
# are looked up when used: either module may be imported first).
from bridge import policy_objects as _policy  # noqa: E402

if TYPE_CHECKING:
    from bridge.policy_objects import PolicyObject

KubeObject = Union[  # typing.Union: one member is a forward reference
    Service, EndpointSlice, Pod, Node, ReplicaSet, Job, Server, ServiceProfile, Namespace,
    Secret, "PolicyObject",
]

# Kinds we decode, and the ones we recognise but have no use for (logged at debug only).
IGNORED_KINDS = frozenset(
    {"Deployment", "StatefulSet", "DaemonSet", "CronJob", "ConfigMap",
     "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
)


def object_key(obj: KubeObject) -> tuple[str, str, str]:
    """(kind, namespace, name): the identity of an object within a source."""
    return (obj.kind, obj.meta.namespace, obj.meta.name)


# --------------------------------------------------------------------------- helpers


def _map(raw: Any, kind: str, name: str, path: str) -> Mapping[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ObjectError(kind, name, f"{path} must be a mapping, got {type(raw).__name__}")
    return raw


def _list(raw: Any, kind: str, name: str, path: str) -> list[Any]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ObjectError(kind, name, f"{path} must be a list, got {type(raw).__name__}")
    return raw


def _str(raw: Any, kind: str, name: str, path: str, default: str = "") -> str:
    if raw is None:
        return default
    if not isinstance(raw, str):
        raise ObjectError(kind, name, f"{path} must be a string, got {raw!r}")
    return raw


def _bool(raw: Any, kind: str, name: str, path: str, default: bool) -> bool:
    if raw is None:
        return default
    if not isinstance(raw, bool):
        raise ObjectError(kind, name, f"{path} must be true or false, got {raw!r}")
    return raw


def _port(raw: Any, kind: str, name: str, path: str, allow_zero: bool = False) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise ObjectError(kind, name, f"{path} must be a port number, got {raw!r}")
    low = 0 if allow_zero else 1
    if not low <= raw <= 65535:
        raise ObjectError(kind, name, f"{path} {raw} is out of range")
    return raw


def _str_map(raw: Any, kind: str, name: str, path: str) -> dict[str, str]:
    m = _map(raw, kind, name, path)
    out: dict[str, str] = {}
    for k, v in m.items():
        if not isinstance(k, str) or not isinstance(v, str | int | float | bool):
            raise ObjectError(kind, name, f"{path}.{k} must be a string")
        out[k] = v if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)
    return out


def _ip(raw: Any, kind: str, name: str, path: str) -> str:
    text = _str(raw, kind, name, path)
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise ObjectError(kind, name, f"{path} {text!r} is not an IP address") from None


def _meta(raw: Mapping[str, Any], kind: str, namespaced: bool) -> Meta:
    md = raw.get("metadata")
    if not isinstance(md, Mapping):
        raise ObjectError(kind, "<unnamed>", "metadata is missing")
    name = md.get("name")
    if not isinstance(name, str) or not name:
        raise ObjectError(kind, "<unnamed>", "metadata.name is missing")
    ns = _str(md.get("namespace"), kind, name, "metadata.namespace")
    if namespaced and not ns:
        ns = "default"
    full = f"{ns}/{name}" if ns else name
    owners = []
    for i, o in enumerate(_list(md.get("ownerReferences"), kind, full, "ownerReferences")):
        o = _map(o, kind, full, f"ownerReferences[{i}]")
        owners.append(OwnerRef(_str(o.get("kind"), kind, full, "ownerReferences.kind"),
                               _str(o.get("name"), kind, full, "ownerReferences.name")))
    rv = md.get("resourceVersion")
    return Meta(
        name=name,
        namespace=ns if namespaced else "",
        resource_version=str(rv) if rv is not None else "",
        labels=_str_map(md.get("labels"), kind, full, "metadata.labels"),
        annotations=_str_map(md.get("annotations"), kind, full, "metadata.annotations"),
        owners=tuple(owners),
        deleting=md.get("deletionTimestamp") is not None,
    )


def display_name(raw: Any) -> str:
    """`kind ns/name` of a raw object, as well as can be told, for log lines."""
    if not isinstance(raw, Mapping):
        return f"<{type(raw).__name__}>"
    md = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
    assert isinstance(md, Mapping)
    name, ns = md.get("name", "<unnamed>"), md.get("namespace")
    return f"{raw.get('kind', '<no kind>')} {ns + '/' if isinstance(ns, str) else ''}{name}"


# --------------------------------------------------------------------------- decoders


def _decode_service(raw: Mapping[str, Any]) -> Service:
    meta = _meta(raw, "Service", True)
    n = f"{meta.namespace}/{meta.name}"
    spec = _map(raw.get("spec"), "Service", n, "spec")
    stype = _str(spec.get("type"), "Service", n, "spec.type", "ClusterIP")
    ports = []
    # Kubernetes allows one port number once per protocol (kube-dns: 53/UDP and 53/TCP).
    seen: set[tuple[int, str]] = set()
    for i, p in enumerate(_list(spec.get("ports"), "Service", n, "spec.ports")):
        p = _map(p, "Service", n, f"spec.ports[{i}]")
        number = _port(p.get("port"), "Service", n, f"spec.ports[{i}].port")
        proto = _str(p.get("protocol"), "Service", n, "protocol", "TCP")
        if (number, proto) in seen:
            raise ObjectError("Service", n,
                              f"spec.ports[{i}].port {number}/{proto} is declared twice")
        seen.add((number, proto))
        tp = p.get("targetPort")
        if (tp is not None and not isinstance(tp, int | str)) or isinstance(tp, bool):
            raise ObjectError("Service", n, f"spec.ports[{i}].targetPort is not a port")
        ports.append(ServicePort(
            name=_str(p.get("name"), "Service", n, f"spec.ports[{i}].name"),
            port=number,
            target_port=tp,
            protocol=proto,
            app_protocol=_str(p.get("appProtocol"), "Service", n, "appProtocol"),
        ))
    ips = [x for x in _list(spec.get("clusterIPs"), "Service", n, "spec.clusterIPs")]
    if not ips and spec.get("clusterIP"):
        ips = [spec.get("clusterIP")]
    cluster_ips = tuple(_ip(x, "Service", n, "spec.clusterIPs") for x in ips if x != "None")
    return Service(
        meta=meta,
        type=stype,
        ports=tuple(ports),
        cluster_ips=cluster_ips,
        external_name=_str(spec.get("externalName"), "Service", n, "spec.externalName"),
        internal_traffic_local=spec.get("internalTrafficPolicy") == "Local",
        selector=(_str_map(spec["selector"], "Service", n, "spec.selector")
                  if spec.get("selector") is not None else None),
    )


def _decode_slice(raw: Mapping[str, Any]) -> EndpointSlice:
    meta = _meta(raw, "EndpointSlice", True)
    n = f"{meta.namespace}/{meta.name}"
    svc = meta.labels.get("kubernetes.io/service-name", "")
    if not svc:
        svc = next((o.name for o in meta.owners if o.kind == "Service"), "")
    if not svc:
        raise ObjectError("EndpointSlice", n,
                          "no kubernetes.io/service-name label or Service owner")
    family = _str(raw.get("addressType"), "EndpointSlice", n, "addressType")
    if family not in ("IPv4", "IPv6"):
        raise ObjectError("EndpointSlice", n, f"addressType {family!r} is not served (IPv4/IPv6)")
    ports: tuple[SlicePort, ...] | None = None
    if raw.get("ports") is not None:
        plist = []
        for i, p in enumerate(_list(raw.get("ports"), "EndpointSlice", n, "ports")):
            p = _map(p, "EndpointSlice", n, f"ports[{i}]")
            plist.append(SlicePort(
                name=_str(p.get("name"), "EndpointSlice", n, f"ports[{i}].name"),
                port=_port(p.get("port"), "EndpointSlice", n, f"ports[{i}].port"),
                app_protocol=_str(p.get("appProtocol"), "EndpointSlice", n, "appProtocol"),
            ))
        ports = tuple(plist)
    endpoints = []
    for i, e in enumerate(_list(raw.get("endpoints"), "EndpointSlice", n, "endpoints")):
        where = f"endpoints[{i}]"
        e = _map(e, "EndpointSlice", n, where)
        addrs = tuple(
            _ip(a, "EndpointSlice", n, f"{where}.addresses")
            for a in _list(e.get("addresses"), "EndpointSlice", n, f"{where}.addresses")
        )
        if not addrs:
            raise ObjectError("EndpointSlice", n, f"{where} has no addresses")
        for a in addrs:
            if (ipaddress.ip_address(a).version == 6) != (family == "IPv6"):
                raise ObjectError("EndpointSlice", n, f"{where} address {a} is not {family}")
        cond = _map(e.get("conditions"), "EndpointSlice", n, f"{where}.conditions")
        # EndpointSlice API: ready and serving default to true, terminating to false.
        ready = _bool(cond.get("ready"), "EndpointSlice", n, f"{where}.conditions.ready", True)
        terminating = _bool(cond.get("terminating"), "EndpointSlice", n, "terminating", False)
        serving = _bool(cond.get("serving"), "EndpointSlice", n, "serving", ready)
        hints = e.get("hints")
        for_zones: frozenset[str] | None = None
        if hints is not None:
            fz = _list(_map(hints, "EndpointSlice", n, "hints").get("forZones"),
                       "EndpointSlice", n, f"{where}.hints.forZones")
            for_zones = frozenset(
                _str(_map(z, "EndpointSlice", n, "forZones").get("name"),
                     "EndpointSlice", n, "forZones.name") for z in fz
            )
        target = None
        if e.get("targetRef") is not None:
            t = _map(e.get("targetRef"), "EndpointSlice", n, f"{where}.targetRef")
            target = TargetRef(
                kind=_str(t.get("kind"), "EndpointSlice", n, "targetRef.kind"),
                name=_str(t.get("name"), "EndpointSlice", n, "targetRef.name"),
                namespace=_str(t.get("namespace"), "EndpointSlice", n, "targetRef.namespace",
                               meta.namespace),
            )
        zone = e.get("zone")
        endpoints.append(SliceEndpoint(
            addresses=addrs,
            ready=ready,
            serving=serving,
            terminating=terminating,
            hostname=_str(e.get("hostname"), "EndpointSlice", n, f"{where}.hostname"),
            node_name=_str(e.get("nodeName"), "EndpointSlice", n, f"{where}.nodeName"),
            zone=_str(zone, "EndpointSlice", n, f"{where}.zone") if zone is not None else None,
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
    meta = _meta(raw, "Endpoints", True)
    n = f"{meta.namespace}/{meta.name}"
    subsets = _list(raw.get("subsets"), "Endpoints", n, "subsets")
    ports: tuple[SlicePort, ...] | None = None
    endpoints: list[SliceEndpoint] = []
    for si, s in enumerate(subsets):
        s = _map(s, "Endpoints", n, f"subsets[{si}]")
        sp = tuple(
            SlicePort(
                name=_str(_map(p, "Endpoints", n, "ports").get("name"), "Endpoints", n, "name"),
                port=_port(p.get("port"), "Endpoints", n, f"subsets[{si}].ports.port"),
                app_protocol=_str(p.get("appProtocol"), "Endpoints", n, "appProtocol"),
            )
            for p in _list(s.get("ports"), "Endpoints", n, f"subsets[{si}].ports")
        )
        if ports is not None and set(sp) != set(ports):
            raise ObjectError("Endpoints", n, "subsets with different ports are not supported")
        ports = sp
        for ready, key in ((True, "addresses"), (False, "notReadyAddresses")):
            for ai, a in enumerate(_list(s.get(key), "Endpoints", n, f"subsets[{si}].{key}")):
                a = _map(a, "Endpoints", n, f"subsets[{si}].{key}[{ai}]")
                target = None
                if a.get("targetRef") is not None:
                    t = _map(a.get("targetRef"), "Endpoints", n, "targetRef")
                    target = TargetRef(_str(t.get("kind"), "Endpoints", n, "targetRef.kind"),
                                       _str(t.get("name"), "Endpoints", n, "targetRef.name"),
                                       _str(t.get("namespace"), "Endpoints", n,
                                            "targetRef.namespace", meta.namespace))
                node = a.get("nodeName")
                endpoints.append(SliceEndpoint(
                    addresses=(_ip(a.get("ip"), "Endpoints", n, f"subsets[{si}].{key}.ip"),),
                    ready=ready,
                    serving=ready,
                    terminating=False,
                    hostname=_str(a.get("hostname"), "Endpoints", n, "hostname"),
                    node_name=_str(node, "Endpoints", n, "nodeName"),
                    target=target,
                ))
    return EndpointSlice(meta, meta.name, "", ports, tuple(endpoints), kind="Endpoints")


def _decode_containers(raw: Any, n: str, path: str) -> tuple[Container, ...]:
    out = []
    for i, c in enumerate(_list(raw, "Pod", n, path)):
        c = _map(c, "Pod", n, f"{path}[{i}]")
        ports = []
        for j, p in enumerate(_list(c.get("ports"), "Pod", n, f"{path}[{i}].ports")):
            p = _map(p, "Pod", n, f"{path}[{i}].ports[{j}]")
            ports.append(ContainerPort(
                name=_str(p.get("name"), "Pod", n, "ports.name"),
                container_port=_port(p.get("containerPort"), "Pod", n,
                                     f"{path}[{i}].ports[{j}].containerPort"),
                host_port=_port(p.get("hostPort", 0), "Pod", n, "hostPort", allow_zero=True),
            ))
        env = {}
        for e in _list(c.get("env"), "Pod", n, f"{path}[{i}].env"):
            e = _map(e, "Pod", n, "env")
            if isinstance(e.get("name"), str) and isinstance(e.get("value"), str):
                env[e["name"]] = e["value"]
        probes = []
        for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
            get = _map(_map(c.get(kind), "Pod", n, kind).get("httpGet"), "Pod", n, kind)
            if isinstance(get.get("port"), int | str) and not isinstance(get.get("port"), bool):
                probes.append((get["port"], str(get.get("path") or "/").split("?")[0]))
        out.append(Container(_str(c.get("name"), "Pod", n, f"{path}[{i}].name"),
                             tuple(ports), env, tuple(probes)))
    return tuple(out)


def _decode_pod(raw: Mapping[str, Any]) -> Pod:
    meta = _meta(raw, "Pod", True)
    n = f"{meta.namespace}/{meta.name}"
    spec = _map(raw.get("spec"), "Pod", n, "spec")
    status = _map(raw.get("status"), "Pod", n, "status")
    ips = [
        _map(x, "Pod", n, "status.podIPs").get("ip")
        for x in _list(status.get("podIPs"), "Pod", n, "status.podIPs")
    ]
    if not ips and status.get("podIP"):
        ips = [status.get("podIP")]
    if not ips:
        raise ObjectError("Pod", n, "has no IP (status.podIP/podIPs unset)")
    host_ip = status.get("hostIP")
    return Pod(
        meta=meta,
        service_account=_str(spec.get("serviceAccountName"), "Pod", n,
                             "spec.serviceAccountName") or "default",
        node_name=_str(spec.get("nodeName"), "Pod", n, "spec.nodeName"),
        host_network=_bool(spec.get("hostNetwork"), "Pod", n, "spec.hostNetwork", False),
        containers=_decode_containers(spec.get("containers"), n, "spec.containers"),
        init_containers=_decode_containers(spec.get("initContainers"), n,
                                           "spec.initContainers"),
        phase=_str(status.get("phase"), "Pod", n, "status.phase"),
        pod_ips=tuple(_ip(x, "Pod", n, "status.podIPs") for x in ips),
        host_ip=_ip(host_ip, "Pod", n, "status.hostIP") if host_ip else "",
    )


def _decode_server(raw: Mapping[str, Any]) -> Server:
    meta = _meta(raw, "Server", True)
    n = f"{meta.namespace}/{meta.name}"
    spec = _map(raw.get("spec"), "Server", n, "spec")
    port = spec.get("port")
    if isinstance(port, bool) or not isinstance(port, int | str) or port in ("", 0):
        raise ObjectError("Server", n, f"spec.port must be a port number or name, got {port!r}")
    if isinstance(port, int):
        port = _port(port, "Server", n, "spec.port")
    sel = spec.get("podSelector")
    selector: dict[str, str] | None = None
    if sel is not None:
        selector = _str_map(_map(sel, "Server", n, "spec.podSelector").get("matchLabels"),
                            "Server", n, "spec.podSelector.matchLabels")
    return Server(meta, selector, port,
                  _str(spec.get("proxyProtocol"), "Server", n, "spec.proxyProtocol"),
                  access_policy=_str(spec.get("accessPolicy"), "Server", n, "spec.accessPolicy"))


def _decode_profile(raw: Mapping[str, Any]) -> ServiceProfile:
    meta = _meta(raw, "ServiceProfile", True)
    spec = _map(raw.get("spec"), "ServiceProfile", f"{meta.namespace}/{meta.name}", "spec")
    return ServiceProfile(meta, spec)


def _decode_secret(raw: Mapping[str, Any]) -> Secret | None:
    meta = _meta(raw, "Secret", True)
    n = f"{meta.namespace}/{meta.name}"
    if raw.get("type") != REMOTE_KUBECONFIG_SECRET_TYPE:
        return None
    data: dict[str, bytes] = {}
    for key, value in _str_map(raw.get("data"), "Secret", n, "data").items():
        try:
            data[key] = base64.b64decode(value, validate=True)
        except binascii.Error:
            raise ObjectError("Secret", n, f"data.{key} is not base64") from None
    # stringData: what a manifest may carry instead (the API server folds it into data).
    for key, text in _str_map(raw.get("stringData"), "Secret", n, "stringData").items():
        data[key] = text.encode()
    return Secret(meta, data)


_DECODERS: dict[str, Any] = {
    "Service": _decode_service,
    "EndpointSlice": _decode_slice,
    "Endpoints": _decode_endpoints,
    "Pod": _decode_pod,
    "Node": lambda raw: Node(_meta(raw, "Node", False)),
    "ReplicaSet": lambda raw: ReplicaSet(_meta(raw, "ReplicaSet", True)),
    "Job": lambda raw: Job(_meta(raw, "Job", True)),
    "Server": _decode_server,
    "ServiceProfile": _decode_profile,
    "Namespace": lambda raw: Namespace(_meta(raw, "Namespace", False)),
    "Secret": _decode_secret,
}

SUPPORTED_KINDS = frozenset(_DECODERS)  # and bridge.policy_objects.POLICY_KINDS


def decode_object(raw: Any, kind: str | None = None) -> KubeObject | None:
    """Decode one Kubernetes object; None for a known kind we deliberately ignore.

    `kind` overrides `raw["kind"]` (list responses of the API omit it on items).
    Raises ObjectError for anything we cannot use.
    """
    if not isinstance(raw, Mapping):
        raise ObjectError("<unknown>", "<unnamed>", f"not a mapping but {type(raw).__name__}")
    k = kind or raw.get("kind")
    if not isinstance(k, str) or not k:
        raise ObjectError("<unknown>", display_name(raw), "kind is missing")
    decoder = _DECODERS.get(k) or _policy.DECODERS.get(k)
    if decoder is None:
        if k in IGNORED_KINDS:
            return None
        md = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
        assert isinstance(md, Mapping)
        raise ObjectError(k, str(md.get("name", "<unnamed>")), f"unsupported kind {k!r}")
    try:
        obj: KubeObject = decoder(raw)
    except ObjectError:
        raise
    except (TypeError, ValueError, AttributeError) as e:  # defensive: never crash a source
        raise ObjectError(k, display_name(raw), f"malformed: {e}") from None
    return obj


def tombstone(kind: str, namespace: str, name: str) -> KubeObject | None:
    """A key-only object of `kind`, enough for the cache to delete what it holds under
    that key when the real object can no longer be decoded."""
    meta = Meta(name=name, namespace=namespace)
    makers: dict[str, Any] = {
        "Service": lambda: Service(meta),
        "EndpointSlice": lambda: EndpointSlice(meta, "", "", None, ()),
        "Endpoints": lambda: EndpointSlice(meta, "", "", None, (), kind="Endpoints"),
        "Pod": lambda: Pod(meta),
        "Node": lambda: Node(Meta(name=name, namespace="")),
        "ReplicaSet": lambda: ReplicaSet(meta),
        "Job": lambda: Job(meta),
        "Server": lambda: Server(meta, None, 0),
        "ServiceProfile": lambda: ServiceProfile(meta, {}),
        "Namespace": lambda: Namespace(Meta(name=name, namespace="")),
        "Secret": lambda: Secret(meta, {}),
    }
    make = makers.get(kind)
    if make is None and kind in _policy.TOMBSTONES:
        return _policy.TOMBSTONES[kind](meta)
    return make() if make is not None else None
