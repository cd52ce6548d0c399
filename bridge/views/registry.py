"""Every watched service port: routes cluster changes and subscriptions, nothing more.

Linkerd's endpoints watcher (Linkerd §4.2): the merging, enriching, filtering and diffing
belong to the `PortPublisher` and `View` it routes to.
"""

from __future__ import annotations

from collections.abc import Mapping

from bridge.cluster import Cluster, ClusterChange, ListenerStage
from bridge.model import Endpoint, EndpointId, MeshConfig, ResolvedEndpoint, ServiceKey, ViewKey
from bridge.views.metrics import ViewMetrics
from bridge.views.port_publisher import PortPublisher
from bridge.views.view import EMPTY, Snapshot, View, ViewSubscriber


class InvalidService(LookupError):
    """The service cannot be subscribed to (an ExternalName service)."""


class ViewRegistry:
    """Owns every PortPublisher; refreshes the ports of each service a change touches."""

    def __init__(
        self, cluster: Cluster, config: MeshConfig, metrics: ViewMetrics | None = None
    ) -> None:
        self.cluster = cluster
        self.config = config
        self.metrics = metrics
        self.ports: dict[tuple[ServiceKey, int], PortPublisher] = {}
        # Indexed by service so a one-service change costs O(its ports), not O(all ports).
        self._ports_by_service: dict[ServiceKey, set[int]] = {}
        cluster.add_listener(self._on_cluster_change, ListenerStage.VIEWS)

    # ------------------------------------------------------------- subscriptions

    def subscribe(self, key: ViewKey, subscriber: ViewSubscriber, protocol: str) -> View:
        """Join (creating if needed) the View of `key`. The caller reads `view.snapshot`
        for its initial state; later versions arrive through `on_view_change`."""
        self._check_watchable(key)
        view = self.view(key, create=True)
        assert view is not None
        view.add_subscriber(subscriber, protocol)
        return view

    def unsubscribe(self, key: ViewKey, subscriber: ViewSubscriber) -> None:
        pub = self.ports.get((key.service, key.port))
        if pub is None:
            return
        view = pub.views.get(key.filter)
        if view is None or not view.remove_subscriber(subscriber):
            return
        if not pub.drop(key.filter):
            return
        del self.ports[(key.service, key.port)]
        ports = self._ports_by_service.get(key.service)
        if ports is not None:
            ports.discard(key.port)
            if not ports:
                del self._ports_by_service[key.service]

    def view(self, key: ViewKey, create: bool = False) -> View | None:
        pub = self.ports.get((key.service, key.port))
        if pub is None:
            if not create:
                return None
            pub = PortPublisher(key.service, key.port, self.cluster, self.config, self.metrics)
            pub.load()
            self.ports[(key.service, key.port)] = pub
            self._ports_by_service.setdefault(key.service, set()).add(key.port)
        return pub.view(key.filter, create)

    def views(self) -> list[View]:
        return [v for pub in self.ports.values() for v in pub.views.values()]

    def _check_watchable(self, key: ViewKey) -> None:
        svc = self.cluster.services.get(key.service)
        if svc is not None and svc.type == "ExternalName":
            raise InvalidService(f"{key.service} is an ExternalName service")

    # ------------------------------------------------------------- one-off reads

    def peek(self, key: ViewKey) -> View:
        """The View of `key` for a reader that must change nothing (debug pages): the
        registered one if anyone watches it, else one computed now and never
        registered, with no metrics, so no version, metric or subscriber count of
        any registered View moves."""
        view = self.view(key)
        if view is not None:
            return view
        self._check_watchable(key)
        pub = PortPublisher(key.service, key.port, self.cluster, self.config)
        pub.load()
        throwaway = pub.view(key.filter, create=True)
        assert throwaway is not None
        return throwaway

    def merge_endpoints(
        self, service: ServiceKey, port: int
    ) -> tuple[bool, Mapping[EndpointId, Endpoint]]:
        """`PortPublisher.merge` of a port, now, whether or not anyone watches it (for
        summaries and fuzzing, which want no View)."""
        return PortPublisher(service, port, self.cluster, self.config).merge()

    def filter_endpoints(
        self, key: ViewKey, available: Mapping[EndpointId, Endpoint],
        previous: Snapshot = EMPTY,
    ) -> dict[EndpointId, ResolvedEndpoint]:
        """`View.filter` of `key`, without a View to keep."""
        return View(key, self.cluster, self.config).filter(available, previous)

    # ------------------------------------------------------------- routing

    def _on_cluster_change(self, change: ClusterChange) -> None:
        watched = self._ports_by_service
        for svc in change.touched(watched.keys()):
            for port in sorted(watched.get(svc, ())):
                pub = self.ports.get((svc, port))
                if pub is not None:
                    pub.refresh(change)
