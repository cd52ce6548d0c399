"""One comparison run: meshbridge in this process, the measuring clients in another.

    1. meshbridge starts on 127.0.0.1 (ephemeral ports) on the sim source, its churn
       held back; the truth recorder joins the View of every followed target.
    2. One client process per model starts (the same Python), so that no model's
       decoding delays another's; they connect one model at a time, each waiting for
       every initial snapshot, so that the server's memory growth per model can be
       read between them.
    3. The churn runs for the scenario's duration.
    4. Settle: wait until the clients have received exactly what the server sent and
       nothing moved for a quiet period (with a deadline), read the server's own
       counts, then stop the clients, which write what they received.

Server CPU seconds are this process's own (`time.process_time`) over steps 3-4;
nothing else of note runs here then (the live view redraws twice a second).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import resource
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog

from bridge.cluster import Event, EventType
from bridge.model import MeshConfig
from bridge.multicluster.links import Link
from bridge.multicluster.targets import (
    LOCAL_DISCOVERY_ANNOTATION,
    REMOTE_DISCOVERY,
    REMOTE_SERVICE_LABEL,
)
from bridge.objects import Meta, Service
from bridge.sources.sim import EmitHook, SimSource
from harness.compare import environment
from harness.compare.scenario import MODELS, ClientSpec, CompareScenario
from harness.compare.truth import TruthRecorder
from harness.compare.wire import CountingServer, WireCounter
from meshbridge import gctune
from meshbridge.app import App, ServeOptions
from meshbridge.host import GrpcServer, Host, Layer
from meshbridge.layers import PROTOCOL_LAYERS, layer, load_optional
from meshbridge.limits import LOOPBACK_CROWD, Limits

log = structlog.get_logger("meshbridge.compare")

# What `meshbridge serve` mounts; a model whose layer is absent is skipped and said so.
MODEL_LAYER = {"linkerd": "linkerd_api.service", "sotw": "xds_api.service",
               "delta": "xds_api.service", "leds": "xds_api.service"}
STREAM_MODEL = {"linkerd-get": "linkerd"}  # xDS streams are told apart by node id
LINKERD_GET = "/io.linkerd.proxy.destination.Destination/Get"


class RunError(RuntimeError):
    """The run could not be carried out (not: the run found a divergence)."""


@dataclass(frozen=True, slots=True)
class RunOptions:
    connect_timeout: float = 60.0
    settle_timeout: float = 30.0
    quiet: float = 0.5
    trace_memory: bool = True
    # Seconds the server is watched with every client connected and no change, before
    # the churn: its CPU rate then (timers, keepalives, the harness's own polling) is
    # no change's cost, and the per-change figures leave it out.
    idle_window: float = 2.0
    # Also run each model alone, one after another, on the same seeded churn.
    isolate: bool = False
    # The protocol layers' typed options, as `serve` passes them (`--xds-*`).
    layer_options: tuple[object, ...] = ()


class ExtraClients(Protocol):
    """Clients started by someone else (real Envoys): `attach` once the measuring
    clients hold their snapshots, `collect` after the settle, server still up."""

    async def attach(self, run: Run, app: App) -> None: ...

    async def collect(self, run: Run, app: App) -> None: ...


class Progress(Protocol):
    """What the live view is told; every method must be cheap."""

    def phase(self, text: str) -> None: ...

    def tick(self, run: Run) -> None: ...


@dataclass(slots=True)
class ServerCounts:
    streams: int = 0
    connections: int = 0
    messages: int = 0
    bytes: int = 0


@dataclass(slots=True)
class Run:
    """Everything a run measured, raw; the report is computed from it."""

    cs: CompareScenario
    models: tuple[str, ...] = ()
    skipped: dict[str, str] = field(default_factory=dict)  # model -> why
    broken: dict[str, str] = field(default_factory=dict)  # layer module -> its error
    wire: WireCounter = field(default_factory=lambda: WireCounter(frozenset({LINKERD_GET})))
    truth: TruthRecorder = field(default_factory=TruthRecorder)
    phase: str = "starting"
    churn_start_ns: int = 0
    churn_end_ns: int = 0
    settled_ns: int = 0
    settled: bool = False
    changes: int = 0
    cpu_seconds: float = 0.0
    cpu_user: float = 0.0
    cpu_system: float = 0.0
    # Of cpu_seconds, what the harness itself spent in this process: the sim source
    # making its changes and the truth recorder recording their versions.
    harness_cpu_seconds: float = 0.0
    # The server's CPU seconds per second with every client connected and no change.
    idle_cpu_rate: float = 0.0
    rss_start: int = 0
    rss_end: int = 0
    memory: dict[str, dict[str, int]] = field(default_factory=dict)  # model -> figures
    connect: dict[str, dict[str, Any]] = field(default_factory=dict)
    server: dict[str, ServerCounts] = field(default_factory=dict)
    client_counts: dict[str, list[int]] = field(default_factory=dict)  # live, from workers
    results: dict[str, Any] = field(default_factory=dict)  # what the workers wrote, merged
    processes: dict[str, dict[str, Any]] = field(default_factory=dict)  # model -> pid, cpu
    environment: dict[str, Any] = field(default_factory=dict)  # harness.compare.environment
    isolated: dict[str, Run] = field(default_factory=dict)  # model -> its run alone
    live_server: dict[str, ServerCounts] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    grpc_port: int = 0
    # Filled in by the report and by optional parts (Envoy): see harness.compare.report.
    kube: Any = None
    analysed: Any = None
    extra_figures: dict[str, Any] = field(default_factory=dict)

    def source_emitted(self) -> int:
        return len(self.truth.emissions)


def rss_bytes() -> int:
    """This process's resident memory now (Linux), else its peak."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def load_layers(broken: dict[str, str] | None = None, wire: WireCounter | None = None,
                ) -> tuple[list[Layer], set[str]]:
    """The protocol layers `serve` would mount. A layer that fails to register is
    left out and the reason put in `broken` (module -> error), so the other models
    still run and the report says why one did not."""
    layers: list[Layer] = []
    present: set[str] = set()
    for module in PROTOCOL_LAYERS:
        if load_optional(module) is None:
            continue
        counted = wire if module == MODEL_LAYER["linkerd"] else None
        layers.append(_guarded(layer(module), broken if broken is not None else {}, counted))
        present.add(module)
    return layers, present


