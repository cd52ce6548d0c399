"""A route-edit run of `meshbridge compare`: how long a route change takes to reach every
client of each model, and how many bytes it costs (docs/compare.md, "Route edits").

A scenario with a `routes` section is one:

    routes:
      edits: 40          # route changes, one after another
      interval: 0.25     # seconds between two
      services: 10       # services with a route (the first N of the sim; default all)

Every routed service gets an HTTPRoute splitting it with the next service of its own
namespace (1000 to itself, 1 to the canary: a backend in a third namespace is refused,
Routes §3.2). Edit k changes one route's canary weight to k + 2, so every
edit is told apart by its weight; the routes are edited round robin over the routed
services that some client follows. The sim's endpoints do not churn. The models:

    linkerd  OutboundPolicies.Watch, a stream per (client, target)
    sotw     RDS over one SotW ADS stream per client
    delta    RDS over one delta ADS stream per client

meshbridge runs in this process on the sim source; each model's clients in a child
process (`harness.compare.route_clients`). An edit is stamped (`time.monotonic_ns()`)
just before it is applied to the Cluster, as the source's own events are; a client
stamps each message on arrival. For every edit and every client that follows the
edited service, the latency is the first arrival of the edit's weight; the edit
reached a model when its last client had it. Every client must end on the last
weight of each of its targets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge.cluster import Event, EventType
from bridge.model import MeshConfig
from bridge.objects import decode_object
from bridge.sources.sim import ScenarioError, SimSource
from harness.compare.scenario import MODEL_TITLES, CompareScenario
from meshbridge.app import App, ServeOptions
from meshbridge.layers import protocol_layers
from meshbridge.limits import LOOPBACK_CROWD, Limits

ROUTE_MODELS = ("linkerd", "sotw", "delta")
ROUTE_TITLES = {"linkerd": "Linkerd OutboundPolicies (stream per target)",
                "sotw": MODEL_TITLES["sotw"] + ", RDS", "delta": MODEL_TITLES["delta"] + ", RDS"}
BASE_WEIGHT = 1000


@dataclass(frozen=True, slots=True)
class RoutePlan:
    edits: int
    interval: float
    services: int | None  # None: every service


def parse_route_plan(raw: Mapping[str, Any], services: int) -> RoutePlan:
    unknown = sorted(set(raw) - {"edits", "interval", "services"})
    if unknown:
        raise ScenarioError(f"routes: unknown key {unknown[0]!r} (allowed: edits, interval, "
                            "services)")
    edits = raw.get("edits", 20)
    if isinstance(edits, bool) or not isinstance(edits, int) or not 1 <= edits <= 100000:
        raise ScenarioError(f"routes.edits: must be an integer in 1..100000, got {edits!r}")
    interval = raw.get("interval", 0.25)
    if isinstance(interval, bool) or not isinstance(interval, int | float) or interval < 0:
        raise ScenarioError(f"routes.interval: must be a number of seconds >= 0, got "
                            f"{interval!r}")
    count = raw.get("services")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                              or not 1 <= count <= services):
        raise ScenarioError(f"routes.services: must be an integer in 1..{services}, got "
                            f"{count!r}")
    return RoutePlan(edits, float(interval), count)


def check_route_scenario(cs: CompareScenario) -> RoutePlan:
    """The plan of a route-edit scenario; ScenarioError for what it cannot measure."""
    plan = parse_route_plan(cs.scenario.routes, cs.scenario.cluster.services)
    if cs.clients.leds:
        raise ScenarioError("clients.leds: a route-edit run has no LEDS model (routes "
                            "travel over RDS)")
    shape = cs.scenario.cluster
    if shape.services < 2 * shape.namespaces:
        raise ScenarioError(f"cluster.services: a route-edit run needs two services in "
                            f"every namespace to split between ({2 * shape.namespaces} for "
                            f"{shape.namespaces} namespaces), got {shape.services}")
    return plan


def canary_of(cs: CompareScenario, index: int) -> tuple[str, str]:
    """The service after `index` in its own namespace (the sim deals services round
    robin over namespaces, so that is `namespaces` further on, wrapping)."""
    services = cs.services()
    ns = services[index][0]
    same = [s for s in services if s[0] == ns]
    return same[(same.index(services[index]) + 1) % len(same)]


def http_route(cs: CompareScenario, index: int, canary: int) -> Any:
    """svc-index's route: BASE_WEIGHT to itself, `canary` to its canary service."""
    ns, name = cs.services()[index]
    _, canary_name = canary_of(cs, index)
    port = cs.scenario.cluster.port
    return decode_object({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": f"{name}-split", "namespace": ns},
        "spec": {"parentRefs": [{"group": "", "kind": "Service", "name": name, "port": port}],
                 "rules": [{"backendRefs": [
                     {"name": name, "port": port, "weight": BASE_WEIGHT},
                     {"name": canary_name, "port": port, "weight": canary}]}]}})


