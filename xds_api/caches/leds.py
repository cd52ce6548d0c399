"""LEDS: each endpoint its own `LbEndpoint` resource, in one glob collection per
locality of a CLA (§7), so that a one-endpoint change is one small delta response.

* Naming: `xds_api.names` (`leds_collection`, `leds_member`): the collection names
  the CLA and the locality; a member adds the endpoint's address. The client's node
  (NODE_NAME) picks the View, as for EDS, so the name itself carries no node.
* Subscription: by collection, over delta ADS only (§7.1). A collection's members
  are what the client holds; `removed_resources` carries members that left and, once,
  a collection that does not exist (not ours, or its service port does not).
* Content: the very LbEndpoint bytes the CLA would carry, from the View's CLA
  assembly (`caches/endpoints.py` `ClaState`, `xds_api/assembly.py`); each watched
  View keeps its members as a value it derives (`MemberState`, advanced by the View
  with each version, after the assembly), wrapped as resources once per endpoint
  change for every stream, and a stream in step compares only the members changed
  since its last reply (`delta_reply`).
* Wildcard: none.

A watched collection is a `CollectionWatch`: the View's subscriber on the stream's
behalf, like an EDS watch, handed the View's members on every version.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from bridge.model import FilterKey, ServiceKey, ViewKey
from bridge.views import Derivation, InvalidService, View, ViewChange, ViewRegistry
from xds_api import resource_types as rt
from xds_api.caches.endpoints import (
    ClaState,
    EndpointCache,
    SubWatches,
    drop_watches,
    retry_blocked,
)
from xds_api.caches.type_cache import Reply, Version, Watcher
from xds_api.metrics import XdsMetrics
from xds_api.names import (
    collection_of,
    leds_collection,
    leds_member,
    parse_leds_collection,
)
from xds_api.resources import EncodedEndpoint, EncodedResource, encode_resource
from xds_api.subscription import ABSENT, Subscription

# collection -> member name -> resource, for one View version.
Members = dict[str, dict[str, EncodedResource]]
# How many View versions of changed member names a View keeps, for the streams that
# are behind: one further behind compares its whole collection once.
LOG_VERSIONS = 64


class MemberState:
    """One View's LEDS members at its current version, and which members each recent
    version changed, so that a stream in step compares only those (`delta_reply`).
    Built once from the View's CLA assembly, then moved by each version's moves of
    the assembly alone, O(change), once for every stream."""

    __slots__ = ("_cache", "_cla", "log", "members", "sources", "version")

    def __init__(self, cache: LedsCache, view: View) -> None:
        self._cache = cache
        # Made (so advanced) before this: the members follow what it moved.
        self._cla: ClaState = view.derived(cache.endpoints.clas)
        self.version = -1
        self.members: Members = {}
        self.sources: dict[str, bytes] = {}  # member -> the LbEndpoint bytes wrapped
        # View version -> collection -> member names that version added, changed or
        # removed; only versions followed change by change since the last build.
        self.log: dict[int, dict[str, set[str]]] = {}
        self._build(view.version)

    def changed_since(self, version: int, collection: str) -> set[str] | None:
        """Members of `collection` changed after `version`; None if not all known."""
        out: set[str] = set()
        for v in range(version + 1, self.version + 1):
            changed = self.log.get(v)
            if changed is None:
                return None
            out |= changed.get(collection, set())
        return out

    def advance(self, change: ViewChange) -> None:
        moves = self._cla.assembly.moves
        if moves is None:  # the assembly was built anew: so are the members
            self._build(change.version)
            return
        name = self._cla.name
        changed: dict[str, set[str]] = {}
        encoded = 0
        for before, after in moves:
            if before is not None:
                collection, member = _member_name(name, before)
                members = self.members.get(collection)
                if members is not None and members.pop(member, None) is not None:
                    self.sources.pop(member, None)
                    changed.setdefault(collection, set()).add(member)
            if after is not None:
                collection, member = _member_name(name, after)
                self.members.setdefault(collection, {})[member] = encode_resource(
                    rt.LB_ENDPOINT, member, after.data)
                self.sources[member] = after.data
                changed.setdefault(collection, set()).add(member)
                encoded += 1
        self.log[change.version] = changed
        self.version = change.version
        while len(self.log) > LOG_VERSIONS:
            del self.log[next(iter(self.log))]
        self._cache.counted(encoded)

    def _build(self, version: int) -> None:
        name = self._cla.name
        old = self.members
        out: Members = {}
        sources: dict[str, bytes] = {}
        encoded = 0
        for locality, run in sorted(self._cla.assembly.runs.items()):
            collection = leds_collection(name, locality)
            members = out[collection] = {}
            previous = old.get(collection, {})
            for enc in run.members():
                ep = enc.source.endpoint
                member = leds_member(collection, ep.ip, ep.port)
                prev = previous.get(member)
                if prev is not None and self.sources.get(member) is enc.data:
                    res = prev
                else:
                    res = encode_resource(rt.LB_ENDPOINT, member, enc.data)
                    encoded += 1
                members[member] = res
                sources[member] = enc.data
        self.members = out
        self.sources = sources
        self.version = version
        self.log.clear()  # streams synced to an older version start over
        self._cache.counted(encoded)


def _member_name(name: str, enc: EncodedEndpoint) -> tuple[str, str]:
    collection = leds_collection(name, enc.locality)
    ep = enc.source.endpoint
    return collection, leds_member(collection, ep.ip, ep.port)


class CollectionWatch:
    """One collection watched by one stream: the View's subscriber on its behalf."""

    __slots__ = ("cache", "collection", "key", "state", "view", "watcher")

    def __init__(self, cache: LedsCache, collection: str, key: ViewKey,
                 watcher: Watcher) -> None:
        self.cache = cache
        self.collection = collection
        self.key = key
        self.watcher = watcher
        self.view: View | None = None  # None while the service cannot be watched
        self.state: MemberState | None = None  # the View's members, at its version

    @property
    def name(self) -> str:
        return self.collection

    @property
    def weight(self) -> int:
        """How many client streams this watch stands for (a worker's feed: many)."""
        return getattr(self.watcher, "weight", 1)

    def joined(self, view: View) -> None:
        self.view = view
        self.state = view.derived(self.cache.members_of)

    def on_view_change(self, view: View, change: ViewChange) -> None:
        self.joined(view)
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
        self._watches: SubWatches[CollectionWatch] = SubWatches()
        self._blocked: dict[ServiceKey, set[CollectionWatch]] = {}
        # Each watched View's members, kept by the View (`MemberState`).
        self.members_of = Derivation("xds-leds-members", lambda view: MemberState(self, view))

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
        return view.derived(self.members_of).members.get(collection_of(name), {}).get(name)

    def resource(self, sub: Subscription, name: str) -> EncodedResource | None:
        members = self.members(sub, collection_of(name))
        return members.get(name) if members is not None else None

    def members(self, sub: Subscription, collection: str) -> dict[str, EncodedResource] | None:
        """The collection's members as `sub` is due them; None if it does not exist."""
        watch = self._watches.get(sub, collection)
        if watch is None or watch.state is None or watch.view is None or not watch.view.exists:
            return None
        return watch.state.members.get(collection, {})

    def views_of(self, sub: Subscription) -> list[View]:
        """The Views `sub`'s collections are watched through."""
        return [w.view for w in self._watches.of(sub) if w.view is not None]

    def watch_of(self, sub: Subscription, collection: str) -> CollectionWatch | None:
        """`sub`'s watch of `collection`, if it watches it."""
        return self._watches.get(sub, collection)

    def wildcard_names(self) -> Iterable[str]:
        return ()

    def covers(self, name: str) -> bool:
        return False

    def counted(self, encoded: int) -> None:
        """`encoded` member resources were wrapped anew: a new LEDS version."""
        if encoded:
            self._version.bump()
            self.metrics.serializations[rt.LB_ENDPOINT].inc(encoded)

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
        """What a delta LEDS subscription is due (§7.3): see `members_reply`."""
        watches = self._watches

        def state_of(collection: str) -> MemberState | None:
            watch = watches.get(sub, collection)
            if watch is None or watch.view is None or not watch.view.exists:
                return None
            return watch.state

        return members_reply(sub, state_of)

    # ------------------------------------------------------------------ watching

    def watch(self, sub: Subscription, names: Iterable[str], watcher: Watcher) -> None:
        watches = self._watches
        for collection in names:
            if watches.get(sub, collection) is not None:
                continue
            key = self._parse(collection, watcher.node_name)
            # §7.3: a new collection is answered even while empty, which is what
            # concludes the client's wait for it; one not ours is reported removed.
            sub.must_reply = True
            sub.leds_synced.pop(collection, None)
            if key is None:
                continue
            watch = CollectionWatch(self, collection, key, watcher)
            watches.add(sub, watch)
            try:
                watch.joined(self.views.subscribe(key, watch, watcher.protocol))
            except InvalidService:
                self._blocked.setdefault(key.service, set()).add(watch)

    def unwatch(self, sub: Subscription, names: Iterable[str], watcher: Watcher) -> None:
        names = set(names)
        # The client drops the members with their collection: forget what it held, so
        # that subscribing again sends them all.
        for name in [n for n in sub.sent if collection_of(n) in names]:
            sub.forget(name)
        for collection in names:
            sub.leds_synced.pop(collection, None)
        drop_watches(self.views, self._watches, self._blocked, sub, names)

    def watch_wildcard(self, watcher: Watcher) -> None:
        pass  # no wildcard for LEDS

    def unwatch_wildcard(self, watcher: Watcher) -> None:
        pass

    def services_changed(self, services: Iterable[ServiceKey]) -> None:
        """Retry the blocked watches of these services: one may be watchable now."""
        retry_blocked(self.views, self._blocked, services, rt.LB_ENDPOINT)


