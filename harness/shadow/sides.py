"""The two control planes as `meshbridge shadow` hears them.

A side subscribes to every target on one server, as a proxy of its API would, and
tells its sink each target's latest `Answer` whenever it changes:

    LinkerdSide    per target one destination `Get` stream and one `GetProfile`
                   stream (and `--routes`: one `OutboundPolicies.Watch` stream); a
                   stream that ends is re-opened with backoff, so a target
                   that was NOT_FOUND is found once it exists, and a restarted server
                   is followed. A server that refuses GetProfile (UNIMPLEMENTED) is
                   noted once and its profiles are not compared.
    XdsSide        one ADS stream naming every target as an EDS resource (`XdsClient`),
                   plus `ClusterWatch`: the server's CDS (wildcard), which says which
                   targets exist, since an EDS answer alone cannot (an empty
                   ClusterLoadAssignment is also what a missing service gets)
    HostnameWatch  `--all`: ours' EDS of every service, for the StatefulSet pod
                   authorities (`<hostname>.<svc>.<ns>.svc.<domain>:<port>`) of
                   endpoints that carry a hostname

Every message is kept whole, flattened to field paths (`harness.shadow.flat`), and
counted; one that changes nothing is counted as redundant. A side never goes back to
"pending": while it reconnects, its last answer stands until the new stream says
something else. Errors are per target (Linkerd) or per stream (xDS: every target of
that side), never fatal to the run; a server that speaks the other API is also noted
once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from harness.clients import ADS_SOTW, Received, XdsClient
from harness.normalize import State, carries_metadata
from harness.shadow import flat
from harness.shadow.fields import PROFILE_STATUS, Flat
from harness.shadow.model import (
    ABSENT,
    EMPTY,
    EMPTY_ADD,
    ENDPOINTS,
    ERROR,
    NO_ANSWER,
    NO_ENDPOINTS,
    NOT_FOUND,
    PENDING,
    REMOVED,
    REMOVED_ALL,
    SILENT,
    Answer,
)
from harness.shadow.routes import WATCH, policy_fields, policy_status, traffic_spec
from linkerd_api.proto import destination_pb2

CDS_TYPE = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
GET = "/io.linkerd.proxy.destination.Destination/Get"
GET_PROFILE = "/io.linkerd.proxy.destination.Destination/GetProfile"
LINKERD_METADATA = 'endpoint.metadata.filter_metadata."io.linkerd.destination"'

Sink = Callable[[str, Answer], None]  # (target, answer)


class Backoff:
    """Delays between reconnects: doubling from `low` up to `high`."""

    def __init__(self, low: float, high: float) -> None:
        self.low, self.high = low, max(low, high)
        self.current = low

    def next(self) -> float:
        delay = self.current
        self.current = min(self.high, self.current * 2)
        return delay

    def reset(self) -> None:
        self.current = self.low


def status_text(code: str, details: str = "") -> str:
    return f"{code}: {details}" if details else code


async def _ended(run: Any) -> str:
    """Run a client until its stream ends; its status as "CODE: details". Anything
    the client could not make sense of is an error of that stream, not of shadow."""
    try:
        await run
    except Exception as e:  # a decode error from a server that is not what we think
        return status_text("UNKNOWN", f"{type(e).__name__}: {e}")
    return ""


async def _stream(call: Any, each: Callable[[bytes], None]) -> str:
    """Read a server stream to its end: "OK" or "CODE: details"."""
    try:
        async for raw in call:
            each(raw)
        return str((await call.code()).name)
    except grpc.aio.AioRpcError as e:
        return status_text(e.code().name, e.details() or "")
    except Exception as e:  # a message that does not decode: not the server we think
        call.cancel()
        return status_text("UNKNOWN", f"{type(e).__name__}: {e}")


def _code(status: str) -> str:
    return status.split(":", 1)[0]


@dataclass(slots=True)
class GetState:
    """What one `Get` stream has said: each endpoint's WeightedAddr (bytes, to tell a
    repeat, and flattened), the set's fields, the signal, and the message counts."""

    raw: dict[str, bytes] = field(default_factory=dict)
    endpoints: dict[str, Flat] = field(default_factory=dict)
    labels: Flat = field(default_factory=dict)
    signal: str = PENDING
    existed: bool = False
    counts: dict[str, int] = field(default_factory=dict)

    def apply(self, update: Any) -> str:
        """Apply one Update; its kind."""
        kind = update.WhichOneof("update") or "unknown"
        before = (dict(self.raw), dict(self.labels), self.signal)
        if kind == "add":
            for wa in update.add.addrs:
                key = flat.weighted_addr_key(wa)
                self.raw[key] = wa.SerializeToString(deterministic=True)
                self.endpoints[key] = flat.weighted_addr(wa)
            self.labels = flat.addr_set(update.add)
            if self.raw:
                self.signal = ENDPOINTS
            elif self.signal != REMOVED_ALL:
                self.signal = EMPTY_ADD
        elif kind == "remove":
            for addr in update.remove.addrs:
                key = flat.tcp_key(addr)
                self.raw.pop(key, None)
                self.endpoints.pop(key, None)
            self.signal = ENDPOINTS if self.raw else REMOVED_ALL
        elif kind == "no_endpoints":
            self.raw.clear()
            self.endpoints.clear()
            self.labels = {}
            self.signal = NO_ENDPOINTS if update.no_endpoints.exists else ABSENT
        self.counts[kind] = self.counts.get(kind, 0) + 1
        # The first message always says something (it ends the silence).
        if sum(n for k, n in self.counts.items() if k != "redundant") > 1 and before == (
                self.raw, self.labels, self.signal):
            self.counts["redundant"] = self.counts.get("redundant", 0) + 1
        self.existed = self.existed or self.signal in (ENDPOINTS, NO_ENDPOINTS)
        return kind


