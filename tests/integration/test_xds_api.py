"""The xDS services over real gRPC on loopback: what they serve, bad input, slow
readers, the EDS-only service, the `meshbridge xds` client and the debug pages."""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from envoy.service.endpoint.v3 import eds_pb2_grpc

from bridge.cluster import Event, EventType
from bridge.objects import decode_object
from meshbridge.app import App
from testkit.polling import HANG, eventually_seen
from tests.conftest import AppFactory
from tests.integration.xds_helpers import DEMO, Manifests, service_with_addresses
from xds_api import resource_types as rt
from xds_api.service import XdsOptions

CDS, EDS = rt.CLUSTER, rt.ENDPOINT
WEB = "web.emojivoto.svc.cluster.local:80"
CATALOG = "catalog.shop.svc.cluster.local:80"
ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"


def endpoints_of(cla: endpoint_pb2.ClusterLoadAssignment) -> dict[tuple[str, int], str]:
    return {(lb.endpoint.address.socket_address.address,
             lb.endpoint.address.socket_address.port_value): loc.locality.zone
            for loc in cla.endpoints for lb in loc.lb_endpoints}


def clas(resources: Any) -> dict[str, endpoint_pb2.ClusterLoadAssignment]:
    out = {}
    for a in resources:
        cla = endpoint_pb2.ClusterLoadAssignment()
        a.Unpack(cla)
        out[cla.cluster_name] = cla
    return out


async def read(call: Any, timeout: float = HANG) -> Any:
    return await asyncio.wait_for(call.read(), timeout)


def request(type_url: str, names: list[str] | None = None, **kw: Any
            ) -> discovery_pb2.DiscoveryRequest:
    return discovery_pb2.DiscoveryRequest(type_url=type_url, resource_names=names or [], **kw)


async def test_sotw_and_delta_ads_serve_every_demo_port(demo_dir: Path,
                                                        make_app: AppFactory) -> None:
    app: App = await make_app(demo_dir)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(ch)
        call = stub.StreamAggregatedResources()
        await call.write(request(CDS, node={"id": "sotw"}))
        cds = await read(call)
        names = []
        for a in cds.resources:
            c = cluster_pb2.Cluster()
            a.Unpack(c)
            names.append(c.name)
        assert sorted(names) == sorted(DEMO)
        await call.write(request(CDS, version_info=cds.version_info, response_nonce=cds.nonce))
        await call.write(request(EDS, names))
        eds = await read(call)
        assert {n: endpoints_of(c) for n, c in clas(eds.resources).items()} == DEMO
        call.cancel()

        delta = stub.DeltaAggregatedResources()
        await delta.write(discovery_pb2.DeltaDiscoveryRequest(
            type_url=EDS, resource_names_subscribe=names, node={"id": "delta"}))
        resp = await read(delta)
        assert {r.name for r in resp.resources} == set(DEMO)
        got = {r.name: endpoints_of(clas([r.resource])[r.name]) for r in resp.resources}
        assert got == DEMO
        delta.cancel()


async def test_bad_requests_get_a_clear_status_and_leave_other_streams_alone(
        demo_dir: Path, make_app: AppFactory) -> None:
    app: App = await make_app(demo_dir)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(ch)
        healthy = stub.StreamAggregatedResources()
        await healthy.write(request(EDS, [CATALOG], node={"id": "healthy"}))
        first = await read(healthy)
        await healthy.write(request(EDS, [CATALOG], version_info=first.version_info,
                                    response_nonce=first.nonce))

        async def refused(*messages: Any) -> grpc.aio.AioRpcError:
            raw = ch.stream_stream(ADS)  # bytes in, bytes out
            call = raw()
            for m in messages:
                await call.write(m if isinstance(m, bytes) else m.SerializeToString())
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await read(call)
            return e.value

        err = await refused(b"\xff\xff\xff\xff")
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "does not decode" in (err.details() or "")
        err = await refused(request("", [WEB]))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "type_url is required" in (err.details() or "")
        limit = app.options.limits.max_resource_names
        err = await refused(request(EDS, [f"s{i}.x.svc.cluster.local:80"
                                          for i in range(limit + 1)]))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert str(limit) in (err.details() or "")

        # Thousands of names of services that do not exist, some twice: one empty CLA
        # each, and every View they made is released when the stream ends.
        many = stub.StreamAggregatedResources()
        names = [f"s{i}.x.svc.cluster.local:80" for i in range(3000)]
        await many.write(request(EDS, names + names[:100]))
        resp = await read(many)
        assert len(resp.resources) == 3000
        assert all(not c.endpoints for c in clas(resp.resources).values())
        # Garbage nonces: stale for a type already answered, so ignored...
        await many.write(request(EDS, names[:1], response_nonce="garbage"))
        # ...and an unknown type is answered empty, as a type with nothing in it.
        await many.write(request("type.googleapis.com/no.such.Type", ["x"]))
        unknown = await read(many)
        assert unknown.type_url == "type.googleapis.com/no.such.Type"
        assert not unknown.resources
        many.cancel()
        await eventually_seen(_views_at_most(app, 1), HANG, "views of the closed stream released")

        # The healthy stream saw none of that and still follows changes.
        Manifests(demo_dir).remove_endpoint("20-shop.yaml", "shop", "catalog-5m7kp",
                                            "10.244.1.20")
        update = await read(healthy)
        assert ("10.244.1.20", 8080) not in endpoints_of(clas(update.resources)[CATALOG])
        assert len(endpoints_of(clas(update.resources)[CATALOG])) == 5
        healthy.cancel()
    bad = app.sample_value
    assert await bad("meshbridge_xds_bad_requests_total", {"reason": "undecodable"}) == 1
    assert await bad("meshbridge_xds_bad_requests_total", {"reason": "too_many_names"}) == 1
    assert await bad("pilot_xds_expired_nonce_total", {"type": "eds"}) == 1


