"""Types meshbridge does not serve, and istiod's debug types on the xDS streams
(xDS §9): who gets an answer, what syncz and config_dump say, and who may ask."""

from __future__ import annotations

import asyncio
import json

import pytest
from envoy.admin.v3 import config_dump_shared_pb2 as dump_pb2
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2
from envoy.service.status.v3 import csds_pb2
from google.protobuf import json_format

from meshbridge.debug_access import DebugAccess, peer_address
from meshbridge.stream_registry import StreamInfo, StreamRegistry
from testkit.polling import HANG
from testkit.xds_model import CDS, EDS, DeltaClient, SotwClient, World, name
from xds_api.debug_types import (
    CONFIG_DUMP,
    SYNCZ,
    SYNCZ_METADATA,
    DebugTypes,
    GatheredDebugTypes,
    merged,
)
from xds_api.stream import DebugReply, DeltaStream, Forbidden, SotwStream, XdsStream

WEB = name("web")
SECRET = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
ENVOY = "sidecar~10.0.0.9~envoy-1.app~app.svc.cluster.local"


class Debug:
    """A World, a stream registry and the debug answers over them."""

    def __init__(self, access: DebugAccess | None = None) -> None:
        self.world = World()
        self.registry = StreamRegistry()
        self.streams: list[XdsStream] = []
        self.types = DebugTypes(self.registry, lambda: self.streams, self.world.cache,
                                access=access or DebugAccess("any"), cluster_id="Kubernetes")

    def sotw(self, node_id: str = ENVOY, peer: str = "ipv4:127.0.0.1:4000") -> SotwClient:
        info = self.registry.add(StreamInfo("xds-sotw", peer))
        stream = SotwStream(self.world.cache, info=info,
                            debug=self.types.for_client(peer, certified=False))
        self.streams.append(stream)
        client = SotwClient(stream)
        client.node_id = node_id
        return client


def test_a_first_request_for_an_unserved_type_quoting_a_foreign_nonce_is_answered() -> None:
    # §9.1: istioctl's first request quotes a timestamp of its own; it is not an ACK.
    client = World().sotw()
    client.request(SECRET, ["cert"], nonce="2026-12-01 20:00:00.1 +0000 UTC")
    first = client.one(SECRET)
    assert first.resources == [] and first.nonce
    client.request(SECRET, ["cert"], nonce="a nonce we never sent")  # stale: ignored
    assert client.responses() == []
    client.ack(SECRET, ["cert"])  # our nonce, the same names: an ACK
    assert client.responses() == []
    client.request(SECRET, ["other"])  # our nonce, other names: a new request
    assert client.one(SECRET).nonce != first.nonce
    client.request(SECRET, ["other"], nonce="")  # asked again
    assert len(client.responses()) == 1


def test_a_first_request_for_a_served_type_quoting_a_foreign_nonce_is_answered() -> None:
    client = World().sotw()
    client.request(CDS, [WEB], nonce="a nonce of the client's own")
    assert client.names(CDS) == [WEB]


def test_a_delta_first_request_quoting_a_foreign_nonce_is_answered_with_removals() -> None:
    client = DeltaClient(DeltaStream(World().cache))
    client.request(SECRET, ["cert"], nonce="not ours")
    resp = client.one(SECRET)
    assert list(resp.removed_resources) == ["cert"] and resp.nonce
    client.ack(SECRET)
    assert client.responses() == []


def test_a_debug_type_without_debug_answers_ends_the_stream_naming_it() -> None:
    client = World().sotw()  # no debug answers on this stream
    with pytest.raises(Forbidden, match=r"istio\.io/debug/syncz"):
        client.request(SYNCZ, [], nonce="")


