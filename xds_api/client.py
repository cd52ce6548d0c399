"""`meshbridge xds NAME... [--type eds|cds|lds|rds|leds] [--delta] [--server ADDR]`

Subscribes over ADS as a client would, ACKs every response, and prints what arrives:
readable by default, one JSON object per response with `--json`. CDS and LDS without
names subscribe to everything (`*`). Names may be short (`web.emojivoto:80`).
`--node-metadata meshbridge.io/leds=always` asks for LEDS (`--type leds --delta` with
a collection name from the CLA follows it).

`DeltaAdsClient` is the same client as a library, for tools and tests: one delta ADS
stream, any types on it, every response ACKed, applied to what it holds, and sized.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Iterable, Mapping
from typing import Any, Self, TextIO

import grpc
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import health_check_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2

# The well-known types the printed messages refer to must be importable by Any.
from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2 as hcm_pb2,
)
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2  # noqa: F401
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import any_pb2, json_format

from bridge.authority import parse_target
from bridge.routes.text import format_rows
from meshbridge.client_tls import add_tls_arguments, aio_channel
from xds_api import resource_types as rt
from xds_api.resources import METADATA_NAMESPACE
from xds_api.route_text import route_config_rows

_MESSAGES: dict[str, Any] = {
    rt.CLUSTER: cluster_pb2.Cluster,
    rt.ENDPOINT: endpoint_pb2.ClusterLoadAssignment,
    rt.LB_ENDPOINT: endpoint_components_pb2.LbEndpoint,
    rt.LISTENER: listener_pb2.Listener,
    rt.ROUTE: route_pb2.RouteConfiguration,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="resource names: <svc>.<ns>.svc.<domain>:<port> "
                             "(or <svc>.<ns>:<port>); none means `*` for cds and lds")
    parser.add_argument("--type", choices=sorted(rt.BY_SHORT), default="eds",
                        help="resource type (default: eds)")
    parser.add_argument("--delta", action="store_true", help="use incremental (delta) ADS")
    parser.add_argument("--node-metadata", action="append", default=[], type=_key_value,
                        metavar="KEY=VALUE",
                        help="node metadata to send (e.g. meshbridge.io/leds=always, "
                             "NODE_NAME=node-a); repeatable")
    parser.add_argument("--server", default="127.0.0.1:8086", help="meshbridge gRPC address")
    parser.add_argument("--json", action="store_true", help="one JSON object per response")
    parser.add_argument("--count", type=int, default=0,
                        help="exit after this many responses (default: run until stopped)")
    parser.add_argument("--timeout", type=float, default=0.0,
                        help="fail if a response takes longer than this many seconds")
    parser.add_argument("--node-id", default="meshbridge-xds-client",
                        help="the xDS node id sent in every request")
    parser.add_argument("--cluster-domain", default="cluster.local",
                        help="the cluster's DNS domain (short names are expanded with it)")
    add_tls_arguments(parser)


def _key_value(text: str) -> str:
    if "=" not in text or text.startswith("="):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, not {text!r}")
    return text


def run(args: argparse.Namespace) -> int:
    type_url = rt.BY_SHORT[args.type]
    names = [parse_target(n, args.cluster_domain) for n in args.names]  # one grammar
    if not names and type_url not in rt.WILDCARD_CAPABLE:
        print(f"meshbridge xds: --type {args.type} needs at least one NAME", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_watch(args, type_url, names, sys.stdout))
    except KeyboardInterrupt:
        return 130


async def _watch(args: argparse.Namespace, type_url: str, names: list[str],
                 out: TextIO) -> int:
    async with aio_channel(args) as channel:
        stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
        call: Any
        if args.delta:
            call = stub.DeltaAggregatedResources()
            first: Any = discovery_pb2.DeltaDiscoveryRequest(
                type_url=type_url, resource_names_subscribe=names or ["*"])
        else:
            call = stub.StreamAggregatedResources()
            first = discovery_pb2.DiscoveryRequest(type_url=type_url, resource_names=names)
        first.node.id = args.node_id
        first.node.user_agent_name = "meshbridge-xds"
        first.node.metadata.update(dict(kv.split("=", 1) for kv in args.node_metadata))
        seen = 0
        try:
            await call.write(first)
            while not args.count or seen < args.count:
                read = call.read()
                resp = await (asyncio.wait_for(read, args.timeout) if args.timeout else read)
                if resp is grpc.aio.EOF:
                    print("meshbridge xds: the server ended the stream", file=sys.stderr)
                    return 1
                seen += 1
                if seen == 1 and not resp.resources:  # a query that matches nothing says so
                    print(f"meshbridge xds: no {args.type} resource matches "
                          f"{' '.join(names) or '*'}", file=sys.stderr)
                    return 1
                out.write(render_json(resp) + "\n" if args.json else render_text(resp))
                out.flush()
                await call.write(_ack(resp, type_url, names, args.delta))
        except grpc.aio.AioRpcError as e:
            print(f"meshbridge xds: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
        except TimeoutError:
            print(f"meshbridge xds: no response within {args.timeout}s", file=sys.stderr)
            return 1
        finally:
            call.cancel()
    return 0


def _ack(resp: Any, type_url: str, names: list[str], delta: bool) -> Any:
    if delta:
        return discovery_pb2.DeltaDiscoveryRequest(type_url=type_url,
                                                   response_nonce=resp.nonce)
    return discovery_pb2.DiscoveryRequest(type_url=type_url, resource_names=names,
                                          version_info=resp.version_info,
                                          response_nonce=resp.nonce)


def _unpack(any_msg: any_pb2.Any) -> Any:
    cls = _MESSAGES.get(any_msg.type_url)
    if cls is None:
        return None
    msg = cls()
    any_msg.Unpack(msg)
    return msg


def _entries(resp: Any) -> list[tuple[str, str, Any]]:
    """(name, per-resource version or "", message) of each resource in a response."""
    if isinstance(resp, discovery_pb2.DeltaDiscoveryResponse):
        return [(r.name, r.version, _unpack(r.resource)) for r in resp.resources]
    out = []
    for a in resp.resources:
        msg = _unpack(a)
        name = "" if msg is None else (
            msg.cluster_name if isinstance(msg, endpoint_pb2.ClusterLoadAssignment)
            else msg.name)
        out.append((name, "", msg))
    return out


def render_json(resp: Any) -> str:
    delta = isinstance(resp, discovery_pb2.DeltaDiscoveryResponse)
    body: dict[str, Any] = {
        "type": rt.short_name(resp.type_url),
        "version": resp.system_version_info if delta else resp.version_info,
        "nonce": resp.nonce,
        "resources": [
            {"name": name, **({"version": version} if delta else {}),
             "resource": json_format.MessageToDict(msg, preserving_proto_field_name=True)
             if msg is not None else None}
            for name, version, msg in _entries(resp)],
    }
    if delta:
        body["removed"] = list(resp.removed_resources)
    return json.dumps(body, sort_keys=True)


def render_text(resp: Any) -> str:
    delta = isinstance(resp, discovery_pb2.DeltaDiscoveryResponse)
    version = resp.system_version_info if delta else resp.version_info
    entries = _entries(resp)
    lines = [f"{rt.short_name(resp.type_url)} version {version} nonce {resp.nonce}: "
             f"{len(entries)} resource{'s' if len(entries) != 1 else ''}"
             + (f", {len(resp.removed_resources)} removed" if delta else "")]
    for name, res_version, msg in entries:
        lines.append(f"  {name}" + (f"  (version {res_version})" if res_version else ""))
        lines.extend("    " + line for line in _describe(msg))
    if delta:
        lines.extend(f"  removed {name}" for name in resp.removed_resources)
    return "\n".join(lines) + "\n"


def _describe(msg: Any) -> list[str]:
    if isinstance(msg, endpoint_pb2.ClusterLoadAssignment):
        if not msg.endpoints:
            return ["no endpoints"]
        lines = []
        for loc in msg.endpoints:
            where = "/".join(p for p in (loc.locality.region, loc.locality.zone) if p)
            if loc.HasField("leds_cluster_locality_config"):
                lines.append(f"locality {where or '(none)'}  LEDS "
                             f"{loc.leds_cluster_locality_config.leds_collection_name}")
                continue
            lines.append(f"locality {where or '(none)'}  weight "
                         f"{loc.load_balancing_weight.value}")
            lines.extend("  " + _describe_endpoint(lb) for lb in loc.lb_endpoints)
        return lines
    if isinstance(msg, endpoint_components_pb2.LbEndpoint):
        return [_describe_endpoint(msg)]
    if isinstance(msg, cluster_pb2.Cluster):
        h2 = "http2" if msg.typed_extension_protocol_options else "http1"
        return [f"{cluster_pb2.Cluster.DiscoveryType.Name(msg.type)} over ADS, "
                f"{cluster_pb2.Cluster.LbPolicy.Name(msg.lb_policy)}, {h2}"]
    if isinstance(msg, listener_pb2.Listener):
        manager = hcm_pb2.HttpConnectionManager()
        msg.api_listener.api_listener.Unpack(manager)
        return [f"api_listener, routes from RDS {manager.rds.route_config_name}"]
    if isinstance(msg, route_pb2.RouteConfiguration):
        # The route-table text `meshbridge policy` prints a Linkerd policy in.
        domains = ", ".join(d for vh in msg.virtual_hosts for d in vh.domains)
        return format_rows(f"routes ({domains}):", route_config_rows(msg))
    return ["(unknown resource type)"]


def _describe_endpoint(lb: endpoint_components_pb2.LbEndpoint) -> str:
    sa = lb.endpoint.address.socket_address
    host = f"[{sa.address}]" if ":" in sa.address else sa.address
    extra = ""
    if METADATA_NAMESPACE in lb.metadata.filter_metadata:
        meta = lb.metadata.filter_metadata[METADATA_NAMESPACE].fields
        if "identity" in meta:
            extra += f"  identity {meta['identity'].string_value}"
        if "protocol_hint" in meta and meta["protocol_hint"].string_value:
            extra += f"  hint {meta['protocol_hint'].string_value}"
    health = health_check_pb2.HealthStatus.Name(lb.health_status)
    return f"{host}:{sa.port_value}  {health}  weight {lb.load_balancing_weight.value}{extra}"


class DeltaAdsClient:
    """One delta ADS stream as a client: `subscribe` any type, `read` the next
    response (ACKed, applied to `held`, its encoded size kept in `sizes`)."""

    def __init__(self, channel: grpc.aio.Channel, node_id: str = "meshbridge-xds",
                 metadata: Mapping[str, str] | None = None) -> None:
        self._stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
        node = discovery_pb2.DeltaDiscoveryRequest().node
        node.id = node_id
        node.user_agent_name = "meshbridge-xds"
        node.metadata.update(dict(metadata or {}))
        self._node: Any = node  # sent on the first request only
        self._call: Any = None
        # type URL -> name -> the resource's message
        self.held: dict[str, dict[str, Any]] = {}
        self.sizes: list[tuple[str, int]] = []  # (type URL, bytes) per response

    async def __aenter__(self) -> Self:
        self._call = self._stub.DeltaAggregatedResources()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._call is not None:
            self._call.cancel()

    async def subscribe(self, type_url: str, names: Iterable[str] = (),
                        unsubscribe: Iterable[str] = ()) -> None:
        req = discovery_pb2.DeltaDiscoveryRequest(
            type_url=type_url, resource_names_subscribe=list(names),
            resource_names_unsubscribe=list(unsubscribe))
        if self._node is not None:
            req.node.CopyFrom(self._node)
            self._node = None
        await self._call.write(req)

    async def read(self, timeout: float | None = None) -> discovery_pb2.DeltaDiscoveryResponse:
        """The next response, ACKed; raises EOFError if the server ended the stream."""
        resp = await asyncio.wait_for(self._call.read(), timeout)
        if resp is grpc.aio.EOF:
            raise EOFError("the server ended the stream")
        self.sizes.append((resp.type_url, resp.ByteSize()))
        held = self.held.setdefault(resp.type_url, {})
        for name, _, msg in _entries(resp):
            held[name] = msg
        for name in resp.removed_resources:
            held.pop(name, None)
        await self._call.write(discovery_pb2.DeltaDiscoveryRequest(
            type_url=resp.type_url, response_nonce=resp.nonce))
        return resp