def _guarded(mounted: Layer, broken: dict[str, str], wire: WireCounter | None) -> Layer:
    def register(host: Host, server: GrpcServer) -> None:
        try:
            mounted.register(host, CountingServer(server, wire) if wire is not None else server)
        except Exception as e:
            log.error("protocol layer failed to start", layer=mounted.name, error=repr(e))
            broken[mounted.name] = f"{type(e).__name__}: {e}"

    return Layer(mounted.name, register, mounted.options)


def server_counts(app: App, wire: WireCounter | None = None) -> dict[str, ServerCounts]:
    """Per model, from the streams the protocol layers registered; for a layer that
    registers none, from what `wire` counted at its handlers."""
    out: dict[str, ServerCounts] = {}
    peers: dict[str, set[str]] = {}
    for info in app.streams.all():
        model = STREAM_MODEL.get(info.protocol)
        if model is None and info.protocol.startswith("xds-"):
            model = _xds_model(info.client)
        if model is None:
            continue
        c = out.setdefault(model, ServerCounts())
        c.streams += 1
        c.messages += info.messages_sent
        c.bytes += info.bytes_sent
        peers.setdefault(model, set()).add(info.peer)
    if wire is not None and "linkerd" not in out:
        for ws in wire.streams:
            c = out.setdefault("linkerd", ServerCounts())
            c.messages += ws.messages
            c.bytes += ws.bytes
            if ws.open:
                c.streams += 1
                peers.setdefault("linkerd", set()).add(ws.peer)
    for model, ps in peers.items():
        out[model].connections = len(ps)
    return out


def _xds_model(node_id: str) -> str | None:
    # Node ids are compare-<model>-<index> (see harness.compare.worker and .envoy_fleet).
    parts = node_id.split("-")
    if len(parts) >= 3 and parts[0] == "compare":
        return parts[1]
    return None


