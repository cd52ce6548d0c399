"""The watcher's side of xDS over workers: one subscription of its own per feed a
worker asks for, and each change of what it is due sent to that worker once, as
the resources already encoded (xds_api.feed_keys says what a feed is).

A feed watches the resource cache exactly as a stream does (`ResourceCache.watch`
with a `Subscription` of the feed's shape), so an EDS feed is its View's subscriber
and is handed the View's derived CLA, a LEDS feed the View's members. Whatever a
change touches is looked at once per loop turn (`_flush`): a feed sends a resource
only when its version moved, a LEDS feed only the members that changed.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import structlog

from bridge.views import View
from xds_api import resource_types as rt
from xds_api.caches.leds import MemberState
from xds_api.feed_keys import SHAPE_FIELDS, Shape, subscription_for
from xds_api.resources import EncodedResource
from xds_api.subscription import NameChange

if TYPE_CHECKING:
    from meshbridge.host import Link
    from xds_api.cache import ResourceCache

log = structlog.get_logger("meshbridge.xds")


class Feed:
    """One feed of one worker: the watcher's subscription on its behalf (a Watcher
    to the resource cache)."""

    __slots__ = ("_held", "_members", "dirty", "feeds", "id", "link", "name", "node_name",
                 "protocol", "published_at", "sub", "weight")

    def __init__(self, feeds: XdsFeeds, link: Link, feed_id: int, type_url: str, name: str,
                 shape: Shape) -> None:
        self.feeds = feeds
        self.link = link
        self.id = feed_id
        self.name = name
        self.sub = subscription_for(type_url, shape)
        self.node_name = self.sub.node_name
        self.protocol = "xds-delta" if self.sub.delta else "xds-sotw"
        # The streams of the worker it stands for (the View's subscriber count).
        self.weight = 0
        self.dirty: set[str] = set()
        self.published_at = 0.0
        # What the worker holds: name -> version (named and wildcard feeds), or
        # (members -> version, the member state and its version) for LEDS.
        self._held: dict[str, str] = {}
        self._members: tuple[MemberState | None, int] = (None, -1)

    # ------------------------------------------------------------ Watcher

    def resource_changed(self, type_url: str, name: str) -> None:
        self.dirty.add(name)
        self.feeds.due(self)

    def endpoints_changed(self, name: str, view: View) -> None:
        self.published_at = view.published_at
        self.dirty.add(name)
        self.feeds.due(self)

    # ------------------------------------------------------------ following

    @property
    def wildcard(self) -> bool:
        return self.name == rt.WILDCARD and self.sub.type_url in rt.WILDCARD_CAPABLE

    def start(self, cache: ResourceCache) -> None:
        """Watch what the feed covers and send its snapshot."""
        if self.wildcard:
            self.sub.wildcard = True
            change = NameChange(frozenset(), frozenset(), wildcard_added=True)
        else:
            self.sub.names = {self.name}
            change = NameChange(frozenset({self.name}), frozenset())
        cache.watch(self.sub, change, self)
        if self.sub.type_url == rt.LB_ENDPOINT:
            self._send_members(cache, snapshot=True)
        elif self.wildcard:
            typed = cache.cache_of(self.sub.type_url)
            assert typed is not None
            current = {n: r for n in typed.wildcard_names()
                       if (r := typed.resource(self.sub, n)) is not None}
            self._held = {n: r.version for n, r in current.items()}
            self.link.send("xds.all", self.id, sorted(current.items()))
        else:
            self._send(cache, self.name, snapshot=True)

    def flush(self, cache: ResourceCache) -> None:
        dirty, self.dirty = self.dirty, set()
        if self.sub.type_url == rt.LB_ENDPOINT:
            self._send_members(cache, snapshot=False)
            return
        for name in sorted(dirty):
            if self.wildcard or name == self.name:
                self._send(cache, name, snapshot=False)

    def stop(self, cache: ResourceCache) -> None:
        cache.release(self.sub, self)

    def _resource(self, cache: ResourceCache, name: str) -> EncodedResource | None:
        typed = cache.cache_of(self.sub.type_url)
        assert typed is not None
        if self.wildcard and not typed.covers(name):
            return None
        return typed.resource(self.sub, name)

    def _send(self, cache: ResourceCache, name: str, snapshot: bool) -> None:
        res = self._resource(cache, name)
        version = res.version if res is not None else None
        if not snapshot and self._held.get(name) == version:
            return
        if version is None:
            self._held.pop(name, None)
        else:
            self._held[name] = version
        self.link.send("xds.res", self.id, name, res, self.published_at)

    def _send_members(self, cache: ResourceCache, snapshot: bool) -> None:
        """The collection's members the worker does not hold as they are: those the
        View's log says changed since the last send, else a comparison of all."""
        collection = self.name
        watch = cache.leds.watch_of(self.sub, collection)
        state = watch.state if watch is not None and watch.view is not None \
            and watch.view.exists else None
        if state is None:
            if snapshot or self._held or self._members[0] is not None:
                self._held = {}
                self._members = (None, -1)
                self.link.send("xds.members", self.id, False, True, [], self.published_at)
            return
        members = state.members.get(collection, {})
        last, version = self._members
        changed = state.changed_since(version, collection) if last is state else None
        items: list[tuple[str, EncodedResource | None]] = []
        full = snapshot or changed is None
        names = members.keys() if full else changed or ()
        for member in sorted(names):
            res = members.get(member)
            if res is not None and (full or self._held.get(member) != res.version):
                items.append((member, res))
                self._held[member] = res.version
            elif res is None and member in self._held:
                items.append((member, None))
                del self._held[member]
        if full:
            self._held = {m: r.version for m, r in members.items()}
        self._members = (state, state.version)
        if items or full:
            self.link.send("xds.members", self.id, True, full, items, self.published_at)


