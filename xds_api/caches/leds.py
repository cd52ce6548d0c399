"""LEDS: each endpoint its own `LbEndpoint` resource, in one glob collection per
locality of a CLA (§7), so that a one-endpoint change is one small delta response.

* Naming: `xds_api.names` (`leds_collection`, `leds_member`): the collection names
  the CLA and the locality; a member adds the endpoint's address. The client's node
  (NODE_NAME) picks the View, as for EDS, so the name itself carries no node.
* Subscription: by collection, over delta ADS only (§7.1). A collection's members
  are what the client holds; `removed_resources` carries members that left and, once,
  a collection that does not exist (not ours, or its service port does not).
* Content: the very LbEndpoint bytes the CLA would carry, from the per-version
  grouping `EndpointCache.groups_of` shares with EDS; wrapped as resources once per
  endpoint change for every stream (`_members_of`).
* Wildcard: none.

A watched collection is a `CollectionWatch`: the View's subscriber on the stream's
behalf, like an EDS watch.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

from bridge.model import FilterKey, ServiceKey, ViewKey
from bridge.views import InvalidService, View, ViewChange, ViewRegistry
from xds_api import resource_types as rt
from xds_api.caches.endpoints import EndpointCache
from xds_api.caches.type_cache import Reply, Version, Watcher
from xds_api.metrics import XdsMetrics
from xds_api.names import (
    collection_of,
    leds_collection,
    leds_member,
    parse_leds_collection,
)
from xds_api.resources import EncodedResource, encode_resource
from xds_api.subscription import ABSENT, Subscription

# collection -> member name -> resource, for one View version.
Members = dict[str, dict[str, EncodedResource]]


class CollectionWatch:
    """One collection watched by one stream: the View's subscriber on its behalf."""

    __slots__ = ("collection", "key", "view", "watcher")

    def __init__(self, collection: str, key: ViewKey, watcher: Watcher) -> None:
        self.collection = collection
        self.key = key
        self.watcher = watcher
        self.view: View | None = None  # None while the service cannot be watched

    def on_view_change(self, view: View, change: ViewChange) -> None:
        self.view = view
        self.watcher.resource_changed(rt.LB_ENDPOINT, self.collection)


