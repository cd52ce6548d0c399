"""What a local Service says about linked clusters (Linkerd's multicluster labels and
annotations, docs/multicluster.md "Remote discovery" and "Federated services").

  * a remote-discovery mirror `<svc>-<cluster>` carries the label
    `multicluster.linkerd.io/remote-discovery: <cluster>` and names the remote service
    in `multicluster.linkerd.io/remote-service: <svc>` (in its own namespace);
  * a federated Service `<svc>-federated` lists its members in the annotations
    `multicluster.linkerd.io/remote-discovery: <svc>@<cluster>,...` and
    `multicluster.linkerd.io/local-discovery: <svc>`; a member is always in the
    federated Service's namespace.
"""

from __future__ import annotations

from dataclasses import dataclass

from bridge.model import ServiceKey
from bridge.objects import Service

REMOTE_DISCOVERY = "multicluster.linkerd.io/remote-discovery"  # label and annotation
REMOTE_SERVICE_LABEL = "multicluster.linkerd.io/remote-service"
LOCAL_DISCOVERY_ANNOTATION = "multicluster.linkerd.io/local-discovery"


@dataclass(frozen=True, slots=True, order=True)
class Member:
    """One member of a federated service: a service of a linked cluster, or of the
    local one (`cluster` "")."""

    cluster: str
    service: ServiceKey


@dataclass(frozen=True, slots=True)
class Federation:
    """A federated Service's members, and the entries that could not be read."""

    members: tuple[Member, ...]
    malformed: tuple[str, ...] = ()

    @property
    def local(self) -> Member | None:
        return next((m for m in self.members if not m.cluster), None)

    @property
    def remote(self) -> tuple[Member, ...]:
        return tuple(m for m in self.members if m.cluster)


def is_federated(svc: Service) -> bool:
    """Either discovery annotation makes a Service federated; Linkerd checks this
    before the remote-discovery label."""
    annotations = svc.meta.annotations
    return REMOTE_DISCOVERY in annotations or LOCAL_DISCOVERY_ANNOTATION in annotations


def federation(svc: Service) -> Federation:
    """The members a federated Service lists: `svc@cluster` entries (anything else is
    malformed and skipped) and the local member, in the Service's namespace."""
    ns = svc.meta.namespace
    members: list[Member] = []
    malformed: list[str] = []
    for entry in svc.meta.annotations.get(REMOTE_DISCOVERY, "").split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, at, cluster = entry.partition("@")
        if not at or not name or not cluster or "@" in cluster:
            malformed.append(entry)
            continue
        member = Member(cluster, ServiceKey(ns, name))
        if member not in members:
            members.append(member)
    local = svc.meta.annotations.get(LOCAL_DISCOVERY_ANNOTATION, "").strip()
    if local:
        members.append(Member("", ServiceKey(ns, local)))
    return Federation(tuple(members), tuple(malformed))


@dataclass(frozen=True, slots=True)
class RemoteTarget:
    """The linked cluster and service a remote-discovery mirror stands for; `service`
    is None when the mirror lacks its remote-service label."""

    cluster: str
    service: ServiceKey | None


def remote_target(svc: Service) -> RemoteTarget | None:
    """None when the Service is no remote-discovery mirror."""
    cluster = svc.meta.labels.get(REMOTE_DISCOVERY, "")
    if not cluster:
        return None
    remote = svc.meta.labels.get(REMOTE_SERVICE_LABEL, "")
    return RemoteTarget(cluster, ServiceKey(svc.meta.namespace, remote) if remote else None)


def wanted_from(svc: Service) -> frozenset[Member]:
    """What this local Service needs watched in linked clusters."""
    if is_federated(svc):
        return frozenset(federation(svc).remote)
    target = remote_target(svc)
    if target is not None and target.service is not None:
        return frozenset({Member(target.cluster, target.service)})
    return frozenset()
