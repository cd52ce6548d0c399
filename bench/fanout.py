"""Fan-out: one endpoint change on a View that N streams of one protocol watch.

    python -m bench.fanout --protocol get|sotw|delta [--streams 5000] [--runs 7]
                           [--channels N] [--endpoints 10] [--workers 1] [--json]

meshbridge (both protocol layers, as `serve` mounts them) runs in this process; the
N client streams run in a child process on 127.0.0.1, spread over `--channels`
connections, each behaving as its proxy does (Linkerd `Get`: read; xDS SotW and
delta ADS: read and ACK every response). Each run scales the watched service up or
down by one pod, applied straight to the cluster cache, and measures the time from
that apply to the moment the *last* stream has decoded the resulting message
(CLOCK_MONOTONIC is one clock for both processes); the figure is the median over
the runs. Before each run the server is idle (every response ACKed, every queue
empty), so the runs do not overlap.

Memory per idle subscriber is the server's resident-memory growth per stream
between N/5 and N open streams (what is paid once, such as code and the first
caches, is not counted); server CPU per change is this process's CPU time (every
thread, gRPC's included) from the apply to the last stream having the change.

`--workers N` (xDS only) serves the port from N worker processes as `serve --workers
N` does (docs/workers.md): the change is applied in the watcher (this process), the
streams are the workers'; server CPU is the watcher's and every worker's together,
memory every process's resident memory added up, and the server is idle when every
stream has ACKed what it was sent (read from the workers' stream registries).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, NoReturn

import grpc

from bench.common import Profile, client_arguments, cpu_seconds, finish, parser, row
from meshbridge import eventloop, gctune
from meshbridge.eventloop import EVENT_LOOPS, default_loop
from testkit.polling import eventually
from testkit.processes import REPO, Child, commands, out_line, pid_rss_kib, rss_kib

PROTOCOLS = ("get", "sotw", "delta")
TITLES = {"get": "Linkerd Get", "sotw": "xDS SotW EDS", "delta": "xDS delta EDS"}
TARGET_MS = {"get": 250.0, "sotw": 300.0, "delta": 300.0}  # at 5,000 streams (issue 8)
TARGET_KIB = 20.0
TARGET_STREAMS = 5000
GET = "/io.linkerd.proxy.destination.Destination/Get"
ADS_SOTW = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
ADS_DELTA = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


def scenario(endpoints: int) -> Any:
    from bridge.sources.sim import Churn, ClusterShape, Scenario, SimCluster

    return SimCluster(Scenario(seed=5, cluster=ClusterShape(
        namespaces=1, services=1, endpoints_per_service=endpoints, zones=3),
        churn=Churn(rate=0)))


TARGET = "svc-0.ns-0.svc.cluster.local:8080"

# The client connections, by default. With workers the kernel gives each connection to
# a worker (SO_REUSEPORT hashes it), so the busiest worker's share of the streams is
# that of the connections: at 10,000 streams, 50 connections of 200 left it anywhere
# in 52-68%, 200 of 50 in 50-59%, for the same server CPU per change (a proxy fleet
# has a connection per proxy: more, with fewer streams each). Far more connections
# cost the server their writes (1,000 of 10: +35-40% of CPU). docs/performance.md.
STREAMS_PER_CHANNEL = 50
MIN_CHANNELS = 50


def default_channels(streams: int) -> int:
    return max(MIN_CHANNELS, streams // STREAMS_PER_CHANNEL)


# ---------------------------------------------------------------------- the client


class Arrivals:
    """What a client process reports. A stream's first message (its snapshot) counts
    it as open; message n >= 1 of every stream belongs to run n, which is reported
    (first and last arrival) once every stream has it."""

    def __init__(self, streams: int) -> None:
        self.streams = streams
        self.goal = 0
        self.opened = 0
        self.ready = asyncio.Event()  # `goal` streams are open
        self._received: dict[int, int] = {}
        self._first_at: dict[int, float] = {}
        self._wrong: dict[int, int] = {}  # per run: messages that did not say it

    def wrong(self, n: int) -> None:
        self._wrong[n] = self._wrong.get(n, 0) + 1

    def expect(self, goal: int) -> None:
        self.goal = goal
        self.ready.clear()

    def got(self, n: int, now: float) -> None:
        if n == 0:
            self.opened += 1
            if self.opened >= self.goal:
                self.ready.set()
            return
        count = self._received[n] = self._received.get(n, 0) + 1
        if count == 1:
            self._first_at[n] = now
        if count == self.streams:
            # The client's own CPU so far: between two runs it does nothing but take
            # one change (decode, ACK), so the difference is its CPU per change.
            out_line(run=n, first=self._first_at[n], last=now, cpu=time.process_time(),
                     wrong=self._wrong.get(n, 0))


async def run_client(args: argparse.Namespace) -> int:
    from envoy.service.discovery.v3 import discovery_pb2

    from linkerd_api.proto import destination_pb2

    options = [("grpc.use_local_subchannel_pool", 1),  # one connection per channel
               ("grpc.max_receive_message_length", 64 << 20)]
    channels = [grpc.aio.insecure_channel(args.server, options=options)
                for _ in range(args.channels)]
    arrivals = Arrivals(args.streams)
    got = arrivals.got

    get_request = destination_pb2.GetDestination(scheme="k8s", path=TARGET).SerializeToString()

    async def linkerd(i: int) -> None:
        call = channels[i % len(channels)].unary_stream(GET)(get_request)
        n = 0
        async for _raw in call:
            got(n, time.monotonic())
            n += 1

    async def ads(i: int, delta: bool) -> None:
        """An ADS stream on the target's CLA that ACKs every response, as Envoy does."""
        request: Any = discovery_pb2.DeltaDiscoveryRequest if delta \
            else discovery_pb2.DiscoveryRequest
        response: Any = discovery_pb2.DeltaDiscoveryResponse if delta \
            else discovery_pb2.DiscoveryResponse
        names = {"resource_names_subscribe" if delta else "resource_names": [TARGET]}
        call = channels[i % len(channels)].stream_stream(ADS_DELTA if delta else ADS_SOTW)()
        first = request(type_url=EDS, **names)
        first.node.id = f"bench-{i}"
        await call.write(first.SerializeToString())
        n = 0
        while (raw := await call.read()) is not grpc.aio.EOF:
            now = time.monotonic()
            resp = response.FromString(raw)
            got(n, now)
            n += 1
            # SotW: an ACK names the resources again, with the version; delta: the nonce.
            ack = request(type_url=EDS, response_nonce=resp.nonce) if delta else request(
                type_url=EDS, resource_names=[TARGET], version_info=resp.version_info,
                response_nonce=resp.nonce)
            await call.write(ack.SerializeToString())

    followers: dict[str, Callable[[int], Coroutine[Any, Any, None]]] = {
        "get": linkerd, "sotw": partial(ads, delta=False), "delta": partial(ads, delta=True)}
    follow = followers[args.protocol]
    tasks: list[asyncio.Task[None]] = []
    reader = await commands()
    for goal in (args.first_phase, args.streams):
        arrivals.expect(goal)
        tasks.extend(asyncio.create_task(follow(i)) for i in range(len(tasks), goal))
        await asyncio.wait_for(arrivals.ready.wait(), 300)
        out_line(ready=goal)
        await reader.readline()  # the parent has read the server's memory
    await reader.read()  # until the parent closes stdin
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in channels:
        await c.close(grace=None)
    return 0


