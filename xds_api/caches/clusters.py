"""CDS: one Cluster per service port, named by its authority.

* Naming: `<svc>.<ns>.svc.<domain>:<port>`, the same name as its CLA (EDS).
* Wildcard: `*` covers every Cluster there is (Envoy's usual CDS subscription).
* Unknown name: nothing exists, so nothing is sent for it (SotW leaves it out of
  the full set; delta reports it removed, once).
* Versions: a Cluster is rebuilt for every service a change touches, but the CDS
  version moves only when some Cluster's content did.
"""

from __future__ import annotations

from collections.abc import Iterable

from xds_api import resource_types as rt
from xds_api.caches.ports import PortsChange
from xds_api.caches.type_cache import NamedWatchers, Version, Watcher
from xds_api.metrics import XdsMetrics
from xds_api.resources import EncodedResource, build_cluster, encode_named
from xds_api.subscription import Subscription


class ClusterCache:
    type_url = rt.CLUSTER
    full_state = True

    def __init__(self, prefix: str, metrics: XdsMetrics) -> None:
        self.metrics = metrics
        self._version = Version(prefix)
        self._clusters: dict[str, EncodedResource] = {}
        self.watchers = NamedWatchers(self.type_url)

    def version(self) -> str:
        return str(self._version)

    def get(self, name: str, node_name: str = "") -> EncodedResource | None:
        return self._clusters.get(name)

    def resource(self, sub: Subscription, name: str) -> EncodedResource | None:
        return self._clusters.get(name)

    def wildcard_names(self) -> Iterable[str]:
        return self._clusters.keys()

    def covers(self, name: str) -> bool:
        return name in self._clusters

    def watch(self, sub: Subscription, names: Iterable[str], watcher: Watcher) -> None:
        self.watchers.watch(names, watcher)

    def unwatch(self, sub: Subscription, names: Iterable[str], watcher: Watcher) -> None:
        self.watchers.unwatch(names, watcher)

    def watch_wildcard(self, watcher: Watcher) -> None:
        self.watchers.wildcard.add(watcher)

    def unwatch_wildcard(self, watcher: Watcher) -> None:
        self.watchers.wildcard.discard(watcher)

    def ports_changed(self, change: PortsChange) -> None:
        changed = set(change.removed)
        for name in change.removed:
            self._clusters.pop(name, None)
        for name, entry in change.current:
            res = encode_named(rt.CLUSTER, name, build_cluster(name, entry.key, entry.port))
            self.metrics.serializations[rt.CLUSTER].inc()
            old = self._clusters.get(name)
            if old is None or old.version != res.version:
                self._clusters[name] = res
                changed.add(name)
        if changed:
            self._version.bump()
            self.watchers.notify(changed)
