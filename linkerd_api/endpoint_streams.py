"""Get streams: one `EndpointStream` per RPC, one encoding per View version.

Each View that Linkerd streams watch carries one `ViewMessages` (a value the View
derives and advances itself, `bridge.views.derived`): the first stream to hear of a
version encodes that version's messages into it, every other one reuses those very
bytes, so N streams cost one serialization and N queue appends: what a change costs
grows with the changes, not with the subscribers. And a change's messages are built
from the changed endpoints alone (the View's delta, the snapshot's address index and
ready count, set labels kept until a slice of the service changes), so it does not
grow with the service either.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from bridge.cluster import Cluster
from bridge.model import ResolvedEndpoint, ServiceKey, ViewKey
from bridge.multicluster.views import MultiClusterViews
from bridge.views import Derivation, View, ViewChange
from linkerd_api.queue import Outgoing, UpdateQueue
from linkerd_api.translate import Translator, has_ready, ready_diff, ready_endpoints, set_labels

Semantics = Literal["proto", "linkerd-2.20"]
SEMANTICS: tuple[Semantics, ...] = ("proto", "linkerd-2.20")

Messages = tuple[Outgoing, ...]
# The set labels of a View's endpoints from one member cluster ("": the View's own).
Labeller = Callable[[str], dict[str, str]]


class UpdateEncoder:
    """Turns View versions into the `Update` messages one semantics prescribes.

    proto: the destination API's own contract. A service that does not exist gets
      `no_endpoints{exists:false}`, one with no ready endpoint `no_endpoints{exists:
      true}`, at subscribe time and whenever the set becomes empty.
    linkerd-2.20: what Linkerd's 2.20 controller does (§1.7, §2.5): never
      `no_endpoints`; an empty set is silence, a deleted service a `remove` of all.
    Both send the whole set as one `add` first, then `add` before `remove` per change.
    """

    def __init__(self, translator: Translator, semantics: Semantics,
                 views: MultiClusterViews | None = None) -> None:
        self.translator = translator
        self.semantics = semantics
        self.views = views
        self.messages = Derivation("linkerd-messages", lambda view: ViewMessages(self, view))

    def snapshot(self, view: View) -> Messages:
        """What a new subscriber of `view` is sent first."""
        return view.derived(self.messages).snapshot()

    def diff(self, view: View, change: ViewChange) -> Messages:
        """What every subscriber is sent for `change` (the view's current version)."""
        return view.derived(self.messages).diff(change)

    def labels_source(self, view: View, member_cluster: str) -> tuple[Cluster, ServiceKey]:
        """Where the set labels of `view`'s endpoints from `member_cluster` are read: a
        View served from other clusters' Views has the labels of each member's own
        service and slices, as each of Linkerd's per-member translators sends them."""
        cluster, service = view.cluster, view.key.service
        merged = self.views.merged_port(view) if self.views is not None else None
        if merged is not None and self.views is not None:
            member = merged.member_in(member_cluster)
            if member is not None:
                service = member.service
                cluster = self.views.cluster_named(member.cluster) or cluster
        return cluster, service

    def _adds(self, endpoints: list[ResolvedEndpoint], labels: Labeller) -> list[bytes]:
        """One `add` per member cluster the endpoints come from (one for a View of
        one cluster), each with its set labels."""
        by_cluster: dict[str, list[ResolvedEndpoint]] = {}
        for r in endpoints:
            by_cluster.setdefault(r.id.cluster, []).append(r)
        return [self.translator.add(group, labels(cluster))
                for cluster, group in sorted(by_cluster.items())]

    def snapshot_messages(self, view: View, labels: Labeller) -> list[bytes]:
        ready = ready_endpoints(view.snapshot)
        if ready:
            return self._adds(ready, labels)
        if self.semantics == "proto":
            return [self.translator.no_endpoints(view.exists)]
        return []

    def diff_messages(self, view: View, change: ViewChange, labels: Labeller) -> list[bytes]:
        added, removed = ready_diff(change)
        out: list[bytes] = []
        # Add before remove, as Linkerd's publishDiff does (§2.5).
        if added:
            out.extend(self._adds(added, labels))
        if removed:
            out.append(self.translator.remove(removed))
        if (self.semantics == "proto" and (removed or change.exists_changed)
                and not has_ready(change.current)):
            out.append(self.translator.no_endpoints(view.exists))
        return out


class ViewMessages:
    """One View's messages under one encoder: the snapshot a new stream is sent and
    the current version's diff, each encoded at most once per version, and the set
    labels of each member cluster, read from the service's slices again only when one
    of them changed (`Cluster.slice_stamps`), not on every version."""

    __slots__ = ("_diff", "_encoder", "_labels", "_snapshot", "view")

    def __init__(self, encoder: UpdateEncoder, view: View) -> None:
        self._encoder = encoder
        self.view = view
        self._snapshot: Messages | None = None
        self._diff: Messages | None = None
        self._labels: dict[str, tuple[int, dict[str, str]]] = {}  # member -> (stamp, labels)

    def advance(self, change: ViewChange) -> None:
        self._snapshot = self._diff = None

    def labels(self, member_cluster: str = "") -> dict[str, str]:
        cluster, service = self._encoder.labels_source(self.view, member_cluster)
        stamp = cluster.slice_stamps.get(service, 0)
        hit = self._labels.get(member_cluster)
        if hit is not None and hit[0] == stamp:
            return hit[1]
        labels = set_labels(cluster, service)
        self._labels[member_cluster] = (stamp, labels)
        return labels

    def snapshot(self) -> Messages:
        if self._snapshot is None:
            version = str(self.view.version)
            self._snapshot = tuple(
                (version, m) for m in self._encoder.snapshot_messages(self.view, self.labels))
        return self._snapshot

    def diff(self, change: ViewChange) -> Messages:
        if self._diff is None:
            version = str(change.version)
            self._diff = tuple((version, m) for m in self._encoder.diff_messages(
                self.view, change, self.labels))
        return self._diff


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
