"""Big services: what one endpoint change costs as the service grows (issue 16).

    python -m bench.big_service [--endpoints 100,1000,10000] [--changes 300] [--runs 5]
                                [--metadata istio] [--latency-endpoints 10000] [--rate 3]
                                [--latency-changes 60] [--streams 5] [--pattern scale]
                                [--clients lean] [--json]

CPU: no network, in this process: the cluster cache, the View registry and both
protocol layers' caches on one meshed service of N endpoints in slices of 100, with
one Linkerd subscriber, one SotW EDS subscriber and one LEDS subscriber of every
collection of the service (the cache's own watches, as a stream has them). Each
change scales the service up or down by one pod (a pod event plus the one
EndpointSlice it lands in, as the slice controller writes them). Every change's
events are built before the first is applied: the simulator rebuilds and compares
every slice of the service per change (N entries, then freed), which is no part of
the server, and done just before each timed change it evicted the server's working
set from the CPU caches by an amount that grows with N (at 1,000 endpoints it
doubled the core's figure without one more call). Per change, process CPU time
(time.process_time) around:

    core + Linkerd  Cluster.apply (merge, enrich, filter, diff, publish) and the
                    Linkerd `Update` bytes of the change (linkerd_api's encoder)
    xDS CLA         the new version's ClusterLoadAssignment, framed as one SotW
                    stream's response (delta EDS carries the same bytes: the whole
                    set, by protocol), with the xDS View callback that moves the
                    CLA's assembly by the change (timed inside Cluster.apply, counted
                    here); each further stream costs one more framing
    LEDS            one LEDS stream's reply (the members changed and removed),
                    framed, and recording what it then holds, with the LEDS View
                    callback

The figure of a run is the median over its changes; the table shows the median of
runs.

Latency: meshbridge (`serve`'s layers) in this process on the same kind of service
of `--latency-endpoints` endpoints, `--streams` Linkerd `Get` streams in a child
process (bench/h2client.py), and `--rate` changes a second applied on a fixed
schedule (not waiting for the clients). Change-to-client is from the apply to the
moment the last stream has decoded the change's message (CLOCK_MONOTONIC is one
clock for both processes); p99 over every change of a run. `--pattern flap` toggles
one pod's readiness instead of scaling (the slice alone changes, as in `compare`'s
one-big-service scenario); `--clients grpcio` makes the streams grpc.aio calls (as
`compare`'s measuring clients are) instead of bench/h2client.py's lean ones.

Serving CPU per change, from the same run: the server process's CPU time
(time.process_time: every thread, user and system) from the first change's apply
until the last stream has the last change, less what the process spends in as long
a time with the streams open and nothing changing (measured for a second before),
divided by the changes. That is everything the process does for a change: the
core, the encoding, the writes to every stream and the event loop's turns, and
what the clients' frames cost it; it is the figure `compare --isolate` reports as a
model's serving CPU per change (docs/compare.md), on the same kind of change.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import sys
import time
from typing import Any

from bench.common import finish, parser, row
from testkit.polling import eventually
from testkit.processes import Child

TARGET_CPU_MS = 2.0
TARGET_P99_MS = 20.0
TARGET = "svc-0.ns-0.svc.cluster.local:8080"


class _Linkerd:
    """A Linkerd subscriber as the Get streams are: the change's bytes, once."""

    def __init__(self, encoder: Any) -> None:
        self.encoder = encoder
        self.messages: Any = ()

    def on_view_change(self, view: Any, change: Any) -> None:
        self.messages = self.encoder.diff(view, change)


def simulated(endpoints: int, seed: int = 3) -> Any:
    from bridge.sources.sim import Churn, ClusterShape, Scenario, SimCluster

    return SimCluster(Scenario(seed=seed, cluster=ClusterShape(
        namespaces=1, services=1, endpoints_per_service=endpoints, zones=3,
        slice_size=100, meshed=True), churn=Churn(rate=0)))


