"""The LEDS measuring client: a delta ADS stream that asks for its endpoints one by one.

It subscribes to its targets' ClusterLoadAssignments as the delta client does, but
opts in to LEDS with the node metadata `meshbridge.io/leds: "always"`. A CLA that
answers with `leds_cluster_locality_config` in a locality names a glob collection
(`xdstp://.../envoy.config.endpoint.v3.LbEndpoint/.../*`); the client subscribes to
it on the same stream, and every endpoint of that locality then arrives as its own
`LbEndpoint` resource, a removed one in `removed_resources`. A locality without the
config carries its endpoints inline, as a plain CLA does, so against a server that
does not serve LEDS this client is a delta client (and says so: `leds_resources`
stays 0).

A resource belongs to the collection whose path is its own minus the last segment,
with the same context parameters (how a glob collection's members are named in
xdstp:// names; see docs/compare.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2

from harness.clients import ADS_DELTA, EDS_TYPE, Observer, Received, TargetState, run_ads
from harness.normalize import NormalEndpoint, State, from_lb_endpoint

LEDS_TYPE = "type.googleapis.com/envoy.config.endpoint.v3.LbEndpoint"
OPT_IN_KEY = "meshbridge.io/leds"
OPT_IN_VALUE = "always"


def collection_of(resource_name: str) -> str:
    """The glob collection a LEDS resource name belongs to: `.../path/id?ctx` ->
    `.../path/*?ctx`."""
    name, sep, query = resource_name.partition("?")
    head, slash, _ = name.rpartition("/")
    if not slash:
        return ""
    return f"{head}/*" + (sep + query if sep else "")


@dataclass(slots=True)
class Locality:
    """One locality of a target's CLA: a LEDS collection, or its endpoints inline."""

    collection: str = ""
    inline: tuple[NormalEndpoint, ...] = ()


@dataclass(slots=True)
class Collection:
    endpoints: dict[str, NormalEndpoint] = field(default_factory=dict)  # resource name ->
    answered: bool = False  # the server said something about it since we subscribed
    target: str = ""


