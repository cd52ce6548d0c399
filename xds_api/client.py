"""`meshbridge xds NAME... [--type eds|cds|lds|rds] [--delta] [--server ADDR]`

Subscribes over ADS as a client would, ACKs every response, and prints what arrives:
readable by default, one JSON object per response with `--json`. CDS and LDS without
names subscribe to everything (`*`). Names may be short (`web.emojivoto:80`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any, TextIO

import grpc
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import health_check_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
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
from meshbridge.client_tls import add_tls_arguments, aio_channel
from xds_api import resource_types as rt
from xds_api.resources import METADATA_NAMESPACE

_MESSAGES: dict[str, Any] = {
    rt.CLUSTER: cluster_pb2.Cluster,
    rt.ENDPOINT: endpoint_pb2.ClusterLoadAssignment,
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
    parser.add_argument("--server", default="127.0.0.1:8086", help="meshbridge gRPC address")
    parser.add_argument("--json", action="store_true", help="one JSON object per response")
    parser.add_argument("--count", type=int, default=0,
                        help="exit after this many responses (default: run until stopped)")
    parser.add_argument("--timeout", type=float, default=0.0,
                        help="fail if a response takes longer than this many seconds")
    parser.add_argument("--node-id", default="meshbridge-xds-client")
    parser.add_argument("--cluster-domain", default="cluster.local")
    add_tls_arguments(parser)


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
            lines.append(f"locality {where or '(none)'}  weight "
                         f"{loc.load_balancing_weight.value}")
            for lb in loc.lb_endpoints:
                sa = lb.endpoint.address.socket_address
                host = f"[{sa.address}]" if ":" in sa.address else sa.address
                meta = lb.metadata.filter_metadata[METADATA_NAMESPACE].fields
                extra = ""
                if "identity" in meta:
                    extra += f"  identity {meta['identity'].string_value}"
                if "protocol_hint" in meta and meta["protocol_hint"].string_value:
                    extra += f"  hint {meta['protocol_hint'].string_value}"
                health = health_check_pb2.HealthStatus.Name(lb.health_status)
                lines.append(f"  {host}:{sa.port_value}  {health}  weight "
                             f"{lb.load_balancing_weight.value}{extra}")
        return lines
    if isinstance(msg, cluster_pb2.Cluster):
        h2 = "http2" if msg.typed_extension_protocol_options else "http1"
        return [f"{cluster_pb2.Cluster.DiscoveryType.Name(msg.type)} over ADS, "
                f"{cluster_pb2.Cluster.LbPolicy.Name(msg.lb_policy)}, {h2}"]
    if isinstance(msg, listener_pb2.Listener):
        manager = hcm_pb2.HttpConnectionManager()
        msg.api_listener.api_listener.Unpack(manager)
        return [f"api_listener, routes from RDS {manager.rds.route_config_name}"]
    if isinstance(msg, route_pb2.RouteConfiguration):
        return [f"{vh.name}: {', '.join(vh.domains)} -> "
                f"{', '.join(r.route.cluster for r in vh.routes)}"
                for vh in msg.virtual_hosts]
    return ["(unknown resource type)"]
