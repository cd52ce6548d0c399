"""The SotW and delta stream state machines: how a subscription is streamed.

A stream takes decoded requests (`handle`), is told by the cache when a watched
resource may have changed (`resource_changed`, `endpoints_changed`), and produces the
encoded responses that are due (`take_responses`), in CDS, EDS, LDS, RDS order. It
owns one `Subscription` per type and knows nothing of gRPC: `service.py` reads,
writes and maps `StreamError`s to statuses, so these classes are unit-tested as is.
It reaches the resource cache through `Resources` alone (the mux in `cache.py`).

Responses are computed when written, from the current state, never queued: a slow
reader gets the latest state once it catches up, and memory per stream stays bounded.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol, cast

import structlog
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from bridge.views import View
from meshbridge.host import StreamInfo
from xds_api import node_identity, wire
from xds_api import resource_types as rt
from xds_api.caches.type_cache import PENDING, Pending, Reply, Watcher
from xds_api.metrics import XdsMetrics
from xds_api.names import collection_of
from xds_api.resources import EncodedResource, wrap_resource
from xds_api.shared_responses import UNSHARED, SharedResponses
from xds_api.subscription import (
    ABSENT,
    LEDS_ALWAYS,
    LEDS_METADATA,
    LEDS_NEVER,
    RESEND,
    VERSION_DIGITS,
    HeldVersions,
    NameChange,
    Subscription,
    held_with,
)

log = structlog.get_logger("meshbridge.xds")

_SOTW = discovery_pb2.DiscoveryResponse.DESCRIPTOR
_SOTW_VERSION = wire.field_number(_SOTW, "version_info")
_SOTW_TYPE = wire.field_number(_SOTW, "type_url")
_SOTW_NONCE = wire.field_number(_SOTW, "nonce")
_SOTW_CONTROL_PLANE = wire.field_number(_SOTW, "control_plane")
_SOTW_RESOURCES = wire.field_number(_SOTW, "resources")
_DELTA = discovery_pb2.DeltaDiscoveryResponse.DESCRIPTOR
_DELTA_VERSION = wire.field_number(_DELTA, "system_version_info")
_DELTA_TYPE = wire.field_number(_DELTA, "type_url")
_DELTA_NONCE = wire.field_number(_DELTA, "nonce")
_DELTA_REMOVED = wire.field_number(_DELTA, "removed_resources")
_DELTA_CONTROL_PLANE = wire.field_number(_DELTA, "control_plane")

CONTROL_PLANE_ID = "meshbridge"
_CONTROL_PLANE_IDENTIFIER = wire.field_number(base_pb2.ControlPlane.DESCRIPTOR, "identifier")
_CONTROL_PLANE = wire.string_field(_CONTROL_PLANE_IDENTIFIER, CONTROL_PLANE_ID)
_SOTW_CONTROL = wire.length_delimited(_SOTW_CONTROL_PLANE, _CONTROL_PLANE)
_DELTA_CONTROL = wire.length_delimited(_DELTA_CONTROL_PLANE, _CONTROL_PLANE)
_TYPE_FIELDS: dict[tuple[int, str], bytes] = {}


# A SotW response is the same bytes for every stream of a fan-out up to its nonce:
# the head (version, resources, type) of the last response framed is kept, if small,
# so that each further stream only adds its nonce. A large head (a big CLA) is not
# kept: it is joined per stream into the response itself, as the assembly intends.
_SOTW_HEAD_MAX = 64 * 1024
_SotwHeadKey = tuple[str, tuple[EncodedResource, ...], str]
_sotw_head: tuple[_SotwHeadKey, bytes | None] | None = None


def _sotw_head_of(version: str, resources: tuple[EncodedResource, ...],
                  type_url: str) -> bytes | None:
    """The head of a SotW response of these resources; None if too big to keep."""
    global _sotw_head
    key = (version, resources, type_url)
    kept = _sotw_head
    if kept is not None and kept[0] == key:
        return kept[1]
    head: bytes | None = None
    if sum(len(p) for r in resources for p in r.any_parts) <= _SOTW_HEAD_MAX:
        head = b"".join(_sotw_parts(version, resources, type_url))
    _sotw_head = (key, head)
    return head


def _sotw_parts(version: str, resources: Iterable[EncodedResource], type_url: str,
                anys: Iterable[bytes] = ()) -> list[bytes]:
    """A SotW response up to its nonce, in the field order protobuf writes: version,
    resources (then `anys`, other resources as Any bytes), type."""
    parts = [wire.string_field(_SOTW_VERSION, version)]
    for r in resources:
        parts.append(r.sotw_prefix)
        parts.extend(r.any_parts)
    parts.extend(wire.length_delimited(_SOTW_RESOURCES, a) for a in anys)
    parts.append(_type_field(_SOTW_TYPE, type_url))
    return parts


def _type_field(number: int, type_url: str) -> bytes:
    key = (number, type_url)
    field = _TYPE_FIELDS.get(key)
    if field is None:
        field = wire.string_field(number, type_url)
        if type_url in rt.SHORT:  # only served types are remembered
            _TYPE_FIELDS[key] = field
    return field


# What `ack_key` makes of a plain ACK: (type, nonce, version, names) for SotW,
# (type, nonce) for delta.
_SotwAckKey = tuple[str, str, str, frozenset[str]]
_DeltaAckKey = tuple[str, str]

DEFAULT_MAX_NAMES = 10_000
NODE_NAME_METADATA = "NODE_NAME"
MAX_QUEUED_UNKNOWN = 16
# §9.1: types outside the served ones a stream may ask for (each remembered with the
# nonce of its last answer); one more ends the stream naming it.
MAX_OTHER_TYPES = 16
# §9.2: istiod's debug types (`istio.io/debug/syncz`, `.../config_dump`, ...).
DEBUG_TYPE = "istio.io/debug"
# Node metadata shown to operators (istioctl proxy-status reads these three).
NODE_LABELS = ("NAMESPACE", "CLUSTER_ID", "ISTIO_VERSION")


_EMPTY: Mapping[str, Any] = MappingProxyType({})


def is_debug_type(type_url: str) -> bool:
    return type_url == DEBUG_TYPE or type_url.startswith(DEBUG_TYPE + "/")


class Waker(Protocol):
    def wake(self) -> None:
        """Something may be due on the stream: write it soon."""


class _NoWaker:
    def wake(self) -> None:
        pass


_NO_WAKER = _NoWaker()


class Resources(Protocol):
    """The resource cache, as a stream sees it: routed by the subscription's type."""

    metrics: XdsMetrics

    def watch(self, sub: Subscription, change: NameChange, watcher: Watcher) -> None:
        """Follow a change of the subscription's names (and `*`)."""

    def release(self, sub: Subscription, watcher: Watcher) -> None:
        """Drop every watch of the subscription: its stream is over."""

    def wildcard_names(self, type_url: str) -> Iterable[str]:
        """What `*` covers for the type."""

    def sotw_reply(self, sub: Subscription) -> Reply | Pending | None:
        """What a SotW subscription is due now: None if nothing, PENDING if the cache
        cannot tell yet (then it wakes the stream when it can)."""

    def delta_reply(self, sub: Subscription) -> Reply | Pending | None:
        """What a delta subscription is due now (None, PENDING: as `sotw_reply`)."""


