"""One service port served from several clusters' Views: a remote-discovery mirror (its
linked cluster's service), a federated Service (its members), or, for xDS clients in
istiod's mode, a service and its namesakes in every linked cluster.

A `MergedPort` joins the Views of its members and publishes their union to a View of
its own in the local cluster, so both protocols encode it as they encode any View, and
zone locality is the subscriber's node's (local) against the endpoint's zone. Each
member's endpoints keep their linked cluster in their id (`EndpointId.cluster`), so
one pod name in two clusters is two endpoints; a member that joins adds its
endpoints, one that leaves removes them, in one version each.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import structlog

from bridge.cluster import Cluster
from bridge.model import Endpoint, EndpointId, MeshConfig, ViewKey
from bridge.multicluster.targets import Member
from bridge.views import InvalidService, VersionedMap, View, ViewChange
from bridge.views.metrics import ViewMetrics

log = structlog.get_logger("meshbridge.multicluster")

# What a member's View is joined through (a ViewRegistry's subscribe and unsubscribe).
Join = Callable[[ViewKey, "MemberFeed"], View]
Leave = Callable[[ViewKey, "MemberFeed"], None]


@dataclass(frozen=True, slots=True)
class MemberSource:
    """Where a member's endpoints come from now: its cluster's registry and key, or
    nothing yet (its cluster is not linked, or its service cannot be watched)."""

    key: ViewKey
    join: Join | None = None
    leave: Leave | None = None
    origin: object = None  # which registry: a change of it is a rejoin


class MemberFeed:
    """One member's View, as the merged port's subscriber to it."""

    __slots__ = ("member", "owner", "source", "stamped", "view")

    def __init__(self, owner: MergedPort, member: Member, source: MemberSource) -> None:
        self.owner = owner
        self.member = member
        self.source = source
        self.view: View | None = None
        # Each endpoint as the merged port publishes it (its id naming the cluster),
        # kept so that an unchanged endpoint stays the very same object.
        self.stamped: dict[EndpointId, tuple[Endpoint, Endpoint]] = {}

    def on_view_change(self, view: View, change: ViewChange) -> None:
        self.owner.member_changed(self, change)

    def stamp(self, ep: Endpoint) -> Endpoint:
        if not self.member.cluster:
            return ep
        known = self.stamped.get(ep.id)
        if known is not None and known[0] is ep:
            return known[1]
        out = replace(ep, id=replace(ep.id, cluster=self.member.cluster))
        self.stamped[ep.id] = (ep, out)
        return out

    def stamped_id(self, eid: EndpointId) -> EndpointId:
        return replace(eid, cluster=self.member.cluster) if self.member.cluster else eid


class MergedPort:
    """The union of its members' Views, published as one View of the local cluster."""

    def __init__(self, key: ViewKey, local: Cluster, config: MeshConfig,
                 metrics: ViewMetrics | None = None, kind: str = "federated") -> None:
        self.key = key
        self.kind = kind  # remote-discovery | federated | istio
        # Filtered already by each member's View; here only locality and weight are
        # resolved, against the subscriber's node in the local cluster.
        self.view = View(key, local, config, metrics)
        self.view.filters = False
        self.available: VersionedMap[EndpointId, Endpoint] = VersionedMap()
        self.exists = False
        self.members: dict[Member, MemberFeed] = {}
        self.view.publish(self.available, self.exists)

    # ------------------------------------------------------------------ members

    def update(self, sources: Mapping[Member, MemberSource], exists: bool) -> None:
        """Make the members `sources`: those that left leave, those that joined (or
        whose cluster came or was replaced) join; one version for all of it."""
        delta: dict[EndpointId, Endpoint | None] = {}
        for member, feed in list(self.members.items()):
            source = sources.get(member)
            if source is None or source.origin is not feed.source.origin:
                self._leave(feed, delta)
                del self.members[member]
        for member, source in sorted(sources.items()):
            if member not in self.members:
                feed = self.members[member] = MemberFeed(self, member, source)
                self._join(feed, delta)
        self._publish(delta, exists)

    def close(self) -> None:
        for feed in self.members.values():
            self._leave(feed, {})
        self.members.clear()

    def _join(self, feed: MemberFeed, delta: dict[EndpointId, Endpoint | None]) -> None:
        source = feed.source
        if source.join is None:
            return  # pending: joins when its cluster is linked
        try:
            view = source.join(source.key, feed)
        except InvalidService as e:
            log.info("member not served", service=str(self.key.service), port=self.key.port,
                     member=f"{feed.member.service}@{feed.member.cluster or 'local'}",
                     reason=str(e))
            return
        feed.view = view
        for r in view.snapshot.values():
            delta[feed.stamped_id(r.id)] = feed.stamp(r.endpoint)

    def _leave(self, feed: MemberFeed, delta: dict[EndpointId, Endpoint | None]) -> None:
        view, feed.view = feed.view, None
        if view is None:
            return
        for eid in view.snapshot:
            sid = feed.stamped_id(eid)
            if delta.get(sid) is None:
                delta[sid] = None
        if feed.source.leave is not None:
            feed.source.leave(feed.source.key, feed)

    def member_changed(self, feed: MemberFeed, change: ViewChange) -> None:
        if feed.view is None:
            return
        delta: dict[EndpointId, Endpoint | None] = {}
        for r in change.removed:
            delta[feed.stamped_id(r.id)] = None
            feed.stamped.pop(r.id, None)
        for r in change.added:
            delta[feed.stamped_id(r.id)] = feed.stamp(r.endpoint)
        self._publish(delta, self.exists)

    def _publish(self, delta: dict[EndpointId, Endpoint | None], exists: bool) -> None:
        available = self.available
        real = {i: e for i, e in delta.items()
                if (e is None and i in available) or (e is not None and available.get(i) != e)}
        if not real and exists == self.exists:
            return
        if real:
            self.available = available.evolve(real)
        self.exists = exists
        self.view.publish(self.available, exists, set(real))

    def member_in(self, cluster: str) -> Member | None:
        """The (first) member from `cluster` ("": the local one): whose service an
        endpoint with that cluster in its id belongs to."""
        return next((m for m in self.members if m.cluster == cluster), None)
