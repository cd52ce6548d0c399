"""A route edit fanned out: one HTTPRoute's weights change while N Envoy-style RDS
streams (SotW ADS, each ACKing) and N Linkerd OutboundPolicies.Watch streams follow
the Service port it attaches to.

    python -m bench.route_edit [--streams 1000] [--runs 5] [--channels 20] [--json]

meshbridge (every protocol layer, as `serve` mounts them) runs in this process; the 2N
streams run in a child process on 127.0.0.1 on bench/h2client.py's lean connections
(each response decoded; each RDS response ACKed), so that the figure is the server's.
Each run applies the edited route straight to the cluster cache and measures the time
from that apply to the moment the *last* stream of each kind has decoded the new
message (CLOCK_MONOTONIC is one clock for both processes); the figures are medians
over the runs. The server is idle before each run. Encodings per edit are counted
where they happen: RDS RouteConfigurations serialized, OutboundPolicies encoded.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

from bench.common import (
    Child,
    StaticSource,
    commands,
    cpu_seconds,
    out_line,
    poll,
    print_json,
    row,
    serving_layers,
)
from bridge.cluster import Event, EventType
from bridge.objects import KubeObject, decode_object
from meshbridge import gctune

NS = "bench"
TARGET = f"web.{NS}.svc.cluster.local:80"
TARGET_MS = 100.0  # issue 24: 1,000 streams of each kind within 100 ms
ADS_SOTW = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
WATCH = "/io.linkerd.proxy.outbound.OutboundPolicies/Watch"
RDS = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
KINDS = ("rds", "policy")


def service(name: str, ip: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
            "spec": {"clusterIP": ip, "ports": [{"name": "http", "port": 80,
                                                 "targetPort": 8080}]}}


def route(canary_weight: int) -> dict[str, Any]:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "web-canary", "namespace": NS,
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": "web",
                                     "port": 80}],
                     "rules": [{"backendRefs": [
                         {"name": "web", "port": 80, "weight": 100 - canary_weight},
                         {"name": "web-canary", "port": 80, "weight": canary_weight}]}]}}


def decoded(docs: list[dict[str, Any]]) -> list[KubeObject]:
    out = []
    for d in docs:
        obj = decode_object(d)
        assert obj is not None
        out.append(obj)
    return out


# ---------------------------------------------------------------------- the client


async def run_client(args: argparse.Namespace) -> int:
    from envoy.service.discovery.v3 import discovery_pb2

    from bench.h2client import LeanConnection
    from linkerd_api.proto import outbound_pb2 as ob

    host, port = args.server.rsplit(":", 1)
    seen: dict[tuple[int, int], int] = {}
    kinds: dict[tuple[int, int], str] = {}
    received: dict[tuple[str, int], int] = {}
    last_at: dict[tuple[str, int], float] = {}
    opened = 0
    ready = asyncio.Event()
    total = 2 * args.streams
    conns: list[LeanConnection] = []
    Response, Request = discovery_pb2.DiscoveryResponse, discovery_pb2.DiscoveryRequest

    def on_message_of(ci: int) -> Any:
        def on_message(sid: int, raw: bytes) -> None:
            nonlocal opened
            now = time.monotonic()
            key = (ci, sid)
            n = seen[key] = seen.get(key, -1) + 1
            kind = kinds[key]
            if kind == "rds":
                resp = Response.FromString(raw)
                conns[ci].send(sid, Request(
                    type_url=RDS, resource_names=[TARGET], version_info=resp.version_info,
                    response_nonce=resp.nonce).SerializeToString())
            else:
                ob.OutboundPolicy.FromString(raw)
            if n == 0:
                opened += 1
                if opened == total:
                    ready.set()
                return
            count = received[(kind, n)] = received.get((kind, n), 0) + 1
            last_at[(kind, n)] = now
            if count == args.streams and all(
                    received.get((k, n), 0) == args.streams for k in KINDS):
                out_line(run=n, **{k: last_at[(k, n)] for k in KINDS})
        return on_message

    for ci in range(args.channels):
        conns.append(await LeanConnection.connect(host, int(port), on_message_of(ci),
                                                  lambda sid, status: None))
    for i in range(args.streams):
        rds = Request(type_url=RDS, resource_names=[TARGET])
        rds.node.id = f"bench-envoy-{i}"
        rds.node.user_agent_name = "envoy"
        ci = i % len(conns)
        sid = conns[ci].open(ADS_SOTW, rds.SerializeToString())
        kinds[(ci, sid)] = "rds"
        spec = ob.TrafficSpec(source_workload=f"{NS}:client-{i}", authority=TARGET)
        ci = (i + 1) % len(conns)
        sid = conns[ci].open(WATCH, spec.SerializeToString(), end_stream=True)
        kinds[(ci, sid)] = "policy"
    await asyncio.wait_for(ready.wait(), 300)
    out_line(ready=total)
    reader = await commands()
    await reader.read()  # until the parent closes stdin
    for c in conns:
        c.close()
    return 0


# ---------------------------------------------------------------------- the server


async def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    from meshbridge.app import App, ServeOptions
    from meshbridge.limits import LOOPBACK_CROWD, Limits
    from meshbridge.log import configure_logging
    from xds_api import resource_types as rt

    configure_logging("console", "warning")
    objects = decoded([service("web", "10.96.0.10"), service("web-canary", "10.96.0.11"),
                       route(10)])
    limits = Limits(max_streams_per_client=args.streams * 4 + 100, h2=LOOPBACK_CROWD)
    app = App(StaticSource(objects), None,
              ServeOptions("127.0.0.1:0", "127.0.0.1:0", limits=limits), serving_layers())
    await app.start()
    gctune.settle_heap()
    child: Child | None = None
    xds, policy = app.service("xds"), app.service("policy")

    def idle() -> bool:
        for r in xds.runners:
            sub = r.stream.subs.get(rt.ROUTE)
            if sub is None or sub.acked_version != sub.version_sent or r.write_started:
                return False
        return all(s.pending is None for s in policy.streams)

    def rds_encodings() -> float:
        return app.metrics.get_sample_value("meshbridge_xds_serializations_total",
                                            {"type": "rds"}) or 0.0

    latencies: dict[str, list[float]] = {k: [] for k in KINDS}
    encodings: dict[str, list[float]] = {k: [] for k in KINDS}
    cpu_ms: list[float] = []
    try:
        child = await Child.start(
            "bench.route_edit", "--server", f"127.0.0.1:{app.grpc_port}",
            "--streams", str(args.streams), "--channels", str(args.channels))
        await child.line()  # every stream holds its first answer
        await poll(lambda: len(xds.runners) >= args.streams
                   and len(policy.streams) >= args.streams and idle(), 120,
                   "streams open and idle")
        profiler = None
        if args.profile:
            from pyinstrument import Profiler

            profiler = Profiler(interval=0.0005, async_mode="disabled")
            profiler.start()
        for run in range(1, args.runs + 1):
            await poll(idle, 120, "server idle before a run")
            edit = decoded([route(20 if run % 2 else 10)])
            rds0, pol0 = rds_encodings(), policy.encodings
            cpu0 = cpu_seconds()
            t0 = time.monotonic()
            app.cluster.apply([Event(EventType.MODIFIED, edit[0])])
            got = await child.line()
            cpu_ms.append((cpu_seconds() - cpu0) * 1000)
            assert got["run"] == run, got
            for k in KINDS:
                latencies[k].append((got[k] - t0) * 1000)
            encodings["rds"].append(rds_encodings() - rds0)
            encodings["policy"].append(policy.encodings - pol0)
        if profiler is not None:
            profiler.stop()
            with open(args.profile, "w", encoding="utf-8") as f:
                f.write(profiler.output_text(unicode=True, show_all=False))
    finally:
        if child is not None:
            await child.close()
        await app.stop(grace=0.5)
        gctune.release_heap()
    return {"streams": args.streams, "channels": args.channels, "runs": args.runs,
            "all_received_ms": latencies, "encodings_per_edit": encodings,
            "server_cpu_ms": cpu_ms}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    n = result["streams"]
    titles = {"rds": "Envoy RDS", "policy": "Linkerd OutboundPolicies"}
    return [row(f"route edit: one HTTPRoute change to {n:,} {titles[k]} streams (beside "
                f"{n:,} of the other kind)", "last stream has it",
                result["all_received_ms"][k], "ms", TARGET_MS if n == 1000 else None,
                encodings=result["encodings_per_edit"][k],
                server_cpu_ms=result["server_cpu_ms"]) for k in KINDS]


def report(result: dict[str, Any]) -> str:
    lines = [f"route edit: {result['streams']:,} RDS + {result['streams']:,} OutboundPolicies "
             f"streams over {result['channels']} connections, {result['runs']} runs"]
    for k in KINDS:
        lat = result["all_received_ms"][k]
        lines.append(f"  {k}: last stream has it: median {statistics.median(lat):.1f} ms "
                     f"(min {min(lat):.1f}, max {max(lat):.1f}); encodings per edit "
                     f"{result['encodings_per_edit'][k]}")
    lines.append(f"  server CPU per edit (both kinds): median "
                 f"{statistics.median(result['server_cpu_ms']):.1f} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.route_edit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=1000, help="streams of each kind")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--channels", type=int, default=20,
                   help="client connections the streams are spread over")
    p.add_argument("--json", action="store_true")
    p.add_argument("--profile", metavar="FILE",
                   help="profile the server during the runs (pyinstrument) into FILE")
    p.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--server", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.client:
        return asyncio.run(run_client(args))
    result = asyncio.run(run_bench(args))
    if args.json:
        print_json("route_edit", rows(result), result)
    else:
        print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
