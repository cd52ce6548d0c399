"""xDS fan-out: one endpoint change on a View watched by many SotW EDS streams.

    python -m bench.xds_fanout [--streams 5000] [--runs 7] [--channels 50] [--no-floor]

meshbridge runs in this process; the client load (grpc.aio, one ADS stream per
simulated client, each ACKing every response as Envoy and gRPC do) runs in a separate
process on 127.0.0.1. For each run one endpoint is added to or removed from the
watched service, and the figure is the time from that change entering the cluster
cache to the moment the *last* stream has received the new assignment
(CLOCK_MONOTONIC is shared by both processes); the median of the runs is reported.

Memory per idle ADS stream is the server's resident-memory growth per stream between
two stream counts (1/5 and all of them), so what is paid once is not counted.

The same client is then run against a bare grpc.aio server that does nothing but
write a fixed response on each change and read the ACKs: the floor that gRPC itself
sets on this machine, so that what meshbridge adds can be told from what it cannot
avoid.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

from bridge.cluster import Event, EventType
from bridge.objects import decode_object
from bridge.sources.files import FilesSource
from meshbridge.app import App, ServeOptions
from meshbridge.limits import Limits
from meshbridge.log import configure_logging
from xds_api import resource_types as rt
from xds_api import service as xds_service

NAME = "fan.bench.svc.cluster.local:80"
TARGET_MS = 300.0
TARGET_KIB = 20.0
ADS_SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"


def objects(docs: list[dict[str, Any]]) -> list[Event]:
    out = []
    for d in docs:
        obj = decode_object(d)
        assert obj is not None
        out.append(Event(EventType.MODIFIED, obj))
    return out


def manifests(endpoints: int) -> list[dict[str, Any]]:
    return [
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "fan", "namespace": "bench"},
         "spec": {"clusterIP": "10.96.0.99",
                  "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}},
        {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
         "metadata": {"name": "fan-1", "namespace": "bench",
                      "labels": {"kubernetes.io/service-name": "fan"}},
         "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}],
         "endpoints": [{"addresses": [f"10.9.0.{i + 1}"], "conditions": {"ready": True},
                        "zone": f"zone-{'abc'[i % 3]}"} for i in range(endpoints)]},
    ]


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# ---------------------------------------------------------------------- the client


async def run_client(args: argparse.Namespace) -> int:
    """Open the streams in two phases, then report when every stream has each update."""
    options = [("grpc.use_local_subchannel_pool", 1)]  # one connection per channel
    channels = [grpc.aio.insecure_channel(args.server, options=options)
                for _ in range(args.channels)]
    stubs = [ads_pb2_grpc.AggregatedDiscoveryServiceStub(c) for c in channels]
    received: dict[int, int] = {}
    first_at: dict[int, float] = {}
    ready = asyncio.Event()
    opened = 0
    target = 0
    cpu = time.process_time()

    def out(**fields: Any) -> None:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()

    async def watch(i: int) -> None:
        nonlocal opened, cpu
        call = stubs[i % len(stubs)].StreamAggregatedResources()
        req = discovery_pb2.DiscoveryRequest(type_url=rt.ENDPOINT, resource_names=[NAME])
        req.node.id = f"bench-{i}"
        await call.write(req)
        n = 0
        while True:
            resp = await call.read()
            now = time.monotonic()
            if resp is grpc.aio.EOF:
                return
            if n == 0:
                opened += 1
                if opened == target:
                    ready.set()
            else:
                received[n] = received.get(n, 0) + 1
                first_at.setdefault(n, now)
                if received[n] == args.streams:
                    spent, cpu = time.process_time() - cpu, time.process_time()
                    out(run=n, first=first_at[n], last=now, cpu=spent)
            n += 1
            await call.write(discovery_pb2.DiscoveryRequest(
                type_url=rt.ENDPOINT, resource_names=[NAME], version_info=resp.version_info,
                response_nonce=resp.nonce))

    tasks: list[asyncio.Task[None]] = []
    for target in (args.first_phase, args.streams):
        ready.clear()
        tasks.extend(asyncio.create_task(watch(i)) for i in range(len(tasks), target))
        await ready.wait()
        cpu = time.process_time()
        out(ready=target)
    # Run until the parent closes stdin.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for c in channels:
        await c.close()
    return 0


# ---------------------------------------------------------------------- the servers


class Target(Protocol):
    name: str
    port: int

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def change(self, run: int) -> None: ...

    def settled(self, streams: int) -> bool:
        """At least `streams` streams, each having ACKed all it was sent."""


class Meshbridge:
    name = "meshbridge"

    def __init__(self, endpoints: int, tmp: Path) -> None:
        self.docs = manifests(endpoints)
        (tmp / "fan.json").write_text(json.dumps(self.docs[0]))
        # The slice is applied directly, so that each change has a precise start.
        self.app = App(FilesSource(tmp, poll_interval=3600), None,
                       ServeOptions("127.0.0.1:0", "127.0.0.1:0", {}), [xds_service.register])
        self.port = 0

    async def start(self) -> None:
        await self.app.start()
        self.port = self.app.grpc_port
        self.app.cluster.apply(objects(self.docs[1:]))

    async def stop(self) -> None:
        await self.app.stop(grace=0.5)

    def change(self, run: int) -> None:
        slice_doc = self.docs[1]
        extra = {"addresses": ["10.9.1.1"], "conditions": {"ready": True}, "zone": "zone-a"}
        eps = list(slice_doc["endpoints"]) + ([extra] if run % 2 else [])
        self.app.cluster.apply(objects([dict(slice_doc, endpoints=eps)]))

    def settled(self, streams: int) -> bool:
        runners = self.app.service("xds").runners
        done = sum(1 for r in runners if (s := r.stream.subs.get(rt.ENDPOINT)) is not None
                   and s.acked_version and s.acked_version == s.version_sent)
        return done >= streams

    def encodings(self) -> float:
        return self.app.metrics.get_sample_value(
            "meshbridge_xds_serializations_total", {"type": "eds"}) or 0.0


class Bare:
    """grpc.aio's own floor: the same wire traffic and nothing else. Each stream reads
    its request, writes a fixed response (a real CLA of the same size) on each change,
    and reads ACKs."""

    name = "bare grpc.aio"

    def __init__(self, response: bytes) -> None:
        self.response = response
        self.waiters: list[asyncio.Future[None]] = []
        self.acked: dict[int, bool] = {}
        self.server = grpc.aio.server(options=Limits().server_options())
        self.port = 0

    async def _handler(self, _requests: Any, context: grpc.aio.ServicerContext) -> None:
        loop = asyncio.get_running_loop()
        key = id(context)

        async def writer() -> None:
            while True:
                waiter = loop.create_future()
                self.waiters.append(waiter)
                await waiter
                self.acked[key] = False
                await context.write(self.response)

        await context.read()
        await context.write(self.response)
        task = asyncio.create_task(writer())
        try:
            while await context.read() is not grpc.aio.EOF:
                self.acked[key] = True
        finally:
            task.cancel()
            self.acked.pop(key, None)

    async def start(self) -> None:
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            ADS_SERVICE, {"StreamAggregatedResources":
                          grpc.stream_stream_rpc_method_handler(self._handler)}),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()

    async def stop(self) -> None:
        await self.server.stop(0.5)

    def change(self, run: int) -> None:
        waiters, self.waiters = self.waiters, []
        for w in waiters:
            w.set_result(None)

    def settled(self, streams: int) -> bool:
        return sum(self.acked.values()) >= streams and len(self.waiters) >= streams


def sample_response(endpoints: int) -> bytes:
    """A DiscoveryResponse as meshbridge sends for the benchmark's View."""
    from bridge.cluster import Cluster
    from bridge.model import MeshConfig
    from bridge.views import ViewRegistry
    from xds_api.cache import ResourceCache
    from xds_api.stream import SotwStream

    cluster = Cluster()
    cluster.apply(objects(manifests(endpoints)))
    cache = ResourceCache(cluster, ViewRegistry(cluster, MeshConfig()), "cluster.local")
    stream = SotwStream(cache)
    stream.handle(discovery_pb2.DiscoveryRequest(type_url=rt.ENDPOINT, resource_names=[NAME]))
    [response] = stream.take_responses()
    return response