def _views_at_most(app: App, n: int) -> Any:
    async def probe() -> tuple[bool, Any]:
        return len(app.views.views()) <= n, len(app.views.views())
    return probe


async def test_eds_alone_serves_stream_delta_and_fetch(demo_dir: Path,
                                                       make_app: AppFactory) -> None:
    app: App = await make_app(demo_dir)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
        stub = eds_pb2_grpc.EndpointDiscoveryServiceStub(ch)
        call = stub.StreamEndpoints()
        await call.write(request("", [WEB]))  # type implied by the service
        resp = await read(call)
        assert endpoints_of(clas(resp.resources)[WEB]) == DEMO[WEB]
        call.cancel()
        delta = stub.DeltaEndpoints()
        await delta.write(discovery_pb2.DeltaDiscoveryRequest(resource_names_subscribe=[WEB]))
        dresp = await read(delta)
        assert [r.name for r in dresp.resources] == [WEB]
        delta.cancel()
        fetched = await stub.FetchEndpoints(request(EDS, [WEB, CATALOG]))
        assert set(clas(fetched.resources)) == {WEB, CATALOG}
        with pytest.raises(grpc.aio.AioRpcError) as e:
            wrong = stub.StreamEndpoints()
            await wrong.write(request(CDS))
            await read(wrong)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await eventually_seen(_views_at_most(app, 0), HANG, "EDS views released")


async def test_a_client_that_stops_reading_is_cut_off(tmp_path: Path,
                                                      make_app: AppFactory) -> None:
    manifests = tmp_path / "m"
    manifests.mkdir()
    app: App = await make_app(manifests, layer_options=(XdsOptions(write_timeout=0.3),))
    addresses = [f"10.1.{i // 250}.{i % 250 + 1}" for i in range(3000)]

    def publish(count: int) -> None:
        docs = service_with_addresses("big", "big", 80, 8080,
                                      [(ip, "zone-a") for ip in addresses[:count]])
        objs = [decode_object(d) for d in docs]
        app.cluster.apply(Event(EventType.MODIFIED, o) for o in objs if o is not None)

    publish(3000)
    big = "big.big.svc.cluster.local:80"
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(ch)
        reader = stub.StreamAggregatedResources()
        await reader.write(request(EDS, [big], node={"id": "reader"}))
        await read(reader)
        sleeper = stub.StreamAggregatedResources()
        await sleeper.write(request(EDS, [big], node={"id": "sleeper"}))
        # ~400 KB per CLA; a client that never reads fills its windows in a few.
        count = 3000

        async def cut_off() -> tuple[bool, Any]:
            nonlocal count
            count = 2999 if count == 3000 else 3000
            publish(count)
            # The reader keeps up (and ACKs), so it is never cut off.
            resp = await read(reader)
            await reader.write(request(EDS, [big], version_info=resp.version_info,
                                       response_nonce=resp.nonce))
            cut = await app.sample_value("pilot_xds_write_timeout_total")
            clients = sorted(s.client for s in await app.stream_infos())
            return cut == 1 and clients == ["reader"], (cut, clients)
        await eventually_seen(cut_off, HANG, "the sleeping client cut off", period=0.1)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            while True:
                await read(sleeper)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        reader.cancel()