class WorkerProcess:
    """One model's client process and its JSON-lines conversation."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.counts: dict[str, list[int]] = {}
        self.replies: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read(), name="compare-worker-reader")

    @classmethod
    async def start(cls, config: Path, stderr: Path) -> WorkerProcess:
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        with stderr.open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "harness.compare.worker", str(config),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err,
                env=env)
        return cls(proc)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                await self.replies.put({"event": "exited"})
                return
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            if msg.get("event") == "progress":
                self.counts = msg["counts"]
            else:
                await self.replies.put(msg)

    async def request(self, cmd: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd).encode() + b"\n")
        await self.proc.stdin.drain()
        try:
            reply = await asyncio.wait_for(self.replies.get(), timeout)
        except TimeoutError:
            raise RunError(f"client process {self.proc.pid}: no answer to {cmd['cmd']} "
                           f"within {timeout:g}s") from None
        if reply.get("event") == "exited":
            raise RunError(f"client process {self.proc.pid} exited during {cmd['cmd']} "
                           f"(status {await self.proc.wait()})")
        return reply

    async def close(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()


class Workers:
    """The client processes of a run, one per model."""

    def __init__(self) -> None:
        self.by_model: dict[str, WorkerProcess] = {}
        self.results: dict[str, Path] = {}

    @property
    def counts(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for w in self.by_model.values():
            out.update(w.counts)
        return out

    async def start(self, model: str, server: str, specs: list[ClientSpec], out: Path,
                    options: RunOptions) -> None:
        config = out / f"clients-{model}.json"
        results = out / f"client-results-{model}.json"
        config.write_text(json.dumps({
            "server": server,
            "clients": [{"model": s.model, "index": s.index, "targets": list(s.targets)}
                        for s in specs if s.model == model],
            "results": str(results),
            "connect_timeout": options.connect_timeout,
        }), encoding="utf-8")
        self.results[model] = results
        self.by_model[model] = await WorkerProcess.start(
            config, out / f"client-process-{model}.log")

    async def stop(self) -> dict[str, Any]:
        """Stop every process (at once) and merge what they wrote."""
        await asyncio.gather(*(w.request({"cmd": "stop"}, 60.0)
                               for w in self.by_model.values()))
        merged: dict[str, Any] = {"records": [], "finals": [], "states": {},
                                  "cpu_seconds": 0.0, "processes": {}}
        for model, path in self.results.items():
            res = json.loads(path.read_text(encoding="utf-8"))
            merged["records"] += res["records"]
            merged["finals"] += res["finals"]
            merged["states"].update(res["states"])
            merged["cpu_seconds"] += res["cpu_seconds"]
            merged["processes"][model] = {"pid": res["pid"], "cpu_seconds": res["cpu_seconds"]}
        return merged

    async def close(self) -> None:
        for w in self.by_model.values():
            await w.close()


async def run(cs: CompareScenario, out: Path, options: RunOptions, progress: Progress,
              extra: ExtraClients | None = None) -> Run:
    """Carry out one run; raises RunError if it cannot."""
    out.mkdir(parents=True, exist_ok=True)
    r = Run(cs)
    r.environment = environment.at_start(options.layer_options)
    layers, present = load_layers(r.broken, r.wire)
    wanted = [m for m in MODELS if cs.clients.count(m) > 0]
    for m in wanted:
        if MODEL_LAYER[m] not in present:
            r.skipped[m] = f"{MODEL_LAYER[m]} is not installed in this build"
    r.models = tuple(m for m in wanted if m not in r.skipped)
    if not r.models:
        raise RunError("no protocol layer serves the scenario's clients: "
                       + "; ".join(f"{m}: {why}" for m, why in r.skipped.items()))
    all_specs = cs.client_specs(r.models)
    streams = sum(len(s.targets) if s.model == "linkerd" else 1 for s in all_specs)
    start_churn = asyncio.Event()
    source = SimSource(cs.scenario, on_emit=r.truth.on_emit, start_churn=start_churn)
    linked = LinkedCluster.of(cs, start_churn, r.truth.on_emit)
    limits = Limits(max_streams_per_client=max(Limits().max_streams_per_client,
                                                2 * streams + 100),
                    max_streams_per_connection=max(Limits().max_streams_per_connection,
                                                   2 * len(cs.all_targets()) + 100),
                    h2=LOOPBACK_CROWD)
    app = App(source, MeshConfig(), ServeOptions("127.0.0.1:0", "127.0.0.1:0", limits=limits,
                                                 layer_options=options.layer_options,
                                                 links=linked.links if linked else ()),
              layers)
    if linked is not None:
        app.clusters.make_dev_source = linked.source_for
    workers = Workers()
    try:
        progress.phase("starting meshbridge")
        await app.start()
        if linked is not None:
            await linked.serve(app)
        r.grpc_port = app.grpc_port
        for m in r.models:
            if MODEL_LAYER[m] in r.broken:
                r.skipped[m] = f"{MODEL_LAYER[m]} failed to start: {r.broken[MODEL_LAYER[m]]}"
        r.models = tuple(m for m in r.models if m not in r.skipped)
        if not r.models:
            raise RunError("no protocol layer started: " + "; ".join(r.broken.values()))
        specs = cs.client_specs(r.models)
        r.truth.follow(app.views, cs.followed_targets())
        gctune.settle_heap()  # as `meshbridge serve` does once synced
        for model in r.models:
            await workers.start(model, f"127.0.0.1:{app.grpc_port}", specs, out, options)
        gc.collect()
        r.rss_start = rss_bytes()
        if options.trace_memory:
            tracemalloc.start()
        for model in r.models:
            r.phase = f"connecting {model} clients"
            progress.phase(r.phase)
            before_rss, before_heap = rss_bytes(), _heap()
            reply = await workers.by_model[model].request({"cmd": "connect", "model": model},
                                                          options.connect_timeout + 10)
            gc.collect()
            r.connect[model] = reply
            r.processes[model] = {"pid": reply.get("pid", workers.by_model[model].proc.pid)}
            r.memory[model] = {"rss": rss_bytes() - before_rss,
                               "heap": _heap() - before_heap if options.trace_memory else -1}
            bad = reply.get("error_count", 0) + reply.get("missing_count", 0)
            if bad:
                shown = (reply.get("errors", []) + reply.get("missing", []))[:3]
                raise RunError(f"{model}: {bad} streams did not get their initial snapshot "
                               f"within {options.connect_timeout:g}s, e.g. "
                               + "; ".join(shown))
        if options.trace_memory:
            tracemalloc.stop()
        if extra is not None:
            r.phase = "starting the extra clients"
            progress.phase(r.phase)
            await extra.attach(r, app)

        r.phase = "idle"
        progress.phase(f"idle for {options.idle_window:g}s: the server's CPU with no change")
        r.idle_cpu_rate = await _idle_rate(app, workers, r, options.idle_window, progress)

        r.phase = "churn"
        progress.phase(f"churn: {cs.scenario.churn.rate:g} changes/s for {cs.duration:g}s")
        cpu0, ru0 = time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
        harness0 = source.cpu_seconds + r.truth.cpu_seconds
        r.churn_start_ns = time.monotonic_ns()
        start_churn.set()
        churn_deadline = time.monotonic() + cs.duration + max(10.0, cs.duration)
        sources = [source, *([linked.source] if linked else [])]
        while not all(s.finished.is_set() for s in sources):
            if time.monotonic() > churn_deadline:
                raise RunError("the churn did not finish in time")
            _watch(app, workers, r, progress)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(source.finished.wait(), 0.5)
        r.churn_end_ns = time.monotonic_ns()
        r.changes = sum(s.emitted for s in sources)

        r.phase = "settling"
        progress.phase("settling: waiting for the clients to be quiet")
        r.settled = await _settle(app, workers, r, options, progress)
        r.settled_ns = time.monotonic_ns()
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        r.cpu_seconds = time.process_time() - cpu0
        r.harness_cpu_seconds = source.cpu_seconds + r.truth.cpu_seconds - harness0
        r.cpu_user = ru1.ru_utime - ru0.ru_utime
        r.cpu_system = ru1.ru_stime - ru0.ru_stime
        r.server = server_counts(app, r.wire)
        r.rss_end = rss_bytes()
        if extra is not None:
            await extra.collect(r, app)

        r.phase = "collecting"
        progress.phase("collecting what the clients received")
        r.results = await workers.stop()
        for model, proc in r.results["processes"].items():
            r.processes.setdefault(model, {}).update(proc)
        r.truth.unfollow(app.views)
        environment.at_end(r.environment)
        return r
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
        await workers.close()
        await app.stop(grace=0.5)
        gctune.release_heap()


LINKED_CHANGES = 1_000_000_000  # the linked sim's change indices start here


@dataclass(slots=True)
class LinkedCluster:
    """The scenario's linked cluster: a sim of its own, churning with the local one, and
    the local Services that serve the clients' targets from it (docs/compare.md)."""

    name: str
    mode: str
    source: SimSource
    links: tuple[Link, ...]

    @classmethod
    def of(cls, cs: CompareScenario, start_churn: asyncio.Event,
           on_emit: EmitHook) -> LinkedCluster | None:
        plan = cs.linked
        if plan is None:
            return None
        link = Link(plan.name, "cluster.local", f"{plan.name}.local",
                    f"scenario {cs.scenario.name}", dev_source=f"sim:{plan.scenario.name}")

        def emitted(index: int, pattern: str, at: float) -> None:
            # The truth keys changes by index: the linked cluster's are numbered apart.
            on_emit(LINKED_CHANGES + index, pattern, at)

        source = SimSource(plan.scenario, on_emit=emitted, start_churn=start_churn)
        return cls(plan.name, plan.mode, source, (link,))

    def source_for(self, _spec: str) -> SimSource:
        return self.source

    async def serve(self, app: App) -> None:
        """Wait for the linked cluster, then add the local Services naming it."""
        deadline = time.monotonic() + 60
        while (lc := app.clusters.get(self.name)) is None or lc.synced_at is None:
            if time.monotonic() > deadline:
                raise RunError(f"the linked cluster {self.name} did not sync")
            await asyncio.sleep(0.05)  # polling the store, under the deadline above
        aliases = []
        for key, svc in sorted(app.cluster.services.items()):
            if self.mode == "federated":
                meta = Meta(f"{key.name}-federated", key.namespace, annotations={
                    REMOTE_DISCOVERY: f"{key.name}@{self.name}",
                    LOCAL_DISCOVERY_ANNOTATION: key.name})
            else:
                meta = Meta(f"{key.name}-{self.name}", key.namespace, labels={
                    REMOTE_DISCOVERY: self.name, REMOTE_SERVICE_LABEL: key.name})
            aliases.append(Event(EventType.ADDED, Service(meta, ports=svc.ports,
                                                          cluster_ips=svc.cluster_ips)))
        app.cluster.apply(aliases)