async def measure(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    await target.start()
    gc.collect()
    rss0 = rss_kib()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.xds_fanout", "--client",
        "--server", f"127.0.0.1:{target.port}", "--streams", str(args.streams),
        "--first-phase", str(args.streams // 5), "--channels", str(args.channels),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None and proc.stdin is not None

    async def line() -> dict[str, Any]:
        assert proc.stdout is not None
        raw = await asyncio.wait_for(proc.stdout.readline(), 300)
        if not raw:
            raise RuntimeError("the client process died")
        parsed: dict[str, Any] = json.loads(raw)
        return parsed

    async def settled(streams: int) -> None:
        while not target.settled(streams):
            await asyncio.sleep(0.01)  # polling, under the caller's timeout

    try:
        n1 = (await line())["ready"]
        await asyncio.wait_for(settled(n1), 300)
        gc.collect()
        rss1 = rss_kib()
        n2 = (await line())["ready"]
        await asyncio.wait_for(settled(n2), 300)
        gc.collect()
        rss2 = rss_kib()
        encodings_before = target.encodings() if isinstance(target, Meshbridge) else 0.0
        last: list[float] = []
        first: list[float] = []
        server_cpu: list[float] = []
        client_cpu: list[float] = []
        profiler = None
        if args.profile and isinstance(target, Meshbridge):
            import cProfile

            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
        for run in range(1, args.runs + 1):
            await asyncio.wait_for(settled(n2), 300)
            c0 = time.process_time()
            t0 = time.monotonic()
            target.change(run)
            got = await line()
            server_cpu.append((time.process_time() - c0) * 1000)
            assert got["run"] == run, got
            last.append((got["last"] - t0) * 1000)
            first.append((got["first"] - t0) * 1000)
            client_cpu.append(got["cpu"] * 1000)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        encodings = ((target.encodings() - encodings_before) / args.runs
                     if isinstance(target, Meshbridge) else None)
    finally:
        proc.stdin.close()
        await asyncio.wait_for(proc.wait(), 60)
        await target.stop()
    return {
        "server": target.name,
        "all_received_ms": {"median": statistics.median(last), "min": min(last),
                            "max": max(last), "each": [round(x, 1) for x in last]},
        "first_received_ms": statistics.median(first),
        # CPU from the change until the last stream had it (all threads), including
        # reading the ACKs that came back meanwhile; the client's likewise.
        "server_cpu_ms": statistics.median(server_cpu),
        "client_cpu_ms": statistics.median(client_cpu),
        "encodings_per_change": encodings,
        "memory_per_idle_stream_kib": (rss2 - rss1) / (n2 - n1),
        "server_rss_mib": [round(rss0 / 1024, 1), round(rss2 / 1024, 1)],
    }


async def measure_one(args: argparse.Namespace) -> dict[str, Any]:
    configure_logging("console", "warning")
    if args.measure == "bare":
        return await measure(Bare(sample_response(args.endpoints)), args)
    with tempfile.TemporaryDirectory() as tmp:
        return await measure(Meshbridge(args.endpoints, Path(tmp)), args)


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    """Each server is measured in a fresh process, so neither inherits the other's heap."""
    results = []
    for which in ("meshbridge", *(() if args.no_floor else ("bare",))):
        cmd = [sys.executable, "-m", "bench.xds_fanout", "--measure", which,
               "--streams", str(args.streams), "--runs", str(args.runs),
               "--channels", str(args.channels), "--endpoints", str(args.endpoints)]
        if args.profile and which == "meshbridge":
            cmd += ["--profile", args.profile]
        done = subprocess.run(cmd, stdout=subprocess.PIPE, check=True, timeout=1800)
        results.append(json.loads(done.stdout))
    return {"streams": args.streams, "channels": args.channels, "endpoints": args.endpoints,
            "runs": args.runs, "results": results}


def report(result: dict[str, Any]) -> str:
    lines = [f"xds fan-out: {result['streams']} SotW EDS streams over {result['channels']} "
             f"connections, one View of {result['endpoints']} endpoints, median of "
             f"{result['runs']} runs"]
    for r in result["results"]:
        lat, mem = r["all_received_ms"], r["memory_per_idle_stream_kib"]
        lines.append(f"  {r['server']}:")
        lines.append(f"    one endpoint change -> last stream has it: {lat['median']:.0f} ms "
                     f"(min {lat['min']:.0f}, max {lat['max']:.0f}); first: "
                     f"{r['first_received_ms']:.0f} ms")
        lines.append(f"    CPU meanwhile: server {r['server_cpu_ms']:.0f} ms, client "
                     f"{r['client_cpu_ms']:.0f} ms")
        lines.append(f"    memory per idle ADS stream: {mem:.1f} KiB (server RSS "
                     f"{r['server_rss_mib'][0]:.0f} -> {r['server_rss_mib'][1]:.0f} MiB)")
        if r["encodings_per_change"] is not None:
            lines.append(f"    CLA encodings per change: {r['encodings_per_change']:.2f}")
    mb = result["results"][0]
    lines.append(f"  targets: all received <= {TARGET_MS:.0f} ms: "
                 f"{'met' if mb['all_received_ms']['median'] <= TARGET_MS else 'NOT met'}; "
                 f"<= {TARGET_KIB:.0f} KiB per idle stream: "
                 f"{'met' if mb['memory_per_idle_stream_kib'] <= TARGET_KIB else 'NOT met'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.xds_fanout", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=5000)
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--channels", type=int, default=50,
                   help="client connections the streams are spread over")
    p.add_argument("--endpoints", type=int, default=10)
    p.add_argument("--no-floor", action="store_true",
                   help="skip the bare grpc.aio comparison")
    p.add_argument("--json", action="store_true")
    p.add_argument("--profile", metavar="FILE", help="cProfile meshbridge during the runs")
    p.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--server", help=argparse.SUPPRESS)
    p.add_argument("--first-phase", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--measure", choices=("meshbridge", "bare"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.client:
        return asyncio.run(run_client(args))
    if args.measure:
        print(json.dumps(asyncio.run(measure_one(args))))
        return 0
    result = run_bench(args)
    print(json.dumps(result, indent=1) if args.json else report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