class StreamError(Exception):
    """The request breaks the protocol; the stream ends with a clear status."""


class BadRequest(StreamError):
    pass


class TooManyNames(StreamError):
    pass


class Forbidden(StreamError):
    """A debug type asked for where debug answers are not served (§9.2)."""


# A debug answer: its resources as (name, serialized google.protobuf.Any), and the
# response's version_info.
DebugReply = tuple[tuple[tuple[str, bytes], ...], str]


class DebugAnswers(Protocol):
    """istiod's debug types, answered for one stream (`xds_api.debug_types`)."""

    # The control_plane identifier of debug answers: istioctl reads it as JSON (§9.2).
    control_plane: str

    def answer(self, stream: XdsStream, type_url: str, names: Sequence[str]
               ) -> DebugReply | Awaitable[DebugReply]:
        """What a debug request is answered with (§9.2): now, or when the other
        processes have added theirs (a worker's answer: docs/workers.md)."""


# Debug answers still being gathered from the other processes (held: a task the loop
# alone refers to may be collected before it is done).
_GATHERING: set[asyncio.Future[DebugReply]] = set()


# Node ids already warned about a request refused for their variant; bounded, so
# that clients inventing ids cannot grow it.
_WARNED: set[str] = set()
_MAX_WARNED = 4096


def _is_version(text: str) -> bool:
    """A resource version this server could have issued (§1.2: 24 hex digits)."""
    return len(text) == VERSION_DIGITS and all(c in _HEX for c in text)


_HEX = frozenset("0123456789abcdef")


def _first_time(node_id: str) -> bool:
    if node_id in _WARNED or len(_WARNED) >= _MAX_WARNED:
        return False
    _WARNED.add(node_id)
    return True


