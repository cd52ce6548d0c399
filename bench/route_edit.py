"""A route edit fanned out: one HTTPRoute's weights change while N Envoy-style RDS
streams (SotW ADS, each ACKing) and N Linkerd OutboundPolicies.Watch streams follow
the Service port it attaches to.

    python -m bench.route_edit [--streams 1000] [--runs 5] [--channels 20] [--procs 1]
                               [--client-nice 5] [--json]

meshbridge (every protocol layer, as `serve` mounts them) runs in this process; the
streams run in client processes of their own on 127.0.0.1, each kind in its own
(`--procs` per kind), niced (`--client-nice`) so that the clients' decoding yields to
the server, on bench/h2client.py's lean connections (each response decoded; each RDS
response ACKed; each message checked to carry the edit's canary weight: in full once
per edit and process, then as the same bytes), so that the figure is the server's.
Each run applies the edited route straight to the cluster cache and measures the time
from that apply to the moment the first and the *last* stream of each kind decoded
the new message (CLOCK_MONOTONIC is one clock for every process); the figures are
medians over the runs. The server is idle before each run.

Where the time goes, per run: the apply itself (the route recomputed, the policy
watches written in the same call), the moment every message of the edit has been
handed to its connection and the server's main-thread CPU until then, the server's
CPU per edit (ACKs read included) and each client kind's CPU. Encodings per edit are
counted where they happen: RDS RouteConfigurations serialized, OutboundPolicies
encoded. The load average before and after is printed beside the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import sys
import time
from typing import Any

from bench.common import Profile, client_arguments, cpu_seconds, finish, parser, row
from bridge.cluster import Event, EventType
from bridge.objects import KubeObject, decode_object
from meshbridge import gctune
from testkit.polling import eventually
from testkit.processes import Child, commands, out_line

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


def canary_weight(run: int) -> int:
    """The canary's weight after edit `run` (0: the route the server starts with)."""
    return 20 if run % 2 else 10


def canary_seen(rows: list[Any]) -> int | None:
    """The canary backend's weight in a route table's rows (RouteRow.to is
    "web... 90, web-canary... 10"), None if no row names it."""
    for r in rows:
        found = re.search(r"web-canary\S* (\d+)", r.to)
        if found:
            return int(found.group(1))
    return None


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


class EditReader:
    """What one client process makes of each message of one kind: whether it says what
    edit `n` says (the canary's weight), and for RDS the ACK to send.

    The first message of each edit is decoded in full and its route table read; every
    other stream's message of that edit must then be the same bytes: an OutboundPolicy
    whole; an RDS response up to its nonce (bench/sotw_check.py, which also builds the
    ACK). So each message is checked while the client's CPU per message stays well
    below the server's (the figure is the server's); a message that differs is decoded
    and checked in full."""

    def __init__(self, rds: bool) -> None:
        from bench.sotw_check import SotwReader

        self.rds = rds
        self._rds = SotwReader(RDS, [TARGET], self._says_edit)
        self._known: dict[int, bytes] = {}  # per edit: the OutboundPolicy's bytes

    def read(self, n: int, raw: bytes) -> tuple[bool, bytes]:
        """(says edit n, the ACK to send or b"")."""
        if self.rds:
            return self._rds.read(n, raw)
        if self._known.get(n) == raw:
            return True, b""
        from linkerd_api.policy.text import policy_rows
        from linkerd_api.proto import outbound_pb2 as ob

        rows = policy_rows(ob.OutboundPolicy.FromString(raw))[1]
        ok = canary_seen(rows) == canary_weight(n)
        if ok:
            self._known.setdefault(n, raw)
        return ok, b""

    @staticmethod
    def _says_edit(n: int, message: Any) -> bool:
        from envoy.config.route.v3 import route_pb2

        from xds_api.route_text import route_config_rows

        content = message.resources[0].value if len(message.resources) == 1 else b""
        rows = route_config_rows(route_pb2.RouteConfiguration.FromString(content))
        return canary_seen(rows) == canary_weight(n)