@dataclass(slots=True)
class ProfileState:
    pending: bool = True
    fields: Flat = field(default_factory=dict)
    last: bytes | None = None
    counts: dict[str, int] = field(default_factory=dict)

    def apply(self, raw: bytes) -> None:
        p = destination_pb2.DestinationProfile.FromString(raw)
        data = p.SerializeToString(deterministic=True)
        self.counts["profile"] = self.counts.get("profile", 0) + 1
        if data == self.last:
            self.counts["profile_redundant"] = self.counts.get("profile_redundant", 0) + 1
        self.last = data
        self.fields = flat.profile(p)
        self.pending = False


class LinkerdSide:
    api = "linkerd"

    def __init__(self, name: str, channel: grpc.aio.Channel, sink: Sink, *, token: str = "",
                 settle: float = 2.0, retry: Backoff | None = None,
                 workload: str | None = None) -> None:
        self.name = name
        self.channel = channel
        self.sink = sink
        self.token = token
        self.settle = settle
        # --routes: the client OutboundPolicies are asked for; None: routes not compared.
        self.workload = workload
        self._policies: dict[str, Flat | None] = {}  # per target; None: none yet
        self.policies_refused = ""  # OutboundPolicies' status, when not served
        self._retry = retry or Backoff(0.2, 5.0)
        self.targets: list[str] = []
        self._group: asyncio.TaskGroup | None = None
        # Which semantics the server showed (a no_endpoints, or NOT_FOUND), for the report.
        self.semantics: set[str] = set()
        self._get: dict[str, Answer] = {}  # per target, from Get alone
        self._profiles: dict[str, ProfileState] = {}
        self.profiles_refused = ""  # GetProfile's status, when the server does not serve it
        self.other_api = ""  # Get's UNIMPLEMENTED status: a server of another API

    def ignored(self) -> tuple[str, ...]:
        out = ("profile", "messages.profile_redundant") if self.profiles_refused else ()
        return (*out, "policy") if self.policies_refused else out

    def notes(self) -> list[str]:
        shown = {"proto": "proto semantics (it sent no_endpoints)",
                 "linkerd-2.20": "linkerd-2.20 semantics (Get ended NOT_FOUND)"}
        said = [shown[s] for s in sorted(self.semantics, reverse=True)]
        out = [f"{self.name} answers in " + " and ".join(said)] if said else []
        if self.other_api:
            out.append(f"{self.name} does not serve the Linkerd destination API "
                       f"({self.other_api}): is it an xDS server (--api xds)?")
        if self.profiles_refused:
            out.append(f"{self.name} refuses GetProfile ({self.profiles_refused}): "
                       f"profiles are not compared")
        if self.policies_refused:
            out.append(f"{self.name} refuses OutboundPolicies ({self.policies_refused}): "
                       f"routes are not compared")
        return out

    def add(self, targets: Iterable[str]) -> None:
        for t in targets:
            if t in self.targets:
                continue
            self.targets.append(t)
            self._get[t] = Answer()
            self._profiles[t] = ProfileState()
            self._policies[t] = None
            if self._group is not None:
                self._start(self._group, t)

    def _start(self, tg: asyncio.TaskGroup, target: str) -> None:
        tg.create_task(self._follow(target), name=f"{self.name} Get {target}")
        if not self.profiles_refused:
            tg.create_task(self._follow_profile(target),
                           name=f"{self.name} GetProfile {target}")
        if self.workload is not None and not self.policies_refused:
            tg.create_task(self._follow_policy(target, self.workload),
                           name=f"{self.name} OutboundPolicies {target}")

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._group = tg
            for t in self.targets:
                self._start(tg, t)
            await asyncio.Event().wait()  # until cancelled by the owner

    def _request(self, target: str) -> destination_pb2.GetDestination:
        return destination_pb2.GetDestination(scheme="k8s", path=target,
                                              context_token=self.token)

    def _emit(self, target: str) -> None:
        get = self._get[target]
        if get.signal in (PENDING, ERROR, NOT_FOUND):
            self.sink(target, get)
            return
        prof = self._profiles[target]
        refused = bool(self.profiles_refused)
        routes = self.workload is not None and not self.policies_refused
        policy = self._policies.get(target)
        self.sink(target, Answer(
            get.signal, get.endpoints, status=get.status, existed=get.existed,
            section="add", common=get.common,
            profile=None if refused else prof.fields,
            profile_pending=prof.pending and not refused,
            routes=(policy or {}) if routes else None,
            routes_pending=routes and policy is None,
            messages={**get.messages, **({} if refused else prof.counts)}))

    def _set(self, target: str, answer: Answer) -> None:
        self._get[target] = answer
        self._emit(target)

    async def _follow(self, target: str) -> None:
        backoff = Backoff(self._retry.low, self._retry.high)
        while True:
            status, heard = await self._attempt(target)
            code = _code(status)
            if code == "NOT_FOUND":
                self.semantics.add("linkerd-2.20")
                self._set(target, Answer(NOT_FOUND, status=status))
            elif code != "OK":
                if code == "UNIMPLEMENTED":
                    self.other_api = self.other_api or status
                self._set(target, Answer(ERROR, status=status))
            # OK: the server ended the stream (shutdown, slow consumer); reconnect, and
            # keep the last answer until the new stream says otherwise.
            if heard:
                backoff.reset()
            await asyncio.sleep(backoff.next())  # reconnect delay, not synchronisation

    async def _attempt(self, target: str) -> tuple[str, bool]:
        """One Get stream, until it ends: its status, and whether it said anything."""
        st = GetState()

        def each(raw: bytes) -> None:
            silence.cancel()
            if st.apply(destination_pb2.Update.FromString(raw)) == "no_endpoints":
                self.semantics.add("proto")
            self._set(target, Answer(
                st.signal, {k: dict(v) for k, v in st.endpoints.items()}, existed=st.existed,
                # Set labels label endpoints: without any they are nothing to compare.
                common=dict(st.labels) if st.raw else {}, messages=dict(st.counts)))

        def silent() -> None:
            # linkerd-2.20 sends nothing for a service without endpoints (Linkerd §2.5).
            if not st.counts:
                self._set(target, Answer(SILENT))

        get = self.channel.unary_stream(
            GET, request_serializer=destination_pb2.GetDestination.SerializeToString)
        silence = asyncio.get_running_loop().call_later(self.settle, silent)
        try:
            status = await _stream(get(self._request(target)), each)
        finally:
            silence.cancel()
        return status, bool(st.counts)

    async def _follow_profile(self, target: str) -> None:
        backoff = Backoff(self._retry.low, self._retry.high)
        method = self.channel.unary_stream(
            GET_PROFILE, request_serializer=destination_pb2.GetDestination.SerializeToString)
        while not self.profiles_refused:
            st = ProfileState()

            def each(raw: bytes, st: ProfileState = st) -> None:
                st.apply(raw)
                self._profiles[target] = st
                self._emit(target)

            def silent(st: ProfileState = st) -> None:
                if st.pending:
                    st.pending = False
                    st.fields = {f"profile.{PROFILE_STATUS}": SILENT}
                    self._profiles[target] = st
                    self._emit(target)

            timer = asyncio.get_running_loop().call_later(self.settle, silent)
            try:
                status = await _stream(method(self._request(target)), each)
            finally:
                timer.cancel()
            code = _code(status)
            if code == "UNIMPLEMENTED":
                # Said once for the side; every target's profile is left out.
                self.profiles_refused = self.profiles_refused or status
                for t in self.targets:
                    self._emit(t)
                return
            if code != "OK":
                self._profiles[target] = ProfileState(
                    False, {f"profile.{PROFILE_STATUS}": code}, None, st.counts)
                self._emit(target)
            if st.counts:
                backoff.reset()
            await asyncio.sleep(backoff.next())  # reconnect delay, not synchronisation


    async def _follow_policy(self, target: str, workload: str) -> None:
        """--routes: the target's OutboundPolicies.Watch, re-opened when it ends."""
        backoff = Backoff(self._retry.low, self._retry.high)
        method = self.channel.unary_stream(WATCH, request_serializer=None)
        while not self.policies_refused:
            heard = False

            def each(raw: bytes) -> None:
                nonlocal heard
                heard = True
                self._policies[target] = policy_fields(raw)
                self._emit(target)

            status = await _stream(method(traffic_spec(target, workload)), each)
            code = _code(status)
            if code == "UNIMPLEMENTED":
                self.policies_refused = self.policies_refused or status
                for t in self.targets:
                    self._emit(t)
                return
            if code != "OK":
                self._policies[target] = policy_status(code)
                self._emit(target)
            if heard:
                backoff.reset()
            await asyncio.sleep(backoff.next())  # reconnect delay, not synchronisation