def endpoints_in(n: int, endpoints: int) -> int:
    """The endpoints message n of every stream carries: run n scales the service up
    (odd n) or back down (even n) by one pod; the snapshot (n = 0) has them all."""
    return endpoints + n % 2


def sotw_reader(endpoints: int) -> Any:
    """The check of each SotW response (bench/sotw_check.py): the target's CLA, with
    the endpoints its change must give."""
    from envoy.config.endpoint.v3 import endpoint_pb2

    from bench.sotw_check import SotwReader

    def says(n: int, message: Any) -> bool:
        if len(message.resources) != 1:
            return False
        cla = endpoint_pb2.ClusterLoadAssignment.FromString(message.resources[0].value)
        count = sum(len(locality.lb_endpoints) for locality in cla.endpoints)
        return cla.cluster_name == TARGET and count == endpoints_in(n, endpoints)

    return SotwReader(EDS, [TARGET], says)


async def run_lean_client(args: argparse.Namespace) -> int:
    """The streams on bench/h2client.py: callbacks, no task per stream. `lean`: each
    SotW response checked (sotw_reader) and ACKed with the prebuilt ACK and its
    nonce; `decoding` (and delta, Get): each response decoded in full, each xDS one
    ACKed with a request built and encoded for it, as run_client does."""
    from envoy.service.discovery.v3 import discovery_pb2

    from bench.h2client import LeanConnection
    from linkerd_api.proto import destination_pb2

    host, port = args.server.rsplit(":", 1)
    arrivals = Arrivals(args.streams)
    got = arrivals.got

    SotwResponse = discovery_pb2.DiscoveryResponse
    DeltaResponse = discovery_pb2.DeltaDiscoveryResponse
    SotwRequest = discovery_pb2.DiscoveryRequest
    DeltaRequest = discovery_pb2.DeltaDiscoveryRequest
    conns: list[LeanConnection] = []
    checked = args.protocol == "sotw" and args.clients == "lean"
    reader = sotw_reader(args.endpoints)
    previous: dict[int, bytes] = {}  # --corrupt-run: the stream's message of the run before

    def on_message_of(ci: int) -> Any:
        seen: dict[int, int] = {}  # stream -> messages so far
        conn_send = conns[ci].send  # bound once: one attribute look-up less per message

        def on_message(sid: int, raw: bytes) -> None:
            n = seen[sid] = seen.get(sid, -1) + 1
            if checked:
                if args.corrupt_run and ci == 0 and sid == 1:
                    # Proof that a wrong message fails the run: this stream is handed
                    # the run before's message in place of run --corrupt-run's.
                    raw = previous.get(n - 1, raw) if n == args.corrupt_run else raw
                    previous[n] = raw
                ok, ack = reader.read(n, raw)
                if not ok:
                    arrivals.wrong(n)
                got(n, time.monotonic())
                conn_send(sid, ack)
            elif args.protocol == "sotw":
                resp = SotwResponse.FromString(raw)
                got(n, time.monotonic())
                conn_send(sid, SotwRequest(
                    type_url=EDS, resource_names=[TARGET], version_info=resp.version_info,
                    response_nonce=resp.nonce).SerializeToString())
            elif args.protocol == "delta":
                dresp = DeltaResponse.FromString(raw)
                got(n, time.monotonic())
                conn_send(sid, DeltaRequest(
                    type_url=EDS, response_nonce=dresp.nonce).SerializeToString())
            else:
                got(n, time.monotonic())
        return on_message

    def on_end(sid: int, status: str) -> None:
        return None  # streams end only when the run is over

    for ci in range(args.channels):
        # No message comes before a stream is opened: the callback is set right after.
        conns.append(await LeanConnection.connect(host, int(port), lambda *_: None, on_end))
        conns[ci].on_message = on_message_of(ci)
    get_request = destination_pb2.GetDestination(scheme="k8s", path=TARGET).SerializeToString()

    def first_request(i: int) -> bytes:
        if args.protocol == "get":
            return get_request
        if args.protocol == "sotw":
            first = SotwRequest(type_url=EDS, resource_names=[TARGET])
        else:
            first = DeltaRequest(type_url=EDS, resource_names_subscribe=[TARGET])
        first.node.id = f"bench-{i}"
        data: bytes = first.SerializeToString()
        return data

    path = {"get": GET, "sotw": ADS_SOTW, "delta": ADS_DELTA}[args.protocol]
    started = 0
    commands_in = await commands()
    profile = Profile(args.client_profile)
    for goal in (args.first_phase, args.streams):
        arrivals.expect(goal)
        for i in range(started, goal):
            conns[i % len(conns)].open(path, first_request(i), end_stream=args.protocol == "get")
        started = goal
        await asyncio.wait_for(arrivals.ready.wait(), 300)
        out_line(ready=goal)
        # The next streams open only once the parent has read the server's memory
        # with exactly these open.
        await commands_in.readline()
    await commands_in.read()  # until the parent closes stdin
    profile.save()
    for c in conns:
        c.close()
    return 0


