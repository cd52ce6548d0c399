"""A worker's xDS resources: a mirror of the watcher's resource cache, fed over the
worker channel, that the stream state machines read as they read the cache itself
(`stream.Resources`). Nothing is encoded here: resources arrive encoded, once per
worker, and every stream of the worker shares them (xds_api.feed_keys says what a
feed is; xds_api.feeds is the watcher's side).

A stream's name joins the feed of its key, subscribing it on first use; until the
feed's snapshot comes, the subscription's replies are PENDING (what is due stays
due) and the feed wakes it on arrival. A feed no stream watches is kept for
`LINGER` seconds before it is given up, so that clients reconnecting to this worker
find it there. The SotW and delta rules are the cache's own (`type_cache`,
`caches/leds.members_reply`), applied to the mirrored resources.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable
from typing import TYPE_CHECKING

from xds_api import resource_types as rt
from xds_api.caches.leds import LOG_VERSIONS, members_reply
from xds_api.caches.type_cache import PENDING, Pending, Reply, Watcher, delta_reply, sotw_reply
from xds_api.feed_keys import FeedKey, shape_of
from xds_api.metrics import XdsMetrics
from xds_api.names import collection_of
from xds_api.resources import EncodedResource
from xds_api.subscription import NameChange, Subscription

if TYPE_CHECKING:
    from meshbridge.host import Link

# Seconds a feed no stream watches is kept (a reconnect storm does not subscribe and
# unsubscribe in a loop).
LINGER = 5.0


class _Published:
    """What a stream reads of a View when told its endpoints changed."""

    __slots__ = ("published_at",)

    def __init__(self, published_at: float) -> None:
        self.published_at = published_at


class MirrorFeed:
    """One feed's resources as the watcher last sent them, and the streams on it."""

    __slots__ = (
        "exists",
        "id",
        "key",
        "linger",
        "log",
        "members",
        "ready",
        "resources",
        "version",
        "watchers",
    )

    def __init__(self, feed_id: int, key: FeedKey) -> None:
        self.id = feed_id
        self.key = key
        self.ready = False
        self.resources: dict[str, EncodedResource] = {}
        # watcher -> its subscription, for every stream watching the feed
        self.watchers: dict[Watcher, Subscription] = {}
        self.linger: asyncio.TimerHandle | None = None
        # LEDS (`caches/leds.Members`): the collection's members, whether it exists,
        # and the members each recent version changed.
        self.exists = False
        self.members: dict[str, dict[str, EncodedResource]] = {}
        self.version = 0
        self.log: dict[int, set[str]] = {}

    def changed_since(self, version: int, collection: str) -> set[str] | None:
        out: set[str] = set()
        for v in range(version + 1, self.version + 1):
            changed = self.log.get(v)
            if changed is None:
                return None
            out |= changed
        return out


class _MirrorType:
    """One type's mirrored resources, as `type_cache`'s reply rules read a cache."""

    def __init__(self, mirror: MirrorCache, type_url: str) -> None:
        self.mirror = mirror
        self.type_url = type_url
        self.full_state = type_url in rt.FULL_STATE

    def resource(self, sub: Subscription, name: str) -> EncodedResource | None:
        shape = shape_of(sub)
        feed = self.mirror.feeds.get((self.type_url, name, shape))
        res = feed.resources.get(name) if feed is not None else None
        if res is None and sub.wildcard:
            every = self.mirror.feeds.get((self.type_url, rt.WILDCARD, shape))
            res = every.resources.get(name) if every is not None else None
        return res

    def wildcard_names(self) -> Iterable[str]:
        every = self.mirror.feeds.get((self.type_url, rt.WILDCARD, ()))
        return every.resources.keys() if every is not None else ()

    def covers(self, name: str) -> bool:
        every = self.mirror.feeds.get((self.type_url, rt.WILDCARD, ()))
        return every is not None and name in every.resources