class _XdsWatcher:
    """A stream as the cache sees it (xds_api.caches.type_cache.Watcher): it only
    marks what is due, as a stream does before its next write."""

    node_name = ""

    def __init__(self, protocol: str, sub: Any) -> None:
        self.protocol = protocol
        self.sub = sub

    def resource_changed(self, type_url: str, name: str) -> None:
        self.sub.mark(name)

    def endpoints_changed(self, name: str, view: Any) -> None:
        self.sub.mark(name)


class _TimedValue:
    """A View's derived value whose `advance` is timed; everything else is its own."""

    def __init__(self, inner: Any, advance: Any) -> None:
        self._inner = inner
        self.advance = advance

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _time_derived(derivation: Any, watch: _Stopwatch, label: str) -> None:
    make = derivation.make

    def made(view: Any) -> Any:
        value = make(view)
        return _TimedValue(value, watch.wrap(label, value.advance))
    derivation.make = made


class _Stopwatch:
    """Process CPU time spent in the wrapped callables, by label; a call made inside
    another wrapped one counts for the outer one only."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self._depth = 0

    def reset(self) -> None:
        self.totals = dict.fromkeys(self.totals, 0.0)

    def wrap(self, label: str, fn: Any) -> Any:
        self.totals[label] = 0.0

        def timed(*args: Any) -> Any:
            self._depth += 1
            t0 = time.process_time()
            try:
                return fn(*args)
            finally:
                self._depth -= 1
                if not self._depth:
                    self.totals[label] += time.process_time() - t0
        return timed


def measure_cpu(endpoints: int, changes: int, profile: str = "istio") -> dict[str, float]:
    """Median per-change CPU µs of one run: core + Linkerd, the xDS CLA (SotW and
    delta EDS), and the LEDS resources of one LEDS subscriber."""
    import gc

    from bridge.authority import view_authority
    from bridge.cluster import Cluster, Event, EventType
    from bridge.model import MeshConfig, ServiceKey, ViewKey
    from bridge.views import ViewRegistry
    from linkerd_api.endpoint_streams import UpdateEncoder
    from linkerd_api.translate import Translator
    from xds_api import resource_types as rt
    from xds_api.cache import Reply, ResourceCache
    from xds_api.names import leds_collection
    from xds_api.resources import MetadataEncoder
    from xds_api.stream import DeltaStream, SotwStream
    from xds_api.subscription import ABSENT, Subscription

    sim = simulated(endpoints)
    cluster = Cluster()
    config = MeshConfig()
    registry = ViewRegistry(cluster, config)
    cluster.apply(Event(EventType.ADDED, o) for o in sim.initial_objects())
    key = ViewKey(ServiceKey("ns-0", "svc-0"), 8080)
    name = view_authority(key, config.cluster_domain)
    linkerd = _Linkerd(UpdateEncoder(Translator(config), "proto"))
    view = registry.subscribe(key, linkerd, "bench")

    def pod_labels(resolved: Any) -> Any:  # as xds_api.service wires it
        ep = resolved.endpoint
        pod = cluster.pods.get((ep.id.namespace, ep.pod_name)) if ep.pod_name else None
        return pod.meta.labels if pod is not None else {}

    cache = ResourceCache(cluster, registry, config.cluster_domain,
                          metadata=MetadataEncoder(profile, pod_labels=pod_labels))
    # What the View does for xDS as it publishes (advancing the CLA assembly and the
    # LEDS members: O(change) bookkeeping), timed apart from the core's work that
    # surrounds it.
    watch = _Stopwatch()
    eds, leds = cache.endpoints, cache.leds
    _time_derived(eds.clas, watch, "eds")
    _time_derived(leds.members_of, watch, "leds")
    # One SotW EDS subscriber (a delta EDS one is sent the very same CLA bytes) and
    # one LEDS subscriber of every collection of the service.
    sotw = Subscription(rt.ENDPOINT)
    eds.watch(sotw, [name], _XdsWatcher("xds-sotw", sotw))
    collections = [leds_collection(name, loc) for loc in eds.assembly_of(view).runs]
    ledsub = Subscription(rt.LB_ENDPOINT, delta=True)
    leds.watch(ledsub, collections, _XdsWatcher("xds-delta", ledsub))
    ledsub.names = set(collections)
    ledsub.mark_all(collections)

    # Streams only to frame responses with: what each stream adds to the shared bytes.
    sotw_stream, delta_stream = SotwStream(cache), DeltaStream(cache)

    def eds_push() -> bytes:
        """What a SotW EDS stream is handed per change, framed as its response."""
        res = eds.resource(sotw, name)
        assert res is not None
        return sotw_stream._encode(Reply(rt.ENDPOINT, (res,)), res.version, rt.ENDPOINT, "1")

    def leds_push() -> int:
        """What a LEDS stream does per change: the reply, framed, and recording what
        the client then holds."""
        reply = cache.delta_reply(ledsub)
        ledsub.clean()
        ledsub.must_reply = False
        if reply is None:
            return 0
        for r in reply.resources:
            ledsub.hold(r.name, r.version)
        for gone in reply.removed:
            if gone in ledsub.names:
                ledsub.hold(gone, ABSENT)
            else:
                ledsub.forget(gone)
        delta_stream._encode(reply, ledsub.sent.version(), rt.LB_ENDPOINT, "1")
        return len(reply.resources) + len(reply.removed)

    # The first version, as a subscriber would have it. The bench holds each CLA until
    # the next is encoded, so freeing the old one (pages of bytes) is timed as the
    # xDS cost it is, not where the View drops its per-version cache.
    held = [eds_push()]
    leds_push()
    svc = sim.services[0]
    batches = [sim._step_scale(svc, up=i % 2 == 0) for i in range(changes)]
    batches.reverse()  # popped in order, so each batch is freed once applied
    core_linkerd, cla, leds_cost = [], [], []
    gc.collect()
    for _ in range(changes):
        events = batches.pop()
        version = view.version
        watch.reset()
        t0 = time.process_time()
        cluster.apply(events)
        t1 = time.process_time()
        held[0] = eds_push()
        t2 = time.process_time()
        sent = leds_push()
        t3 = time.process_time()
        assert view.version == version + 1 and linkerd.messages and held[0]
        assert 0 < sent <= 4, sent
        in_eds, in_leds = watch.totals["eds"], watch.totals["leds"]
        core_linkerd.append((t1 - t0 - in_eds - in_leds) * 1e6)
        cla.append((t2 - t1 + in_eds) * 1e6)
        leds_cost.append((t3 - t2 + in_leds) * 1e6)
    cache.close()
    return {"core_linkerd": statistics.median(core_linkerd), "cla": statistics.median(cla),
            "leds": statistics.median(leds_cost)}


IDLE_WINDOW = 1.0  # seconds of no change, every stream open, before the changes


async def measure_latency(endpoints: int, streams: int, rate: float, changes: int,
                          pattern: str = "scale", clients: str = "lean") -> dict[str, Any]:
    """One run: change-to-last-client ms of every change, at `rate` changes/s, and
    the server process's serving CPU per change."""
    from meshbridge import gctune
    from meshbridge.log import configure_logging
    from testkit.serving import serve_objects

    configure_logging("console", "warning")
    sim = simulated(endpoints, seed=5)
    app = await serve_objects(sim.initial_objects(), streams * 2 + 100)
    gctune.settle_heap()  # as `meshbridge serve` does once synced
    child: Child | None = None
    try:
        child = await Child.start(
            "bench.fanout", "--protocol", "get", "--server", f"127.0.0.1:{app.grpc_port}",
            "--streams", str(streams), "--first-phase", "1", "--channels", str(streams),
            "--clients", clients)
        for _ in range(2):
            await child.line()  # {"ready": n}: first phase, then every stream open
            await child.send(next=True)  # the child waits for this before going on
        streams_of = app.service("linkerd").streams
        await eventually(lambda: all(len(q) == 0 for q in streams_of), 120, "snapshots sent")
        svc = sim.services[0]
        applied: dict[int, float] = {}
        arrived: dict[int, float] = {}

        async def read() -> None:
            assert child is not None
            while len(arrived) < changes:
                got = await child.line()
                arrived[got["run"]] = got["last"]

        # Built beforehand: the simulator rebuilds every slice of the service per change,
        # which is its cost, not the server's, and must not hold the event loop.
        batches = [sim._step_flap() if pattern == "flap" else
                   sim._step_scale(svc, up=n % 2 == 1) for n in range(1, changes + 1)]
        reader = asyncio.create_task(read())
        idle_cpu, idle_from = time.process_time(), time.monotonic()
        await asyncio.sleep(IDLE_WINDOW)  # a window of no change, not synchronisation
        idle_rate = (time.process_time() - idle_cpu) / (time.monotonic() - idle_from)
        start = time.monotonic() + 0.2
        cpu0 = wall0 = 0.0
        for n, events in enumerate(batches, 1):
            delay = start + (n - 1) / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # the schedule, not synchronisation
            applied[n] = time.monotonic()
            if n == 1:
                cpu0, wall0 = time.process_time(), applied[n]
            app.cluster.apply(events)
        await asyncio.wait_for(reader, 120)
        busy = time.process_time() - cpu0 - idle_rate * (time.monotonic() - wall0)
        latencies = [(arrived[n] - applied[n]) * 1000 for n in sorted(applied)]
    finally:
        if child is not None:
            await child.close()
        await app.stop(grace=0.5)
        gctune.release_heap()
    return {"latencies_ms": latencies,
            "p50_ms": statistics.median(latencies),
            "p99_ms": _percentile(latencies, 99), "max_ms": max(latencies),
            "serving_cpu_ms_per_change": max(0.0, busy) * 1000 / changes,
            "idle_cpu_ms_per_second": idle_rate * 1000}


