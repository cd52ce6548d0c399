"""`meshbridge status`: every client of a running meshbridge and how far it is in sync,
as a table (what `istioctl proxy-status` and `linkerd diagnostics` users look for).

It asks the gRPC port (`--server`, as every subcommand's `--server` means) for the
debug type `istio.io/debug/syncz`, the one istioctl asks for, whose answer carries
each stream's /debug/syncz entry; or, with `--admin ADDR`, reads /debug/syncz from the
admin port. Given a PROXY (a node id, or part of one), it prints instead what that
proxy holds, from `istio.io/debug/config_dump`: as Envoy's admin config dump
(`--config-dump`, which `istioctl proxy-config clusters|listeners|routes --file` and
`istioctl proxy-status PROXY --file` read) or as Envoy's /clusters?format=json
(`--endpoints`, which `istioctl proxy-config endpoints --file` reads).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import sys
import urllib.error
import urllib.request
from typing import Any, TextIO

import grpc
from envoy.admin.v3 import clusters_pb2, config_dump_pb2, config_dump_shared_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from envoy.service.status.v3 import csds_pb2
from google.protobuf import json_format

from meshbridge.client_tls import add_tls_arguments, aio_channel
from meshbridge.probe import what_answers

# The types meshbridge's resources carry inside Any fields (HttpProtocolOptions, the
# HttpConnectionManager, the router filter) are registered by the module that encodes
# them: a config dump prints as JSON only if every Any in it is known.
from xds_api import resources  # noqa: F401

DEFAULT_SERVER = "127.0.0.1:8086"
SYNCZ = "istio.io/debug/syncz"
CONFIG_DUMP = "istio.io/debug/config_dump"
SYNCZ_METADATA = "MESHBRIDGE_SYNCZ"  # xds_api.debug_types: each stream's syncz entry
COLUMNS = ("ID", "PROTOCOL", "CLIENT", "PEER", "TYPE/TARGET", "SENT", "ACKED", "STATE",
           "BEHIND")


class StatusError(Exception):
    """One line for stderr: what went wrong, and with which address."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("proxy", nargs="?", metavar="PROXY",
                        help="a connected proxy's node id (or part of it): print what it "
                             "holds (--config-dump, the default, or --endpoints)")
    parser.add_argument("--server", default=DEFAULT_SERVER,
                        help="meshbridge's gRPC address (its --listen)")
    parser.add_argument("--admin", default=None, metavar="ADDR",
                        help="read /debug/syncz from this admin address (its --admin) "
                             "instead of the gRPC port")
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument("--config-dump", action="store_true",
                       help="with PROXY: Envoy's admin config dump of what it holds")
    shown.add_argument("--endpoints", action="store_true",
                       help="with PROXY: its endpoints as Envoy's /clusters?format=json")
    parser.add_argument("--json", action="store_true", help="print the syncz entries as JSON")
    parser.add_argument("--timeout", type=float, default=5.0,
                        help="seconds to wait for an answer")
    add_tls_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        if args.proxy:
            if args.admin:
                raise StatusError("PROXY is read from the gRPC port (--server), not --admin")
            print(asyncio.run(_proxy(args)))
            return 0
        syncz = _from_admin(args) if args.admin else asyncio.run(_syncz(args))
    except StatusError as e:
        print(f"meshbridge status: {e}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(syncz, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    elif not syncz:
        print("no clients connected")
    else:
        table(syncz, sys.stdout)
    return 0


# ---------------------------------------------------------------------- reading


def _from_admin(args: argparse.Namespace) -> list[dict[str, Any]]:
    url = f"http://{args.admin}/debug/syncz"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as r:
            body = r.read()
    except urllib.error.HTTPError as e:
        raise StatusError(f"{url}: {e.code} {e.read().decode(errors='replace').strip()}") \
            from None
    except (OSError, ValueError, http.client.HTTPException) as e:
        answered = what_answers(args.admin, min(args.timeout, 2.0))
        if answered.startswith("nothing"):
            raise StatusError(f"--admin {args.admin}: {answered}") from None
        if "HTTP/1.1" in answered:
            reason = getattr(e, "reason", None) or e
            raise StatusError(f"{url}: {reason}") from None
        hint = " (the gRPC address goes to --server)" if "HTTP/2" in answered else ""
        raise StatusError(f"--admin {args.admin}: {answered} answered; expected "
                          f"meshbridge's admin port (HTTP/1.1){hint}") from None
    try:
        parsed = json.loads(body)
    except ValueError:
        raise StatusError(f"{url}: the answer is not JSON: is {args.admin} meshbridge's "
                          "admin port?") from None
    if not isinstance(parsed, list):
        raise StatusError(f"{url}: the answer is not a list of streams")
    return parsed


async def _ask(args: argparse.Namespace, type_url: str,
               names: list[str]) -> discovery_pb2.DiscoveryResponse:
    """One debug request on a fresh ADS stream, and its answer."""
    request = discovery_pb2.DiscoveryRequest(type_url=type_url, resource_names=names)
    request.node.id = "meshbridge-status"
    request.node.user_agent_name = "meshbridge-status"
    async with aio_channel(args) as channel:
        call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).StreamAggregatedResources()
        try:
            await call.write(request)
            resp = await asyncio.wait_for(call.read(), args.timeout)
        except grpc.aio.AioRpcError as e:
            raise StatusError(_grpc_failure(args.server, e, args.timeout)) from None
        except TimeoutError:
            raise StatusError(f"--server {args.server}: no answer to {type_url} within "
                              f"{args.timeout:g}s") from None
        finally:
            call.cancel()
    if resp is grpc.aio.EOF:
        raise StatusError(f"--server {args.server}: the stream ended without an answer")
    return resp