def _captured_xds_client(channel: grpc.aio.Channel, names: list[str], *, delta: bool,
                         node_id: str, zone: str,
                         observe: Callable[[Received, list[Any]], None]) -> XdsClient:
    """An XdsClient whose observer is also given the whole ClusterLoadAssignments of
    each response, in the order of `Received.states` (delta removals come after)."""
    pending: list[Any] = []

    def keep(cla: Any) -> State:
        pending.append(cla)
        return frozenset()

    def seen(r: Received) -> None:
        clas = list(pending)
        pending.clear()
        observe(r, clas)

    return XdsClient(channel, names, delta=delta, node_id=node_id, observe=seen, zone=zone,
                     normalize=keep)


@dataclass(slots=True)
class _NameState:
    last: bytes | None = None
    counts: dict[str, int] = field(default_factory=dict)

    def count(self, kind: str) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1


class XdsSide:
    api = "xds"

    def __init__(self, name: str, channel: grpc.aio.Channel, sink: Sink, *,
                 node_id: str = "meshbridge-shadow", zone: str = "", delta: bool = False,
                 resource_name: Callable[[str], str] = str, settle: float = 2.0,
                 retry: Backoff | None = None) -> None:
        self.name = name
        self.channel = channel
        self.sink = sink
        self.node_id = node_id
        self.zone = zone
        self.delta = delta
        self.resource_name = resource_name
        self.settle = settle
        self._retry = retry or Backoff(0.2, 5.0)
        self.targets: list[str] = []
        self._by_name: dict[str, list[str]] = {}
        self._eds: dict[str, Answer] = {}  # per target, from EDS alone
        # EDS names of the server's clusters (its CDS); None while unknown.
        self.clusters: frozenset[str] | None = None
        # Whether its endpoints carry meshbridge's metadata; None until seen.
        self.metadata: bool | None = None
        self.other_api = ""
        self._resubscribe = asyncio.Event()
        # --routes: each target's route fields from the RouteWatch; None: not compared.
        self.routes: dict[str, Flat] | None = None

    def ignored(self) -> tuple[str, ...]:
        return (LINKERD_METADATA,) if self.metadata is False else ()

    def notes(self) -> list[str]:
        out = []
        if self.metadata is False:
            out.append(f"{self.name} sends no io.linkerd.destination endpoint metadata: "
                       f"identity, protocol hint, opaque transport and the other Linkerd "
                       f"fields are not compared")
        if self.other_api:
            out.append(f"{self.name} does not serve xDS ADS ({self.other_api}): is it a "
                       f"Linkerd destination server (--api linkerd)?")
        return out

    def add(self, targets: Iterable[str]) -> None:
        new = [t for t in targets if t not in self._eds]
        for t in new:
            self.targets.append(t)
            self._by_name.setdefault(self.resource_name(t), []).append(t)
            self._eds[t] = Answer(section="endpoint")
        if new:
            # One ADS stream names every target: a new target is a new subscription.
            self._resubscribe.set()

    def set_clusters(self, names: frozenset[str] | None) -> None:
        if names == self.clusters:
            return
        self.clusters = names
        for t in self.targets:
            self._emit(t)

    def _exists(self, target: str) -> bool | None:
        if self.clusters is None:
            return None
        return self.resource_name(target) in self.clusters

    def compare_routes(self) -> None:
        self.routes = {}

    def set_routes(self, target: str, fields: Flat) -> None:
        assert self.routes is not None
        self.routes[target] = fields
        if target in self._eds:
            self._emit(target)

    def _emit(self, target: str) -> None:
        eds = self._eds[target]
        if eds.signal in (PENDING, ERROR):
            self.sink(target, eds)
            return
        routes = None if self.routes is None else self.routes.get(target)
        self.sink(target, Answer(eds.signal, eds.endpoints, self._exists(target),
                                 section="endpoint", common=eds.common,
                                 routes=None if self.routes is None else (routes or {}),
                                 routes_pending=self.routes is not None and routes is None,
                                 messages=eds.messages))

    def _set(self, target: str, answer: Answer) -> None:
        self._eds[target] = answer
        self._emit(target)

    async def run(self) -> None:
        backoff = Backoff(self._retry.low, self._retry.high)
        while True:
            if not self.targets:
                await self._resubscribe.wait()
            self._resubscribe.clear()
            status, heard = await self._attempt()
            if status is None:
                continue  # new targets: subscribe again at once
            if _code(status) != "OK":
                if _code(status) == "UNIMPLEMENTED":
                    self.other_api = self.other_api or status
                for t in self.targets:
                    self._set(t, Answer(ERROR, status=status, section="endpoint"))
            if heard:
                backoff.reset()
            await asyncio.sleep(backoff.next())  # reconnect delay, not synchronisation

    async def _attempt(self) -> tuple[str | None, bool]:
        """One ADS stream for every target, until it ends (its status) or the targets
        change (None); and whether it said anything."""
        names = list(dict.fromkeys(self.resource_name(t) for t in self.targets))
        heard = False
        per_name: dict[str, _NameState] = {}  # this stream's, reset with it

        def observe(r: Received, clas: list[Any]) -> None:
            nonlocal heard
            heard = True
            data = [c.SerializeToString(deterministic=True) for c in clas]
            states = [per_name.setdefault(n, _NameState()) for n, _ in r.states]
            # SotW: a response that changes none of its resources is redundant (servers
            # may resend unchanged ones beside a changed one). Delta: per resource.
            unchanged = [s.last is not None and s.last == d
                         for s, d in zip(states, data, strict=False)]
            sotw_redundant = not self.delta and bool(unchanged) and all(unchanged)
            for i, (name, _) in enumerate(r.states):
                ns = states[i]
                ns.count("responses")
                if (sotw_redundant or (self.delta and i < len(unchanged) and unchanged[i])):
                    ns.count("redundant")
                st = client.state.get(name)
                if i < len(clas):
                    cla = clas[i]
                    ns.last = data[i]
                    carried = carries_metadata(cla)
                    if carried or (carried is False and self.metadata is None):
                        self.metadata = carried
                    endpoints = flat.cla_endpoints(cla)
                    answer = Answer(ENDPOINTS if endpoints else EMPTY, endpoints,
                                    section="endpoint", common=flat.cla_common(cla),
                                    messages=dict(ns.counts))
                else:
                    ns.last = None
                    answer = Answer(REMOVED if st is not None and st.exists is False
                                    else EMPTY, section="endpoint", messages=dict(ns.counts))
                for t in self._by_name.get(name, ()):
                    self._set(t, answer)

        def unanswered() -> None:
            # xDS §1.7: SotW has no "does not exist"; a client gives up waiting.
            for name in names:
                if name not in client.received:
                    for t in self._by_name.get(name, ()):
                        self._set(t, Answer(NO_ANSWER, section="endpoint"))

        client = _captured_xds_client(self.channel, names, delta=self.delta,
                                      node_id=self.node_id, zone=self.zone, observe=observe)
        timer = asyncio.get_running_loop().call_later(self.settle, unanswered)
        stream = asyncio.create_task(_ended(client.run()))
        again = asyncio.create_task(self._resubscribe.wait())
        try:
            await asyncio.wait({stream, again}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            again.cancel()
            if not stream.done():
                await client.close()
                stream.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stream
        if self._resubscribe.is_set():
            return None, heard
        return stream.result() or client.status, heard


def pod_authorities(authority: str, cla: Any) -> list[str]:
    """The StatefulSet pod authorities of a service authority's endpoints: the core
    names an endpoint with a hostname (a pod with hostname and subdomain behind a
    headless service) `<hostname>.<svc>.<ns>.svc.<domain>:<port>`."""
    hostnames = {lb.endpoint.hostname for loc in cla.endpoints for lb in loc.lb_endpoints
                 if lb.endpoint.hostname}
    return [f"{h}.{authority}" for h in sorted(hostnames)]


class HostnameWatch:
    """`--all`: ours' EDS for every service authority its CDS names, reporting the pod
    authorities found (`pod_authorities`); restarted whenever the names change."""

    def __init__(self, channel: grpc.aio.Channel, found: Callable[[list[str]], None], *,
                 node_id: str = "meshbridge-shadow", retry: Backoff | None = None) -> None:
        self.channel = channel
        self.found = found
        self.node_id = node_id
        self._retry = retry or Backoff(0.2, 5.0)
        self.names: frozenset[str] = frozenset()
        self.answered = asyncio.Event()  # the first EDS answer came (or there is none)
        self._changed = asyncio.Event()

    def set_names(self, names: frozenset[str] | None) -> None:
        if names is None or names == self.names:
            return
        self.names = names
        if not names:
            self.answered.set()
        self._changed.set()

    async def run(self) -> None:
        backoff = Backoff(self._retry.low, self._retry.high)
        while True:
            if not self.names:
                await self._changed.wait()
            self._changed.clear()
            heard = False

            def observe(r: Received, clas: list[Any]) -> None:
                nonlocal heard
                heard = True
                out: list[str] = []
                for (name, _), cla in zip(r.states, clas, strict=False):
                    out.extend(pod_authorities(name, cla))
                if out:
                    self.found(out)
                self.answered.set()

            client = _captured_xds_client(self.channel, sorted(self.names), delta=False,
                                          node_id=self.node_id, zone="", observe=observe)
            stream = asyncio.create_task(_ended(client.run()))
            again = asyncio.create_task(self._changed.wait())
            try:
                await asyncio.wait({stream, again}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                again.cancel()
                if not stream.done():
                    await client.close()
                    stream.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stream
            if self._changed.is_set():
                continue
            self.answered.set()  # ended: do not hold the start for it
            if heard:
                backoff.reset()
            await asyncio.sleep(backoff.next())  # reconnect delay, not synchronisation


class ClusterWatch:
    """A wildcard CDS subscription over ADS: the EDS names of every EDS cluster the
    server has, reported on each response, and None whenever the stream is down."""

    def __init__(self, channel: grpc.aio.Channel,
                 on_change: Callable[[frozenset[str] | None, str], None], *,
                 node_id: str = "meshbridge-shadow", zone: str = "",
                 retry: Backoff | None = None) -> None:
        self.channel = channel
        self.on_change = on_change
        self.node = base_pb2.Node(id=node_id, cluster="meshbridge-shadow")
        if zone:
            self.node.locality.zone = zone
        self._retry = retry or Backoff(0.2, 5.0)
        self.status = ""

    async def run(self) -> None:
        backoff = Backoff(self._retry.low, self._retry.high)
        while True:
            heard = await self._stream()
            self.on_change(None, self.status)
            if heard:
                backoff.reset()
            await asyncio.sleep(backoff.next())  # reconnect delay, not synchronisation

    async def _stream(self) -> bool:
        requests: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def outgoing() -> AsyncIterator[bytes]:
            while (item := await requests.get()) is not None:
                yield item

        # xDS §1.5: CDS with no names on the first request is the (legacy) wildcard,
        # which every server understands.
        requests.put_nowait(discovery_pb2.DiscoveryRequest(
            node=self.node, type_url=CDS_TYPE).SerializeToString())
        call = self.channel.stream_stream(ADS_SOTW)(outgoing())
        heard = False
        try:
            async for raw in call:
                heard = True
                resp = discovery_pb2.DiscoveryResponse.FromString(raw)
                self.on_change(eds_names(resp.resources), "")
                requests.put_nowait(discovery_pb2.DiscoveryRequest(
                    type_url=CDS_TYPE, version_info=resp.version_info,
                    response_nonce=resp.nonce).SerializeToString())
            self.status = (await call.code()).name
        except grpc.aio.AioRpcError as e:
            self.status = status_text(e.code().name, e.details() or "")
        except Exception as e:
            self.status = status_text("UNKNOWN", f"{type(e).__name__}: {e}")
            call.cancel()
        finally:
            requests.put_nowait(None)
        return heard


def eds_names(resources: Iterable[Any]) -> frozenset[str]:
    """The EDS names of the EDS clusters among CDS resources (a cluster's
    `eds_cluster_config.service_name`, else its name); other clusters (static,
    original-destination: Istio's passthrough and blackhole) have no endpoints to ask."""
    out = set()
    for any_ in resources:
        c = cluster_pb2.Cluster.FromString(any_.value)
        if c.WhichOneof("cluster_discovery_type") == "type" and c.type == cluster_pb2.Cluster.EDS:
            out.add(c.eds_cluster_config.service_name or c.name)
    return frozenset(out)
