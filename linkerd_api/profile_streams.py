"""GetProfile streams: shared profile publications, recomputed on cluster changes.

Like Views for Get, every GetProfile stream that asks the same question shares one
`Publication`: the profile is rebuilt once per relevant cluster change, encoded once,
compared with what was last sent, and the same bytes are queued on every stream.
An unchanged profile is not re-sent ("a new message whenever the result changes").

Two kinds of question (§2.6):
  ServiceProfileKey   a service port, as named or by cluster IP: ServiceProfiles
                      (the client's namespace first, then the service's) + opaque ports
  EndpointProfileKey  one workload address, by pod IP, host IP:port, or StatefulSet
                      pod DNS name resolved to its pod IP at subscribe time
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog

from bridge.authority import service_host
from bridge.cluster import Cluster, ClusterChange, ListenerStage, PodKey
from bridge.enrich import EnrichError
from bridge.model import MeshConfig, ServiceKey
from bridge.objects import Pod, ServiceProfile
from linkerd_api.endpoint_streams import Semantics
from linkerd_api.errors import AmbiguousAddress, NoSuchWorkload
from linkerd_api.profiles import (
    ProfileError,
    endpoint_profile,
    service_opaque_ports,
    service_profile,
)
from linkerd_api.proto import destination_pb2 as dst
from linkerd_api.queue import Outgoing, UpdateQueue
from linkerd_api.translate import Translator

log = structlog.get_logger("meshbridge.linkerd.profiles")

# Terminated pods keep their IP in status but no longer own it (§2.9).
_FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class ServiceProfileKey:
    service: ServiceKey
    fqn: str  # as the client named it (or built from the cluster IP's service)
    port: int
    client_ns: str  # the token's ns: where the client-side ServiceProfile lives


@dataclass(frozen=True, slots=True)
class EndpointProfileKey:
    ip: str
    port: int


ProfileKey = ServiceProfileKey | EndpointProfileKey


class ProfileStream(UpdateQueue):
    """One GetProfile RPC's subscription to one publication."""

    __slots__ = ("key", "on_overflow", "peer")

    def __init__(self, capacity: int, key: ProfileKey, peer: str,
                 on_overflow: Callable[[ProfileStream], None]) -> None:
        super().__init__(capacity)
        self.key = key
        self.peer = peer
        self.on_overflow = on_overflow

    def deliver(self, message: Outgoing) -> None:
        if not self.push(message) and self.overflowed:
            self.on_overflow(self)


class Publication:
    """The current profile for one key and the streams that want it."""

    __slots__ = ("key", "message", "pod", "subscribers", "version")

    def __init__(self, key: ProfileKey) -> None:
        self.key = key
        self.version = 0  # bumped each time the profile changes
        self.message: Outgoing | None = None  # last profile; None: none built yet
        self.pod: PodKey | None = None  # for endpoint profiles: the pod last attached
        self.subscribers: dict[ProfileStream, None] = {}


def profile_name(service: ServiceKey, cluster_domain: str) -> str:
    """The name a ServiceProfile for `service` has (§2.8 ProfileIDs)."""
    return service_host(service, cluster_domain)


def pods_at(cluster: Cluster, ip: str, port: int) -> tuple[str, list[Pod]]:
    """The pods that own ip (or ip:port through a hostPort), as Linkerd's workload
    watcher looks them up (§2.9): the pod IP index first, which leaves out
    host-network and finished or terminating pods, then host IP and hostPort.
    Returns which index answered, for the conflict message, and the pods."""
    owners = [
        pod for key in sorted(cluster.pods_by_ip.get(ip, ()))
        if (pod := cluster.pods.get(key)) is not None
        and not pod.host_network and not pod.meta.deleting
        and pod.phase not in _FINISHED_PHASES
    ]
    if owners:
        return f"pod network IP {ip}", owners
    return f"host network endpoint {ip}:{port}", [
        pod for _, pod in sorted(cluster.pods.items())
        if pod.host_ip == ip
        and any(cp.host_port == port for c in pod.all_containers() for cp in c.ports)
    ]


def workload_at(cluster: Cluster, ip: str, port: int) -> Pod | None:
    """The running pod behind ip:port, None if there is none; AmbiguousAddress if
    several claim it. Readiness is not required, only the Running phase."""
    where, owners = pods_at(cluster, ip, port)
    if len(owners) > 1:
        raise AmbiguousAddress(f"found {len(owners)} pods with a conflicting {where}")
    if owners and owners[0].phase == "Running":
        return owners[0]
    return None


def instance_ip(cluster: Cluster, service: ServiceKey, instance: str) -> str:
    """The pod IP behind `<instance>.<svc>.<ns>.svc...`: the endpoint of the service's
    slices whose hostname is `instance` (§2.9)."""
    for slice_ in cluster.slices_of(service):
        for ep in slice_.endpoints:
            if ep.hostname != instance:
                continue
            target = ep.target
            if target is None or target.kind != "Pod":
                # Linkerd 2.20 dereferences a nil pod here; we refuse instead.
                raise NoSuchWorkload(f"the endpoint for hostname {instance} of Service "
                                     f"{service.namespace}/{service.name} is not a pod")
            pod = cluster.pods.get((target.namespace, target.name))
            if pod is None or not pod.pod_ips:
                raise NoSuchWorkload(f"pod {target.namespace}/{target.name} for hostname "
                                     f"{instance} is not known")
            return pod.pod_ips[0]
    raise NoSuchWorkload(f"no pod found in EndpointSlices of Service "
                         f"{service.namespace}/{service.name} for hostname {instance}")


