"""Linkerd's service-mirror rules, as pure functions: the local `<svc>-<cluster>` mirror
of a remote service exported for remote discovery, and the `<svc>-federated` Service of
a service federated across clusters (docs/multicluster.md, "The mirror").

Every function returns the Service the rules call for, as the API's JSON; the
controller (`meshbridge mirror`) compares it with what is there and writes only the
difference.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bridge.model import ServiceKey
from bridge.multicluster.targets import (
    LOCAL_DISCOVERY_ANNOTATION,
    REMOTE_DISCOVERY,
    REMOTE_SERVICE_LABEL,
)
from bridge.objects import Service

MIRROR_PREFIX = "mirror.linkerd.io"  # remote labels under it are never copied
MIRRORED_LABEL = "mirror.linkerd.io/mirrored-service"
CLUSTER_NAME_LABEL = "mirror.linkerd.io/cluster-name"
REMOTE_FQN_ANNOTATION = "mirror.linkerd.io/remote-svc-fq-name"
REMOTE_VERSION_ANNOTATION = "mirror.linkerd.io/remote-resource-version"
OPAQUE_PORTS_ANNOTATION = "config.linkerd.io/opaque-ports"
# Topology hints describe the remote cluster's zones, not ours.
HINT_ANNOTATIONS = frozenset({"service.kubernetes.io/topology-aware-hints",
                              "service.kubernetes.io/topology-mode"})
FEDERATED_SUFFIX = "-federated"

# `linkerd multicluster link`'s defaults.
DEFAULT_REMOTE_DISCOVERY_SELECTOR = "mirror.linkerd.io/exported=remote-discovery"
DEFAULT_FEDERATED_SELECTOR = "mirror.linkerd.io/federated=member"


class SelectorError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Selector:
    """A label selector's matchLabels; an empty one matches nothing (Linkerd's rule
    since an empty selector once mirrored every service)."""

    match: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> Selector:
        """`key=value[,key=value]`; "" for a selector that matches nothing."""
        pairs = []
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, eq, value = part.partition("=")
            if not eq or not key:
                raise SelectorError(f"selector {text!r}: {part!r} is not key=value")
            pairs.append((key, value))
        return cls(tuple(sorted(pairs)))

    def matches(self, labels: Mapping[str, str]) -> bool:
        return bool(self.match) and all(labels.get(k) == v for k, v in self.match)


@dataclass(frozen=True, slots=True)
class LinkRules:
    """What one link mirrors and how (a Link's selectors and exclusions). `cluster` ""
    is the local cluster joining federated services; `rank` orders links by age (the
    oldest link's metadata wins a federated Service; the local one is always oldest)."""

    cluster: str
    cluster_domain: str = "cluster.local"
    remote_discovery: Selector = field(
        default_factory=lambda: Selector.parse(DEFAULT_REMOTE_DISCOVERY_SELECTOR))
    federated: Selector = field(
        default_factory=lambda: Selector.parse(DEFAULT_FEDERATED_SELECTOR))
    excluded_labels: tuple[str, ...] = ()
    excluded_annotations: tuple[str, ...] = ()
    rank: int = 0


def _excluded(key: str, patterns: Iterable[str]) -> bool:
    """An exact key, or `prefix/*` for every key under a prefix."""
    return any(p == key or (p.endswith("/*") and key.startswith(p[:-1])) for p in patterns)


def common_labels(remote: Service, rules: LinkRules) -> dict[str, str]:
    labels = {k: v for k, v in remote.meta.labels.items()
              if not k.startswith(MIRROR_PREFIX) and not _excluded(k, rules.excluded_labels)}
    labels[MIRRORED_LABEL] = "true"
    return labels


def common_annotations(remote: Service, rules: LinkRules) -> dict[str, str]:
    annotations = {k: v for k, v in remote.meta.annotations.items()
                   if k not in HINT_ANNOTATIONS
                   and not _excluded(k, rules.excluded_annotations)}
    opaque = remote.meta.annotations.get(OPAQUE_PORTS_ANNOTATION)
    if opaque is not None:
        annotations[OPAQUE_PORTS_ANNOTATION] = opaque  # kept whatever is excluded
    return annotations


def copied_ports(remote: Service) -> list[dict[str, Any]]:
    """Name, protocol, port and target port: a nodePort or appProtocol means nothing
    here."""
    ports = []
    for p in remote.ports:
        port: dict[str, Any] = {"name": p.name, "protocol": p.protocol, "port": p.port}
        if p.target_port is not None:
            port["targetPort"] = p.target_port
        ports.append(port)
    return ports


def is_headless(svc: Service) -> bool:
    return svc.type == "ClusterIP" and not svc.cluster_ips


def mirror_name(service: str, cluster: str) -> str:
    return f"{service}-{cluster}"


def mirror_service(remote: Service, rules: LinkRules) -> dict[str, Any]:
    """The remote-discovery mirror of `remote` (exported by `rules`' link): no selector
    and no Endpoints; its endpoints are read from the linked cluster itself."""
    name = remote.meta.name
    labels = common_labels(remote, rules)
    labels[CLUSTER_NAME_LABEL] = rules.cluster
    labels[REMOTE_DISCOVERY] = rules.cluster
    labels[REMOTE_SERVICE_LABEL] = name
    annotations = common_annotations(remote, rules)
    annotations[REMOTE_FQN_ANNOTATION] = (f"{name}.{remote.meta.namespace}.svc."
                                          f"{rules.cluster_domain}")
    annotations[REMOTE_VERSION_ANNOTATION] = remote.meta.resource_version
    return _service(mirror_name(name, rules.cluster), remote.meta.namespace, labels,
                    annotations, copied_ports(remote))


@dataclass(frozen=True, slots=True)
class FederatedMember:
    """A service that joins `<name>-federated`: from a link's cluster, or local."""

    rules: LinkRules
    service: Service

    @property
    def entry(self) -> str:
        return f"{self.service.meta.name}@{self.rules.cluster}"


def federated_service(key: ServiceKey, members: Sequence[FederatedMember]
                      ) -> dict[str, Any] | None:
    """`<svc>-federated` for its members (headless ones already refused), or None
    when none is left. Labels, annotations and ports come from the oldest link's
    member (the local one first); the member lists are kept whatever they say."""
    if not members:
        return None
    ordered = sorted(members, key=lambda m: (bool(m.rules.cluster), m.rules.rank,
                                             m.rules.cluster))
    winner = ordered[0]
    labels = common_labels(winner.service, winner.rules)
    annotations = common_annotations(winner.service, winner.rules)
    annotations.pop(REMOTE_DISCOVERY, None)
    annotations.pop(LOCAL_DISCOVERY_ANNOTATION, None)
    remote = [m.entry for m in ordered if m.rules.cluster]
    local = [m.service.meta.name for m in ordered if not m.rules.cluster]
    if remote:
        annotations[REMOTE_DISCOVERY] = ",".join(remote)
    if local:
        annotations[LOCAL_DISCOVERY_ANNOTATION] = local[0]
    return _service(key.name + FEDERATED_SUFFIX, key.namespace, labels, annotations,
                    copied_ports(winner.service))


def _service(name: str, namespace: str, labels: dict[str, str],
             annotations: dict[str, str], ports: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": namespace, "labels": labels,
                         "annotations": annotations},
            "spec": {"ports": ports}}


def differs(desired: Mapping[str, Any], actual: Service) -> bool:
    """Whether the Service in the cluster must be rewritten to be `desired`: its
    labels, annotations or ports differ."""
    md = desired["metadata"]
    if dict(actual.meta.labels) != md["labels"]:
        return True
    if dict(actual.meta.annotations) != md["annotations"]:
        return True
    have = [{"name": p.name, "protocol": p.protocol, "port": p.port,
             **({"targetPort": p.target_port} if p.target_port is not None else {})}
            for p in actual.ports]
    return bool(have != desired["spec"]["ports"])
