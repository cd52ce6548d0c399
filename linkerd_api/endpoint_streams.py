"""Get streams: one `EndpointStream` per RPC, one encoding per View version.

A View tells each of its subscribers about a new version; the first Linkerd
subscriber to hear of it encodes the version's messages into `View.cache`, every
other one reuses those very bytes, so N streams cost one serialization and N
queue appends: what a change costs grows with the changes, not with the subscribers.
And a change's messages are built from the changed endpoints alone (the View's
delta, the snapshot's address index and ready count, set labels kept until a slice
of the service changes), so it does not grow with the service either.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Literal

from bridge.cluster import Cluster
from bridge.model import ResolvedEndpoint, ViewKey
from bridge.multicluster.views import MultiClusterViews
from bridge.views import View, ViewChange
from linkerd_api.queue import Outgoing, UpdateQueue
from linkerd_api.translate import Translator, has_ready, ready_diff, ready_endpoints, set_labels

Semantics = Literal["proto", "linkerd-2.20"]
SEMANTICS: tuple[Semantics, ...] = ("proto", "linkerd-2.20")

Messages = tuple[Outgoing, ...]

_SNAPSHOT = ("linkerd", "snapshot")
_DIFF = ("linkerd", "diff")


class UpdateEncoder:
    """Turns View versions into the `Update` messages one semantics prescribes.

    proto: the destination API's own contract. A service that does not exist gets
      `no_endpoints{exists:false}`, one with no ready endpoint `no_endpoints{exists:
      true}`, at subscribe time and whenever the set becomes empty.
    linkerd-2.20: what Linkerd's 2.20 controller does (§1.7, §2.5): never
      `no_endpoints`; an empty set is silence, a deleted service a `remove` of all.
    Both send the whole set as one `add` first, then `add` before `remove` per change.
    """

    def __init__(self, cluster: Cluster, translator: Translator, semantics: Semantics,
                 views: MultiClusterViews | None = None) -> None:
        self.cluster = cluster
        self.translator = translator
        self.semantics = semantics
        self.views = views
        self._set_labels: weakref.WeakKeyDictionary[
            View, dict[str, tuple[int, dict[str, str]]]] = weakref.WeakKeyDictionary()

    def snapshot(self, view: View) -> Messages:
        """What a new subscriber of `view` is sent first."""
        result: Messages = view.cached(_SNAPSHOT, lambda: self._encode_snapshot(view))
        return result

    def diff(self, view: View, change: ViewChange) -> Messages:
        """What every subscriber is sent for `change` (the view's current version)."""
        # Called once per subscriber: a plain lookup first, no closure, on this path.
        cached: Messages | None = view.cache.get(_DIFF)
        if cached is None:
            cached = view.cached(_DIFF, lambda: self._encode_diff(view, change))
        return cached

    def _labels(self, view: View, member_cluster: str = "") -> dict[str, str]:
        """The set labels, read from the service's slices again only when one of them
        changed (`Cluster.slice_stamps`), not on every version. A View served from
        other clusters' Views has the labels of each member's own service and slices,
        as each of Linkerd's per-member translators sends them."""
        cluster, service = self.cluster, view.key.service
        merged = self.views.merged_port(view) if self.views is not None else None
        if merged is not None and self.views is not None:
            member = merged.member_in(member_cluster)
            if member is not None:
                service = member.service
                cluster = self.views.cluster_named(member.cluster) or cluster
        stamp = cluster.slice_stamps.get(service, 0)
        known = self._set_labels.setdefault(view, {})
        hit = known.get(member_cluster)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        labels = set_labels(cluster, service)
        known[member_cluster] = (stamp, labels)
        return labels

    def _adds(self, view: View, endpoints: list[ResolvedEndpoint]) -> list[bytes]:
        """One `add` per member cluster the endpoints come from (one for a View of
        one cluster), each with its set labels."""
        by_cluster: dict[str, list[ResolvedEndpoint]] = {}
        for r in endpoints:
            by_cluster.setdefault(r.id.cluster, []).append(r)
        return [self.translator.add(group, self._labels(view, cluster))
                for cluster, group in sorted(by_cluster.items())]

    def _encode_snapshot(self, view: View) -> Messages:
        return tuple((str(view.version), m) for m in self.snapshot_messages(view))

    def snapshot_messages(self, view: View) -> list[bytes]:
        ready = ready_endpoints(view.snapshot)
        if ready:
            return self._adds(view, ready)
        if self.semantics == "proto":
            return [self.translator.no_endpoints(view.exists)]
        return []

    def _encode_diff(self, view: View, change: ViewChange) -> Messages:
        version = str(change.version)
        return tuple((version, m) for m in self._diff_messages(view, change))

    def _diff_messages(self, view: View, change: ViewChange) -> list[bytes]:
        added, removed = ready_diff(change)
        out: list[bytes] = []
        # Add before remove, as Linkerd's publishDiff does (§2.5).
        if added:
            out.extend(self._adds(view, added))
        if removed:
            out.append(self.translator.remove(removed))
        if (self.semantics == "proto" and (removed or change.exists_changed)
                and not has_ready(change.current)):
            out.append(self.translator.no_endpoints(view.exists))
        return out


class EndpointStream(UpdateQueue):
    """One Get RPC's subscription to one View: queues what the encoder produced."""

    __slots__ = ("encoder", "ends_with_service", "key", "label", "on_overflow", "peer")

    def __init__(self, capacity: int, encoder: UpdateEncoder, key: ViewKey, label: str,
                 peer: str, on_overflow: Callable[[EndpointStream], None]) -> None:
        super().__init__(capacity)
        self.encoder = encoder
        self.key = key
        self.label = label  # the `service` label of this stream's metrics
        self.peer = peer
        self.on_overflow = on_overflow
        # A federated Service's stream ends when the Service does (status OK).
        self.ends_with_service = False

    def on_view_change(self, view: View, change: ViewChange) -> None:
        if self.ended:
            return
        if self.ends_with_service and not view.exists:
            self.end()
            return
        messages = self.encoder.diff(view, change)
        if messages and self.info is not None:
            self.info.changed(view.published_at)
        for message in messages:
            if not self.push(message):
                if self.overflowed:
                    self.on_overflow(self)
                return
