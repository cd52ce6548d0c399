"""The service ports CDS, LDS and RDS are built from: one name per port of every
Service (ExternalName excepted), kept up to date service by service."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from bridge.authority import view_authority
from bridge.model import ServiceKey, ViewKey
from bridge.objects import Service, ServicePort


@dataclass(frozen=True, slots=True)
class PortEntry:
    key: ViewKey
    service: Service
    port: ServicePort


@dataclass(frozen=True, slots=True)
class PortsChange:
    """What one refresh did: names that appeared or went, and every entry of the
    services it looked at again (their content may have changed)."""

    added: frozenset[str]
    removed: frozenset[str]
    current: tuple[tuple[str, PortEntry], ...]


class ServicePorts:
    def __init__(self, cluster_domain: str) -> None:
        self.cluster_domain = cluster_domain
        self.entries: dict[str, PortEntry] = {}
        self._by_service: dict[ServiceKey, set[str]] = {}
        # The Service object each entry was built from: a relist hands back the very
        # same object, and a service that did not change is not looked at again.
        self.seen: dict[ServiceKey, Service] = {}

    def names(self) -> list[str]:
        return sorted(self.entries)

    def refresh(self, services: Iterable[ServiceKey],
                current: Mapping[ServiceKey, Service]) -> PortsChange:
        added: set[str] = set()
        removed: set[str] = set()
        entries: list[tuple[str, PortEntry]] = []
        for svc_key in services:
            svc = current.get(svc_key)
            if svc is not None and svc.type == "ExternalName":
                svc = None
            if svc is not None and self.seen.get(svc_key) is svc:
                continue
            if svc is None:
                self.seen.pop(svc_key, None)
            else:
                self.seen[svc_key] = svc
            self._refresh_service(svc_key, svc, added, removed, entries)
        return PortsChange(frozenset(added), frozenset(removed), tuple(entries))

    def _refresh_service(self, svc_key: ServiceKey, svc: Service | None, added: set[str],
                         removed: set[str], out: list[tuple[str, PortEntry]]) -> None:
        entries: dict[str, PortEntry] = {}
        if svc is not None:
            for sp in svc.ports:
                key = ViewKey(svc_key, sp.port)
                name = view_authority(key, self.cluster_domain)
                # A port number listed twice (TCP and UDP) is one name: the first wins.
                entries.setdefault(name, PortEntry(key, svc, sp))
        old = self._by_service.pop(svc_key, set())
        for name in old - entries.keys():
            del self.entries[name]
            removed.add(name)
        for name, entry in entries.items():
            self.entries[name] = entry
            out.append((name, entry))
            if name not in old:
                added.add(name)
        if entries:
            self._by_service[svc_key] = set(entries)