async def run_client(args: argparse.Namespace) -> int:
    """One client process: `--streams` streams of one `--kind` over `--channels`
    connections. For every edit it reports when its first and its last stream had
    read (and checked) the new message, how many messages did not say what the edit
    says, and the CPU it spent since the previous report."""
    from envoy.service.discovery.v3 import discovery_pb2

    from bench.h2client import LeanConnection
    from linkerd_api.proto import outbound_pb2 as ob

    host, port = args.server.rsplit(":", 1)
    rds = args.kind == "rds"
    seen: dict[tuple[int, int], int] = {}
    received: dict[int, int] = {}
    first_at: dict[int, float] = {}
    wrong: dict[int, int] = {}
    edits = EditReader(rds)
    opened = 0
    ready = asyncio.Event()
    conns: list[LeanConnection] = []
    Request = discovery_pb2.DiscoveryRequest
    cpu_before = cpu_seconds()

    def on_message_of(ci: int) -> Any:
        def on_message(sid: int, raw: bytes) -> None:
            nonlocal opened, cpu_before
            key = (ci, sid)
            n = seen[key] = seen.get(key, -1) + 1
            ok, ack = edits.read(n, raw)
            now = time.monotonic()  # read and checked
            if ack:
                conns[ci].send(sid, ack)
            if not ok:
                wrong[n] = wrong.get(n, 0) + 1
            if n == 0:
                opened += 1
                if opened == args.streams:
                    ready.set()
                return
            first_at.setdefault(n, now)
            count = received[n] = received.get(n, 0) + 1
            if count == args.streams:
                cpu = cpu_seconds()
                out_line(run=n, kind=args.kind, first=first_at[n], last=now,
                         wrong=wrong.get(n, 0), cpu_ms=(cpu - cpu_before) * 1000)
                cpu_before = cpu
        return on_message

    for ci in range(args.channels):
        conns.append(await LeanConnection.connect(host, int(port), on_message_of(ci),
                                                  lambda sid, status: None))
    for i in range(args.streams):
        ci = i % len(conns)
        if rds:
            request = Request(type_url=RDS, resource_names=[TARGET])
            request.node.id = f"bench-envoy-{args.first + i}"
            request.node.user_agent_name = "envoy"
            conns[ci].open(ADS_SOTW, request.SerializeToString())
        else:
            spec = ob.TrafficSpec(source_workload=f"{NS}:client-{args.first + i}",
                                  authority=TARGET)
            conns[ci].open(WATCH, spec.SerializeToString(), end_stream=True)
    await asyncio.wait_for(ready.wait(), 300)
    cpu_before = cpu_seconds()
    out_line(ready=args.streams, wrong=wrong.get(0, 0))
    reader = await commands()
    await reader.read()  # until the parent closes stdin
    for c in conns:
        c.close()
    return 0


# ---------------------------------------------------------------------- the server


