"""Measuring clients: they subscribe as real proxies do, decode everything they receive,
keep their own endpoint state per target, and report each message (when it arrived,
how many bytes, what the state became) to an observer.

    LinkerdClient   one destination `Get` stream per target (as linkerd2-proxy does)
    XdsClient       one ADS stream naming all its targets as EDS resources, SotW or
                    delta (as Envoy and proxyless gRPC do)

Both read raw bytes off the wire (no deserializer in the stub) so byte counts are
exact, then parse them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2

from harness.normalize import (
    NormalEndpoint,
    State,
    address_term,
    from_cla,
    from_weighted_addr,
    sum_digest,
    tcp_address,
)
from linkerd_api.proto import destination_pb2

GET = "/io.linkerd.proxy.destination.Destination/Get"
ADS_SOTW = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
ADS_DELTA = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
EDS_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


@dataclass(frozen=True, slots=True)
class Received:
    """One message as a client saw it."""

    model: str  # linkerd | sotw | delta
    client: int
    at_ns: int  # time.monotonic_ns() when decoded: comparable across processes
    size: int  # bytes of the message on the wire (protobuf payload)
    states: tuple[tuple[str, State], ...]  # (target, state after applying) per target touched
    kind: str = ""  # add | remove | no_endpoints | response
    # (target, address digest after applying), from a client that keeps its digests
    # change by change instead of handing out states (LinkerdClient(snapshots=False)).
    digests: tuple[tuple[str, str], ...] | None = None


Observer = Callable[[Received], None]


@dataclass(slots=True)
class TargetState:
    endpoints: dict[tuple[str, int], NormalEndpoint] = field(default_factory=dict)
    exists: bool | None = None  # from no_endpoints (xDS: False once delta-removed)
    status: str = ""  # the stream's final status, if it ended
    # The address digest's running sum (harness.normalize.sum_digest), kept by `put`
    # and `drop`; None once `endpoints` was assigned whole (computed again if asked).
    _sum: int | None = 0

    def state(self) -> State:
        return frozenset(self.endpoints.values())

    def put(self, ep: NormalEndpoint) -> None:
        key = (ep.address, ep.port)
        if key not in self.endpoints and self._sum is not None:
            self._sum += address_term(ep.addr)
        self.endpoints[key] = ep

    def drop(self, key: tuple[str, int]) -> None:
        ep = self.endpoints.pop(key, None)
        if ep is not None and self._sum is not None:
            self._sum -= address_term(ep.addr)

    def clear(self) -> None:
        self.endpoints.clear()
        self._sum = 0

    def assign(self, endpoints: dict[tuple[str, int], NormalEndpoint]) -> None:
        self.endpoints = endpoints
        self._sum = None

    def digest(self) -> str:
        """The address digest of `state()`, in O(1) while kept by put/drop."""
        if self._sum is None:
            self._sum = sum(address_term(e.addr) for e in self.endpoints.values())
        return sum_digest(self._sum)


class LinkerdClient:
    """Get streams for a set of targets, one stream each."""

    model = "linkerd"

    def __init__(self, channel: grpc.aio.Channel, targets: Iterable[str], client_id: int = 0,
                 token: str = "", observe: Observer | None = None,
                 snapshots: bool = True) -> None:
        self.channel = channel
        self.targets = list(targets)
        self.client_id = client_id
        self.token = token
        self.observe = observe
        # False: each Received carries the target's address digest, not its whole state,
        # so that a message costs the client what it changed (a diff of one endpoint in
        # a service of 5,000 must not cost a 5,000-endpoint state).
        self.snapshots = snapshots
        self.state: dict[str, TargetState] = {t: TargetState() for t in self.targets}
        self.messages = 0
        self.bytes = 0
        self.first_message: dict[str, asyncio.Event] = {t: asyncio.Event() for t in self.targets}

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for t in self.targets:
                tg.create_task(self._follow(t))

    async def _follow(self, target: str) -> None:
        get = self.channel.unary_stream(
            GET, request_serializer=destination_pb2.GetDestination.SerializeToString)
        request = destination_pb2.GetDestination(scheme="k8s", path=target,
                                                 context_token=self.token)
        st = self.state[target]
        call = get(request)
        try:
            async for raw in call:
                self._apply(target, st, raw)
            st.status = (await call.code()).name
        except grpc.aio.AioRpcError as e:
            st.status = f"{e.code().name}: {e.details()}"
        finally:
            self.first_message[target].set()

    def _apply(self, target: str, st: TargetState, raw: bytes) -> None:
        update = destination_pb2.Update.FromString(raw)
        kind = update.WhichOneof("update") or ""
        if kind == "add":
            for wa in update.add.addrs:
                st.put(from_weighted_addr(wa))
        elif kind == "remove":
            for addr in update.remove.addrs:
                st.drop(tcp_address(addr))
        elif kind == "no_endpoints":
            st.clear()
            st.exists = update.no_endpoints.exists
        self.messages += 1
        self.bytes += len(raw)
        self.first_message[target].set()
        if self.observe is not None:
            at = time.monotonic_ns()
            if self.snapshots:
                self.observe(Received(self.model, self.client_id, at, len(raw),
                                      ((target, st.state()),), kind))
            else:
                self.observe(Received(self.model, self.client_id, at, len(raw), (), kind,
                                      ((target, st.digest()),)))


async def run_ads(method: grpc.aio.StreamStreamMultiCallable, first: bytes,
                  requests: asyncio.Queue[bytes | None], apply: Callable[[bytes], None],
                  done: asyncio.Event) -> str:
    """Drive one ADS stream: send `first`, then whatever is queued on `requests` (None
    ends the stream), hand every response to `apply`. Returns how the call ended; sets
    `done` whatever happened, so nobody waits on a stream that is gone."""
    requests.put_nowait(first)

    async def sent() -> AsyncIterator[bytes]:
        while (item := await requests.get()) is not None:
            yield item

    call = method(sent())
    try:
        async for raw in call:
            apply(raw)
        return str((await call.code()).name)
    except grpc.aio.AioRpcError as e:
        return f"{e.code().name}: {e.details()}"
    finally:
        requests.put_nowait(None)
        done.set()


class XdsClient:
    """One ADS stream subscribing to every target's ClusterLoadAssignment."""

    def __init__(self, channel: grpc.aio.Channel, targets: Iterable[str], client_id: int = 0,
                 delta: bool = False, node_id: str = "", observe: Observer | None = None,
                 zone: str = "", normalize: Callable[[Any], State] = from_cla,
                 node_name: str = "") -> None:
        self.channel = channel
        self.targets = list(targets)
        self.client_id = client_id
        self.delta = delta
        self.model = "delta" if delta else "sotw"
        self.node = base_pb2.Node(id=node_id or f"meshbridge-harness-{client_id}",
                                  cluster="harness")
        if zone:
            self.node.locality.zone = zone
        if node_name:  # the Kubernetes node, as Istio's sidecars say it
            self.node.metadata.update({"NODE_NAME": node_name})
        self.observe = observe
        # ClusterLoadAssignment -> state; `shadow` reads CLAs as Envoy does.
        self.normalize = normalize
        self.state: dict[str, TargetState] = {t: TargetState() for t in self.targets}
        self.messages = 0
        self.bytes = 0
        self.nacks = 0
        self.received: set[str] = set()
        self.all_received = asyncio.Event()
        self.status = ""
        self._requests: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def run(self) -> None:
        if self.delta:
            method = self.channel.stream_stream(ADS_DELTA)
            first = discovery_pb2.DeltaDiscoveryRequest(
                node=self.node, type_url=EDS_TYPE, resource_names_subscribe=self.targets)
        else:
            method = self.channel.stream_stream(ADS_SOTW)
            first = discovery_pb2.DiscoveryRequest(
                node=self.node, type_url=EDS_TYPE, resource_names=self.targets)
        self.status = await run_ads(method, first.SerializeToString(), self._requests,
                                    self._apply, self.all_received)

    def _apply(self, raw: bytes) -> None:
        touched: list[tuple[str, State]] = []
        if self.delta:
            resp = discovery_pb2.DeltaDiscoveryResponse.FromString(raw)
            for res in resp.resources:
                cla = endpoint_pb2.ClusterLoadAssignment.FromString(res.resource.value)
                touched.append(self._set(res.name, self.normalize(cla)))
            for name in resp.removed_resources:
                # Delta: a removed (or never existing) resource is said so explicitly.
                touched.append(self._set(name, frozenset(), exists=False))
            ack = discovery_pb2.DeltaDiscoveryRequest(type_url=EDS_TYPE,
                                                      response_nonce=resp.nonce)
        else:
            resp = discovery_pb2.DiscoveryResponse.FromString(raw)
            for any_ in resp.resources:
                cla = endpoint_pb2.ClusterLoadAssignment.FromString(any_.value)
                touched.append(self._set(cla.cluster_name, self.normalize(cla)))
            ack = discovery_pb2.DiscoveryRequest(
                type_url=EDS_TYPE, version_info=resp.version_info, resource_names=self.targets,
                response_nonce=resp.nonce)
        self._requests.put_nowait(ack.SerializeToString())
        self.messages += 1
        self.bytes += len(raw)
        if self.observe is not None:
            self.observe(Received(self.model, self.client_id, time.monotonic_ns(), len(raw),
                                  tuple(touched), "response"))

    def _set(self, name: str, state: State, exists: bool | None = None) -> tuple[str, State]:
        st = self.state.setdefault(name, TargetState())
        st.assign({(e.address, e.port): e for e in state})
        st.exists = exists
        self.received.add(name)
        if self.received.issuperset(self.targets):
            self.all_received.set()
        return name, state

    async def close(self) -> None:
        self._requests.put_nowait(None)