class LedsCache:
    type_url = rt.LB_ENDPOINT
    full_state = False

    def __init__(self, endpoints: EndpointCache, views: ViewRegistry, cluster_domain: str,
                 prefix: str, metrics: XdsMetrics) -> None:
        self.endpoints = endpoints
        self.views = views
        self.cluster_domain = cluster_domain
        self.metrics = metrics
        self._version = Version(prefix)
        self._watches: dict[Subscription, dict[str, CollectionWatch]] = {}
        self._blocked: dict[ServiceKey, set[CollectionWatch]] = {}
        # Per View: member name -> (LbEndpoint bytes, resource), so that an unchanged
        # endpoint is not wrapped and hashed again for the next version.
        self._memos: weakref.WeakKeyDictionary[
            View, dict[str, tuple[bytes, EncodedResource]]] = weakref.WeakKeyDictionary()
        self._key = ("xds_api.leds", endpoints.draining)

    def version(self) -> str:
        return str(self._version)

    # ------------------------------------------------------------------ reading

    def get(self, name: str, node_name: str = "") -> EncodedResource | None:
        """One member, as a client on `node_name` would get it; a collection is not a
        resource itself."""
        parsed = self._parse(collection_of(name), node_name)
        if parsed is None:
            return None
        view = self.views.view(parsed)
        if view is None or not view.exists:
            return None
        return self._members_of(view).get(collection_of(name), {}).get(name)

    def resource(self, sub: Subscription, name: str) -> EncodedResource | None:
        members = self.members(sub, collection_of(name))
        return members.get(name) if members is not None else None

    def members(self, sub: Subscription, collection: str) -> dict[str, EncodedResource] | None:
        """The collection's members as `sub` is due them; None if it does not exist."""
        watch = self._watches.get(sub, {}).get(collection)
        if watch is None or watch.view is None or not watch.view.exists:
            return None
        return self._members_of(watch.view).get(collection, {})

    def wildcard_names(self) -> Iterable[str]:
        return ()

    def covers(self, name: str) -> bool:
        return False

    def _members_of(self, view: View) -> Members:
        out: Members = view.cached(self._key, lambda: self._build(view))
        return out

    def _build(self, view: View) -> Members:
        name = view.key.authority(self.cluster_domain)
        old = self._memos.get(view, {})
        memo: dict[str, tuple[bytes, EncodedResource]] = {}
        out: Members = {}
        encoded = 0
        for locality, group in self.endpoints.groups_of(view).items():
            collection = leds_collection(name, locality)
            members = out[collection] = {}
            for enc in group:
                ep = enc.source.endpoint
                member = leds_member(collection, ep.ip, ep.port)
                prev = old.get(member)
                if prev is not None and prev[0] is enc.data:
                    res = prev[1]
                else:
                    res = encode_resource(rt.LB_ENDPOINT, member, enc.data)
                    encoded += 1
                memo[member] = (enc.data, res)
                members[member] = res
        self._memos[view] = memo
        if encoded:
            self._version.bump()
            self.metrics.serializations[rt.LB_ENDPOINT].inc(encoded)
        return out

    def _parse(self, collection: str, node_name: str) -> ViewKey | None:
        parsed = parse_leds_collection(collection, self.cluster_domain)
        if parsed is None:
            return None
        _, key, _ = parsed
        if not node_name:
            return key
        return ViewKey(key.service, key.port,
                       FilterKey(node_name=node_name, hostname=key.filter.hostname))

    # ------------------------------------------------------------------ deciding

    def delta_reply(self, sub: Subscription) -> Reply | None:
        """What a delta LEDS subscription is due (§7.3): per dirty collection, the
        members whose version the client does not hold and the members it holds that
        left; a subscribed collection that does not exist is reported removed, once."""
        collections = sorted({collection_of(n) for n in sub.dirty})
        held: dict[str, list[str]] = {c: [] for c in collections}
        if collections:
            for name in sub.sent:
                bucket = held.get(collection_of(name))
                if bucket is not None and name != collection_of(name):
                    bucket.append(name)
        send: list[EncodedResource] = []
        removed: list[str] = []
        for collection in collections:
            members = self.members(sub, collection) if collection in sub.names else None
            if members is None:
                removed.extend(sorted(n for n in held[collection] if sub.sent[n] != ABSENT))
                if collection in sub.names and sub.sent.get(collection) != ABSENT:
                    removed.append(collection)
                continue
            if sub.sent.get(collection) == ABSENT:
                del sub.sent[collection]  # it exists again: members are what it holds
            for name in sorted(members):
                res = members[name]
                if sub.sent.get(name) != res.version:
                    send.append(res)
            removed.extend(sorted(n for n in held[collection] if n not in members))
        if not send and not removed and not sub.must_reply:
            return None
        return Reply(rt.LB_ENDPOINT, self.version(), tuple(send), tuple(removed))

    # ------------------------------------------------------------------ watching

    def watch(self, sub: Subscription, names: Iterable[str], watcher: Watcher) -> None:
        watches = self._watches.setdefault(sub, {})
        for collection in names:
            if collection in watches:
                continue
            key = self._parse(collection, watcher.node_name)
            # §7.3: a new collection is answered even while empty, which is what
            # concludes the client's wait for it; one not ours is reported removed.
            sub.must_reply = True
            if key is None:
                continue
            watch = watches[collection] = CollectionWatch(collection, key, watcher)
            try:
                watch.view = self.views.subscribe(key, watch, watcher.protocol)
            except InvalidService:
                self._blocked.setdefault(key.service, set()).add(watch)
        if not watches:
            del self._watches[sub]

    def unwatch(self, sub: Subscription, names: Iterable[str], watcher: Watcher) -> None:
        names = set(names)
        # The client drops the members with their collection: forget what it held, so
        # that subscribing again sends them all.
        for name in [n for n in sub.sent if collection_of(n) in names]:
            del sub.sent[name]
        watches = self._watches.get(sub)
        if watches is None:
            return
        for collection in names:
            watch = watches.pop(collection, None)
            if watch is None:
                continue
            if watch.view is not None:
                self.views.unsubscribe(watch.key, watch)
                continue
            blocked = self._blocked.get(watch.key.service)
            if blocked is not None:
                blocked.discard(watch)
                if not blocked:
                    del self._blocked[watch.key.service]
        if not watches:
            del self._watches[sub]

    def watch_wildcard(self, watcher: Watcher) -> None:
        pass  # no wildcard for LEDS

    def unwatch_wildcard(self, watcher: Watcher) -> None:
        pass

    def services_changed(self, services: Iterable[ServiceKey]) -> None:
        """Retry the blocked watches of these services: one may be watchable now."""
        for svc in services:
            blocked = self._blocked.get(svc)
            if not blocked:
                continue
            for watch in sorted(blocked, key=lambda w: w.collection):
                try:
                    watch.view = self.views.subscribe(watch.key, watch,
                                                      watch.watcher.protocol)
                except InvalidService:
                    continue
                blocked.discard(watch)
                watch.watcher.resource_changed(rt.LB_ENDPOINT, watch.collection)
            if not blocked:
                del self._blocked[svc]