def _grpc_failure(server: str, error: grpc.aio.AioRpcError, timeout: float) -> str:
    if error.code() == grpc.StatusCode.UNAVAILABLE:
        answered = what_answers(server, min(timeout, 2.0))
        if answered.startswith("nothing"):
            return f"--server {server}: {answered}"
        if not answered.startswith(("an HTTP/2", "a TLS")):
            hint = " (the admin address goes to --admin)" if "HTTP/1.1" in answered else ""
            return (f"--server {server}: {answered} answered; expected meshbridge's gRPC "
                    f"port (HTTP/2){hint}")
    if error.code() == grpc.StatusCode.UNIMPLEMENTED:
        return (f"--server {server}: a gRPC server without xDS (ADS) answered; expected "
                f"meshbridge's gRPC port: {error.details()}")
    return f"--server {server}: {error.code().name}: {error.details()}"


async def _syncz(args: argparse.Namespace) -> list[dict[str, Any]]:
    resp = await _ask(args, SYNCZ, [])
    out = []
    for res in resp.resources:
        config = csds_pb2.ClientConfig()
        if not res.Unpack(config):
            continue
        entry = config.node.metadata.fields.get(SYNCZ_METADATA)
        if entry is None:
            continue
        syncz = json_format.MessageToDict(entry.struct_value)
        syncz["id"] = int(syncz.get("id", 0))  # a Struct holds every number as a double
        out.append(syncz)
    return out


async def _proxy(args: argparse.Namespace) -> str:
    resp = await _ask(args, CONFIG_DUMP, [args.proxy])
    if not resp.resources:
        raise StatusError(resp.version_info or f"no proxy {args.proxy!r} is connected")
    dump = config_dump_pb2.ConfigDump(configs=list(resp.resources))
    message: Any = clusters_of(dump) if args.endpoints else dump
    return json_format.MessageToJson(message, indent=2)


def clusters_of(dump: config_dump_pb2.ConfigDump) -> clusters_pb2.Clusters:
    """The endpoints of a config dump as Envoy's /clusters?format=json lists them."""
    out = clusters_pb2.Clusters()
    for section in dump.configs:
        endpoints = config_dump_shared_pb2.EndpointsConfigDump()
        if not section.Unpack(endpoints):
            continue
        for config in endpoints.dynamic_endpoint_configs:
            cla = endpoint_pb2.ClusterLoadAssignment()
            config.endpoint_config.Unpack(cla)
            status = out.cluster_statuses.add(name=cla.cluster_name)
            for locality in cla.endpoints:
                for lb in locality.lb_endpoints:
                    host = status.host_statuses.add(
                        weight=lb.load_balancing_weight.value or 1, locality=locality.locality)
                    host.address.CopyFrom(lb.endpoint.address)
                    host.health_status.eds_health_status = lb.health_status
    return out


# ---------------------------------------------------------------------- table


def rows(syncz: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for s in syncz:
        types = s.get("types") or {"-": {}}
        for name, t in sorted(types.items()):
            out.append(tuple(str(v) for v in (
                s["id"], s["protocol"], s["client"][:40] or "-", s["peer"], name,
                t.get("sent") or "-", t.get("acked") or "-", t.get("state", "-"),
                f"{s['behind_seconds']:g}s")))
    return out


def table(syncz: list[dict[str, Any]], out: TextIO) -> None:
    body = rows(syncz)
    widths = [max(len(c), *(len(r[i]) for r in body)) if body else len(c)
              for i, c in enumerate(COLUMNS)]
    for line in (COLUMNS, *body):
        out.write("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
                  + "\n")
