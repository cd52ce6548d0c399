"""What the local cluster wants from each linked cluster: the services its mirror and
federated Services name (`targets.wanted_from`), plus what a layer adds (istiod-style
merging wants a service from every cluster). Kept per local Service, so a Service
change costs what it changes, not a scan of every Service."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import structlog

from bridge.model import ServiceKey
from bridge.multicluster.targets import Member, federation, is_federated, wanted_from
from bridge.objects import Service

log = structlog.get_logger("meshbridge.multicluster")


class Demand:
    def __init__(self) -> None:
        self._by_service: dict[ServiceKey, frozenset[Member]] = {}
        self._counts: dict[str, Counter[ServiceKey]] = {}
        self._logged: dict[ServiceKey, tuple[str, ...]] = {}

    def of(self, cluster: str) -> frozenset[ServiceKey]:
        return frozenset(self._counts.get(cluster, ()))

    def clusters(self) -> set[str]:
        return set(self._counts)

    def rebuild(self, services: Iterable[Service]) -> set[str]:
        by_key = {ServiceKey(s.meta.namespace, s.meta.name): s for s in services}
        return self.update(by_key, set(by_key) | set(self._by_service))

    def update(self, services: Mapping[ServiceKey, Service],
               changed: Iterable[ServiceKey]) -> set[str]:
        """Look again at the `changed` local Services; the clusters whose wanted set
        changed."""
        touched: set[str] = set()
        for key in changed:
            svc = services.get(key)
            now = wanted_from(svc) if svc is not None else frozenset()
            if svc is not None:
                self._log_malformed(key, svc)
            else:
                self._logged.pop(key, None)
            before = self._by_service.get(key, frozenset())
            if now == before:
                continue
            if now:
                self._by_service[key] = now
            else:
                self._by_service.pop(key, None)
            for member in before - now:
                touched |= self._count(member.cluster, [member.service], -1)
            for member in now - before:
                touched |= self._count(member.cluster, [member.service], 1)
        return touched

    def add_extra(self, cluster: str, services: Iterable[ServiceKey]) -> bool:
        return bool(self._count(cluster, services, 1))

    def remove_extra(self, cluster: str, services: Iterable[ServiceKey]) -> bool:
        return bool(self._count(cluster, services, -1))

    def _count(self, cluster: str, services: Iterable[ServiceKey], delta: int) -> set[str]:
        counts = self._counts.setdefault(cluster, Counter())
        changed = False
        for key in services:
            before = counts[key]
            counts[key] = before + delta
            if counts[key] <= 0:
                del counts[key]
            changed = changed or (before > 0) != (counts.get(key, 0) > 0)
        if not counts:
            del self._counts[cluster]
        return {cluster} if changed else set()

    def _log_malformed(self, key: ServiceKey, svc: Service) -> None:
        """A federated annotation's malformed entries: logged once per change of them."""
        bad = federation(svc).malformed if is_federated(svc) else ()
        if bad and self._logged.get(key) != bad:
            log.warning("federated service: malformed members skipped (expected svc@cluster)",
                        namespace=key.namespace, service=key.name, entries=list(bad))
        if bad:
            self._logged[key] = bad
        else:
            self._logged.pop(key, None)
