"""LDS: the proxyless Listener of every service port (a gRPC client dials
`xds:///<authority>` and asks for the Listener of that name).

* Naming: the service port's authority, `<svc>.<ns>.svc.<domain>:<port>`.
* Wildcard: `*` covers nothing. The only Listeners are proxyless ones, asked for by
  name, so Envoy's wildcard LDS gets an empty set.
* Unknown name: nothing is sent for it (SotW leaves it out of the full set; delta
  reports it removed, once).
"""

from __future__ import annotations

from collections.abc import Iterable

from xds_api import resource_types as rt
from xds_api.caches.named import PortNamedCache
from xds_api.caches.ports import ServicePorts
from xds_api.caches.type_cache import Watcher
from xds_api.metrics import XdsMetrics
from xds_api.resources import build_listener


class ListenerCache(PortNamedCache):
    type_url = rt.LISTENER
    # §1.6: every SotW LDS response carries the whole subscribed set.
    full_state = True

    def __init__(self, ports: ServicePorts, prefix: str, metrics: XdsMetrics) -> None:
        super().__init__(ports, prefix, metrics, build_listener)

    def wildcard_names(self) -> Iterable[str]:
        return ()

    def covers(self, name: str) -> bool:
        return False

    def watch_wildcard(self, watcher: Watcher) -> None:
        self.watchers.wildcard.add(watcher)

    def unwatch_wildcard(self, watcher: Watcher) -> None:
        self.watchers.wildcard.discard(watcher)
