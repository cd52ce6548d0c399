"""The Views of a process that serves more than its own cluster.

`MultiClusterViews` is the `ViewRegistry` the protocol layers subscribe through. A
subscription to a local service is the local registry's; one to a service whose
endpoints live elsewhere is a `MergedPort`'s View, chosen in Linkerd's order
(docs/multicluster.md, "What a Get is answered from"):

  1. a federated Service (either discovery annotation): its members, the local one
     filtered for the subscriber's node as any local service, the remote ones not
     filtered (no topology hints, no `internalTrafficPolicy`);
  2. a remote-discovery mirror (the `multicluster.linkerd.io/remote-discovery`
     label): its linked cluster's service, unfiltered;
  3. otherwise the local service, unless istiod's merging is on for the subscriber's
     protocol (`enable_istio_merge`): then also every linked cluster's service of the
     same namespace and name, cluster-local hosts excepted.

Each linked cluster's endpoints come from a `ViewRegistry` of its own (its Cluster
cache, enriched with its trust domain). A cluster linked after a federated stream
opened is added to it; one unlinked is taken out (unless the store keeps unlinked
clusters' endpoints, Linkerd 2.20's behaviour).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
from collections.abc import Iterable

from bridge.cluster import Cluster, ClusterChange, ListenerStage
from bridge.model import FilterKey, MeshConfig, ServiceKey, ViewKey
from bridge.multicluster.merged import MemberFeed, MemberSource, MergedPort
from bridge.multicluster.store import ClusterStore, LinkedCluster
from bridge.multicluster.targets import (
    Member,
    federation,
    is_federated,
    remote_target,
)
from bridge.views import InvalidService, View, ViewRegistry, ViewSubscriber
from bridge.views.metrics import ViewMetrics

# istiod's default cluster-local hosts: never merged across clusters.
DEFAULT_CLUSTER_LOCAL = ("*.kube-system.svc.{domain}", "kubernetes.default.svc.{domain}")


class MissingRemoteService(LookupError):
    """A remote-discovery mirror without its remote-service label."""


class UnknownCluster(LookupError):
    """A mirror or member naming a cluster that is not linked."""

    def __init__(self, cluster: str) -> None:
        super().__init__(f"Remote cluster not found: {cluster}")
        self.cluster = cluster


class MultiClusterViews(ViewRegistry):
    def __init__(self, cluster: Cluster, config: MeshConfig,
                 metrics: ViewMetrics | None = None,
                 store: ClusterStore | None = None) -> None:
        super().__init__(cluster, config, metrics)
        self.store = store
        self.linked: dict[str, tuple[LinkedCluster, LinkedViews]] = {}
        self.merged: dict[ViewKey, MergedPort] = {}
        self._port_of_view: dict[View, MergedPort] = {}
        self._merged_by_service: dict[ServiceKey, set[ViewKey]] = {}
        self._istio_protocols: frozenset[str] = frozenset()
        self._cluster_local: tuple[str, ...] = ()
        # After the local registry's own listener (same stage, added later): a local
        # member's View has published before the members are looked at again.
        cluster.add_listener(self._on_local_change, ListenerStage.VIEWS)
        if store is not None:
            store.listeners.append(self._link_changed)
            for name, lc in store.linked.items():
                self._link_changed(name, lc)

    def enable_istio_merge(self, protocols: Iterable[str],
                           cluster_local: Iterable[str] = ()) -> None:
        """Merge a service with its namesakes in every linked cluster for subscribers
        of `protocols` (istiod's namespace sameness), except hosts matching
        istiod's defaults or `cluster_local` (`*.ns.svc.cluster.local` globs)."""
        self._istio_protocols = frozenset(protocols)
        domain = self.config.cluster_domain
        self._cluster_local = (*(h.format(domain=domain) for h in DEFAULT_CLUSTER_LOCAL),
                               *cluster_local)

    # ------------------------------------------------------------- dispatch

    def check(self, key: ViewKey) -> None:
        """Linkerd's refusals of a remote-discovery target, at subscribe time:
        MissingRemoteService, UnknownCluster, or InvalidService (an ExternalName)."""
        svc = self.cluster.services.get(key.service)
        if svc is None or is_federated(svc):
            return
        target = remote_target(svc)
        if target is None:
            return
        if target.service is None:
            raise MissingRemoteService(
                f"{key.service} has a multicluster.linkerd.io/remote-discovery label but "
                "no multicluster.linkerd.io/remote-service label")
        linked = self.linked.get(target.cluster)
        # An unlinked cluster whose endpoints open streams keep (Linkerd 2.20) is not
        # found by a new subscription either: the store says what is linked.
        if linked is None or (self.store is not None
                              and self.store.get(target.cluster) is None):
            raise UnknownCluster(target.cluster)
        remote = linked[0].cluster.services.get(target.service)
        if remote is not None and remote.type == "ExternalName":
            raise InvalidService(f"{target.service} in cluster {target.cluster} is an "
                                 "ExternalName service")

    def subscribe(self, key: ViewKey, subscriber: ViewSubscriber, protocol: str) -> View:
        kind = self._kind(key, protocol)
        if kind is None:
            return self._subscribe_local(key, subscriber, protocol)
        port = self.merged.get(key)
        if port is None or port.kind != kind:
            port = self._open(key, kind)
        port.view.add_subscriber(subscriber, protocol)
        return port.view

    def unsubscribe(self, key: ViewKey, subscriber: ViewSubscriber) -> None:
        port = self.merged.get(key)
        if port is None or subscriber not in port.view.subscribers:
            super().unsubscribe(key, subscriber)
            return
        if port.view.remove_subscriber(subscriber):
            self._close(key, port)

    def view(self, key: ViewKey, create: bool = False) -> View | None:
        """The View a subscription to `key` would join (for one-off reads: istiod's
        merging, which depends on who asks, is not applied here)."""
        port = self.merged.get(key)
        if port is not None and port.kind != "istio":
            return port.view
        return super().view(key, create)

    def views(self) -> list[View]:
        return [*super().views(), *(p.view for p in self.merged.values())]

    def cluster_named(self, name: str) -> Cluster | None:
        """The cache of the cluster an endpoint id names ("": the local one)."""
        if not name:
            return self.cluster
        linked = self.linked.get(name)
        return linked[0].cluster if linked is not None else None

    def merged_port(self, view: View) -> MergedPort | None:
        """The merged port whose View this is, if any."""
        return self._port_of_view.get(view)

    def _kind(self, key: ViewKey, protocol: str) -> str | None:
        svc = self.cluster.services.get(key.service)
        if svc is not None and is_federated(svc):
            return "federated"
        if svc is not None and remote_target(svc) is not None:
            return "remote-discovery"
        if protocol in self._istio_protocols and self.linked and not self._is_local(key):
            return "istio"
        return None

    def _is_local(self, key: ViewKey) -> bool:
        host = f"{key.service.name}.{key.service.namespace}.svc.{self.config.cluster_domain}"
        return any(fnmatch.fnmatchcase(host, pattern) for pattern in self._cluster_local)

    # ------------------------------------------------------------- merged ports

    def _open(self, key: ViewKey, kind: str) -> MergedPort:
        old = self.merged.get(key)
        if old is not None and not old.view.subscribers:
            self._close(key, old)
        # istiod-style merging shares its key with the local View it merges: one set of
        # endpoints_* series per key, the local one's.
        port = MergedPort(key, self.cluster, self.config,
                          None if kind == "istio" else self.metrics, kind)
        self.merged[key] = port
        self._port_of_view[port.view] = port
        self._merged_by_service.setdefault(key.service, set()).add(key)
        self._refresh(port)
        return port

    def _close(self, key: ViewKey, port: MergedPort) -> None:
        port.close()
        self._port_of_view.pop(port.view, None)
        if self.merged.get(key) is port:
            del self.merged[key]
            keys = self._merged_by_service.get(key.service)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._merged_by_service[key.service]
        if port.kind == "istio" and self.store is not None:
            for name in self.linked:
                self.store.remove_interest(name, [key.service])

    def _refresh(self, port: MergedPort) -> None:
        """Bring a port's members and existence up to date with the local Service and
        the linked clusters."""
        key = port.key
        svc = self.cluster.services.get(key.service)
        members: dict[Member, MemberSource] = {}
        exists = svc is not None and svc.type != "ExternalName"
        if port.kind == "federated":
            if svc is None or not is_federated(svc):
                exists = False
            else:
                for member in federation(svc).members:
                    members[member] = self._source(member, key)
        elif port.kind == "remote-discovery":
            target = remote_target(svc) if svc is not None else None
            if target is not None and target.service is not None:
                member = Member(target.cluster, target.service)
                members[member] = self._source(member, key)
                linked = self.linked.get(target.cluster)
                remote = linked[0].cluster.services.get(target.service) if linked else None
                exists = remote is not None and remote.type != "ExternalName"
            else:
                exists = False
        else:  # istio: the same service in every cluster
            members[Member("", key.service)] = self._source(Member("", key.service), key)
            for name in self.linked:
                member = Member(name, key.service)
                members[member] = self._source(member, key)
                if self.store is not None:
                    self.store.add_interest(name, [key.service])
            exists = exists or any(
                lc.cluster.services.get(key.service) is not None
                for lc, _ in self.linked.values())
        port.update(members, exists)

    def _source(self, member: Member, key: ViewKey) -> MemberSource:
        fk = key.filter
        if not member.cluster:
            local_key = ViewKey(member.service, key.port,
                                FilterKey(fk.node_name, fk.hostname, fk.filtering))
            return MemberSource(local_key, self._join_local, self._leave_local, self)
        remote_key = ViewKey(member.service, key.port, FilterKey("", fk.hostname, False))
        linked = self.linked.get(member.cluster)
        if linked is None:
            return MemberSource(remote_key)
        registry = linked[1]
        return MemberSource(remote_key, registry.subscribe_member, registry.unsubscribe,
                            registry)

    def _subscribe_local(self, key: ViewKey, subscriber: ViewSubscriber,
                         protocol: str) -> View:
        # The local registry's own View of the key, never a merged port's (a port
        # merging a service with its namesakes has the very same key).
        svc = self.cluster.services.get(key.service)
        if svc is not None and svc.type == "ExternalName":
            raise InvalidService(f"{key.service} is an ExternalName service")
        view = ViewRegistry.view(self, key, create=True)
        assert view is not None
        view.add_subscriber(subscriber, protocol)
        return view

    def _join_local(self, key: ViewKey, feed: MemberFeed) -> View:
        return self._subscribe_local(key, feed, "merged")

    def _leave_local(self, key: ViewKey, feed: MemberFeed) -> None:
        ViewRegistry.unsubscribe(self, key, feed)

    # ------------------------------------------------------------- following

    def _on_local_change(self, change: ClusterChange) -> None:
        if not self._merged_by_service:
            return
        for service in change.touched(self._merged_by_service.keys()):
            if service not in change.service_objects and not change.all_services:
                continue  # only the Service object says who the members are
            for key in sorted(self._merged_by_service.get(service, ()), key=_order):
                port = self.merged.get(key)
                if port is not None:
                    self._refresh(port)

    def _link_changed(self, name: str, lc: LinkedCluster | None) -> None:
        current = self.linked.get(name)
        if lc is None:
            if current is None:
                return
            if self.store is not None and self.store.keep_on_unlink:
                return  # Linkerd 2.20: open streams keep what they had
            del self.linked[name]
        elif current is not None and current[0] is lc and current[1].cluster is lc.cluster \
                and current[1].config.trust_domain == lc.link.trust_domain:
            return  # the same cluster, synced now: its Views follow it already
        else:
            self.linked[name] = (lc, LinkedViews(lc, self.config, self.metrics))
        for port in list(self.merged.values()):
            if port.kind == "istio" or any(m.cluster == name for m in port.members):
                self._refresh(port)
        if current is not None:
            current[1].close()  # after its members moved: nothing reads it any more


def _order(key: ViewKey) -> tuple[ServiceKey, int, str, str]:
    return (key.service, key.port, key.filter.node_name, key.filter.hostname)


class LinkedViews(ViewRegistry):
    """A linked cluster's Views: its cache, enriched with its own trust domain and
    cluster domain (identities name the local controller namespace, as Linkerd's)."""

    def __init__(self, lc: LinkedCluster, config: MeshConfig,
                 metrics: ViewMetrics | None) -> None:
        super().__init__(lc.cluster, dataclasses.replace(
            config, trust_domain=lc.link.trust_domain, cluster_domain=lc.link.cluster_domain),
            metrics)

    def subscribe_member(self, key: ViewKey, feed: MemberFeed) -> View:
        return self.subscribe(key, feed, "merged")

    def close(self) -> None:
        """Stop following the cluster (its link was replaced or removed)."""
        with contextlib.suppress(ValueError):
            self.cluster.remove_listener(self._on_cluster_change)