async def start_clients(args: argparse.Namespace, server: str) -> list[Child]:
    """`--procs` client processes per kind, the kind's streams split between them."""
    children: list[Child] = []
    per_proc = -(-args.streams // args.procs)
    channels = max(1, args.channels // (2 * args.procs))
    for kind in KINDS:
        for p in range(args.procs):
            first = p * per_proc
            count = min(per_proc, args.streams - first)
            children.append(await Child.start(
                "bench.route_edit", "--server", server, "--kind", kind,
                "--streams", str(count), "--first", str(first),
                "--channels", str(channels), "--nice", str(args.client_nice)))
    return children


async def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    from meshbridge.log import configure_logging
    from testkit.serving import serve_objects
    from xds_api import resource_types as rt

    configure_logging("console", "warning")
    objects = decoded([service("web", "10.96.0.10"), service("web-canary", "10.96.0.11"),
                       route(10)])
    app = await serve_objects(objects, args.streams * 4 + 100)
    gctune.settle_heap()
    children: list[Child] = []
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

    figures: dict[str, dict[str, list[float]]] = {
        k: {"first_ms": [], "last_ms": [], "client_cpu_ms": [], "encodings": []}
        for k in KINDS}
    cpu_ms: list[float] = []
    apply_ms: list[float] = []
    handed: list[tuple[float, float]] = []
    handed_ms: list[float] = []
    handed_cpu_ms: list[float] = []
    loop = asyncio.get_running_loop()
    load = os.getloadavg()[0]
    try:
        children = await start_clients(args, f"127.0.0.1:{app.grpc_port}")
        for c in children:
            # Every stream of that process holds its first answer.
            first = await c.line()
            assert not first["wrong"], f"{first['wrong']} first answers without the route"
        await eventually(lambda: len(xds.runners) >= args.streams
                         and len(policy.streams) >= args.streams and idle(), 120,
                         "streams open and idle")
        profile = Profile(args.profile)
        for run in range(1, args.runs + 1):
            await eventually(idle, 120, "server idle before a run")
            edit = decoded([route(canary_weight(run))])
            rds0, pol0 = rds_encodings(), policy.encodings
            cpu0, thread0 = cpu_seconds(), time.thread_time()
            t0 = time.monotonic()
            app.cluster.apply([Event(EventType.MODIFIED, edit[0])])
            apply_ms.append((time.monotonic() - t0) * 1000)
            # The edit's writes to the RDS streams were queued (call_soon) inside the
            # apply; a callback queued now runs right after them: every message of the
            # edit has then been handed to its connection (or to a writer task, for a
            # stream whose client is behind).
            loop.call_soon(lambda: handed.append((time.monotonic(), time.thread_time())))
            got = [await c.line() for c in children]
            handed_at, handed_cpu = handed.pop()
            handed_ms.append((handed_at - t0) * 1000)
            handed_cpu_ms.append((handed_cpu - thread0) * 1000)
            cpu_ms.append((cpu_seconds() - cpu0) * 1000)
            for k in KINDS:
                mine = [g for g in got if g["kind"] == k]
                assert all(g["run"] == run for g in mine), mine
                # Every stream's message says what the edit says (canary weight).
                assert not any(g["wrong"] for g in mine), mine
                figures[k]["first_ms"].append((min(g["first"] for g in mine) - t0) * 1000)
                figures[k]["last_ms"].append((max(g["last"] for g in mine) - t0) * 1000)
                figures[k]["client_cpu_ms"].append(sum(g["cpu_ms"] for g in mine))
            figures["rds"]["encodings"].append(rds_encodings() - rds0)
            figures["policy"]["encodings"].append(policy.encodings - pol0)
        profile.save()
    finally:
        for c in children:
            await c.close()
        await app.stop(grace=0.5)
        gctune.release_heap()
    return {"streams": args.streams, "channels": args.channels, "runs": args.runs,
            "client_processes": len(children), "client_nice": args.client_nice,
            "kinds": figures, "server_cpu_ms": cpu_ms, "apply_ms": apply_ms,
            "handed_over_ms": handed_ms, "handed_over_cpu_ms": handed_cpu_ms,
            "load_average": [round(load, 2), round(os.getloadavg()[0], 2)]}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    n = result["streams"]
    titles = {"rds": "Envoy RDS", "policy": "Linkerd OutboundPolicies"}
    return [row(f"route edit: one HTTPRoute change to {n:,} {titles[k]} streams (beside "
                f"{n:,} of the other kind)", "last stream has it",
                result["kinds"][k]["last_ms"], "ms", TARGET_MS if n == 1000 else None,
                encodings=result["kinds"][k]["encodings"],
                first_stream_ms=result["kinds"][k]["first_ms"],
                server_cpu_ms=result["server_cpu_ms"]) for k in KINDS]


def _median(values: list[float]) -> str:
    return (f"median {statistics.median(values):.1f} ms (min {min(values):.1f}, "
            f"max {max(values):.1f})")


def report(result: dict[str, Any]) -> str:
    lines = [f"route edit: {result['streams']:,} RDS + {result['streams']:,} OutboundPolicies "
             f"streams over {result['channels']} connections in "
             f"{result['client_processes']} client processes (nice +{result['client_nice']}),"
             f" {result['runs']} runs; load average {result['load_average'][0]} before, "
             f"{result['load_average'][1]} after"]
    for k in KINDS:
        fig = result["kinds"][k]
        lines.append(f"  {k}: first stream has it: {_median(fig['first_ms'])}")
        lines.append(f"  {k}: last stream has it:  {_median(fig['last_ms'])}")
        lines.append(f"  {k}: client CPU per edit: {_median(fig['client_cpu_ms'])}; "
                     f"encodings per edit {fig['encodings']}")
    lines.append(f"  server: apply (recompute, policy writes): {_median(result['apply_ms'])}")
    lines.append(f"  server: every message handed over: {_median(result['handed_over_ms'])}"
                 f"; its CPU (main thread) {_median(result['handed_over_cpu_ms'])}")
    lines.append(f"  server CPU per edit (both kinds, ACKs read): "
                 f"{_median(result['server_cpu_ms'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = parser("route_edit", __doc__)
    p.add_argument("--streams", type=int, default=1000, help="streams of each kind")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--channels", type=int, default=20,
                   help="client connections the streams are spread over (all processes)")
    p.add_argument("--procs", type=int, default=1,
                   help="client processes per kind (each kind has its own)")
    p.add_argument("--client-nice", type=int, default=5,
                   help="niceness the client processes add to their own")
    p.add_argument("--profile", metavar="FILE",
                   help="profile the server during the runs (pyinstrument) into FILE")
    client_arguments(p)
    p.add_argument("--kind", choices=KINDS, help=argparse.SUPPRESS)
    p.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--nice", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.client:
        os.nice(args.nice)
        return asyncio.run(run_client(args))
    if args.streams < 1 or args.procs < 1 or args.runs < 1:
        p.error("--streams, --procs and --runs must be >= 1")
    return finish("route_edit", asyncio.run(run_bench(args)), args.json, rows, report)


if __name__ == "__main__":
    sys.exit(main())
