"""Both gRPC servers (`--grpc-transport native|grpcio`) serve the same bytes: the same
Linkerd snapshot, the same CLA, the same statuses, the same per-RPC metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2

from linkerd_api.proto import destination_pb2
from testkit.linkerd import metric
from tests.conftest import AppFactory

WEB = "web.emojivoto.svc.cluster.local:80"
GET = "/io.linkerd.proxy.destination.Destination/Get"
ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


async def _what_clients_get(app: Any) -> dict[str, Any]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
        get = ch.unary_stream(GET)(destination_pb2.GetDestination(
            scheme="k8s", path=WEB).SerializeToString())
        snapshot = await get.read()
        get.cancel()
        ads = ch.stream_stream(ADS)()
        await ads.write(discovery_pb2.DiscoveryRequest(
            type_url=EDS, resource_names=[WEB]).SerializeToString())
        response = discovery_pb2.DiscoveryResponse.FromString(await ads.read())
        await ads.done_writing()
        bad = ch.unary_stream(GET)(destination_pb2.GetDestination(
            scheme="k8s", path="web.emojivoto:80").SerializeToString())
        try:
            await bad.read()
            refused = None
        except grpc.aio.AioRpcError as e:
            refused = (e.code(), e.details())
    counted = {code: await metric(app, "grpc_server_handled_total", {
        "grpc_service": "io.linkerd.proxy.destination.Destination", "grpc_method": "Get",
        "grpc_type": "server_stream", "grpc_code": code}) for code in ("InvalidArgument",)}
    return {"snapshot": snapshot, "cla": [r.value for r in response.resources],
            "refused": refused, "counted": counted}


async def test_native_and_grpcio_servers_answer_byte_for_byte_alike(
        make_app: AppFactory, demo_dir: Path) -> None:
    native = await _what_clients_get(await make_app(demo_dir))
    grpcio = await _what_clients_get(await make_app(demo_dir, grpc_transport="grpcio"))
    assert native["snapshot"] and native["cla"]
    assert native["snapshot"] == grpcio["snapshot"]
    assert native["cla"] == grpcio["cla"]
    assert native["refused"] is not None
    assert native["refused"] == grpcio["refused"]
    assert native["refused"][0] == grpc.StatusCode.INVALID_ARGUMENT
    assert native["counted"] == grpcio["counted"] == {"InvalidArgument": 1.0}
