"""The two control planes as `meshbridge shadow` hears them.

A side subscribes to every target on one server, as a proxy of its API would, and
tells its sink each target's latest `Answer` whenever it changes:

    LinkerdSide    one destination `Get` stream per target (`LinkerdClient`); a stream
                   that ends is re-opened with backoff, so a target that was NOT_FOUND
                   is found once it exists, and a restarted server is followed
    XdsSide        one ADS stream naming every target as an EDS resource (`XdsClient`),
                   plus `ClusterWatch`: the server's CDS (wildcard), which says which
                   targets exist, since an EDS answer alone cannot (an empty
                   ClusterLoadAssignment is also what a missing service gets)

A side never goes back to "pending": while it reconnects, its last answer stands
until the new stream says something else. Errors are per target (Linkerd) or per
stream (xDS: every target of that side), never fatal to the run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import grpc
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import base_pb2
from envoy.service.discovery.v3 import discovery_pb2

from harness.clients import ADS_SOTW, LinkerdClient, Received, XdsClient
from harness.normalize import State, carries_metadata, from_cla_as_envoy
from harness.shadow.model import (
    ABSENT,
    ALL_FIELDS,
    EMPTY,
    ENDPOINTS,
    ERROR,
    NO_ANSWER,
    NO_ENDPOINTS,
    NOT_FOUND,
    PENDING,
    PLAIN_XDS_FIELDS,
    REMOVED,
    REMOVED_ALL,
    SILENT,
    Answer,
)

CDS_TYPE = "type.googleapis.com/envoy.config.cluster.v3.Cluster"

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


class LinkerdSide:
    api = "linkerd"

    def __init__(self, name: str, channel: grpc.aio.Channel, sink: Sink, *, token: str = "",
                 settle: float = 2.0, retry: Backoff | None = None) -> None:
        self.name = name
        self.channel = channel
        self.sink = sink
        self.token = token
        self.settle = settle
        self._retry = retry or Backoff(0.2, 5.0)
        self.targets: list[str] = []
        self._group: asyncio.TaskGroup | None = None
        # Which semantics the server showed (a no_endpoints, or NOT_FOUND), for the report.
        self.semantics: set[str] = set()

    def fields(self) -> tuple[str, ...]:
        return ALL_FIELDS  # a WeightedAddr carries every field (health: always HEALTHY)

    def note(self) -> str:
        shown = {"proto": "proto semantics (it sent no_endpoints)",
                 "linkerd-2.20": "linkerd-2.20 semantics (Get ended NOT_FOUND)"}
        said = [shown[s] for s in sorted(self.semantics, reverse=True)]
        return f"{self.name} answers in " + " and ".join(said) if said else ""

    def add(self, targets: Iterable[str]) -> None:
        for t in targets:
            if t in self.targets:
                continue
            self.targets.append(t)
            if self._group is not None:
                self._group.create_task(self._follow(t), name=f"{self.name} Get {t}")

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self._group = tg
            for t in self.targets:
                tg.create_task(self._follow(t), name=f"{self.name} Get {t}")
            await asyncio.Event().wait()  # until cancelled by the owner

    async def _follow(self, target: str) -> None:
        backoff = Backoff(self._retry.low, self._retry.high)
        while True:
            status, heard = await self._attempt(target)
            code = status.split(":", 1)[0]
            if code == "NOT_FOUND":
                self.semantics.add("linkerd-2.20")
                self.sink(target, Answer(NOT_FOUND, status=status))
            elif code != "OK":
                self.sink(target, Answer(ERROR, status=status))
            # OK: the server ended the stream (shutdown, slow consumer); reconnect, and
            # keep the last answer until the new stream says otherwise.
            if heard:
                backoff.reset()
            await asyncio.sleep(backoff.next())  # reconnect delay, not synchronisation

    async def _attempt(self, target: str) -> tuple[str, bool]:
        """One Get stream, until it ends: its status, and whether it said anything."""
        heard = False
        existed = False

        def observe(r: Received) -> None:
            nonlocal heard, existed
            heard = True
            silence.cancel()
            st = client.state[target]
            if r.kind == "no_endpoints":
                self.semantics.add("proto")
                signal = NO_ENDPOINTS if st.exists else ABSENT
            elif st.endpoints:
                signal = ENDPOINTS
            else:
                signal = REMOVED_ALL
            existed = existed or signal in (ENDPOINTS, NO_ENDPOINTS)
            self.sink(target, Answer(signal, st.state(), existed=existed))

        def silent() -> None:
            # linkerd-2.20 sends nothing for a service without endpoints (Linkerd §2.5).
            if not heard:
                self.sink(target, Answer(SILENT))

        client = LinkerdClient(self.channel, [target], token=self.token, observe=observe)
        silence = asyncio.get_running_loop().call_later(self.settle, silent)
        try:
            status = await _ended(client.run()) or client.state[target].status
        finally:
            silence.cancel()
        return status, heard


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
        self._resubscribe = asyncio.Event()

    def fields(self) -> tuple[str, ...]:
        return PLAIN_XDS_FIELDS if self.metadata is False else ALL_FIELDS

    def note(self) -> str:
        if self.metadata is False:
            return (f"{self.name} sends no io.linkerd.destination endpoint metadata: "
                    f"identity, protocol hint, opaque transport and zone locality "
                    f"are not compared")
        return ""

    def add(self, targets: Iterable[str]) -> None:
        new = [t for t in targets if t not in self._eds]
        for t in new:
            self.targets.append(t)
            self._by_name.setdefault(self.resource_name(t), []).append(t)
            self._eds[t] = Answer()
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

    def _emit(self, target: str) -> None:
        eds = self._eds[target]
        if eds.signal in (PENDING, ERROR):
            self.sink(target, eds)
        else:
            self.sink(target, Answer(eds.signal, eds.endpoints, self._exists(target)))

    def _set(self, target: str, answer: Answer) -> None:
        self._eds[target] = answer
        self._emit(target)

    def _normalize(self, cla: Any) -> State:
        carried = carries_metadata(cla)
        if carried or (carried is False and self.metadata is None):
            self.metadata = carried
        return from_cla_as_envoy(cla)

    async def run(self) -> None:
        backoff = Backoff(self._retry.low, self._retry.high)
        while True:
            if not self.targets:
                await self._resubscribe.wait()
            self._resubscribe.clear()
            status, heard = await self._attempt()
            if status is None:
                continue  # new targets: subscribe again at once
            if status.split(":", 1)[0] != "OK":
                for t in self.targets:
                    self._set(t, Answer(ERROR, status=status))
            if heard:
                backoff.reset()
            await asyncio.sleep(backoff.next())  # reconnect delay, not synchronisation

    async def _attempt(self) -> tuple[str | None, bool]:
        """One ADS stream for every target, until it ends (its status) or the targets
        change (None); and whether it said anything."""
        names = list(dict.fromkeys(self.resource_name(t) for t in self.targets))
        heard = False

        def observe(r: Received) -> None:
            nonlocal heard
            heard = True
            for name, state in r.states:
                st = client.state.get(name)
                signal = (REMOVED if st is not None and st.exists is False
                          else ENDPOINTS if state else EMPTY)
                for t in self._by_name.get(name, ()):
                    self._set(t, Answer(signal, state))

        def unanswered() -> None:
            # xDS §1.7: SotW has no "does not exist"; a client gives up waiting.
            for name in names:
                if name not in client.received:
                    for t in self._by_name.get(name, ()):
                        self._set(t, Answer(NO_ANSWER))

        client = XdsClient(self.channel, names, delta=self.delta, node_id=self.node_id,
                           observe=observe, zone=self.zone, normalize=self._normalize)
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