class MirrorCache:
    """`stream.Resources` for a worker (see the module)."""

    def __init__(self, link: Link, metrics: XdsMetrics) -> None:
        self.link = link
        self.metrics = metrics
        self.feeds: dict[FeedKey, MirrorFeed] = {}
        self._by_id: dict[int, MirrorFeed] = {}
        self._ids = itertools.count(1)
        self._types = {t: _MirrorType(self, t) for t in rt.ORDER}
        # Subscriptions with feeds still pending: how many.
        self._waiting: dict[Subscription, int] = {}
        self._reweigh: set[MirrorFeed] = set()
        link.on("xds.res", self._res)
        link.on("xds.all", self._all)
        link.on("xds.members", self._members)

    def cache_of(self, type_url: str) -> _MirrorType | None:
        """One type's mirrored resources (what a config dump reads)."""
        return self._types.get(type_url)

    def close(self) -> None:
        for feed in self.feeds.values():
            if feed.linger is not None:
                feed.linger.cancel()

    # ------------------------------------------------------------------ Resources

    def watch(self, sub: Subscription, change: NameChange, watcher: Watcher) -> None:
        t, shape = sub.type_url, shape_of(sub)
        for name in change.removed:
            self._leave((t, name, shape), watcher)
        for name in change.added:
            self._join((t, name, shape), watcher, sub)
        if change.wildcard_added:
            self._join((t, rt.WILDCARD, shape), watcher, sub)
        if change.wildcard_removed:
            self._leave((t, rt.WILDCARD, shape), watcher)

    def release(self, sub: Subscription, watcher: Watcher) -> None:
        t, shape = sub.type_url, shape_of(sub)
        for name in sub.names:
            self._leave((t, name, shape), watcher)
        if sub.wildcard:
            self._leave((t, rt.WILDCARD, shape), watcher)
        self._waiting.pop(sub, None)

    def wildcard_names(self, type_url: str) -> Iterable[str]:
        return self._types[type_url].wildcard_names()

    def sotw_reply(self, sub: Subscription) -> Reply | Pending | None:
        if sub in self._waiting:
            return PENDING
        return sotw_reply(self._types[sub.type_url], sub)

    def delta_reply(self, sub: Subscription) -> Reply | Pending | None:
        if sub in self._waiting:
            return PENDING
        if sub.type_url == rt.LB_ENDPOINT:
            shape = shape_of(sub)

            def state_of(collection: str) -> MirrorFeed | None:
                feed = self.feeds.get((rt.LB_ENDPOINT, collection, shape))
                return feed if feed is not None and feed.exists else None

            return members_reply(sub, state_of)
        return delta_reply(self._types[sub.type_url], sub)

    # ------------------------------------------------------------------ feeds

    def _join(self, key: FeedKey, watcher: Watcher, sub: Subscription) -> None:
        feed = self.feeds.get(key)
        if feed is None:
            feed = self.feeds[key] = MirrorFeed(next(self._ids), key)
            self._by_id[feed.id] = feed
            self.link.send("xds.sub", feed.id, *key)
        elif feed.linger is not None:
            feed.linger.cancel()
            feed.linger = None
        feed.watchers[watcher] = sub
        if not feed.ready:
            self._waiting[sub] = self._waiting.get(sub, 0) + 1
        self._weigh(feed)

    def _leave(self, key: FeedKey, watcher: Watcher) -> None:
        feed = self.feeds.get(key)
        if feed is None:
            return
        sub = feed.watchers.pop(watcher, None)
        if sub is not None and not feed.ready:
            self._done_waiting(sub)
        self._weigh(feed)
        if not feed.watchers and feed.linger is None:
            loop = asyncio.get_running_loop()
            feed.linger = loop.call_later(LINGER, self._drop, feed)

    def _drop(self, feed: MirrorFeed) -> None:
        if feed.watchers or self.feeds.get(feed.key) is not feed:
            return
        del self.feeds[feed.key]
        del self._by_id[feed.id]
        self._reweigh.discard(feed)
        self.link.send("xds.unsub", feed.id)

    def _weigh(self, feed: MirrorFeed) -> None:
        """Tell the watcher how many streams a View feed stands for (its subscriber
        count), once per loop turn."""
        if feed.key[0] not in (rt.ENDPOINT, rt.LB_ENDPOINT):
            return
        if not self._reweigh:
            asyncio.get_running_loop().call_soon(self._send_weights)
        self._reweigh.add(feed)

    def _send_weights(self) -> None:
        feeds, self._reweigh = self._reweigh, set()
        for feed in feeds:
            if self._by_id.get(feed.id) is feed:
                self.link.send("xds.weight", feed.id, len(feed.watchers))

    def _done_waiting(self, sub: Subscription) -> None:
        left = self._waiting.get(sub, 0) - 1
        if left > 0:
            self._waiting[sub] = left
        else:
            self._waiting.pop(sub, None)

    def _arrived(self, feed: MirrorFeed) -> None:
        """The feed's snapshot: it is ready, and the streams waiting on it may reply."""
        feed.ready = True
        for sub in feed.watchers.values():
            self._done_waiting(sub)

    # ------------------------------------------------------------------ from the watcher

    def _res(self, feed_id: int, name: str, res: EncodedResource | None,
             published_at: float) -> None:
        feed = self._by_id.get(feed_id)
        if feed is None:
            return
        first = not feed.ready
        if res is None:
            feed.resources.pop(name, None)
        else:
            feed.resources[name] = res
        if first:
            self._arrived(feed)
        self._tell(feed, (name,), published_at)

    def _all(self, feed_id: int, items: list[tuple[str, EncodedResource]]) -> None:
        feed = self._by_id.get(feed_id)
        if feed is None:
            return
        feed.resources = dict(items)
        self._arrived(feed)
        self._tell(feed, [*feed.resources, rt.WILDCARD], 0.0)

    def _members(self, feed_id: int, exists: bool, full: bool,
                 items: list[tuple[str, EncodedResource | None]], published_at: float) -> None:
        feed = self._by_id.get(feed_id)
        if feed is None:
            return
        collection = feed.key[1]
        members = {} if full else feed.members.get(collection, {})
        for member, res in items:
            if res is None:
                members.pop(member, None)
            else:
                members[member] = res
        feed.exists = exists
        feed.members = {collection: members} if exists else {}
        feed.version += 1
        if full:
            feed.log.clear()  # streams in step with an older version compare it all
        else:
            feed.log[feed.version] = {member for member, _ in items}
            while len(feed.log) > LOG_VERSIONS:
                del feed.log[next(iter(feed.log))]
        if not feed.ready:
            self._arrived(feed)
        self._tell(feed, (collection,), published_at)

    def _tell(self, feed: MirrorFeed, names: Iterable[str], published_at: float) -> None:
        t = feed.key[0]
        if t == rt.ENDPOINT:
            view = _Published(published_at)
            for watcher in list(feed.watchers):
                for name in names:
                    watcher.endpoints_changed(name, view)  # type: ignore[arg-type]
            return
        for watcher in list(feed.watchers):
            for name in names:
                watcher.resource_changed(t, collection_of(name) if t == rt.LB_ENDPOINT
                                         else name)