class XdsStream:
    """What SotW and delta streams share: node, nonces, subscriptions, watches."""

    # Thousands of these live at once; slots keep each one small.
    __slots__ = ("_closed", "_node_seen", "_nonce", "_shared", "_unknown", "_waker", "ads",
                 "cache", "client", "debug", "info", "leds", "max_names", "metrics",
                 "namespace", "node_id", "node_labels", "node_name", "others", "peer", "subs")
    api = ""
    protocol = ""

    def __init__(
        self,
        cache: Resources,
        *,
        ads: bool = True,
        waker: Waker | None = None,
        metrics: XdsMetrics | None = None,
        max_names: int = DEFAULT_MAX_NAMES,
        peer: str = "",
        info: StreamInfo | None = None,
        debug: DebugAnswers | None = None,
        shared: SharedResponses | None = None,
    ) -> None:
        self.cache = cache
        # The nonce clock and the responses encoded once for all the streams that
        # send them (xds_api.shared_responses); a stream of its own by default.
        self._shared = shared or UNSHARED
        # ADS serves every type and needs type_url; the EDS-only service implies it.
        self.ads = ads
        # Told when something may be due (its runner); kept as the object, not a bound
        # method of it: one allocation less per stream.
        self._waker = waker or _NO_WAKER
        self.metrics = metrics or cache.metrics
        self.max_names = max_names
        self.peer = peer
        # What /debug/streams shows about this stream.
        self.info = info
        # §1.1: the node is guaranteed only on the first request; remember it (its
        # id, for logs: an Envoy node lists every extension it has, kilobytes each).
        self.node_id = ""
        self.node_name = ""
        # NODE_LABELS the node's metadata has; the shared empty mapping until it has one
        # (thousands of streams: no dict each for what most never fill).
        self.node_labels: Mapping[str, str] = _EMPTY
        self.leds = ""  # the node's LEDS preference (§7)
        # Which routes it is sent: its kind and namespace (xds_api.node_identity).
        self.client = node_identity.ENVOY
        self.namespace = ""
        self._node_seen = False
        self.subs: dict[str, Subscription] = {}
        self._nonce = 0
        self._unknown: list[bytes] | None = None  # answers to unserved types, queued
        # §9.1: each type asked for that is not served -> (nonce of its last answer,
        # the names that answer was for).
        self.others: Mapping[str, tuple[str, tuple[str, ...]]] = _EMPTY
        self.debug = debug
        self._closed = False

    def handle(self, req: Any) -> None:
        """Apply one decoded request; raises StreamError if it breaks the protocol."""
        raise NotImplementedError

    @staticmethod
    def ack_key(req: Any) -> Hashable | None:
        """What `take_ack` needs of a request that may be a plain ACK (no node, no
        error, a nonce, no other change), or None for any other request. Equal
        requests have equal keys: the fan-out's ACKs are thousands of equal messages,
        each decoded once (xds_api.service)."""
        raise NotImplementedError

    def take_ack(self, key: Hashable) -> bool:
        """Apply a request `ack_key` described if it is an ACK of the last response
        of its type that changes nothing; False leaves it to `handle`."""
        raise NotImplementedError

    def awaiting_answer(self) -> bool:
        """A response was sent that the client has not yet ACKed or NACKed."""
        return any(sub.nonce and sub.answered != sub.nonce for sub in self.subs.values())

    def take_responses(self) -> list[bytes]:
        """The encoded responses due now, in CDS, EDS, LEDS, LDS, RDS order (§1.9)."""
        out: list[bytes] = []
        subs = self.subs
        # One type subscribed (an EDS-only client, most Linkerd-less sidecars' EDS
        # streams): no order to keep.
        for t in subs if len(subs) == 1 else rt.ORDER:
            sub = subs.get(t)
            if sub is None or not (sub.dirty or sub.must_reply):
                continue
            reply = self._reply(sub)
            if reply is PENDING:  # the module's constant: a member's lookup costs a call
                continue  # what is due stays due; the cache wakes us when it can tell
            sub.clean()
            sub.must_reply = False
            if reply is None:
                continue
            nonce = self._next_nonce()
            changed = self._new_or_changed(sub, reply) if t == rt.CLUSTER else ()
            self._record_sent(sub, reply)
            # §1.2: the response's version is that of what the client now holds.
            version = sub.sent.version()
            if sub.presented:
                if sub.presented == version:
                    self.metrics.reconnects_current[t].inc()
                sub.presented = ""
            data = self._encode(reply, version, t, nonce)
            out.append(data)
            sub.nonce = nonce
            sub.version_sent = version
            # Loop-thread counters (meshbridge.loopmetrics): added to in place, two
            # calls less per response per stream.
            metrics = self.metrics
            metrics.pushes[t].value += 1
            metrics.push_bytes[t].value += len(data)
            if self.info is not None:
                self.info.sent(rt.SHORT[t], version, nonce, len(data))
            if changed:
                self._after_cluster_reply(changed)
        if self._unknown:
            out.extend(self._unknown)
            self._unknown = None
        return out

    def _reply(self, sub: Subscription) -> Reply | Pending | None:
        """What the cache says is due for this subscription (SotW or delta rules)."""
        raise NotImplementedError

    def _encode(self, reply: Reply, version: str, type_url: str, nonce: str) -> bytes:
        raise NotImplementedError

    def _record_sent(self, sub: Subscription, reply: Reply) -> None:
        """Remember what the client now holds, as this variant's rules define it."""
        raise NotImplementedError

    # ------------------------------------------------------------ cache callbacks

    def resource_changed(self, type_url: str, name: str) -> None:
        sub = self.subs.get(type_url)
        if sub is None:
            return
        sub.mark(name)
        self._waker.wake()

    def endpoints_changed(self, name: str, view: View) -> None:
        sub = self.subs.get(rt.ENDPOINT)
        if sub is None:
            return
        sub.mark(name)
        if self.info is not None:
            self.info.changed(view.published_at)
        self._waker.wake()

    # ------------------------------------------------------------ helpers

    def _type_of(self, type_url: str) -> str:
        # A served type's URL is kept as our own constant, not the request's copy of
        # it (one string for thousands of streams' subscriptions).
        type_url = rt.SERVED.get(type_url, type_url)
        if not type_url:
            if self.ads:
                # §1.1: type_url is required on ADS.
                raise BadRequest("type_url is required on the aggregated (ADS) service")
            return rt.ENDPOINT
        if not self.ads and type_url != rt.ENDPOINT:
            raise BadRequest(f"the endpoint discovery service serves only {rt.ENDPOINT}, "
                             f"not {type_url}")
        return type_url

    def _remember_node(self, req: discovery_pb2.DiscoveryRequest
                       | discovery_pb2.DeltaDiscoveryRequest) -> None:
        if not self._node_seen and req.HasField("node"):
            self._node_seen = True
            self.node_id = req.node.id
            # Istio's convention: the pod's node in the node metadata. It keys the
            # Views this stream reads, like nodeName in a Linkerd context token.
            meta = req.node.metadata.fields.get(NODE_NAME_METADATA)
            if meta is not None and meta.HasField("string_value"):
                self.node_name = meta.string_value[:253]
            labels = {}
            for key in NODE_LABELS:
                value = req.node.metadata.fields.get(key)
                if value is not None and value.HasField("string_value"):
                    labels[key] = value.string_value[:253]
            if labels:
                self.node_labels = labels
            leds = req.node.metadata.fields.get(LEDS_METADATA)
            if leds is not None and leds.string_value in (LEDS_ALWAYS, LEDS_NEVER):
                self.leds = leds.string_value
            self.client = node_identity.client_kind(req.node)
            self.namespace = node_identity.client_namespace(req.node)
            if self.info is not None:
                self.info.client = self.node_id  # the one copy

    def _check_size(self, count: int, type_url: str) -> None:
        if count > self.max_names:
            self.metrics.bad_requests.labels("too_many_names").inc()
            raise TooManyNames(f"{count} {rt.short_name(type_url)} resource names on one "
                               f"stream; the limit is {self.max_names}")

    def _next_nonce(self) -> str:
        shared = self._shared
        self._nonce = nonce = shared.nonce_after(self._nonce)
        return shared.text(nonce)

    def _subscription(self, type_url: str) -> tuple[Subscription, bool]:
        sub = self.subs.get(type_url)
        if sub is None:
            sub = self.subs[type_url] = Subscription(
                type_url, node_name=self.node_name, delta=self.api == "delta",
                leds=self.leds, client=self.client, namespace=self.namespace)
            return sub, True
        return sub, False

    def _apply_watches(self, sub: Subscription, change: NameChange) -> None:
        t = sub.type_url
        if self.info is not None and (change.added or change.removed or change.wildcard_added
                                      or change.wildcard_removed):
            shown = sorted(sub.names)
            self.info.subscribe(rt.short_name(t),
                                tuple([rt.WILDCARD, *shown] if sub.wildcard else shown))
        self.cache.watch(sub, change, self)

    def _acked(self, sub: Subscription, nonce: str, version: str) -> None:
        """§1.4: the client took the response `nonce` (at `version`)."""
        sub.answered = nonce
        sub.acked_version = version
        sub.acks += 1
        if self.info is not None:
            self.info.acked(rt.SHORT[sub.type_url], version)

    def _log_nack(self, sub: Subscription, nonce: str, version: str, code: int,
                  message: str) -> None:
        sub.nacks += 1
        sub.last_nack = message
        if self.info is not None:
            self.info.nacked(rt.short_name(sub.type_url), f"{code}: {message}")
        self.metrics.rejects[self.metrics.key(sub.type_url)].inc()
        log.warning("xds NACK", api=self.api, node=self.node_id, peer=self.peer,
                    type=rt.short_name(sub.type_url), nonce=nonce, version=version,
                    code=code, message=message)

    def _new_or_changed(self, sub: Subscription, reply: Reply) -> list[str]:
        """Clusters in a CDS reply that are new or changed for this client."""
        return [r.name for r in reply.resources if sub.sent.get(r.name) != r.version]

    def _after_cluster_reply(self, changed: Iterable[str]) -> None:
        # §1.10 (Envoy warming): a new or updated Cluster stays warming until a CLA
        # arrives for it, even an unchanged one, and Envoy's EDS re-request can look
        # just like an ACK. So every such cluster's CLA is due again now, and goes
        # out right after this CDS response (EDS follows CDS in ORDER).
        eds = self.subs.get(rt.ENDPOINT)
        if eds is None:
            return
        for name in changed:
            eds.forget(name)
            eds.mark(name)

    def _answer_unknown(self, response: bytes) -> None:
        # The only responses ever queued: bounded, so that a client spamming unknown
        # types without reading cannot grow the stream.
        if self._unknown is None:
            self._unknown = []
        if len(self._unknown) < MAX_QUEUED_UNKNOWN:
            self._unknown.append(response)
            self._waker.wake()

    def _answer_debug(self, reply: DebugReply | Awaitable[DebugReply],
                      frame: Callable[[DebugReply], bytes]) -> None:
        """Queue a debug answer (framed by `frame`); one still being gathered from
        the other processes is queued when it comes, if the stream is still open."""
        if isinstance(reply, tuple):
            self._answer_unknown(frame(reply))
            return
        gathering = asyncio.ensure_future(reply)
        _GATHERING.add(gathering)

        def done(task: asyncio.Future[DebugReply]) -> None:
            _GATHERING.discard(task)
            if not task.cancelled() and task.exception() is None and not self._closed:
                self._answer_unknown(frame(task.result()))

        gathering.add_done_callback(done)

    def _answer_other_type(self, type_url: str, nonce: str, names: tuple[str, ...]
                           ) -> tuple[str, DebugReply | Awaitable[DebugReply]] | None:
        """A request for a type that is not served (§9.1): the nonce of its answer and
        what the answer holds (istiod's debug types, §9.2, or nothing), or None when
        it gets no answer. Answered: the first request of the type on this stream,
        whatever nonce it quotes (istioctl's first request quotes one of its own;
        §1.3 cannot apply before we sent anything), and later ones that quote no
        nonce (asked again) or ours with other names. Quoting our nonce with the same
        names (in delta: with none) is an ACK; quoting another is stale (§1.3)."""
        debug = is_debug_type(type_url)
        if not debug:
            self.metrics.bad_requests.labels("unknown_type").inc()
        last = self.others.get(type_url)
        if last is None:
            if len(self.others) >= MAX_OTHER_TYPES:
                self.metrics.bad_requests.labels("too_many_types").inc()
                raise BadRequest(f"{type_url}: more than {MAX_OTHER_TYPES} types that "
                                 "meshbridge does not serve on one stream")
        elif nonce and (nonce != last[0] or names == last[1]
                        or (self.api == "delta" and not names)):
            return None
        if debug and self.debug is None:
            raise Forbidden(f"{type_url}: debug types are not served on this port")
        if not debug:
            log.info("xds request for an unserved type", node=self.node_id, type=type_url)
        sent = self._next_nonce()
        # Recorded first: a stream asking for syncz is itself a debug client in it.
        self.others = {**self.others, type_url: (sent, names)}  # at most 16: copied
        reply = self.debug.answer(self, type_url, names) if self.debug and debug else ((), "")
        return sent, reply

    def _control(self, number: int, type_url: str) -> bytes:
        """The control_plane field of an answer to `type_url`: istioctl reads the
        debug answers' as JSON (§9.2), the rest carry our plain name."""
        if self.debug is None or not is_debug_type(type_url):
            return wire.length_delimited(number, _CONTROL_PLANE)
        return wire.length_delimited(number, wire.string_field(
            _CONTROL_PLANE_IDENTIFIER, self.debug.control_plane))

    @property
    def debug_only(self) -> bool:
        """A client that asked only for debug types (istioctl, `meshbridge status`):
        not a proxy, and not listed as one (§9.2)."""
        return not self.subs and any(is_debug_type(t) for t in self.others)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Release every watch; the stream is over."""
        if self._closed:
            return
        self._closed = True
        for sub in self.subs.values():
            self.cache.release(sub, self)


class SotwStream(XdsStream):
    """State-of-the-world: `StreamAggregatedResources` and `StreamEndpoints` (§1)."""

    __slots__ = ()
    api = "sotw"
    protocol = "xds-sotw"

    def handle(self, req: discovery_pb2.DiscoveryRequest) -> None:
        t = self._type_of(req.type_url)
        self._remember_node(req)
        if t not in rt.SHORT:
            self._unknown_type(t, req)
            return
        if t in rt.DELTA_ONLY:
            self._refuse_delta_only(t)
        # The same name twice is one; each name is one string for every stream.
        names = set(map(sys.intern, req.resource_names))
        self._check_size(len(names), t)
        sub, _ = self._subscription(t)
        nack = req.HasField("error_detail")
        if nack and sub.nonce:
            # §1.4: error_detail marks a NACK (logged even when stale). The rejected
            # versions stay recorded as sent, so nothing is sent again until a
            # resource changes or a new name is asked for (Istio's ShouldRespond).
            self._log_nack(sub, req.response_nonce, req.version_info,
                           req.error_detail.code, req.error_detail.message)
        if sub.nonce and req.response_nonce and req.response_nonce != sub.nonce:
            # §1.3: a response newer than this request's nonce is on its way; the
            # request is stale and ignored (the client's ACK of the newer one will
            # carry its current names).
            self.metrics.stale[t].inc()
            return
        if req.response_nonce and sub.nonce:
            sub.answered = req.response_nonce
            if not nack:
                # The version sent, when the ACK quotes it: one string shared by every
                # stream, not one decoded per ACK and kept per stream.
                quoted = req.version_info
                self._acked(sub, req.response_nonce,
                            sub.version_sent if quoted == sub.version_sent else quoted)
                if names == sub.names and not sub.wildcard and rt.WILDCARD not in names:
                    # An ACK that names what is subscribed changes no subscription
                    # (the usual request by far: one per response per stream).
                    if sub.dirty or sub.must_reply:
                        self._waker.wake()
                    return
        else:
            # §1.8(a): no nonce (or none of ours: nothing was sent for this type on
            # this stream yet) means a first request, or a client starting the type
            # over: it is answered in full, whatever version it says it holds. §1.2:
            # a client that moved from another replica may hold exactly that already,
            # which the first response's version tells (counted, not relied on).
            sub.forget_sent()
            sub.presented = req.version_info[:VERSION_DIGITS]
        change = sub.apply_sotw_names(names)
        if not sub.names and not sub.wildcard:
            # §1.8: an empty, non-wildcard request unsubscribes; no response.
            sub.must_reply = False
            sub.clear_sent()
        if change.wildcard_added:
            sub.mark(rt.WILDCARD)
        self._apply_watches(sub, change)
        if sub.dirty or sub.must_reply:
            self._waker.wake()

    @staticmethod
    def ack_key(req: discovery_pb2.DiscoveryRequest) -> Hashable | None:
        if not req.response_nonce or req.HasField("node") or req.HasField("error_detail"):
            return None
        return (req.type_url, req.response_nonce, req.version_info,
                frozenset(req.resource_names))

    def take_ack(self, key: Hashable) -> bool:
        # The type in quotes: subscripting it would build a new alias per ACK.
        type_url, nonce, version, names = cast("_SotwAckKey", key)
        if not type_url and not self.ads:
            type_url = rt.ENDPOINT
        sub = self.subs.get(type_url)
        # The same test as handle's: our last nonce, no NACK, the names subscribed.
        if sub is None or not sub.nonce or nonce != sub.nonce or sub.wildcard \
                or names != sub.names or rt.WILDCARD in names:
            return False
        sub.answered = nonce
        self._acked(sub, nonce, sub.version_sent if version == sub.version_sent else version)
        if sub.dirty or sub.must_reply:
            self._waker.wake()
        return True

    def _refuse_delta_only(self, type_url: str) -> None:
        # §7.1: LEDS collections exist only in delta xDS, and no CLA sent over SotW
        # names one, so a SotW request for them is a client misconfigured: the stream
        # ends with INVALID_ARGUMENT (the only error a server can send), logged once
        # per node so that a client reconnecting in a loop does not flood the log.
        self.metrics.bad_requests.labels("delta_only_type").inc()
        if _first_time(self.node_id):
            log.warning("xds LEDS asked for over state-of-the-world", node=self.node_id,
                        peer=self.peer, type=rt.short_name(type_url))
        raise BadRequest(f"{type_url} (LEDS) is served over delta xDS only "
                         f"(DeltaAggregatedResources)")

    def _unknown_type(self, type_url: str, req: discovery_pb2.DiscoveryRequest) -> None:
        # §9.1: another type on ADS (SDS secrets, say) is answered, empty, so the
        # client does not wait for a response that cannot come; istiod's debug types
        # are answered with what they ask for (§9.2).
        names = tuple(dict.fromkeys(req.resource_names))
        answer = self._answer_other_type(type_url, req.response_nonce, names)
        if answer is not None:
            nonce, reply = answer
            control = self._control(_SOTW_CONTROL_PLANE, type_url)
            self._answer_debug(reply, lambda r: self._frame(
                r[1], (), type_url, nonce, (body for _, body in r[0]), control))

    def _frame(self, version: str, resources: Iterable[EncodedResource], type_url: str,
               nonce: str, anys: Iterable[bytes] = (), control: bytes = _SOTW_CONTROL
               ) -> bytes:
        parts = _sotw_parts(version, resources, type_url, anys)
        parts.append(wire.string_field(_SOTW_NONCE, nonce))
        parts.append(control)
        return b"".join(parts)

    def _reply(self, sub: Subscription) -> Reply | Pending | None:
        return self.cache.sotw_reply(sub)

    def _encode(self, reply: Reply, version: str, type_url: str, nonce: str) -> bytes:
        resources = reply.resources
        key = (type_url, version, *map(id, resources))
        return self._shared.encoded(self._nonce, key, resources, lambda: self._own_response(
            version, resources, type_url, nonce))

    def _own_response(self, version: str, resources: tuple[EncodedResource, ...],
                      type_url: str, nonce: str) -> bytes:
        """A response no other stream of the batch sends (its nonce its own): the
        last head framed is still shared, when small."""
        head = _sotw_head_of(version, resources, type_url)
        if head is None:
            return self._frame(version, resources, type_url, nonce)
        return b"".join((head, wire.string_field(_SOTW_NONCE, nonce), _SOTW_CONTROL))

    def _record_sent(self, sub: Subscription, reply: Reply) -> None:
        if sub.type_url in rt.FULL_STATE:
            sub.sent = HeldVersions((r.name, r.version) for r in reply.resources)
        else:
            sent = sub.sent
            for r in reply.resources:
                sent = held_with(sent, r.name, r.version)
            sub.sent = sent


class DeltaStream(XdsStream):
    """Incremental: `DeltaAggregatedResources` and `DeltaEndpoints` (§2)."""

    __slots__ = ()
    api = "delta"
    protocol = "xds-delta"

    def handle(self, req: discovery_pb2.DeltaDiscoveryRequest) -> None:
        t = self._type_of(req.type_url)
        self._remember_node(req)
        if t not in rt.SHORT:
            self._unknown_type(t, req)
            return
        sub, first = self._subscription(t)
        if (not first and req.response_nonce and req.response_nonce == sub.nonce
                and not req.resource_names_subscribe and not req.resource_names_unsubscribe
                and not req.HasField("error_detail")):
            # An ACK that changes no subscription: the usual request by far (one per
            # response per stream).
            self._acked(sub, req.response_nonce, sub.version_sent)
            if sub.dirty or sub.must_reply:
                self._waker.wake()
            return
        subscribe = list(dict.fromkeys(map(sys.intern, req.resource_names_subscribe)))
        unsubscribe = list(dict.fromkeys(req.resource_names_unsubscribe))
        self._check_size(len(sub.names) + len(subscribe), t)
        if req.response_nonce and req.response_nonce == sub.nonce:
            sub.answered = req.response_nonce
            if req.HasField("error_detail"):
                self._log_nack(sub, req.response_nonce, "", req.error_detail.code,
                               req.error_detail.message)
            else:
                self._acked(sub, req.response_nonce, sub.version_sent)
        elif req.response_nonce and req.HasField("error_detail"):
            # A NACK of an older response: still logged and counted.
            self._log_nack(sub, req.response_nonce, "", req.error_detail.code,
                           req.error_detail.message)
        # §2: subscription changes are honoured whatever the nonce.
        initial = self._initial_versions(sub, req, subscribe, unsubscribe) if first else None
        change = sub.apply_delta(subscribe, unsubscribe, initial)
        if change.wildcard_added:
            sub.mark_all(self.cache.wildcard_names(t))
        self._apply_watches(sub, change)
        if sub.dirty or sub.must_reply:
            self._waker.wake()

    @staticmethod
    def ack_key(req: discovery_pb2.DeltaDiscoveryRequest) -> Hashable | None:
        if (not req.response_nonce or req.HasField("node") or req.HasField("error_detail")
                or req.resource_names_subscribe or req.resource_names_unsubscribe
                or req.initial_resource_versions):
            return None
        return (req.type_url, req.response_nonce)

    def take_ack(self, key: Hashable) -> bool:
        type_url, nonce = cast("_DeltaAckKey", key)
        if not type_url and not self.ads:
            type_url = rt.ENDPOINT
        sub = self.subs.get(type_url)
        # handle's fast path: an ACK of the last response that changes no subscription.
        if sub is None or nonce != sub.nonce:
            return False
        self._acked(sub, nonce, sub.version_sent)
        if sub.dirty or sub.must_reply:
            self._waker.wake()
        return True

    def _initial_versions(self, sub: Subscription, req: discovery_pb2.DeltaDiscoveryRequest,
                          subscribe: list[str], unsubscribe: list[str]) -> dict[str, str]:
        """What a reconnecting client says it holds (§2), as far as it can matter: the
        versions of names it subscribes to (any name, under `*`), at most the name
        limit of them; a version that is not one of ours is an unknown one (the
        resource is sent again). The rest is ignored, with one log line: a client
        cannot make the server hold, or answer about, what it never asked for."""
        given = req.initial_resource_versions
        if not given:
            return {}
        wildcard = sub.wildcard_capable and (
            rt.WILDCARD in subscribe or sub.wildcard or (not subscribe and not unsubscribe))
        kept: dict[str, str] = {}
        not_versions = 0
        if wildcard:
            # `*` covers whatever the client may hold, even what no longer exists.
            for name, version in given.items():
                if len(kept) >= self.max_names:
                    break
                kept[name] = version
            not_subscribed, over = 0, len(given) - len(kept)
        elif sub.type_url == rt.LB_ENDPOINT:
            # §7: LEDS members are held by the collection subscribed to.
            collections = set(subscribe)
            for name, version in given.items():
                if len(kept) >= self.max_names:
                    break
                if collection_of(name) in collections:
                    kept[name] = version
            not_subscribed, over = len(given) - len(kept), 0
        else:
            for name in subscribe:
                version = given.get(name)
                if version is not None and len(kept) < self.max_names:
                    kept[name] = version
            not_subscribed, over = len(given) - len(kept), 0
        for name, version in kept.items():
            if not _is_version(version):
                kept[name] = RESEND
                not_versions += 1
        if not_subscribed or not_versions or over:
            log.info("xds initial_resource_versions ignored", node=self.node_id,
                     peer=self.peer, type=rt.short_name(sub.type_url), given=len(given),
                     not_subscribed=not_subscribed, not_versions=not_versions,
                     over_limit=over, limit=self.max_names)
        return kept

    def _unknown_type(self, type_url: str, req: discovery_pb2.DeltaDiscoveryRequest) -> None:
        # §9.1 with §2's "does not exist" answer: every name asked for is removed;
        # istiod's debug types are answered with what they ask for (§9.2).
        names = tuple(dict.fromkeys(req.resource_names_subscribe))
        answer = self._answer_other_type(type_url, req.response_nonce, names)
        if answer is None:
            return
        nonce, reply = answer
        if is_debug_type(type_url):
            control = self._control(_DELTA_CONTROL_PLANE, type_url)
            self._answer_debug(reply, lambda r: self._frame(r[1], (
                wrap_resource(name, r[1], (body,), len(body)) for name, body in r[0]),
                (), type_url, nonce, control))
        else:
            removed = [n for n in names if n != rt.WILDCARD]
            self._answer_unknown(self._frame("", (), removed, type_url, nonce))

    def _frame(self, version: str, resources: Iterable[EncodedResource],
               removed: Iterable[str], type_url: str, nonce: str,
               control: bytes = _DELTA_CONTROL) -> bytes:
        # Field order as protobuf writes it: version, resources, type, nonce, removed,
        # control plane.
        parts = [wire.string_field(_DELTA_VERSION, version)]
        for r in resources:
            parts.append(r.delta_head)
            parts.extend(r.any_parts)
            parts.append(r.delta_tail)
        parts.append(_type_field(_DELTA_TYPE, type_url))
        parts.append(wire.string_field(_DELTA_NONCE, nonce))
        parts.extend(wire.length_delimited(_DELTA_REMOVED, n.encode()) for n in removed)
        parts.append(control)
        return b"".join(parts)

    def _reply(self, sub: Subscription) -> Reply | Pending | None:
        return self.cache.delta_reply(sub)

    def _encode(self, reply: Reply, version: str, type_url: str, nonce: str) -> bytes:
        resources, removed = reply.resources, reply.removed
        key = (type_url, version, removed, *map(id, resources))
        return self._shared.encoded(self._nonce, key, resources, lambda: self._frame(
            version, resources, removed, type_url, nonce))

    def _record_sent(self, sub: Subscription, reply: Reply) -> None:
        sent = sub.sent
        for r in reply.resources:
            sent = held_with(sent, r.name, r.version)
        for name in reply.removed:
            if name in sub.names:
                sent = held_with(sent, name, ABSENT)  # told once; sent again when it appears
        sub.sent = sent
        for name in reply.removed:
            if name not in sub.names:
                sub.forget(name)