class MemberView(Protocol):
    """A View's LEDS members as `members_reply` reads them: `MemberState` in the
    process that has the View, a worker's mirror of it elsewhere."""

    @property
    def members(self) -> dict[str, dict[str, EncodedResource]]: ...

    @property
    def version(self) -> int: ...

    def changed_since(self, version: int, collection: str) -> set[str] | None: ...


def members_reply(sub: Subscription, state_of: Callable[[str], MemberView | None]
                  ) -> Reply | None:
    """What a delta LEDS subscription is due (§7.3): per dirty collection, the
    members whose version the client does not hold and the members it holds that
    left; a subscribed collection that does not exist is reported removed, once.
    `state_of(collection)` is the collection's members, or None when it does not
    exist (not watched, its service gone).

    A stream whose collection was last answered at a version the View's log still
    covers compares only the members changed since (O(change)); otherwise, or
    after anything else touched what it holds, the whole collection, once."""
    collections: set[str] = set()
    for name in sub.dirty:
        collection = collection_of(name)
        collections.add(collection)
        if name != collection:
            sub.leds_synced.pop(collection, None)  # a member named on its own
    held: dict[str, list[str]] | None = None
    send: list[EncodedResource] = []
    removed: list[str] = []
    for collection in sorted(collections):
        state = state_of(collection) if collection in sub.names else None
        if state is None:
            sub.leds_synced.pop(collection, None)
            held = held if held is not None else _held(sub, collections)
            removed.extend(sorted(n for n in held[collection] if sub.sent[n] != ABSENT))
            if collection in sub.names and sub.sent.get(collection) != ABSENT:
                removed.append(collection)
            continue
        if sub.sent.get(collection) == ABSENT:
            sub.forget(collection)  # it exists again: members are what it holds
        members = state.members.get(collection, {})
        synced = sub.leds_synced.get(collection)
        changed = (state.changed_since(synced[1], collection)
                   if synced is not None and synced[0] is state else None)
        if changed is None:
            held = held if held is not None else _held(sub, collections)
            for name in sorted(members):
                res = members[name]
                if sub.sent.get(name) != res.version:
                    send.append(res)
            removed.extend(sorted(n for n in held[collection] if n not in members))
        else:
            for name in sorted(changed):
                member = members.get(name)
                if member is not None:
                    if sub.sent.get(name) != member.version:
                        send.append(member)
                elif name in sub.sent:
                    removed.append(name)
        sub.leds_synced_to(collection, (state, state.version))
    if not send and not removed and not sub.must_reply:
        return None
    return Reply(rt.LB_ENDPOINT, tuple(send), tuple(removed))


def _held(sub: Subscription, collections: set[str]) -> dict[str, list[str]]:
    """The members `sub` holds of each of `collections` (a pass over all it holds)."""
    held: dict[str, list[str]] = {c: [] for c in collections}
    for name in sub.sent:
        bucket = held.get(collection_of(name))
        if bucket is not None and name != collection_of(name):
            bucket.append(name)
    return held
