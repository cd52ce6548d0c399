"""RDS: the RouteConfiguration each proxyless Listener names (one per service port,
routing everything to the Cluster of the same name).

* Naming: the service port's authority, as its Listener.
* Wildcard: none; §1.5 gives RDS no wildcard, so `*` is an ordinary (unknown) name.
* Unknown name: nothing is sent for it (SotW sends only what exists; delta reports
  it removed, once).
"""

from __future__ import annotations

from collections.abc import Iterable

from xds_api import resource_types as rt
from xds_api.caches.named import PortNamedCache
from xds_api.caches.ports import ServicePorts
from xds_api.caches.type_cache import Watcher
from xds_api.metrics import XdsMetrics
from xds_api.resources import build_route


class RouteCache(PortNamedCache):
    type_url = rt.ROUTE
    full_state = False

    def __init__(self, ports: ServicePorts, prefix: str, metrics: XdsMetrics) -> None:
        super().__init__(ports, prefix, metrics, build_route)

    def wildcard_names(self) -> Iterable[str]:
        return ()

    def covers(self, name: str) -> bool:
        return False

    def watch_wildcard(self, watcher: Watcher) -> None:
        pass  # no wildcard for RDS: a subscription never asks for one

    def unwatch_wildcard(self, watcher: Watcher) -> None:
        pass
