"""What a source sends the cache (events) and what the cache tells its listeners back
(one `ClusterChange` per batch)."""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass, field

from bridge.model import ServiceKey
from bridge.objects import KubeObject

PodKey = tuple[str, str]  # (namespace, name)
SliceKey = tuple[str, str, str]  # (kind, namespace, name): Endpoints and slices may share names


class EventType(enum.Enum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


@dataclass(frozen=True, slots=True)
class Event:
    type: EventType
    obj: KubeObject


@dataclass(slots=True)
class ClusterChange:
    """What one batch changed; each kind's store writes its own part
    (`bridge.cluster.stores`). `all_services` is set when something every service may
    depend on changed (a Node's zone) in a namespace-less way.

    `services` is every service touched in any way; `service_objects` those whose
    Service object itself changed, and `slices` the slices that changed, by service
    (the old service too when a slice moved), so a consumer can redo only those.
    `enrichment` says that an object enrichment reads besides pods and slices changed
    (the Cluster then moves its `enrich_epoch`)."""

    services: set[ServiceKey] = field(default_factory=set)
    service_objects: set[ServiceKey] = field(default_factory=set)
    slices: dict[ServiceKey, set[SliceKey]] = field(default_factory=dict)
    pods: set[PodKey] = field(default_factory=set)
    profiles: set[tuple[str, str]] = field(default_factory=set)
    namespaces: set[str] = field(default_factory=set)  # every service in these changed
    all_services: bool = False
    enrichment: bool = False
    kinds: set[str] = field(default_factory=set)  # other kinds (policy objects) that changed

    def __bool__(self) -> bool:
        return bool(
            self.services or self.pods or self.profiles or self.namespaces or self.all_services
            or self.kinds
        )

    def touches(self, service: ServiceKey) -> bool:
        return (
            self.all_services or service in self.services or service.namespace in self.namespaces
        )

    def touched(self, among: Collection[ServiceKey]) -> list[ServiceKey]:
        """The services of `among` that this change touches (`touches`), without
        looking at every one of them when the change names its services."""
        if self.all_services or self.namespaces:
            return [s for s in among if self.touches(s)]
        return [s for s in self.services if s in among]
