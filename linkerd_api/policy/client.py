"""`meshbridge policy NAME`: follow an OutboundPolicies.Watch stream, as a
linkerd2-proxy's would, and print each policy as a route table (the format
`meshbridge xds --type rds` prints a RouteConfiguration in).

NAME is a Service port in the shared grammar (`web.emojivoto:80`, ...) or a
ClusterIP:port. `--workload` is the asking workload (its namespace picks the consumer
routes, Routes §1.2), by default a pod in the Service's own namespace.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys

import grpc
from google.protobuf import json_format

from bridge.authority import parse_target
from bridge.routes.text import format_rows
from linkerd_api.policy.outbound import tcp_address
from linkerd_api.policy.text import policy_rows
from linkerd_api.proto import outbound_pb2 as ob
from linkerd_api.render import DEFAULT_SERVER
from meshbridge.client_tls import add_tls_arguments, sync_channel

WATCH = "/io.linkerd.proxy.outbound.OutboundPolicies/Watch"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="NAME",
                        help="a Service port (web.emojivoto:80, web.emojivoto.svc.cluster.local"
                             ":80) or ClusterIP:port")
    parser.add_argument("--workload", default="",
                        help='the asking workload, e.g. \'{"ns":"shop","pod":"cart-0"}\' or '
                             "shop:cart-0 (default: a pod in the Service's namespace)")
    parser.add_argument("--server", default=DEFAULT_SERVER,
                        help=f"policy API address (default {DEFAULT_SERVER})")
    parser.add_argument("--json", action="store_true", help="one JSON object per policy")
    parser.add_argument("--count", type=int, default=0,
                        help="exit after this many policies (default: follow the stream)")
    parser.add_argument("--timeout", type=float, default=None,
                        help="stop following after this many seconds")
    parser.add_argument("--cluster-domain", default="cluster.local",
                        help="the cluster's DNS domain (short names are expanded with it)")
    add_tls_arguments(parser)


def traffic_spec(target: str, workload: str, domain: str) -> ob.TrafficSpec:
    host, _, port = target.rpartition(":")
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        authority = parse_target(target, domain)
        ns = authority.split(".")[1] if authority.count(".") >= 2 else "default"
        return ob.TrafficSpec(source_workload=workload or f"{ns}:meshbridge-policy",
                              authority=authority)
    return ob.TrafficSpec(source_workload=workload or "default:meshbridge-policy",
                          addr=tcp_address(str(ip), int(port)))


def describe(policy: ob.OutboundPolicy, target: str) -> str:
    protocol, rows = policy_rows(policy)
    return "\n".join(format_rows(f"policy {target} ({protocol}):", rows)) + "\n"


def run(args: argparse.Namespace) -> int:
    try:
        spec = traffic_spec(args.target, args.workload, args.cluster_domain)
    except ValueError as e:
        print(f"meshbridge policy: {e}", file=sys.stderr)
        return 2
    name = spec.authority or args.target
    with sync_channel(args) as channel:
        call = channel.unary_stream(WATCH, request_serializer=ob.TrafficSpec.SerializeToString,
                                    response_deserializer=ob.OutboundPolicy.FromString,
                                    )(spec, timeout=args.timeout)
        seen = 0
        try:
            for policy in call:
                seen += 1
                if args.json:
                    print(json.dumps(json_format.MessageToDict(policy), sort_keys=True),
                          flush=True)
                else:
                    sys.stdout.write(describe(policy, name))
                    sys.stdout.flush()
                if args.count and seen >= args.count:
                    call.cancel()
                    break
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and seen:
                return 0
            if e.code() != grpc.StatusCode.CANCELLED:
                print(f"meshbridge policy: {e.code().name}: {e.details()}", file=sys.stderr)
                return 1
    return 0