class ClientProcess:
    """One model's clients in a child process: ready, then stop and results."""

    def __init__(self, proc: asyncio.subprocess.Process, results: Path) -> None:
        self.proc = proc
        self.results = results

    @classmethod
    async def start(cls, model: str, server: str, clients: list[tuple[int, tuple[str, ...]]],
                    out: Path) -> ClientProcess:
        config = out / f"route-clients-{model}.json"
        results = out / f"route-results-{model}.json"
        config.write_text(json.dumps({
            "server": server, "model": model, "results": str(results),
            "clients": [{"index": i, "targets": list(t)} for i, t in clients]}),
            encoding="utf-8")
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        with (out / f"route-clients-{model}.log").open("wb") as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "harness.compare.route_clients", str(config),
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=err,
                env=env)
        return cls(proc, results)

    async def expect(self, event: str, timeout: float) -> None:
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            while line := await self.proc.stdout.readline():
                if json.loads(line).get("event") == event:
                    return
        raise RuntimeError(f"route clients (pid {self.proc.pid}) ended before {event!r}")

    async def settle(self, final: Mapping[str, int], timeout: float) -> None:
        """Until every client holds `final` (target -> canary weight; 1 for the rest)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"settle": final, "timeout": timeout}).encode()
                              + b"\n")
        await self.proc.stdin.drain()
        await self.expect("settled", timeout + 10)

    async def stop(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"stop\n")
        await self.proc.stdin.drain()
        await self.expect("stopped", timeout)
        result: dict[str, Any] = json.loads(self.results.read_text(encoding="utf-8"))
        result["pid"] = self.proc.pid
        return result

    async def close(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        await self.proc.wait()


@dataclass(frozen=True, slots=True)
class Edit:
    index: int
    target: str
    weight: int
    at_ns: int


async def run_route_edit(cs: CompareScenario, plan: RoutePlan, out: Path,
                         connect_timeout: float = 60.0,
                         settle_timeout: float = 30.0) -> dict[str, Any]:
    """One route-edit run; its figures (also written to `out/route-edit.json`)."""
    out.mkdir(parents=True, exist_ok=True)
    models = tuple(m for m in ROUTE_MODELS if cs.clients.count(m))
    if not models:
        raise ScenarioError(f"clients: a route-edit run needs one of {', '.join(ROUTE_MODELS)}")
    routed = list(range(plan.services or cs.scenario.cluster.services))
    specs = {m: [(i, cs.targets_of(i)) for i in range(cs.clients.count(m))] for m in models}
    followed = {t for clients in specs.values() for _, ts in clients for t in ts}
    edited = [i for i in routed if cs.authority(*cs.services()[i]) in followed]
    if not edited:
        raise ScenarioError("routes.services: no client follows a routed service")
    streams = sum(len(ts) for _, ts in specs.get("linkerd", [])) + sum(
        len(c) for m, c in specs.items() if m != "linkerd")
    limits = Limits(max_streams_per_client=max(Limits().max_streams_per_client,
                                                2 * streams + 100), h2=LOOPBACK_CROWD)
    # No endpoint churn: the sim's churn waits for an event no one sets.
    source = SimSource(cs.scenario, start_churn=asyncio.Event())
    app = App(source, MeshConfig(), ServeOptions("127.0.0.1:0", "127.0.0.1:0", limits=limits),
              protocol_layers())
    processes: dict[str, ClientProcess] = {}
    edits: list[Edit] = []
    try:
        await app.start()
        app.cluster.apply(Event(EventType.ADDED, http_route(cs, i, 1)) for i in routed)
        server = f"127.0.0.1:{app.grpc_port}"
        for m in models:
            processes[m] = await ClientProcess.start(m, server, specs[m], out)
        for m in models:
            await processes[m].expect("ready", connect_timeout)
        cpu0, t0 = time.process_time(), time.monotonic()
        for k in range(plan.edits):
            i = edited[k % len(edited)]
            weight = k + 2
            route = http_route(cs, i, weight)
            at = time.monotonic_ns()
            app.cluster.apply([Event(EventType.MODIFIED, route)])
            edits.append(Edit(k, cs.authority(*cs.services()[i]), weight, at))
            await asyncio.sleep(plan.interval)  # the scenario's pace, not synchronisation
        edit_seconds = time.monotonic() - t0
        cpu = time.process_time() - cpu0
        results = await _settled(processes, edits, settle_timeout)
    finally:
        for proc in processes.values():
            await proc.close()
        await app.stop(0.5)
    figures = route_figures(cs, plan, models, specs, edits, results, cpu, edit_seconds)
    (out / "route-edit.json").write_text(json.dumps(figures, indent=1), encoding="utf-8")
    (out / "route-edit.md").write_text(route_table(figures) + "\n", encoding="utf-8")
    return figures


async def _settled(processes: Mapping[str, ClientProcess], edits: list[Edit],
                   timeout: float) -> dict[str, dict[str, Any]]:
    """Wait until each process's clients hold every target's last weight (or the
    deadline: what did not arrive shows as a divergence), then stop them and collect
    what they received."""
    final = {e.target: e.weight for e in edits}
    await asyncio.gather(*(p.settle(final, timeout) for p in processes.values()))
    return {m: await p.stop(30.0) for m, p in processes.items()}


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def route_figures(cs: CompareScenario, plan: RoutePlan, models: tuple[str, ...],
                  specs: Mapping[str, list[tuple[int, tuple[str, ...]]]], edits: list[Edit],
                  results: Mapping[str, Mapping[str, Any]], cpu: float,
                  edit_seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {"scenario": cs.scenario.name, "edits": len(edits),
                           "interval_s": plan.interval,
                           "server_cpu_ms_per_edit": round(1000 * cpu / max(1, len(edits)), 3),
                           "edit_phase_s": round(edit_seconds, 3), "models": {}, "failures": []}
    first_edit_ns = edits[0].at_ns if edits else 0
    for model in models:
        res = results[model]
        clients = {f"compare-{model}-{i}": set(ts) for i, ts in specs[model]}
        # (client, target, weight) -> first arrival; and each client's last weights.
        arrivals: dict[tuple[str, str, int], int] = {}
        latest: dict[tuple[str, str], list[int]] = {}
        edit_bytes = edit_messages = 0
        seen_messages: set[tuple[str, int]] = set()
        for client, target, weights, at, size in res["records"]:
            latest[(client, target)] = weights
            if len(weights) == 2:
                arrivals.setdefault((client, target, weights[1]), at)
            if at >= first_edit_ns and (client, at) not in seen_messages:
                # A SotW or delta response naming several targets counts once.
                seen_messages.add((client, at))
                edit_bytes += size
                edit_messages += 1
        per_client: list[float] = []
        to_all: list[float] = []
        missed = 0
        for e in edits:
            followers = [c for c, ts in clients.items() if e.target in ts]
            times = []
            for c in followers:
                at = arrivals.get((c, e.target, e.weight))
                if at is None:
                    missed += 1  # superseded before it arrived, or never: checked below
                    continue
                times.append((at - e.at_ns) / 1e6)
            per_client += times
            if times and len(times) == len(followers):
                to_all.append(max(times))
        final = {e.target: e.weight for e in edits}
        for c, ts in clients.items():
            for t in sorted(ts):
                want = final.get(t, 1)
                got = latest.get((c, t))
                if got is None or len(got) != 2 or got[1] != want:
                    out["failures"].append({"client": c, "target": t, "want": want,
                                            "got": got})
        out["models"][model] = {
            "title": ROUTE_TITLES[model], "clients": len(clients),
            "streams": sum(len(ts) for ts in clients.values()) if model == "linkerd"
            else len(clients),
            "messages_per_edit": round(edit_messages / max(1, len(edits)), 2),
            "bytes_per_edit": round(edit_bytes / max(1, len(edits)), 1),
            "to_every_client_ms": {"p50": round(_quantile(to_all, 0.5), 2),
                                   "p95": round(_quantile(to_all, 0.95), 2),
                                   "max": round(max(to_all, default=0.0), 2)},
            "per_client_ms": {"p50": round(_quantile(per_client, 0.5), 2),
                              "mean": round(statistics.fmean(per_client), 2)
                              if per_client else 0.0},
            "edits_reaching_every_client": len(to_all), "arrivals_missed": missed,
            "client_cpu_s": round(float(res.get("cpu_seconds", 0.0)), 3),
            "client_errors": res.get("errors", [])}
    out["ok"] = not out["failures"] and all(
        not m["client_errors"] for m in out["models"].values())
    return out


def route_table(fig: Mapping[str, Any]) -> str:
    lines = [f"route edits: {fig['edits']} every {fig['interval_s']:g} s; server CPU "
             f"{fig['server_cpu_ms_per_edit']} ms per edit",
             "",
             "| model | clients (streams) | messages per edit | bytes per edit | "
             "to every client p50 / p95 / max | per client p50 |",
             "|---|--:|--:|--:|--:|--:|"]
    for m in fig["models"].values():
        t = m["to_every_client_ms"]
        lines.append(f"| {m['title']} | {m['clients']} ({m['streams']}) | "
                     f"{m['messages_per_edit']} | {m['bytes_per_edit']} B | "
                     f"{t['p50']} / {t['p95']} / {t['max']} ms | "
                     f"{m['per_client_ms']['p50']} ms |")
    for f in fig["failures"][:20]:
        lines.append(f"DIVERGENCE: {f['client']} {f['target']}: want weight {f['want']}, "
                     f"holds {f['got']}")
    lines.append("PASS" if fig["ok"] else "FAIL")
    return "\n".join(lines)
