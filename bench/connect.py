"""Connect storm: thousands of proxies connecting at the same moment (a restart of the
control plane, or of a whole node pool), each needing its full snapshot.

    python -m bench.connect [--clients 5000] [--targets 2] [--services 1000]
                            [--endpoints 20] [--procs 2] [--runs 3] [--json]

meshbridge serves a static sim cluster (`--services` x `--endpoints`) in this process.
`--procs` client processes on 127.0.0.1 hold the clients between them, a third each of
Linkerd (one Get stream per target), xDS SotW and xDS delta (one ADS stream naming all
its targets), every client on its own connection, following `--targets` services
picked at random. On "go" every client connects at once; the figure is the time from
"go" to the moment the *last* client holds every endpoint of every target (each
client decodes what it receives and checks it has all `--endpoints` of each). Between
runs every client disconnects and the server is left to drop every stream.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import random
import statistics
import sys
import time
from typing import Any

import grpc
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2

from bench.common import GcPauses, client_arguments, cpu_seconds, finish, parser, row
from bench.h2client import LeanConnection
from linkerd_api.proto import destination_pb2
from meshbridge import gctune
from testkit.polling import eventually
from testkit.processes import Child, commands, out_line

TARGET_S = 5.0
TARGET_CLIENTS = 5000
MODELS = ("linkerd", "sotw", "delta")
GET = "/io.linkerd.proxy.destination.Destination/Get"
ADS_SOTW = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
ADS_DELTA = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


def targets_of(index: int, services: int, targets: int) -> list[str]:
    rng = random.Random(index * 7919 + 1)
    return [f"svc-{i}.ns-{i % 10}.svc.cluster.local:8080"
            for i in sorted(rng.sample(range(services), targets))]


# ---------------------------------------------------------------------- clients


async def run_client(args: argparse.Namespace) -> int:
    from harness.compare.worker import ClaStates

    reader = await commands()
    states = ClaStates()
    gctune.settle_heap()  # the measuring clients' own GC pauses are not the server's
    mine = [i for i in range(args.clients) if i % args.procs == args.proc]
    out_line(ready=len(mine))
    while (line := await reader.readline()):
        t0 = json.loads(line)["t0"]
        if args.clients_kind == "lean":
            await one_round_lean(args, mine, t0)
        else:
            await one_round(args, mine, states, t0)
    return 0


def report_round(done_at: list[float], clients: int, t0: float, cpu0: float,
                 pauses: GcPauses) -> None:
    """This process's figures for one round: when its clients were done, its CPU, its
    GC pauses."""
    out_line(complete=len(done_at), clients=clients,
             last=max(done_at) - t0 if done_at else None,
             first=min(done_at) - t0 if done_at else None,
             median=statistics.median(done_at) - t0 if done_at else None,
             cpu_s=cpu_seconds() - cpu0, gc=pauses.figures())


async def one_round(args: argparse.Namespace, mine: list[int], states: Any,
                    t0: float) -> None:
    """Connect every client of this process at once, report, then disconnect all."""
    from harness.clients import LinkerdClient, XdsClient

    channels: list[grpc.aio.Channel] = []
    clients: list[Any] = []
    tasks: list[asyncio.Task[None]] = []
    done_at: list[float] = []
    options = [("grpc.use_local_subchannel_pool", 1)]

    async def follow(i: int) -> None:
        channel = grpc.aio.insecure_channel(args.server, options=options)
        channels.append(channel)
        targets = targets_of(i, args.services, args.targets)
        model = MODELS[i % 3]
        client: Any
        if model == "linkerd":
            client = LinkerdClient(channel, targets, i)
            events = list(client.first_message.values())
        else:
            client = XdsClient(channel, targets, i, delta=model == "delta",
                               node_id=f"connect-{i}", normalize=states)
            events = [client.all_received]
        clients.append(client)
        tasks.append(asyncio.create_task(client.run()))
        for ev in events:
            await ev.wait()
        if all(len(client.state[t].endpoints) == args.endpoints for t in targets):
            done_at.append(time.monotonic())

    cpu0 = cpu_seconds()
    with GcPauses() as pauses:
        waiters = [asyncio.create_task(follow(i)) for i in mine]
        _, pending = await asyncio.wait(waiters, timeout=args.timeout)
    report_round(done_at, len(mine), t0, cpu0, pauses)
    for w in pending:
        w.cancel()
    for c in clients:
        if isinstance(c, XdsClient):
            await c.close()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, *pending, return_exceptions=True)
    for ch in channels:
        await ch.close(grace=None)
    for held in (channels, clients, tasks, waiters):
        held.clear()
    gc.collect()  # this round's clients are garbage: not the next round's pauses
    out_line(closed=True)


class LeanClient:
    """One proxy on bench/h2client.py, on its own connection: a Get stream per target
    (Linkerd) or one ADS stream naming every target (xDS). Every message is decoded,
    every xDS response ACKed; it is done once it holds every endpoint of every target."""

    def __init__(self, index: int, targets: list[str], endpoints: int,
                 done: Any) -> None:
        self.index = index
        self.model = MODELS[index % 3]
        self.targets = targets
        self.endpoints = endpoints
        self.held: dict[str, set[tuple[object, int]]] = {t: set() for t in targets}
        self.by_stream: dict[int, str] = {}
        self.conn: Any = None
        self._done = done
        self.finished = False

    async def start(self, host: str, port: int) -> None:
        self.conn = await LeanConnection.connect(host, port, self.on_message, self.on_end)
        if self.model == "linkerd":
            for t in self.targets:
                sid = self.conn.open(GET, destination_pb2.GetDestination(
                    scheme="k8s", path=t).SerializeToString(), end_stream=True)
                self.by_stream[sid] = t
            return
        if self.model == "sotw":
            first: Any = discovery_pb2.DiscoveryRequest(type_url=EDS,
                                                        resource_names=self.targets)
        else:
            first = discovery_pb2.DeltaDiscoveryRequest(
                type_url=EDS, resource_names_subscribe=self.targets)
        first.node.id = f"connect-{self.index}"
        self.conn.open(ADS_SOTW if self.model == "sotw" else ADS_DELTA,
                       first.SerializeToString())

    def on_message(self, sid: int, raw: bytes) -> None:
        if self.model == "linkerd":
            update = destination_pb2.Update.FromString(raw)
            held = self.held[self.by_stream[sid]]
            kind = update.WhichOneof("update")
            if kind == "add":
                held.update((_ip(a.addr.ip), a.addr.port) for a in update.add.addrs)
            elif kind == "remove":
                held.difference_update((_ip(a.ip), a.port) for a in update.remove.addrs)
            else:
                held.clear()
        else:
            if self.model == "sotw":
                resp: Any = discovery_pb2.DiscoveryResponse.FromString(raw)
                values = [r.value for r in resp.resources]
                ack: Any = discovery_pb2.DiscoveryRequest(
                    type_url=EDS, resource_names=self.targets,
                    version_info=resp.version_info, response_nonce=resp.nonce)
            else:
                resp = discovery_pb2.DeltaDiscoveryResponse.FromString(raw)
                values = [r.resource.value for r in resp.resources]
                ack = discovery_pb2.DeltaDiscoveryRequest(type_url=EDS,
                                                          response_nonce=resp.nonce)
            for value in values:
                cla = endpoint_pb2.ClusterLoadAssignment.FromString(value)
                if cla.cluster_name in self.held:
                    self.held[cla.cluster_name] = {
                        (lb.endpoint.address.socket_address.address,
                         lb.endpoint.address.socket_address.port_value)
                        for loc in cla.endpoints for lb in loc.lb_endpoints}
            self.conn.send(sid, ack.SerializeToString())
        if not self.finished and all(len(h) == self.endpoints for h in self.held.values()):
            self.finished = True
            self._done(time.monotonic())

    def on_end(self, sid: int, status: str) -> None:
        return None  # a stream ending early leaves the client unfinished: counted as such


def _ip(ip: Any) -> tuple[int, ...]:
    return (ip.ipv4,) if ip.HasField("ipv4") else (ip.ipv6.first, ip.ipv6.last)


async def one_round_lean(args: argparse.Namespace, mine: list[int], t0: float) -> None:
    """one_round, with LeanClients: the clients' own cost is a fraction of grpc.aio's."""
    host, port = args.server.rsplit(":", 1)
    done_at: list[float] = []
    all_done = asyncio.Event()

    def done(at: float) -> None:
        done_at.append(at)
        if len(done_at) == len(mine):
            all_done.set()

    clients = [LeanClient(i, targets_of(i, args.services, args.targets), args.endpoints,
                          done) for i in mine]
    cpu0 = cpu_seconds()
    with GcPauses() as pauses:
        starts = [asyncio.create_task(c.start(host, int(port))) for c in clients]
        with contextlib.suppress(TimeoutError):  # reported as incomplete
            await asyncio.wait_for(all_done.wait(), args.timeout)
    report_round(done_at, len(mine), t0, cpu0, pauses)
    for t in starts:
        t.cancel()
    for c in clients:
        if c.conn is not None:
            c.conn.close()
    clients.clear()
    gc.collect()
    out_line(closed=True)


# ---------------------------------------------------------------------- server


async def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    from bridge.sources.sim import Churn, ClusterShape, Scenario, SimCluster
    from meshbridge.log import configure_logging
    from testkit.serving import serve_objects

    configure_logging("console", "warning")
    sim = SimCluster(Scenario(seed=9, cluster=ClusterShape(
        namespaces=10, services=args.services, endpoints_per_service=args.endpoints,
        zones=3), churn=Churn(rate=0)))
    app = await serve_objects(sim.initial_objects(), args.clients * args.targets + 100)
    gctune.settle_heap()  # as `meshbridge serve` does once synced
    children: list[Child] = []
    runs: list[dict[str, Any]] = []
    try:
        for k in range(args.procs):
            children.append(await Child.start(
                "bench.connect", "--server", f"127.0.0.1:{app.grpc_port}",
                "--clients", str(args.clients), "--targets", str(args.targets),
                "--services", str(args.services), "--endpoints", str(args.endpoints),
                "--procs", str(args.procs), "--proc", str(k),
                "--timeout", str(args.timeout), "--clients-kind", args.clients_kind))
        for c in children:
            await c.line()
        for _ in range(args.runs):
            t0, cpu0 = time.monotonic(), cpu_seconds()
            with GcPauses() as pauses:
                for c in children:
                    await c.send(t0=t0)
                parts = [await c.line(args.timeout + 120) for c in children]
            server_cpu = cpu_seconds() - cpu0
            complete = sum(p["complete"] for p in parts)
            lasts = [p["last"] for p in parts if p["last"] is not None]
            runs.append({"complete": complete, "clients": args.clients,
                         "last_s": max(lasts) if lasts and complete == args.clients
                         else None,
                         "median_s": statistics.median(
                             [p["median"] for p in parts if p["median"] is not None] or [0]),
                         # CPU seconds and GC pauses until every client process reported
                         "server_cpu_s": server_cpu, "server_gc": pauses.figures(),
                         "client_cpu_s": [p["cpu_s"] for p in parts],
                         "client_gc": [p["gc"] for p in parts]})
            for c in children:
                await c.line(120)
            await eventually(lambda: len(app.streams) == 0, 120, "every stream dropped", 0.05)
            gc.collect()  # the dropped streams are garbage: not the next round's pauses
    finally:
        for c in children:
            await c.close()
        await app.stop(grace=0.5)
        gctune.release_heap()
    return {"clients": args.clients, "clients_kind": args.clients_kind,
            "targets": args.targets, "services": args.services,
            "endpoints": args.endpoints, "procs": args.procs, "runs": runs}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    n = result["clients"]
    lasts = [r["last_s"] if r["last_s"] is not None else float("inf")
             for r in result["runs"]]
    kind = "" if result.get("clients_kind", "lean") == "lean" else ", grpc.aio clients"
    return [row(f"{n:,} clients connecting at once ({result['targets']} targets each{kind})",
                "last client has its full snapshot", lasts, "s",
                TARGET_S if n == TARGET_CLIENTS else None,
                complete=[r["complete"] for r in result["runs"]])]


def report(result: dict[str, Any]) -> str:
    runs = result["runs"]
    lasts = [r["last_s"] for r in runs]
    shown = ", ".join("-" if x is None else f"{x:.2f}" for x in lasts)
    ok = [x for x in lasts if x is not None]
    return "\n".join([
        f"connect storm: {result['clients']:,} clients (Linkerd, SotW, delta in thirds) x "
        f"{result['targets']} targets over {result['procs']} client processes "
        f"({result.get('clients_kind', 'grpcio')} clients), "
        f"{len(runs)} runs",
        f"  last client has its full snapshot: median "
        f"{statistics.median(ok) if len(ok) == len(lasts) else float('nan'):.2f} s "
        f"(runs: {shown}); target <= {TARGET_S:g} s",
        f"  complete: {', '.join(str(r['complete']) for r in runs)} of {result['clients']}",
    ])


def main(argv: list[str] | None = None) -> int:
    p = parser("connect", __doc__)
    p.add_argument("--clients", type=int, default=TARGET_CLIENTS)
    p.add_argument("--targets", type=int, default=2)
    p.add_argument("--services", type=int, default=1000)
    p.add_argument("--endpoints", type=int, default=20)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--clients-kind", choices=("lean", "grpcio"), default="lean",
                   help="the clients: bench/h2client.py (default) or grpc.aio channels "
                        "(harness/clients.py)")
    client_arguments(p)
    p.add_argument("--proc", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.client:
        return asyncio.run(run_client(args))
    return finish("connect", asyncio.run(run_bench(args)), args.json, rows, report)


if __name__ == "__main__":
    sys.exit(main())