def go_client_binary() -> str:
    """bench/sotw_client's executable (built from the Go module proxy and cached by
    scripts/bench_go.sh)."""
    out = subprocess.run(["bash", str(REPO / "scripts" / "bench_go.sh"), "sotw_client"],
                         check=True, stdout=subprocess.PIPE, text=True).stdout
    return out.strip().splitlines()[-1]


def run_go_client(args: argparse.Namespace) -> NoReturn:
    """`--clients go`: this client process becomes bench/sotw_client (same stdin and
    stdout, same lines), so the CPU it reports is the compiled client's alone."""
    binary = args.go_binary or go_client_binary()
    os.execv(binary, [binary, "-server", args.server, "-target", TARGET,
                      "-streams", str(args.streams), "-first-phase", str(args.first_phase),
                      "-channels", str(args.channels), "-endpoints", str(args.endpoints),
                      "-corrupt-run", str(args.corrupt_run)])


# ---------------------------------------------------------------------- the server


def idle_check(app: Any, protocol: str) -> Any:
    """True when the server has nothing left to do for the streams: every xDS
    response ACKed, every Linkerd queue empty."""
    if protocol == "get":
        streams = app.service("linkerd").streams
        return lambda: all(len(q) == 0 for q in streams)
    from xds_api import resource_types as rt

    runners = app.service("xds").runners

    def idle() -> bool:
        for r in runners:
            sub = r.stream.subs.get(rt.ENDPOINT)
            if sub is None or sub.acked_version != sub.version_sent or r.write_started:
                return False
        return True

    return idle


