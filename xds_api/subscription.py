"""Protocol state of one (stream, type): what the client asked for, what it was sent.

One small value per resource type per stream, in the shape of go-control-plane's
`stream.Subscription`. Each field exists for a rule of docs/protocol/xds.md, cited
beside it; the methods apply a request's subscription change by those rules and say
which names were added and removed, for the stream to (un)watch in the cache.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from bridge.decoding import Interner
from xds_api import resource_types as rt

# A `sent` value meaning "the client was told this resource does not exist" (delta
# `removed_resources`); no resource version is ever empty.
ABSENT = ""
# A `sent` value no version equals: the resource must be sent again (delta §2: a name
# unsubscribed while `*` still covers it).
RESEND = "\x00resend"

# What a client's node metadata `meshbridge.io/leds` may say (xDS §7): LEDS whatever
# the View's size, or never; anything else leaves it to the server's threshold.
LEDS_METADATA = "meshbridge.io/leds"
LEDS_ALWAYS = "always"
LEDS_NEVER = "never"

# §1.2: a resource version is 24 hex digits of a content hash (96 bits), and what a
# client holds of a type is versioned by their sum modulo 2^96: the same resources,
# the same version, on any replica or worker, in any order.
VERSION_DIGITS = 24
_VERSION_MASK = (1 << (4 * VERSION_DIGITS)) - 1


# Thousands of streams hold the same few versions: each is parsed once, not once per
# stream and response (bounded: cleared when full).
_TERMS: dict[str, int] = {}
_MAX_TERMS = 1 << 16


def _term(version: str) -> int:
    """A version's part of a set's version: its value, or 0 for a marker (ABSENT,
    RESEND) or a string that is not a version of ours."""
    term = _TERMS.get(version)
    if term is None:
        term = 0
        if len(version) == VERSION_DIGITS and version.isascii() and version.isalnum():
            with contextlib.suppress(ValueError):
                term = int(version, 16)
        if len(_TERMS) >= _MAX_TERMS:
            _TERMS.clear()
        _TERMS[version] = term
    return term


def held_version(versions: Iterable[str]) -> str:
    """The version of a set of resources, from their content-hash versions (§1.2)."""
    return f"{sum(map(_term, versions)) & _VERSION_MASK:0{VERSION_DIGITS}x}"


class HeldVersions(dict[str, str]):
    """name -> version of what a client holds of one type, with the sum of the
    versions kept in step, so that the version of the whole (§1.2) costs what a
    response changed, not what the client holds (a LEDS client may hold thousands).

    A map can be `shared`: read-only, one object for every subscription that holds the
    same few resources at the same versions (`held_with`), as thousands of streams
    watching one service do; a subscription changes one only through a copy of its
    own (`Subscription.own_sent`)."""

    __slots__ = ("shared", "total")

    def __init__(self, items: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> None:
        super().__init__()
        self.total = 0
        self.shared = False
        self.update(items)

    def _owned(self) -> None:
        if self.shared:
            raise TypeError("a shared HeldVersions is read-only (Subscription.own_sent)")

    def __setitem__(self, name: str, version: str) -> None:
        self._owned()
        # Once per response per stream that holds a map of its own: a version parsed
        # before is one dict lookup (a marker's term, 0, is worked out again: rare).
        old = dict.get(self, name)
        if old is not None:
            self.total -= _TERMS.get(old) or _term(old)
        dict.__setitem__(self, name, version)
        self.total += _TERMS.get(version) or _term(version)

    def __delitem__(self, name: str) -> None:
        self._owned()
        self.total -= _term(dict.__getitem__(self, name))
        dict.__delitem__(self, name)

    def pop(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        if name not in self:
            return default
        self._owned()
        version = dict.pop(self, name)
        self.total -= _term(version)
        return version

    def update(self, items: Mapping[str, str] | Iterable[tuple[str, str]] = (),  # type: ignore[override]
               ) -> None:
        pairs = items.items() if isinstance(items, Mapping) else items
        for name, version in pairs:
            self[name] = version

    def clear(self) -> None:
        self._owned()
        dict.clear(self)
        self.total = 0

    def version(self) -> str:
        """§1.2: the version of everything held; one string for every stream that
        holds the same (each stream keeps it, as sent and as ACKed)."""
        total = self.total & _VERSION_MASK
        text = _VERSION_TEXTS.get(total)
        if text is None:
            if len(_VERSION_TEXTS) >= _MAX_TERMS:
                _VERSION_TEXTS.clear()
            text = _VERSION_TEXTS[total] = f"{total:0{VERSION_DIGITS}x}"
        return text


def _shared_held() -> HeldVersions:
    held = HeldVersions()
    held.shared = True
    return held


# What a subscription holds before anything is sent, or once it holds nothing again.
NOTHING_HELD = _shared_held()

# Shared maps hold this many resources at most; a larger one is its subscription's own.
_SHARED_HELD_SIZE = 16
# (shared map, name, version) -> (that map, the shared map with name at version): the
# streams of a fan-out, holding one map and sent one version, compute the next map
# once (bounded: cleared when full; the entry keeps its first map alive, so the id
# in its key stays that map's).
_HELD_AFTER: dict[tuple[int, str, str], tuple[HeldVersions, HeldVersions]] = {}
_MAX_HELD_AFTER = 1024


def held_with(held: HeldVersions, name: str, version: str) -> HeldVersions:
    """`held` with `name` at `version`: changed in place if it is its subscription's
    own, else the shared map every subscription holding `held` gets for the same."""
    if not held.shared:
        held[name] = version
        return held
    key = (id(held), name, version)
    known = _HELD_AFTER.get(key)
    if known is not None and known[0] is held:
        return known[1]
    after = HeldVersions(held)
    after[name] = version
    if len(after) > _SHARED_HELD_SIZE:
        return after  # its subscription's own from now on
    after.shared = True
    if len(_HELD_AFTER) >= _MAX_HELD_AFTER:
        _HELD_AFTER.clear()
    _HELD_AFTER[key] = (held, after)
    return after


_VERSION_TEXTS: dict[int, str] = {}


# Nothing due: the `dirty` of every subscription with nothing to look at (thousands
# of idle streams hold this one empty set, not an empty set each; `mark` replaces it).
CLEAN: frozenset[str] = frozenset()

# Never written to (Subscription.leds_synced_to replaces it first); clear() and pop()
# on it change nothing.
_NOT_SYNCED: dict[str, tuple[object, int]] = {}


# SotW name sets by value: thousands of streams naming the same few resources keep
# one frozen set (small sets only).
_NAME_SETS = Interner(4096)
_SHARED_SET_SIZE = 16


def _shared_names(names: set[str]) -> frozenset[str]:
    frozen = frozenset(names)
    return frozen if len(frozen) > _SHARED_SET_SIZE else _NAME_SETS.share(frozen)


@dataclass(frozen=True, slots=True)
class NameChange:
    added: frozenset[str]
    removed: frozenset[str]
    wildcard_added: bool = False
    wildcard_removed: bool = False


@dataclass(slots=True, eq=False)
class Subscription:
    type_url: str
    # §1.5 / §2: subscribed to every resource of the type (CDS and LDS only), by `*`
    # or by the legacy empty first request.
    wildcard: bool = False
    # §1.5 legacy wildcard: an empty SotW list means `*` only until the client has
    # named something for this type on this stream; after that it means "nothing".
    named_before: bool = False
    # §1.5: the resources asked for by name; the server must remember them even when
    # they do not exist yet, and send them when they appear (§1.7).
    # A few names are kept as a frozen set, one object for every stream that names
    # the same few (`_shared_names`); delta changes a set of its own in place, and
    # keeps it once it names more.
    names: set[str] | frozenset[str] = field(default_factory=set)
    # go-control-plane's returnedResources: name -> version the client was last sent
    # (SotW), or holds (delta, seeded from initial_resource_versions on reconnect).
    # A name leaving the subscription leaves this map, so asking again resends it.
    # NOTHING_HELD or a map shared by the subscriptions that hold the same (while
    # small, `held_with`); changed only through `hold`, `forget`, `own_sent`.
    sent: HeldVersions = field(default_factory=lambda: NOTHING_HELD)
    # Names to look at on the next reply: newly requested, or changed in the cache.
    # CLEAN while there are none; changed only through `mark`, `mark_all` and `clean`.
    dirty: set[str] | frozenset[str] = CLEAN
    # §1.8(a): the first request of a type is answered even when nothing exists, so
    # the client can finish initialising; §2: likewise the first delta wildcard.
    must_reply: bool = False
    # §1.3: the nonce of the last response of this type. In SotW a request that
    # carries an older one is stale and ignored; in delta it is only used for ACKs.
    nonce: str = ""
    # The nonce of the last response the client answered (ACK or NACK): a response
    # is still unanswered while this differs from `nonce`.
    answered: str = ""
    # Debugging and metrics: what was last sent, acknowledged and rejected.
    version_sent: str = ""
    acked_version: str = ""
    acks: int = 0
    nacks: int = 0
    # The Kubernetes node the client runs on (node metadata NODE_NAME), which picks
    # the View of each EDS name exactly as a Linkerd context token's nodeName does.
    node_name: str = ""
    last_nack: str = ""
    # §1.2: the version_info a SotW client's first request presented, until the first
    # response says whether it held exactly what it is sent (a reconnect recognised
    # as current, counted).
    presented: str = ""
    # Which routes the client is sent (Routes §1.2, xDS §3.8): its kind ("envoy" or
    # "grpc", from the node's user agent) and its Kubernetes namespace (node metadata
    # NAMESPACE, else Istio's node id).
    client: str = "envoy"
    namespace: str = ""
    # §2.1: a delta client is told that a deleted service's CLA no longer exists.
    delta: bool = False
    # §7: the client's LEDS preference (LEDS_ALWAYS, LEDS_NEVER or "": the threshold).
    leds: str = ""
    # LEDS: collection -> (the View's member state, its version) that what the client
    # holds of the collection matches, so the next reply compares only what changed
    # since (caches/leds.py); dropped whenever anything else touches those members.
    # The shared empty map until a LEDS reply records one (`leds_synced_to`): most
    # subscriptions never do, and thousands of them live at once.
    leds_synced: dict[str, tuple[object, int]] = field(default_factory=lambda: _NOT_SYNCED)

    def leds_synced_to(self, collection: str, state: tuple[object, int]) -> None:
        if self.leds_synced is _NOT_SYNCED:
            self.leds_synced = {}
        self.leds_synced[collection] = state

    def own_sent(self) -> HeldVersions:
        """`sent`, as a map of this subscription's own (copied if shared), to change."""
        sent = self.sent
        if sent.shared:
            sent = self.sent = HeldVersions(sent)
        return sent

    def hold(self, name: str, version: str) -> None:
        """The client now holds `name` at `version`."""
        self.sent = held_with(self.sent, name, version)

    def forget(self, name: str) -> None:
        """The client holds `name` no longer (as far as this server is concerned)."""
        if name in self.sent:
            del self.own_sent()[name]

    def clear_sent(self) -> None:
        self.sent = NOTHING_HELD

    def mark(self, name: str) -> None:
        """`name` is to be looked at on the next reply."""
        dirty = self.dirty
        if isinstance(dirty, set):
            dirty.add(name)
        else:  # CLEAN
            self.dirty = {name}

    def mark_all(self, names: Iterable[str]) -> None:
        dirty = self.dirty
        if isinstance(dirty, set):
            dirty.update(names)
        else:  # CLEAN
            self.dirty = set(names) or CLEAN

    def clean(self) -> None:
        """Everything due was looked at: the set goes back to the shared CLEAN."""
        self.dirty = CLEAN

    @property
    def wildcard_capable(self) -> bool:
        return self.type_url in rt.WILDCARD_CAPABLE

    # ------------------------------------------------------------------ SotW

    def apply_sotw_names(self, requested: Iterable[str]) -> NameChange:
        """Apply a SotW request's `resource_names` (the whole desired set, §1.5)."""
        wanted = set(requested)
        was_wildcard = self.wildcard
        if not wanted:
            # §1.5: [] is `*` only if the client never named anything for this type;
            # afterwards it unsubscribes from everything (gRPC relies on this, §3.3).
            self.wildcard = self.wildcard_capable and not self.named_before
        else:
            self.named_before = True
            self.wildcard = self.wildcard_capable and rt.WILDCARD in wanted
            if self.wildcard_capable:
                wanted.discard(rt.WILDCARD)
        added = frozenset(wanted - self.names)
        removed = frozenset(self.names - wanted)
        self.names = _shared_names(wanted)
        if self.wildcard:
            if removed:
                # §1.6: under `*` the client still holds what it stopped naming; the
                # full-state set decides whether it keeps it, so look at it again.
                self.mark(rt.WILDCARD)
        else:
            for name in removed:
                # §1.5: a name asked for again later must be sent again, even unchanged.
                self.forget(name)
        if self.wildcard and not was_wildcard:
            # §1.5: `*` newly asked for is answered like any new name: with the whole
            # set it covers, even unchanged, even empty.
            self.must_reply = True
        if was_wildcard and not self.wildcard:
            # What only `*` brought is no longer the client's concern; dropping a
            # subscription needs no response (§1.8), so nothing may look due for it.
            self._forget_unnamed()
        for name in added:
            # §1.5: a newly requested name is sent, even if it went out before under
            # `*` and has not changed since.
            self.forget(name)
        self.mark_all(added)
        return NameChange(added, removed, self.wildcard and not was_wildcard,
                          was_wildcard and not self.wildcard)

    def _forget_unnamed(self) -> None:
        for name in [n for n in self.sent if n not in self.names]:
            self.forget(name)

    def forget_sent(self) -> None:
        """A request without a nonce starts the type over (§1.8(a)): the client holds
        nothing we know of, so everything subscribed is due again."""
        self.clear_sent()
        self.leds_synced.clear()
        self.mark_all(self.names)
        self.must_reply = True

    # ------------------------------------------------------------------ delta

    def apply_delta(
        self,
        subscribe: Iterable[str],
        unsubscribe: Iterable[str],
        initial_versions: Mapping[str, str] | None = None,
    ) -> NameChange:
        """Apply a delta request's subscription change (§2).

        `initial_versions` is given only for the first request of the type on a
        stream: what a reconnecting client already holds.
        """
        subscribe = list(subscribe)
        unsubscribe = list(unsubscribe)
        first = initial_versions is not None
        was_wildcard = self.wildcard
        if first:
            # §2 reconnect: send only what differs from what the client holds, and
            # tell it about what it holds that no longer exists.
            self.leds_synced.clear()
            if initial_versions:
                self.own_sent().update(initial_versions)
            self.mark_all(initial_versions or {})
            if self.wildcard_capable and not subscribe and not unsubscribe:
                # §2 legacy wildcard: a first request with both lists empty is `*`.
                self.wildcard = True
        # `*` first: a request that both adds `*` and drops a name leaves that name
        # under the wildcard, and must be answered as such.
        if self.wildcard_capable:
            if rt.WILDCARD in subscribe:
                self.wildcard = True
            if rt.WILDCARD in unsubscribe:
                self.wildcard = False
        added: set[str] = set()
        removed: set[str] = set()
        names = self.names
        if not isinstance(names, set):
            names = self.names = set(names)
        for name in unsubscribe:
            if name == rt.WILDCARD and self.wildcard_capable:
                continue
            if name not in names:
                continue  # §2: unsubscribing from what is not subscribed is ignored
            names.discard(name)
            removed.add(name)
            if self.wildcard:
                # §2: with `*` still on, the client must be told whether the wildcard
                # covers the name: it is sent again if so, else reported removed.
                self.own_sent()[name] = RESEND
                self.mark(name)
            else:
                self.forget(name)
        for name in subscribe:
            if name == rt.WILDCARD and self.wildcard_capable:
                continue
            if name in removed:
                removed.discard(name)
            elif name not in names:
                added.add(name)
            names.add(name)
            self.mark(name)
            if not (first and name in (initial_versions or {})):
                # §2: a name in resource_names_subscribe is sent even if the client
                # seems to hold it at the current version: it may have forgotten it.
                self.forget(name)
        if self.wildcard and not was_wildcard:
            # §1.8 / §2: the first wildcard response concludes Envoy's initialisation.
            self.must_reply = True
        if was_wildcard and not self.wildcard:
            # The client drops what only `*` gave it; nothing is owed for those.
            self._forget_unnamed()
        if len(names) <= _SHARED_SET_SIZE:
            # A few names, as most delta streams name: shared like SotW's (copied
            # back into a set of its own by the next change of names).
            self.names = _shared_names(names)
        return NameChange(frozenset(added), frozenset(removed),
                          self.wildcard and not was_wildcard,
                          was_wildcard and not self.wildcard)
