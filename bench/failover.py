"""Failover: N delta xDS clients move from a replica that is killed to another.

    python -m bench.failover [--clients 5000] [--names 10] [--runs 3]

Two replicas (two meshbridge processes, each an App on the same seeded simulated
cluster: `--services` services of `--endpoints` endpoints) and one client process
whose N delta ADS streams (spread over `--channels` connections) each subscribe to
the EDS resources of `--names` services. Once every stream holds its resources, the
first replica is killed (SIGKILL); each client connection notices, reconnects to the
second replica and opens its streams again, either with what it holds in
`initial_resource_versions` (xDS §2, what Envoy does) or without (a full resend, what
a server that ignores those versions amounts to). The figures, per mode, are:

* the time from the kill until the second replica has every stream open, nothing
  due and every response it sent ACKed (every client current again);
* the xDS bytes the second replica sent (`meshbridge_xds_push_bytes`) and the
  server CPU it spent for the move.

Replica versions are content hashes (xDS §1.2), so a client that held the current
resources is sent nothing. Each run starts both replicas afresh; modes alternate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from functools import partial
from typing import Any

from bench.common import finish, parser, row
from testkit.polling import eventually
from testkit.processes import REPO, Child, commands, out_line

MODES = ("versions", "fresh")
ADS_DELTA = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


def target(i: int) -> str:
    return f"svc-{i}.ns-0.svc.cluster.local:8080"


def subscription(stream: int, names: int, services: int) -> list[str]:
    return [target((stream * names + k) % services) for k in range(names)]


# ---------------------------------------------------------------------- a replica


async def run_replica(args: argparse.Namespace) -> int:
    """One meshbridge replica: its ports on stdout, then `{"wait": N}` commands, each
    answered once N delta streams are open and current."""
    from bridge.sources.sim import Churn, ClusterShape, Scenario, SimCluster
    from meshbridge import gctune
    from meshbridge.log import configure_logging
    from testkit.serving import serve_objects
    from xds_api import resource_types as rt

    configure_logging("console", "warning")
    sim = SimCluster(Scenario(seed=5, cluster=ClusterShape(
        namespaces=1, services=args.services, endpoints_per_service=args.endpoints,
        zones=3), churn=Churn(rate=0)))
    app = await serve_objects(sim.initial_objects(), args.clients * 2 + 100)
    gctune.settle_heap()
    xds = app.service("xds")

    def pushed() -> float:
        return sum(app.metrics.get_sample_value("meshbridge_xds_push_bytes_total",
                                                {"type": t}) or 0.0 for t in ("eds",))

    def current(n: int) -> bool:
        runners = xds.runners
        if len(runners) < n:
            return False
        for r in runners:
            sub = r.stream.subs.get(rt.ENDPOINT)
            if (sub is None or len(sub.names) < args.names or sub.dirty or sub.must_reply
                    or sub.nonce != sub.answered or r.write_started is not None):
                return False
        return True

    out_line(port=app.grpc_port)
    reader = await commands()
    while line := await reader.readline():
        n = json.loads(line)["wait"]
        bytes0, cpu0 = pushed(), time.process_time()
        # Each look is O(streams): a period long enough that looking is not the cost.
        await eventually(partial(current, n), 600, "every stream current", period=0.05)
        out_line(at=time.monotonic(), bytes=pushed() - bytes0,
                 cpu_ms=(time.process_time() - cpu0) * 1e3)
    await app.stop(grace=0.5)
    return 0


# ---------------------------------------------------------------------- the clients


async def run_client(args: argparse.Namespace) -> int:
    """N delta streams on the first replica; when a connection is lost, its streams
    open again on the second, with or without what they hold (`--mode`)."""
    from envoy.service.discovery.v3 import discovery_pb2

    from bench.h2client import LeanConnection

    Response = discovery_pb2.DeltaDiscoveryResponse
    Request = discovery_pb2.DeltaDiscoveryRequest
    held: list[dict[str, str]] = [{} for _ in range(args.clients)]
    answered = [False] * args.clients
    first_answers = 0
    ready = asyncio.Event()
    reopened = 0

    async def open_streams(ci: int, port: int, versions: bool) -> asyncio.Future[None]:
        """Connection `ci`'s streams, opened on `port`; the future is done once the
        connection is lost."""
        nonlocal reopened
        by_sid: dict[int, int] = {}
        lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def on_message(sid: int, raw: bytes) -> None:
            nonlocal first_answers
            i = by_sid[sid]
            resp = Response.FromString(raw)
            if not answered[i]:
                answered[i] = True
                first_answers += 1
                if first_answers == args.clients:
                    ready.set()
            mine = held[i]
            for r in resp.resources:
                mine[r.name] = r.version
            for gone in resp.removed_resources:
                mine.pop(gone, None)
            conn.send(sid, Request(type_url=EDS, response_nonce=resp.nonce)
                      .SerializeToString())

        def on_end(_sid: int, status: str) -> None:
            if status.endswith("connection lost") and not lost.done():
                lost.set_result(None)

        conn = await LeanConnection.connect("127.0.0.1", port, on_message, on_end)
        for i in range(ci, args.clients, args.channels):
            req = Request(type_url=EDS, resource_names_subscribe=subscription(
                i, args.names, args.services))
            req.node.id = f"failover-{i}"
            if versions and held[i]:
                req.initial_resource_versions.update(held[i])
            by_sid[conn.open(ADS_DELTA, req.SerializeToString())] = i
            reopened += 1
        return lost

    losses = [await open_streams(ci, args.server, False) for ci in range(args.channels)]
    await asyncio.wait_for(ready.wait(), 600)
    out_line(ready=args.clients)
    reader = await commands()
    await reader.readline()  # the first replica is about to be killed
    reopened = 0

    async def follow(ci: int) -> None:
        # As a proxy does: a lost connection is opened again at once, elsewhere.
        await losses[ci]
        await open_streams(ci, args.fallback, args.mode == "versions")

    await asyncio.gather(*(follow(ci) for ci in range(args.channels)))
    out_line(moved=reopened)
    await reader.read()  # until the parent closes stdin
    return 0


# ---------------------------------------------------------------------- the parent


async def replica(args: argparse.Namespace) -> tuple[Child, int]:
    child = await Child.start("bench.failover", "--replica", *shape(args))
    return child, (await child.line())["port"]


def shape(args: argparse.Namespace) -> list[str]:
    return ["--clients", str(args.clients), "--names", str(args.names), "--services",
            str(args.services), "--endpoints", str(args.endpoints)]


async def one_move(args: argparse.Namespace, mode: str) -> dict[str, float]:
    a, a_port = await replica(args)
    b, b_port = await replica(args)
    client = await Child.start("bench.failover", *shape(args), "--server", str(a_port),
                               "--fallback", str(b_port), "--mode", mode,
                               "--channels", str(args.channels))
    try:
        await client.line(600)  # every stream holds its resources on the first replica
        await client.send(kill=True)
        await b.send(wait=args.clients)
        t0 = time.monotonic()
        a.proc.kill()
        await a.proc.wait()
        done = await b.line(600)
        await client.line(600)
        return {"seconds": done["at"] - t0, "bytes": done["bytes"], "cpu_ms": done["cpu_ms"]}
    finally:
        await client.close()
        await b.close()
        if a.proc.returncode is None:
            a.proc.kill()


async def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, dict[str, list[float]]] = {
        m: {"seconds": [], "bytes": [], "cpu_ms": []} for m in MODES}
    for _ in range(args.runs):
        for mode in MODES:
            got = await one_move(args, mode)
            for k, v in got.items():
                figures[mode][k].append(v)
    return {"clients": args.clients, "names": args.names, "services": args.services,
            "endpoints": args.endpoints, "channels": args.channels, "runs": args.runs,
            "figures": figures}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    f, n = result["figures"], result["clients"]
    out = []
    for mode, what in (("versions", "with initial_resource_versions"),
                       ("fresh", "full resend (no versions)")):
        out.append(row(f"failover: {n:,} delta clients move to another replica, {what}",
                       "until every client is current", f[mode]["seconds"], "s",
                       bytes_sent=f[mode]["bytes"], server_cpu_ms=f[mode]["cpu_ms"]))
    return out


def report(result: dict[str, Any]) -> str:
    f = result["figures"]
    lines = [f"failover: {result['clients']:,} delta clients x {result['names']} EDS names "
             f"({result['services']} services of {result['endpoints']} endpoints), "
             f"{result['runs']} runs"]
    for mode, what in (("versions", "with initial_resource_versions"),
                       ("fresh", "full resend")):
        m = {k: statistics.median(v) for k, v in f[mode].items()}
        lines.append(f"  {what}: every client current in {m['seconds']:.2f} s, "
                     f"{m['bytes'] / 1e6:.2f} MB of xDS sent, {m['cpu_ms']:.0f} ms server CPU")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = parser("failover", __doc__)
    p.add_argument("--clients", type=int, default=5000)
    p.add_argument("--names", type=int, default=10, help="EDS names per client")
    p.add_argument("--services", type=int, default=100)
    p.add_argument("--endpoints", type=int, default=10)
    p.add_argument("--channels", type=int, default=50)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--replica", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--server", type=int, help=argparse.SUPPRESS)
    p.add_argument("--fallback", type=int, help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=MODES, default="versions", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    os.chdir(REPO)
    if args.replica:
        return asyncio.run(run_replica(args))
    if args.client:
        return asyncio.run(run_client(args))
    return finish("failover", asyncio.run(run_bench(args)), args.json, rows, report)


if __name__ == "__main__":
    sys.exit(main())