def open_streams(app: Any, protocol: str) -> int:
    counts = app.streams.counts()
    return int(counts.get(STREAM_PROTOCOL[protocol], 0))


STREAM_PROTOCOL = {"get": "linkerd-get", "sotw": "xds-sotw", "delta": "xds-delta"}


def settled_over_workers(app: Any, protocol: str, n: int) -> Callable[[], Any]:
    """With workers: at least `n` streams open, and every one has ACKed what it was
    sent (each worker's summary of its stream registry: a few numbers per look, where
    copying 10,000 entries over the channel cost the workers more than a change)."""
    async def settled() -> bool:
        summaries = await app.watcher.pool.ask("streams.synced")
        counts = [s.get(STREAM_PROTOCOL[protocol], (0, 0)) for s in summaries]
        return len(summaries) == app.watcher.pool.count and \
            sum(c[0] for c in counts) >= n and all(c[0] == c[1] for c in counts)
    return settled


async def server_cpu(app: Any) -> list[float]:
    """CPU seconds of this process and, with workers, of each worker (in order)."""
    cpu = [cpu_seconds()]
    if app.watcher is not None and app.watcher.pool is not None:
        cpu += [s["cpu"] for s in await app.watcher.pool.ask("stats")]
    return cpu


def channel_sent(app: Any) -> int:
    """Bytes the watcher has sent its workers so far (0 without workers)."""
    if app.watcher is None or app.watcher.pool is None:
        return 0
    return sum(link.sent_bytes for link in app.watcher.pool.links())


def server_rss_kib(app: Any) -> int:
    """Resident memory of this process and, with workers, of every worker."""
    total = rss_kib()
    if app.watcher is not None and app.watcher.pool is not None:
        for pid in app.watcher.pool.pids():
            total += pid_rss_kib(pid)
    return total