class ProfileRegistry:
    """Every profile publication of one host; listens to the Cluster until closed."""

    def __init__(self, cluster: Cluster, config: MeshConfig, translator: Translator,
                 semantics: Semantics) -> None:
        self.cluster = cluster
        self.config = config
        self.translator = translator
        self.semantics = semantics
        self.publications: dict[ProfileKey, Publication] = {}
        self.closed = False
        cluster.add_listener(self._on_cluster_change, ListenerStage.PROFILES)

    def close(self) -> None:
        """Stop listening to the Cluster (the layer's stop hook); idempotent."""
        if not self.closed:
            self.closed = True
            self.cluster.remove_listener(self._on_cluster_change)

    # ------------------------------------------------------------- subscriptions

    def subscribe(self, stream: ProfileStream) -> Publication:
        """Join the publication of `stream.key` and queue its current profile.
        Raises AmbiguousAddress when the address cannot be told apart."""
        if isinstance(stream.key, EndpointProfileKey):
            # A conflict is the caller's error only when it subscribes; later, the
            # publication keeps its last good profile (see _rebuild).
            workload_at(self.cluster, stream.key.ip, stream.key.port)
        pub = self.publications.get(stream.key)
        if pub is None:
            pub = Publication(stream.key)
            self._rebuild(pub)
            self.publications[stream.key] = pub
        pub.subscribers[stream] = None
        if pub.message is not None:
            stream.deliver(pub.message)
        return pub

    def unsubscribe(self, stream: ProfileStream) -> None:
        pub = self.publications.get(stream.key)
        if pub is None:
            return
        pub.subscribers.pop(stream, None)
        if not pub.subscribers:
            del self.publications[stream.key]

    # ------------------------------------------------------------- recomputation

    def _on_cluster_change(self, change: ClusterChange) -> None:
        if not self.publications:
            return
        changed_ips: set[str] = set()
        for pk in change.pods:
            pod = self.cluster.pods.get(pk)
            if pod is not None:
                changed_ips.update(pod.pod_ips)
                if pod.host_ip:
                    changed_ips.add(pod.host_ip)
        for pub in list(self.publications.values()):
            if self._affected(pub, change, changed_ips) and self._rebuild(pub):
                assert pub.message is not None
                for stream in list(pub.subscribers):
                    stream.deliver(pub.message)

    def _affected(self, pub: Publication, change: ClusterChange, changed_ips: set[str]) -> bool:
        key = pub.key
        if isinstance(key, ServiceProfileKey):
            name = profile_name(key.service, self.config.cluster_domain)
            return (change.touches(key.service)
                    or (key.client_ns, name) in change.profiles
                    or (key.service.namespace, name) in change.profiles)
        return (key.ip in changed_ips
                or (pub.pod is not None
                    and (pub.pod in change.pods or pub.pod[0] in change.namespaces)))

    def _rebuild(self, pub: Publication) -> bool:
        """Recompute a publication's profile; True if it changed. A profile that
        cannot be built is logged and not sent: the last good one stands."""
        key = pub.key
        try:
            if isinstance(key, ServiceProfileKey):
                profile = self._service_profile(key)
            else:
                pod = workload_at(self.cluster, key.ip, key.port)
                pub.pod = (pod.meta.namespace, pod.meta.name) if pod is not None else None
                profile = endpoint_profile(key.ip, key.port, pod, self.cluster, self.config,
                                           self.translator)
        except (ProfileError, EnrichError, AmbiguousAddress) as e:
            log.warning("profile not sent: cannot be built", **_describe(key), reason=str(e))
            return False
        message = profile.SerializeToString(deterministic=True)
        if pub.message is not None and message == pub.message[1]:
            return False
        pub.version += 1
        pub.message = (str(pub.version), message)
        return True

    def _service_profile(self, key: ServiceProfileKey) -> dst.DestinationProfile:
        name = profile_name(key.service, self.config.cluster_domain)
        # The client's own ServiceProfile wins over the service's (§2.8 fallback).
        chosen: ServiceProfile | None = None
        if key.client_ns:
            chosen = self.cluster.profiles.get((key.client_ns, name))
        if chosen is None:
            chosen = self.cluster.profiles.get((key.service.namespace, name))
        svc = self.cluster.services.get(key.service)
        if svc is not None:
            opaque = key.port in service_opaque_ports(svc, self.config)
        else:
            # linkerd-2.20 never learns the opaque ports of a service it has not seen.
            opaque = self.semantics == "proto" and key.port in self.config.default_opaque_ports
        return service_profile(chosen, fqn=key.fqn, service=key.service, port=key.port,
                               opaque=opaque, kind_in_ref=self.semantics == "proto")


def _describe(key: ProfileKey) -> dict[str, object]:
    if isinstance(key, ServiceProfileKey):
        return {"namespace": key.service.namespace, "service": key.service.name,
                "port": key.port, "fqn": key.fqn}
    return {"address": key.ip, "port": key.port}