@pytest.mark.parametrize(("access", "peer", "certified", "allowed"), [
    (DebugAccess("local"), "ipv4:127.0.0.1:5", False, True),
    (DebugAccess("local"), "ipv6:[::1]:5", False, True),
    (DebugAccess("local"), "ipv4:10.1.2.3:5", False, False),
    (DebugAccess("any"), "ipv4:10.1.2.3:5", False, True),
    (DebugAccess("off"), "ipv4:127.0.0.1:5", False, False),
    (DebugAccess("local", client_ca=True), "ipv4:127.0.0.1:5", False, False),
    (DebugAccess("local", client_ca=True), "ipv4:127.0.0.1:5", True, True),
])
def test_debug_answers_follow_the_debug_access_setting(
        access: DebugAccess, peer: str, certified: bool, allowed: bool) -> None:
    debug = Debug(access)
    stream = SotwStream(debug.world.cache, debug=debug.types.for_client(peer, certified))
    req = discovery_pb2.DiscoveryRequest(type_url=SYNCZ)
    if allowed:
        stream.handle(req)
        assert len(stream.take_responses()) == 1
    else:
        with pytest.raises(Forbidden, match="syncz: debug answers"):
            stream.handle(req)


def test_peer_addresses_as_grpc_spells_them() -> None:
    assert peer_address("ipv4:127.0.0.1:4000") == "127.0.0.1"
    assert peer_address("ipv6:[::1]:4000") == "::1"
    assert peer_address("ipv6:%5B::1%5D:4000") == ""
    assert peer_address("unix:/tmp/x") == ""


def _clients(resp: discovery_pb2.DiscoveryResponse) -> dict[str, csds_pb2.ClientConfig]:
    out = {}
    for res in resp.resources:
        config = csds_pb2.ClientConfig()
        assert res.Unpack(config)
        out[config.node.id] = config
    return out


def test_syncz_lists_proxies_with_each_type_s_sync_state_and_leaves_out_debug_clients() -> None:
    debug = Debug()
    envoy = debug.sotw()
    envoy.request(CDS, [WEB])
    envoy.responses()
    envoy.ack(CDS, [WEB])  # CDS ACKed
    envoy.request(EDS, [WEB])
    envoy.responses()  # EDS sent, not ACKed yet
    linkerd = debug.registry.add(StreamInfo("linkerd-get", "ipv4:10.0.0.7:1",
                                            client='{"ns":"app","pod":"web-0"}'))
    linkerd.sent(WEB, "3", "", 100)

    istioctl = debug.sotw(node_id="sidecar~0.0.0.0~istioctl.istio-system~x")
    istioctl.request(SYNCZ, [], nonce="2026-12-01 20:00:00 +0000 UTC")
    resp = istioctl.one(SYNCZ)
    cp = json.loads(resp.control_plane.identifier)
    assert cp["Component"] == "meshbridge" and cp["ID"] and "version" in cp["Info"]

    clients = _clients(resp)
    assert set(clients) == {ENVOY, f"linkerd-get~web-0.app~{WEB}"}  # istioctl left out
    states = {c.type_url: c.config_status for c in clients[ENVOY].generic_xds_configs}
    assert states == {CDS: csds_pb2.SYNCED, EDS: csds_pb2.STALE}
    (get,) = clients[f"linkerd-get~web-0.app~{WEB}"].generic_xds_configs
    assert (get.type_url, get.name, get.config_status, get.version_info) == (
        "io.linkerd.proxy.destination.Destination/Get", WEB, csds_pb2.SYNCED, "3")
    meta = json_format.MessageToDict(clients[ENVOY].node.metadata)
    assert meta["CLUSTER_ID"] == "Kubernetes"
    assert meta[SYNCZ_METADATA]["types"]["cds"]["state"] == "SYNCED"


def test_a_nack_shows_as_an_error_with_its_reason() -> None:
    debug = Debug()
    envoy = debug.sotw()
    envoy.request(CDS, [WEB])
    envoy.responses()
    envoy.request(CDS, [WEB], error="cluster rejected")
    istioctl = debug.sotw(node_id="istioctl")
    istioctl.request(SYNCZ, [])
    (config,) = _clients(istioctl.one(SYNCZ))[ENVOY].generic_xds_configs
    assert config.config_status == csds_pb2.ERROR
    assert "cluster rejected" in config.error_state.details


