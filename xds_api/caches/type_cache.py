"""What every per-type cache shares: the seam the mux routes to, versions, watcher
tables, and the SotW and delta rules that decide what a subscription is due.

The rules here are the protocol variants' (§1.6, §2), applied to any type; what
differs by type (full state or not, what `*` covers, what exists) is the type
cache's to say.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from xds_api.resources import EncodedResource
from xds_api.subscription import ABSENT, Subscription

if TYPE_CHECKING:
    from bridge.views import View


class Watcher(Protocol):
    """A stream, as a cache sees it: told when a watched resource may have changed."""

    protocol: str  # the View subscriber label: "xds-sotw" or "xds-delta"
    node_name: str  # the client's Kubernetes node, "" if it did not say

    def resource_changed(self, type_url: str, name: str) -> None: ...

    def endpoints_changed(self, name: str, view: View) -> None:
        """The View an EDS name is watched through has a new version."""


@dataclass(frozen=True, slots=True)
class Reply:
    """What one response of one type carries; the stream adds nonce and framing."""

    type_url: str
    resources: tuple[EncodedResource, ...]
    removed: tuple[str, ...] = ()


class Pending(enum.Enum):
    """What a cache answers while it cannot tell yet what a subscription is due (a
    worker's mirror still waiting for the watcher's first answer about a name): the
    subscription's due names stay due, and the cache wakes its stream once it can
    tell (meshbridge's workers, docs/workers.md)."""

    PENDING = "pending"


PENDING = Pending.PENDING


class ReplySource(Protocol):
    """What the SotW and delta reply rules read of one type's resources."""

    type_url: str
    # §1.6: in SotW, every response of this type carries the whole subscribed set.
    full_state: bool

    def resource(self, sub: Subscription, name: str) -> EncodedResource | None:
        """The resource as `sub` is due it (EDS: through the View it watches)."""

    def wildcard_names(self) -> Iterable[str]:
        """What `*` covers for this type."""

    def covers(self, name: str) -> bool:
        """Whether `*` covers `name`."""


class TypeCache(ReplySource, Protocol):
    """One xDS type's resources: what exists, at which version, and who watches it."""

    def version(self) -> str:
        """How often the type changed in this process (tests and debugging; a
        response's version is content-derived, §1.2)."""

    def get(self, name: str, node_name: str = "") -> EncodedResource | None:
        """The resource as it is now, or None if it does not exist."""

    def watch(self, sub: Subscription, names: Iterable[str], watcher: Watcher) -> None: ...

    def unwatch(self, sub: Subscription, names: Iterable[str], watcher: Watcher) -> None: ...

    def watch_wildcard(self, watcher: Watcher) -> None: ...

    def unwatch_wildcard(self, watcher: Watcher) -> None: ...


class Version:
    """A type's change count in this process, prefixed by the process's id. Never on
    the wire: what a response carries is the content-derived version of what the
    client holds (§1.2), equal on every replica."""

    __slots__ = ("_count", "_prefix")

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self._count = 0

    def bump(self) -> None:
        self._count += 1

    def __str__(self) -> str:
        return f"{self._prefix}-{self._count}"


class NamedWatchers:
    """Who watches which name of one type, and who watches all of it (`*`)."""

    __slots__ = ("by_name", "type_url", "wildcard")

    def __init__(self, type_url: str) -> None:
        self.type_url = type_url
        self.by_name: dict[str, set[Watcher]] = {}
        self.wildcard: set[Watcher] = set()

    def watch(self, names: Iterable[str], watcher: Watcher) -> None:
        for name in names:
            self.by_name.setdefault(name, set()).add(watcher)

    def unwatch(self, names: Iterable[str], watcher: Watcher) -> None:
        for name in names:
            ws = self.by_name.get(name)
            if ws is not None:
                ws.discard(watcher)
                if not ws:
                    del self.by_name[name]

    def notify(self, names: Iterable[str]) -> None:
        """Tell everyone watching these names, or `*`, that they may have changed."""
        for name in sorted(names):
            for w in list(self.by_name.get(name, ())):
                w.resource_changed(self.type_url, name)
            for w in list(self.wildcard):
                w.resource_changed(self.type_url, name)


def sotw_reply(cache: ReplySource, sub: Subscription) -> Reply | None:
    """What a SotW subscription is due now, or None if nothing (§1.6, §1.8)."""
    t = cache.type_url
    if cache.full_state:
        # §1.6: CDS/LDS responses carry the whole subscribed set; one is due when
        # that set, or any member's version, differs from what was last sent.
        scope = set(sub.names)
        if sub.wildcard:
            scope.update(cache.wildcard_names())
        current = {}
        for name in scope:
            res = cache.resource(sub, name)
            if res is not None:
                current[name] = res
        if not sub.must_reply and {n: r.version for n, r in current.items()} == sub.sent:
            return None
        return Reply(t, tuple(current[n] for n in sorted(current)))
    # §1.6: EDS/RDS responses carry only what changed or was newly asked for.
    due = []
    dirty = sub.dirty
    names: Iterable[str]
    if len(dirty) == 1:  # one change to one name: the fan-out's usual case
        (name,) = dirty
        names = (name,) if name in sub.names else ()
    else:
        names = sorted(dirty & sub.names)
    for name in names:
        res = cache.resource(sub, name)
        if res is not None and sub.sent.get(name) != res.version:
            due.append(res)
    if not due and not sub.must_reply:
        return None
    if len(due) == 1:
        return _reply_of_one(t, due[0])
    return Reply(t, tuple(due))


# The last one-resource reply made: a fan-out's thousands of streams due the same
# resource share it (a frozen dataclass costs more to build than to look up).
_LAST_ONE: list[tuple[EncodedResource, Reply]] = []


def _reply_of_one(type_url: str, res: EncodedResource) -> Reply:
    last = _LAST_ONE
    if last and last[0][0] is res and last[0][1].type_url == type_url:
        return last[0][1]
    reply = Reply(type_url, (res,))
    last[:] = [(res, reply)]
    return reply


def delta_reply(cache: ReplySource, sub: Subscription) -> Reply | None:
    """What a delta subscription is due now (§2): resources whose version differs
    from what the client holds, and names it holds (or asked for) that do not exist."""
    send: list[EncodedResource] = []
    removed: list[str] = []
    for name in sorted(sub.dirty):
        in_scope = name in sub.names or (sub.wildcard and cache.covers(name))
        res = cache.resource(sub, name) if in_scope else None
        held = sub.sent.get(name)
        if res is not None:
            if held != res.version:
                send.append(res)
        elif in_scope and name in sub.names:
            # §2: a subscribed name that does not exist is reported removed, once.
            if held != ABSENT:
                removed.append(name)
        elif held is not None and held != ABSENT:
            # Held by the client but gone, or no longer covered by `*`.
            removed.append(name)
    if not send and not removed and not sub.must_reply:
        return None
    return Reply(cache.type_url, tuple(send), tuple(removed))