class LedsClient:
    """One delta ADS stream: the targets' CLAs, then their localities' LEDS collections."""

    model = "leds"

    def __init__(self, channel: grpc.aio.Channel, targets: list[str], client_id: int = 0,
                 node_id: str = "", observe: Observer | None = None,
                 normalize_endpoint: Callable[[Any], NormalEndpoint] = from_lb_endpoint
                 ) -> None:
        self.channel = channel
        self.targets = list(targets)
        self.client_id = client_id
        self.node = base_pb2.Node(id=node_id or f"meshbridge-harness-leds-{client_id}",
                                  cluster="harness")
        self.node.metadata.update({OPT_IN_KEY: OPT_IN_VALUE})
        self.observe = observe
        self.normalize_endpoint = normalize_endpoint
        self.state: dict[str, TargetState] = {t: TargetState() for t in self.targets}
        self.localities: dict[str, list[Locality]] = {}
        self.collections: dict[str, Collection] = {}
        self.messages = 0
        self.bytes = 0
        self.nacks = 0
        self.leds_resources = 0  # LbEndpoint resources received (added or updated)
        self.leds_removed = 0
        self.cla_updates = 0
        self.received: set[str] = set()
        self.all_received = asyncio.Event()
        self.status = ""
        self._requests: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def run(self) -> None:
        method = self.channel.stream_stream(ADS_DELTA)
        first = discovery_pb2.DeltaDiscoveryRequest(
            node=self.node, type_url=EDS_TYPE, resource_names_subscribe=self.targets)
        self.status = await run_ads(method, first.SerializeToString(), self._requests,
                                    self.apply, self.all_received)

    def _send(self, request: discovery_pb2.DeltaDiscoveryRequest) -> None:
        self._requests.put_nowait(request.SerializeToString())

    def apply(self, raw: bytes) -> None:
        """One response off the wire: decode it, ACK it, follow new collections."""
        resp = discovery_pb2.DeltaDiscoveryResponse.FromString(raw)
        touched: set[str] = set()
        subscribe: list[str] = []
        unsubscribe: list[str] = []
        if resp.type_url == LEDS_TYPE:
            touched |= self._apply_endpoints(resp)
        else:
            for res in resp.resources:
                cla = endpoint_pb2.ClusterLoadAssignment.FromString(res.resource.value)
                new, gone = self._apply_cla(res.name, cla)
                subscribe += new
                unsubscribe += gone
                touched.add(res.name)
            for name in resp.removed_resources:
                unsubscribe += self._drop_target(name)
                self.state.setdefault(name, TargetState()).exists = False
                touched.add(name)
        self._send(discovery_pb2.DeltaDiscoveryRequest(type_url=resp.type_url,
                                                       response_nonce=resp.nonce))
        if subscribe or unsubscribe:
            self._send(discovery_pb2.DeltaDiscoveryRequest(
                type_url=LEDS_TYPE, resource_names_subscribe=subscribe,
                resource_names_unsubscribe=unsubscribe))
        states = tuple((t, self._recompute(t)) for t in sorted(touched) if t in self.state)
        self.messages += 1
        self.bytes += len(raw)
        self._check_complete()
        if self.observe is not None:
            self.observe(Received(self.model, self.client_id, time.monotonic_ns(), len(raw),
                                  states, "leds" if resp.type_url == LEDS_TYPE else "response"))

    def _apply_cla(self, target: str, cla: Any) -> tuple[list[str], list[str]]:
        self.cla_updates += 1
        before = {loc.collection for loc in self.localities.get(target, []) if loc.collection}
        locs: list[Locality] = []
        for loc in cla.endpoints:
            name = loc.leds_cluster_locality_config.leds_collection_name \
                if loc.HasField("leds_cluster_locality_config") else ""
            if name:
                locs.append(Locality(collection=name))
            else:
                locs.append(Locality(inline=tuple(self.normalize_endpoint(lb)
                                                  for lb in loc.lb_endpoints)))
        self.localities[target] = locs
        self.received.add(target)
        after = {loc.collection for loc in locs if loc.collection}
        new = sorted(after - before)
        for name in new:
            self.collections[name] = Collection(target=target)
        gone = sorted(before - after)
        for name in gone:
            self.collections.pop(name, None)
        return new, gone

    def _drop_target(self, target: str) -> list[str]:
        gone = [loc.collection for loc in self.localities.pop(target, []) if loc.collection]
        for name in gone:
            self.collections.pop(name, None)
        self.received.add(target)
        return gone

    def _apply_endpoints(self, resp: Any) -> set[str]:
        touched: set[str] = set()
        for res in resp.resources:
            coll = self.collections.get(collection_of(res.name))
            if coll is None:
                continue  # a collection we no longer follow
            lb = endpoint_components_pb2.LbEndpoint.FromString(res.resource.value)
            coll.endpoints[res.name] = self.normalize_endpoint(lb)
            coll.answered = True
            self.leds_resources += 1
            touched.add(coll.target)
        for name in resp.removed_resources:
            coll = self.collections.get(name)
            if coll is not None:  # the collection itself is gone (or never existed)
                coll.endpoints.clear()
                coll.answered = True
                touched.add(coll.target)
                continue
            coll = self.collections.get(collection_of(name))
            if coll is not None:
                coll.endpoints.pop(name, None)
                coll.answered = True
                self.leds_removed += 1
                touched.add(coll.target)
        if not resp.resources and not resp.removed_resources:
            # An empty answer to our subscription: the collections are empty for now.
            for coll in self.collections.values():
                coll.answered = True
        return touched

    def _recompute(self, target: str) -> State:
        endpoints: dict[tuple[str, int], NormalEndpoint] = {}
        for loc in self.localities.get(target, []):
            found = (self.collections[loc.collection].endpoints.values()
                     if loc.collection in self.collections else loc.inline)
            for e in found:
                endpoints[(e.address, e.port)] = e
        st = self.state.setdefault(target, TargetState())
        st.assign(endpoints)
        return st.state()

    def complete(self, target: str) -> bool:
        """The target's CLA came and each of its collections has been answered."""
        if target not in self.received:
            return False
        return all(self.collections[loc.collection].answered
                   for loc in self.localities.get(target, [])
                   if loc.collection in self.collections)

    def _check_complete(self) -> None:
        if all(self.complete(t) for t in self.targets):
            self.all_received.set()

    async def close(self) -> None:
        self._requests.put_nowait(None)