async def test_the_xds_command_prints_what_arrives(demo_dir: Path,
                                                   make_app: AppFactory) -> None:
    # The readable output shows the identity, which the linkerd profile carries.
    app: App = await make_app(demo_dir, layer_options=(XdsOptions(endpoint_metadata="linkerd"),))
    server = f"127.0.0.1:{app.grpc_port}"

    async def cli(*args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "meshbridge.cli", "xds", "--server", server, "--timeout", "60",
            *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 2 * HANG)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    code, out, _ = await cli("web.emojivoto:80", "--count", "1")
    assert code == 0
    assert "eds version" in out and WEB in out
    assert "10.244.1.10:8080  HEALTHY  weight 1  identity web.emojivoto.serviceaccount" in out
    code, out, _ = await cli("--type", "cds", "--count", "1", "--json")
    body = json.loads(out)
    assert body["type"] == "cds" and len(body["resources"]) == len(DEMO)
    code, out, _ = await cli("--type", "lds", "--delta", "--count", "1", WEB)
    assert code == 0 and "routes from RDS " + WEB in out
    code, out, _ = await cli("--type", "rds", "--count", "1", "--json", WEB)
    route = json.loads(out)["resources"][0]["resource"]
    clusters = route["virtual_hosts"][0]["routes"][0]["route"]["weighted_clusters"]["clusters"]
    assert [(c["name"], c["weight"]) for c in clusters] == [
        (WEB, 9000), (WEB.replace("web.", "web-canary."), 1000)]  # web's profile's split
    code, _, err = await cli("--type", "rds")
    assert code == 2 and "needs at least one NAME" in err


async def test_debug_pages_show_xds_streams_and_the_cla(demo_dir: Path,
                                                        make_app: AppFactory) -> None:
    app: App = await make_app(demo_dir)

    def get(path: str) -> Any:
        url = f"http://127.0.0.1:{app.admin_port}{path}"
        with urllib.request.urlopen(url, timeout=HANG) as resp:
            return json.loads(resp.read())

    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
        call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(ch).StreamAggregatedResources()
        await call.write(request(EDS, [WEB], node={"id": "debug-me"}))
        resp = await read(call)
        await call.write(request(EDS, [WEB], version_info=resp.version_info,
                                 response_nonce=resp.nonce))

        async def acked() -> tuple[bool, Any]:
            streams = await asyncio.to_thread(get, "/debug/streams")
            mine = [s for s in streams if s["client"] == "debug-me"]
            ok = bool(mine) and mine[0]["types"]["eds"]["last_ack"]["version"] == \
                resp.version_info
            return ok, mine
        await eventually_seen(acked, HANG, "the stream and its ACK on /debug/streams")
        page = await asyncio.to_thread(get, f"/debug/endpoints?authority={WEB}&format=json")
        xds = page["protocols"]["xds"]
        assert set(xds["endpoints"]) == {"10.244.1.10:8080", "10.244.2.10:8080"}
        assert xds["endpoints"]["10.244.1.10:8080"]["health"] == "HEALTHY"
        assert xds["message"]["cla"]["cluster_name"] == WEB
        call.cancel()
    assert app.service("xds").cache.port_names() == sorted(DEMO)


async def test_stopping_the_server_ends_streams_cleanly(demo_dir: Path,
                                                        make_app: AppFactory) -> None:
    app: App = await make_app(demo_dir)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
        call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(ch).StreamAggregatedResources()
        await call.write(request(EDS, [WEB], node={"id": "bye"}))
        await read(call)
        await app.stop(grace=1.0)
        assert await read(call) is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK


async def test_a_burst_of_thousands_of_new_streams_is_served(demo_dir: Path,
                                                             make_app: AppFactory) -> None:
    # More than gRPC C-core's default pending-call hard limit (3000), as when every
    # proxy of a large mesh reconnects at once after a restart.
    streams = 4000
    app: App = await make_app(demo_dir)
    options = [("grpc.use_local_subchannel_pool", 1)]  # one connection per channel
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}", options=options)
                for _ in range(20)]
    calls = []
    try:
        for i in range(streams):
            stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channels[i % len(channels)])
            calls.append(stub.StreamAggregatedResources())
        await asyncio.gather(*(c.write(request(EDS, [WEB])) for c in calls))
        first = await asyncio.wait_for(asyncio.gather(*(c.read() for c in calls)), 60)
        assert all(len(r.resources) == 1 for r in first)
        assert len(app.views.views()) == 1
    finally:
        for c in calls:
            c.cancel()
        for ch in channels:
            await ch.close()