def _watch(app: App, workers: Workers, r: Run, progress: Progress) -> None:
    """What the run loop does every half second, idle or not: the live counts."""
    r.client_counts = workers.counts
    r.live_server = server_counts(app, r.wire)
    progress.tick(r)


async def _idle_rate(app: App, workers: Workers, r: Run, seconds: float,
                     progress: Progress) -> float:
    """The server's CPU seconds per second while nothing changes, the run loop doing
    what it does during the churn: the median over the loop's half-second turns, so
    that a one-off in the window (a collection, a late connection's bookkeeping) is
    not charged to every second of the churn."""
    if seconds <= 0:
        return 0.0
    rates = []
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        cpu0, start = time.process_time(), time.monotonic()
        _watch(app, workers, r, progress)
        await asyncio.sleep(min(0.5, left))  # the churn loop's period, not synchronisation
        rates.append((time.process_time() - cpu0) / (time.monotonic() - start))
    return statistics.median(rates)


def _heap() -> int:
    return tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0


async def _settle(app: App, workers: Workers, r: Run, options: RunOptions,
                  progress: Progress) -> bool:
    """Wait until every model's clients hold the source's final truth, then until they
    have received what the server sent and nothing has moved for `options.quiet`
    seconds; False if the deadline came first. The truth comes first because a server
    may take longer than the quiet period to push the last change of a big service."""
    deadline = time.monotonic() + options.settle_timeout
    truth = r.truth.final_digests()
    await asyncio.gather(*(w.request({"cmd": "await", "truth": truth,
                                      "timeout": options.settle_timeout},
                                     options.settle_timeout + 10)
                           for w in workers.by_model.values()))
    # However long that took, the counts get their quiet period.
    deadline = max(deadline, time.monotonic() + 4 * options.quiet)
    last: object = None
    still_since = time.monotonic()
    while time.monotonic() < deadline:
        r.live_server = server_counts(app, r.wire)
        server = {m: [c.messages, c.bytes] for m, c in r.live_server.items()}
        clients = {m: list(v) for m, v in workers.counts.items()}
        r.client_counts = clients
        now = (server, clients)
        agree = all(clients.get(m) == server.get(m) for m in r.models)
        if now != last or not agree:
            last, still_since = now, time.monotonic()
        elif time.monotonic() - still_since >= options.quiet:
            return True
        progress.tick(r)
        await asyncio.sleep(0.05)  # polling with a deadline
    return False


async def run_isolated(cs: CompareScenario, out: Path, options: RunOptions,
                       progress: Progress, models: tuple[str, ...]) -> dict[str, Run]:
    """Each model alone, one after another: a fresh server on the same seeded churn
    (the sim's changes are a function of the scenario), nothing shared with the
    other models' runs. Each run's raw data go to `out/isolated-<model>/`."""
    runs: dict[str, Run] = {}
    for model in models:
        progress.phase(f"isolated run: {model} alone")
        runs[model] = await run(cs.only(model), out / f"isolated-{model}", options, progress)
    return runs