async def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    from meshbridge.log import configure_logging
    from testkit.serving import serve_objects

    configure_logging("console", "warning")
    if args.workers > 1 and args.protocol == "get":
        raise SystemExit("--workers above 1 measures the xDS protocols (their ACKs say "
                         "when every worker is idle)")
    go_binary = go_client_binary() if args.clients == "go" else None  # built before serving
    sim = scenario(args.endpoints)
    app = await serve_objects(sim.initial_objects(), args.streams * 2 + 100,
                              workers=args.workers)
    gctune.settle_heap()  # as `meshbridge serve` does once synced
    child: Child | None = None
    try:
        gc.collect()
        rss0 = server_rss_kib(app)
        if args.trace_memory:
            tracemalloc.start()
        child = await Child.start(
            "bench.fanout", "--protocol", args.protocol, "--server",
            f"127.0.0.1:{app.grpc_port}", "--streams", str(args.streams),
            "--first-phase", str(max(1, args.streams // 5)), "--channels", str(args.channels),
            "--clients", args.clients, "--endpoints", str(args.endpoints),
            "--corrupt-run", str(args.corrupt_run),
            *(("--go-binary", go_binary) if go_binary else ()),
            *(("--client-profile", args.client_profile) if args.client_profile else ()))
        workers = args.workers > 1
        idle: Callable[[], Any] = (settled_over_workers(app, args.protocol, 0) if workers
                                   else idle_check(app, args.protocol))
        period = 0.2 if workers else 0.02  # with workers, each look reads every stream
        readings = []
        for _phase in range(2):
            ready: int = (await child.line())["ready"]

            def settled(n: int = ready) -> Any:
                if workers:
                    return settled_over_workers(app, args.protocol, n)()
                return open_streams(app, args.protocol) >= n and idle()
            await eventually(settled, 120, "streams open and idle", period)
            gc.collect()
            readings.append((ready, server_rss_kib(app), tracemalloc.get_traced_memory()[0]))
            await child.send(next=True)
        tracemalloc.stop()
        (n1, rss1, heap1), (n2, rss2, heap2) = readings
        # How the kernel spread the connections (SO_REUSEPORT hashes them): the worker
        # with the most streams bounds the fan-out.
        pool = app.watcher.pool if app.watcher is not None else None
        split = [s.get(STREAM_PROTOCOL[args.protocol], (0, 0))[0]
                 for s in await pool.ask("streams.synced")] if pool is not None else []
        svc = sim.services[0]
        latencies, firsts, cpu_ms, client_cpu_ms = [], [], [], []
        process_cpu_ms: list[list[float]] = []  # per run: the watcher's, each worker's
        channel_bytes: list[int] = []  # per run: what the watcher sent the workers
        client_cpu: float | None = None
        profile = Profile(args.profile)
        for run in range(1, args.runs + 1):
            await eventually(idle, 120, "server idle before a run", period)
            # Alternate up and down so the View keeps its size.
            events = sim._step_scale(svc, up=run % 2 == 1)
            cpu0 = await server_cpu(app)
            sent0 = channel_sent(app)
            t0 = time.monotonic()
            app.cluster.apply(events)
            got = await child.line()
            cpu1 = await server_cpu(app)
            channel_bytes.append(channel_sent(app) - sent0)
            process_cpu_ms.append([(b - a) * 1000 for a, b in zip(cpu0, cpu1, strict=True)])
            cpu_ms.append(sum(process_cpu_ms[-1]))
            assert got["run"] == run, got
            if got.get("wrong"):
                raise SystemExit(f"fan-out run {run}: {got['wrong']} of {args.streams} "
                                 "streams were sent a message that does not say the change")
            if client_cpu is not None and "cpu" in got:
                client_cpu_ms.append((got["cpu"] - client_cpu) * 1000)
            client_cpu = got.get("cpu")
            latencies.append((got["last"] - t0) * 1000)
            firsts.append((got["first"] - t0) * 1000)
        profile.save()
    finally:
        if child is not None:
            await child.close()
        await app.stop(grace=0.5)
        gctune.release_heap()
    return {
        "protocol": args.protocol, "streams": args.streams, "channels": args.channels,
        "workers": args.workers,
        "clients": args.clients, "event_loop": args.event_loop,
        "endpoints": args.endpoints, "runs": args.runs,
        "all_received_ms": latencies, "first_received_ms": firsts,
        "server_cpu_ms": cpu_ms,
        "process_cpu_ms": process_cpu_ms,
        "channel_bytes": channel_bytes,
        "streams_per_worker": split,
        # The load client's CPU per change (runs 2 on; it shares the cores).
        "client_cpu_ms": client_cpu_ms,
        "memory_per_idle_stream_kib": (rss2 - rss1) / (n2 - n1),
        "python_heap_per_idle_stream_kib": ((heap2 - heap1) / 1024 / (n2 - n1)
                                            if args.trace_memory else None),
        "server_rss_mib": {"start": rss0 / 1024, "first_phase": rss1 / 1024,
                           "all": rss2 / 1024},
    }


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    p, n = result["protocol"], result["streams"]
    target = TARGET_MS[p] if n == TARGET_STREAMS else None
    clients = {"lean": "", "go": ", Go clients", "decoding": ", decoding clients"}.get(
        result.get("clients", "lean"), ", grpc.aio clients")
    workers = result.get("workers", 1)
    if workers > 1:
        clients += f", {workers} workers"
    out = [row(f"fan-out: one change to {n:,} {TITLES[p]} streams{clients}",
               "last stream has it", result["all_received_ms"], "ms", target,
               first_ms=result["first_received_ms"], server_cpu_ms=result["server_cpu_ms"])]
    return out


def report(result: dict[str, Any]) -> str:
    import statistics

    lat = result["all_received_ms"]
    return "\n".join([
        f"fan-out: {result['streams']:,} {TITLES[result['protocol']]} streams over "
        f"{result['channels']} connections ({result.get('clients', 'grpcio')} clients), "
        f"{result.get('workers', 1)} worker(s), one "
        f"View of {result['endpoints']} endpoints, {result['runs']} runs, "
        f"{result.get('event_loop', 'asyncio')} loop",
        f"  last stream has the change: median {statistics.median(lat):.1f} ms "
        f"(min {min(lat):.1f}, max {max(lat):.1f})",
        f"  first stream has it: median {statistics.median(result['first_received_ms']):.1f}"
        " ms",
        f"  server CPU per change: median {statistics.median(result['server_cpu_ms']):.1f} ms"
        + (f"; the load client's: {statistics.median(result['client_cpu_ms']):.1f} ms"
           if result.get("client_cpu_ms") else "")
        + ("\n  by process (watcher, worker 1, ...): "
           + " / ".join(f"{statistics.median(p):.1f}"
                        for p in zip(*result["process_cpu_ms"], strict=True))
           + f" ms; channel {statistics.median(result['channel_bytes']):,.0f} bytes per change"
           + f"; streams per worker {result['streams_per_worker']}"
           if result.get("workers", 1) > 1 else ""),
        f"  memory per idle stream: {result['memory_per_idle_stream_kib']:.1f} KiB "
        f"(server RSS {result['server_rss_mib']['start']:.0f} -> "
        f"{result['server_rss_mib']['all']:.0f} MiB)"
        + (f", Python heap {result['python_heap_per_idle_stream_kib']:.1f} KiB of it"
           if result["python_heap_per_idle_stream_kib"] is not None else ""),
    ])


def main(argv: list[str] | None = None) -> int:
    p = parser("fanout", __doc__)
    p.add_argument("--protocol", choices=PROTOCOLS, default="get")
    p.add_argument("--streams", type=int, default=TARGET_STREAMS)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--channels", type=int,
                   help="client connections the streams are spread over (default: one "
                        f"per {STREAMS_PER_CHANNEL} streams, at least {MIN_CHANNELS})")
    p.add_argument("--endpoints", type=int, default=10)
    p.add_argument("--profile", metavar="FILE",
                   help="profile the server during the runs (pyinstrument) into FILE")
    p.add_argument("--trace-memory", action="store_true",
                   help="also measure the Python heap per stream (tracemalloc; slower)")
    p.add_argument("--clients", choices=("go", "lean", "decoding", "grpcio"),
                   help="the client streams: SotW's check (the first response of a change "
                        "decoded in full, the others compared by their bytes) and ACKs, "
                        "compiled (go: bench/sotw_client, built by scripts/bench_go.sh; "
                        "the default for SotW, which it alone speaks); the same in "
                        "bench/h2client.py's Python callbacks (lean, the default for Get "
                        "and delta, which it decodes in full); the same callbacks "
                        "decoding and re-encoding every message (decoding, the client "
                        "until 2026-12-02); or one grpc.aio call and task per stream "
                        "(grpcio)")
    p.add_argument("--corrupt-run", type=int, default=0, metavar="N",
                   help="(proof of the check) one SotW stream is handed run N-1's message "
                        "in place of run N's: the run must fail")
    p.add_argument("--client-profile", metavar="FILE",
                   help="profile the load client process (pyinstrument) into FILE")
    p.add_argument("--workers", type=int, default=1,
                   help="worker processes serving the port (xDS only; docs/workers.md)")
    p.add_argument("--event-loop", choices=EVENT_LOOPS, default=default_loop(),
                   help="the server's event loop (the client's is always asyncio's)")
    client_arguments(p)
    p.add_argument("--first-phase", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--go-binary", help=argparse.SUPPRESS)  # the parent built it
    args = p.parse_args(argv)
    if args.channels is None:
        args.channels = default_channels(args.streams)
    if args.clients is None:
        args.clients = "go" if args.protocol == "sotw" else "lean"
    if args.clients == "go" and args.protocol != "sotw":
        p.error("--clients go speaks SotW only")
    if args.client and args.clients == "go":
        run_go_client(args)  # does not return: this process becomes the Go client
    if args.client:
        return asyncio.run(run_client(args) if args.clients == "grpcio"
                           else run_lean_client(args))
    return finish("fanout", eventloop.run(run_bench(args), args.event_loop), args.json, rows,
                  report)


if __name__ == "__main__":
    sys.exit(main())