def test_config_dump_holds_what_the_proxy_was_sent() -> None:
    debug = Debug()
    envoy = debug.sotw()
    envoy.request(CDS, [WEB])
    envoy.responses()
    envoy.request(EDS, [WEB])
    envoy.responses()
    istioctl = debug.sotw(node_id="istioctl")
    istioctl.request(CONFIG_DUMP, ["envoy-1.app"])  # a part of the node id, as istioctl asks
    resp = istioctl.one(CONFIG_DUMP)
    clusters, listeners, routes, endpoints = (
        dump_pb2.ClustersConfigDump(), dump_pb2.ListenersConfigDump(),
        dump_pb2.RoutesConfigDump(), dump_pb2.EndpointsConfigDump())
    for res, section in zip(resp.resources, (clusters, listeners, routes, endpoints),
                            strict=True):
        assert res.Unpack(section)
    (cluster,) = clusters.dynamic_active_clusters
    c = cluster_pb2.Cluster()
    cluster.cluster.Unpack(c)
    assert c.name == WEB and cluster.version_info and cluster.last_updated.seconds
    (eds,) = endpoints.dynamic_endpoint_configs
    cla = endpoint_pb2.ClusterLoadAssignment()
    eds.endpoint_config.Unpack(cla)
    assert cla.cluster_name == WEB and len(cla.endpoints[0].lb_endpoints) == 2
    assert not listeners.dynamic_listeners and not routes.dynamic_route_configs


def test_config_dump_of_a_proxy_not_connected_is_empty_and_says_why() -> None:
    istioctl = Debug().sotw(node_id="istioctl")
    istioctl.request(CONFIG_DUMP, ["nobody.app"])
    resp = istioctl.one(CONFIG_DUMP)
    assert resp.resources == [] and "'nobody.app' is not connected" in resp.version_info


class Woken:
    """A stream's waker that says when the stream has something to write."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def wake(self) -> None:
        self.event.set()


async def test_a_workers_debug_answers_hold_every_process_s_proxies() -> None:
    # With --workers N a debug client's stream is on one worker, the proxies on any:
    # the worker's answer is every process's, gathered as the watcher does
    # (xds_api.service.register_feeds; docs/workers.md).
    here, there = Debug(), Debug()
    other = "sidecar~10.0.0.10~envoy-2.app~app.svc.cluster.local"
    for process, node_id in ((here, ENVOY), (there, other)):
        proxy = process.sotw(node_id=node_id)
        proxy.request(CDS, [WEB])
        proxy.responses()
    asked: list[tuple[str, tuple[str, ...]]] = []

    async def gather(type_url: str, names: tuple[str, ...]) -> DebugReply:
        asked.append((type_url, names))
        return merged(type_url, [p.types.reply(type_url, names) for p in (here, there)])

    gathered = GatheredDebugTypes(here.types, gather)

    async def ask(type_url: str, names: list[str]) -> discovery_pb2.DiscoveryResponse:
        woken = Woken()
        client = SotwClient(SotwStream(here.world.cache, waker=woken,
                                       debug=gathered.for_client("ipv4:127.0.0.1:1", False)))
        client.node_id = "istioctl"
        client.request(type_url, names)
        assert client.responses() == []  # not before every process has answered
        await asyncio.wait_for(woken.event.wait(), HANG)
        return client.one(type_url)

    assert set(_clients(await ask(SYNCZ, []))) == {ENVOY, other}
    dump = await ask(CONFIG_DUMP, ["envoy-2.app"])  # a proxy of the other process
    clusters = dump_pb2.ClustersConfigDump()
    assert dump.resources[0].Unpack(clusters) and len(clusters.dynamic_active_clusters) == 1
    missing = await ask(CONFIG_DUMP, ["nobody.app"])
    assert missing.resources == [] and "'nobody.app' is not connected" in missing.version_info
    assert asked == [(SYNCZ, ()), (CONFIG_DUMP, ("envoy-2.app",)),
                     (CONFIG_DUMP, ("nobody.app",))]


async def test_a_workers_debug_answer_says_when_the_other_processes_did_not_answer() -> None:
    async def gone(type_url: str, names: tuple[str, ...]) -> DebugReply:
        raise ConnectionError("link closed")

    woken = Woken()
    client = SotwClient(SotwStream(World().cache, waker=woken, debug=GatheredDebugTypes(
        Debug().types, gone).for_client("ipv4:127.0.0.1:1", False)))
    client.request(SYNCZ, [])
    await asyncio.wait_for(woken.event.wait(), HANG)
    resp = client.one(SYNCZ)
    assert resp.resources == [] and "did not answer" in resp.version_info