class XdsFeeds:
    """Every worker's xDS feeds, on the watcher (see the module)."""

    def __init__(self, cache: ResourceCache) -> None:
        self.cache = cache
        self._feeds: dict[tuple[int, int], Feed] = {}
        self._due: list[Feed] = []

    def attach(self, link: Link) -> None:
        key = id(link)
        link.on("xds.sub", lambda *a: self._sub(link, *a))
        link.on("xds.unsub", lambda feed_id: self._unsub(key, feed_id))
        link.on("xds.weight", lambda feed_id, n: self._weight(key, feed_id, n))
        link.on_closed(lambda: self._gone(key))

    @property
    def count(self) -> int:
        return len(self._feeds)

    def due(self, feed: Feed) -> None:
        if not feed.dirty:
            return
        if not self._due:
            asyncio.get_running_loop().call_soon(self._flush)
        self._due.append(feed)

    def _flush(self) -> None:
        due, self._due = self._due, []
        for feed in due:
            if feed.dirty and (id(feed.link), feed.id) in self._feeds:
                feed.flush(self.cache)

    def _sub(self, link: Link, feed_id: int, type_url: str, name: str, shape: Any) -> None:
        fields = SHAPE_FIELDS.get(type_url)
        if fields is None or not isinstance(shape, tuple) or len(shape) != len(fields):
            log.error("worker asked for a feed that is none", type=type_url, shape=shape)
            return
        feed = Feed(self, link, feed_id, type_url, name, shape)
        self._feeds[(id(link), feed_id)] = feed
        feed.start(self.cache)

    def _unsub(self, link: int, feed_id: int) -> None:
        feed = self._feeds.pop((link, feed_id), None)
        if feed is not None:
            feed.stop(self.cache)

    def _weight(self, link: int, feed_id: int, streams: int) -> None:
        feed = self._feeds.get((link, feed_id))
        if feed is not None:
            feed.weight = streams
            for view in self.cache.views_of(feed.sub):
                view.reweighed()

    def _gone(self, link: int) -> None:
        for key in [k for k in self._feeds if k[0] == link]:
            self._feeds.pop(key).stop(self.cache)
