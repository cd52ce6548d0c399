"""What LDS and RDS share: a resource per service port whose content is a function
of its name alone, built on first request and kept while the port exists."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from xds_api.caches.ports import PortsChange, ServicePorts
from xds_api.caches.type_cache import NamedWatchers, Version, Watcher
from xds_api.metrics import XdsMetrics
from xds_api.resources import EncodedResource, encode_named
from xds_api.subscription import Subscription


class PortNamedCache:
    type_url = ""
    full_state = False

    def __init__(self, ports: ServicePorts, prefix: str, metrics: XdsMetrics,
                 build: Callable[[str], object]) -> None:
        self.ports = ports
        self.metrics = metrics
        self._build = build
        self._version = Version(prefix)
        self._built: dict[str, EncodedResource] = {}
        self.watchers = NamedWatchers(self.type_url)

    def version(self) -> str:
        return str(self._version)

    def get(self, name: str, node_name: str = "") -> EncodedResource | None:
        if name not in self.ports.entries:
            return None
        res = self._built.get(name)
        if res is None:
            res = self._built[name] = encode_named(self.type_url, name, self._build(name))
            self.metrics.serializations[self.type_url].inc()
        return res

    def resource(self, sub: Subscription, name: str) -> EncodedResource | None:
        return self.get(name)

    def watch(self, sub: Subscription, names: Iterable[str], watcher: Watcher) -> None:
        self.watchers.watch(names, watcher)

    def unwatch(self, sub: Subscription, names: Iterable[str], watcher: Watcher) -> None:
        self.watchers.unwatch(names, watcher)

    def ports_changed(self, change: PortsChange) -> None:
        # The content is the name's: only a port appearing or going changes anything.
        for name in change.removed:
            self._built.pop(name, None)
        changed = change.added | change.removed
        if changed:
            self._version.bump()
            self.watchers.notify(changed)