def _percentile(values: list[float], p: float) -> float:
    """Nearest rank: the smallest value at least p% of the values do not exceed."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))]


def run(args: argparse.Namespace) -> dict[str, Any]:
    sizes = [int(x) for x in args.endpoints.split(",") if x.strip()]
    cpu: dict[str, dict[str, list[float]]] = {}
    for n in sizes:
        per_run = [measure_cpu(n, args.changes, args.metadata) for _ in range(args.runs)]
        cpu[str(n)] = {k: [r[k] for r in per_run] for k in ("core_linkerd", "cla", "leds")}
    latency = []
    if args.latency_endpoints:
        latency = [asyncio.run(measure_latency(args.latency_endpoints, args.streams,
                                               args.rate, args.latency_changes,
                                               args.pattern, args.clients))
                   for _ in range(args.latency_runs)]
    return {"changes_per_run": args.changes, "runs": args.runs, "metadata": args.metadata,
            "cpu_us_per_change": cpu,
            "latency": {"endpoints": args.latency_endpoints, "streams": args.streams,
                        "rate": args.rate, "changes": args.latency_changes,
                        "pattern": args.pattern, "clients": args.clients,
                        "runs": latency}}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    cpu = result["cpu_us_per_change"]
    for n, figs in cpu.items():
        out.append(row(f"one endpoint change, {int(n):,}-endpoint service",
                       "server CPU: core + Linkerd encoder",
                       [v / 1000 for v in figs["core_linkerd"]], "ms", TARGET_CPU_MS))
        out.append(row(f"one endpoint change, {int(n):,}-endpoint service",
                       "server CPU: xDS CLA bytes (SotW and delta EDS, whole set)",
                       [v / 1000 for v in figs["cla"]], "ms"))
        out.append(row(f"one endpoint change, {int(n):,}-endpoint service",
                       "server CPU: LEDS resources for one LEDS stream",
                       [v / 1000 for v in figs["leds"]], "ms"))
        totals = [(a + b + c) / 1000 for a, b, c in
                  zip(figs["core_linkerd"], figs["cla"], figs["leds"], strict=True)]
        out.append(row(f"one endpoint change, {int(n):,}-endpoint service",
                       "server CPU: core + Linkerd + xDS (CLA and LEDS)", totals, "ms",
                       TARGET_CPU_MS))
    lat = result["latency"]
    if lat["runs"]:
        out.append(row(f"Linkerd Get change-to-client, {lat['endpoints']:,} endpoints",
                       f"p99, {lat['rate']:g} changes/s, {lat['streams']} streams",
                       [r["p99_ms"] for r in lat["runs"]], "ms", TARGET_P99_MS))
        out.append(row(f"Linkerd Get streams, {lat['endpoints']:,} endpoints",
                       f"server process CPU per change ({lat['pattern']}, "
                       f"{lat['streams']} streams, {lat['clients']} clients)",
                       [r["serving_cpu_ms_per_change"] for r in lat["runs"]], "ms"))
    return out


def report(result: dict[str, Any]) -> str:
    lines = [f"one endpoint change: server CPU ms per change (median of {result['runs']} "
             f"runs, each the median of {result['changes_per_run']} changes; xDS "
             f"endpoint metadata {result['metadata']})",
             f"  {'endpoints':>9}  {'core+Linkerd':>12}  {'xDS CLA':>9}  {'LEDS':>7}"
             f"  {'total':>7}"]
    for n, figs in result["cpu_us_per_change"].items():
        med = {k: statistics.median(v) / 1000 for k, v in figs.items()}
        total = statistics.median(
            [(a + b + c) / 1000 for a, b, c in
             zip(figs["core_linkerd"], figs["cla"], figs["leds"], strict=True)])
        lines.append(f"  {int(n):>9,}  {med['core_linkerd']:>12.3f}  {med['cla']:>9.3f}"
                     f"  {med['leds']:>7.3f}  {total:>7.3f}")
    lat = result["latency"]
    for i, r in enumerate(lat["runs"], 1):
        lines.append(f"Get change-to-client at {lat['endpoints']:,} endpoints, "
                     f"{lat['rate']:g}/s ({lat['pattern']}, {lat['streams']} "
                     f"{lat['clients']} streams), run {i}: p50 {r['p50_ms']:.1f} ms, "
                     f"p99 {r['p99_ms']:.1f} ms, max {r['max_ms']:.1f} ms; server "
                     f"process CPU {r['serving_cpu_ms_per_change']:.2f} ms per change "
                     f"(idle {r['idle_cpu_ms_per_second']:.2f} ms/s left out)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = parser("big_service", __doc__)
    p.add_argument("--endpoints", default="100,1000,10000",
                   help="service sizes for the CPU figures, comma-separated")
    p.add_argument("--changes", type=int, default=300, help="changes per CPU run")
    p.add_argument("--runs", type=int, default=5, help="CPU runs per size")
    p.add_argument("--metadata", default="istio", choices=("none", "istio", "linkerd"),
                   help="xDS endpoint metadata profile (the server's default: istio)")
    p.add_argument("--latency-endpoints", type=int, default=10000,
                   help="service size for the latency figure (0: skip it)")
    p.add_argument("--rate", type=float, default=3.0, help="changes a second")
    p.add_argument("--latency-changes", type=int, default=100,
                   help="changes per run (a p99 wants at least 100)")
    p.add_argument("--latency-runs", type=int, default=3)
    p.add_argument("--streams", type=int, default=5, help="Linkerd Get streams")
    p.add_argument("--pattern", choices=("scale", "flap"), default="scale",
                   help="the latency part's change: scale by one pod, or flap one pod")
    p.add_argument("--clients", choices=("lean", "grpcio"), default="lean",
                   help="the Get streams: bench/h2client.py's, or grpc.aio calls")
    args = p.parse_args(argv)
    return finish("big_service", run(args), args.json, rows, report)


if __name__ == "__main__":
    sys.exit(main())
