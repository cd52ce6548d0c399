"""Steady churn: a big cluster changing all the time, watched by many mixed clients.

    python -m bench.churn [--services 1000] [--endpoints 20] [--rate 50] [--clients 2000]
                          [--targets 2] [--duration 30] [--runs 3] [--json]

Each run is one `meshbridge compare` run (harness/compare/run.py): meshbridge on the
sim source in this process, the measuring clients in a child process, an equal share
of Linkerd Get, xDS SotW and xDS delta clients, each following `--targets` services
picked at random. The churn is rolling restarts, scaling and a flapping pod, at
`--rate` changes a second for `--duration` seconds. Figures per run:

    CPU share     the server process's CPU seconds (every thread) over the churn and
                  the settle after it, divided by that wall time: 50% = half a core
    latency       change-to-client, truth-based (docs/compare.md): from the moment
                  a change is applied to the moment a client's state for the target
                  equals the truth of that change; p50/p99 over every (client,
                  target, change), per model
    correct       every client's final state equals the truth

The figure in the table is the median over the runs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import finish, parser, row

TARGET_CPU_SHARE = 50.0  # percent of one core
TARGET_P99_MS = 100.0
MODELS = ("linkerd", "sotw", "delta")
TITLES = {"linkerd": "Linkerd Get", "sotw": "xDS SotW", "delta": "xDS delta"}


def scenario_yaml(args: argparse.Namespace) -> str:
    share = [args.clients // 3 + (1 if i < args.clients % 3 else 0) for i in range(3)]
    return f"""
name: bench-churn
seed: 17
cluster:
  namespaces: 10
  services: {args.services}
  endpoints_per_service: {args.endpoints}
  zones: 3
  slice_size: 100
  port: 8080
  meshed: true
churn:
  rate: {args.rate}
  patterns: {{rolling_restart: 3, scale: 2, flap: 1, zone_loss: 0}}
duration: {args.duration}
clients:
  linkerd: {share[0]}
  sotw: {share[1]}
  delta: {share[2]}
  targets: {args.targets}
  selection: random
  kube_watchers: 1
"""


class _Quiet:
    def phase(self, text: str) -> None:
        print(f"  churn bench: {text}", file=sys.stderr, flush=True)

    def tick(self, run: Any) -> None:
        return None


async def one_run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    from harness.compare import report as compare_report
    from harness.compare import run as compare_run
    from harness.compare.scenario import parse_compare_scenario

    cs = parse_compare_scenario(scenario_yaml(args), "bench-churn")
    out.mkdir(parents=True, exist_ok=True)
    options = compare_run.RunOptions(connect_timeout=180.0, settle_timeout=60.0,
                                     trace_memory=False)
    run = await compare_run.run(cs, out, options, _Quiet())
    fig = compare_report.write(run, out, with_charts=False)
    wall = (run.settled_ns - run.churn_start_ns) / 1e9
    return {
        "changes": fig["run"]["changes"],
        "churn_seconds": fig["run"]["churn_seconds"],
        "wall_seconds": wall,
        "cpu_seconds": fig["server"]["cpu_seconds"],
        "cpu_share_percent": 100.0 * fig["server"]["cpu_seconds"] / wall if wall else 0.0,
        "latency_ms": {m: fig["models"][m]["latency_ms"] for m in MODELS
                       if m in fig["models"]},
        "streams": {m: fig["models"][m]["streams"] for m in MODELS if m in fig["models"]},
        "connect_seconds": {m: run.connect[m].get("seconds") for m in run.connect},
        "ok": fig["ok"],
        "failed_checks": [c["name"] for c in fig["checks"] if not c["ok"]],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-churn-") as tmp:
        for i in range(args.runs):
            results.append(asyncio.run(one_run(args, Path(tmp) / f"run-{i}")))
    return {"services": args.services, "endpoints": args.endpoints, "rate": args.rate,
            "clients": args.clients, "targets": args.targets, "duration": args.duration,
            "runs": results}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    runs = result["runs"]
    what = (f"steady churn: {result['services']:,} services x {result['endpoints']}, "
            f"{result['rate']:g} changes/s, {result['clients']:,} mixed clients")
    out = [row(what, "server CPU share of one core", [r["cpu_share_percent"] for r in runs],
               "%", TARGET_CPU_SHARE,
               correct=all(r["ok"] for r in runs))]
    for m in MODELS:
        lats = [r["latency_ms"][m] for r in runs if m in r["latency_ms"]]
        if not lats:
            continue
        out.append(row(what, f"{TITLES[m]} change-to-client p50", [x["p50"] for x in lats],
                       "ms"))
        out.append(row(what, f"{TITLES[m]} change-to-client p99", [x["p99"] for x in lats],
                       "ms", TARGET_P99_MS))
    return out


def report(result: dict[str, Any]) -> str:
    runs = result["runs"]
    med = statistics.median
    lines = [f"steady churn: {result['services']:,} services x {result['endpoints']} "
             f"endpoints, {result['rate']:g} changes/s for {result['duration']:g}s, "
             f"{result['clients']:,} clients x {result['targets']} targets; "
             f"{len(runs)} runs (medians)",
             f"  server CPU share: {med([r['cpu_share_percent'] for r in runs]):.1f}% of one "
             f"core (target < {TARGET_CPU_SHARE:g}%)"]
    for m in MODELS:
        lats = [r["latency_ms"][m] for r in runs if m in r["latency_ms"]]
        if lats:
            lines.append(f"  {TITLES[m]:12} p50 {med([x['p50'] for x in lats]):6.1f} ms  "
                         f"p99 {med([x['p99'] for x in lats]):6.1f} ms "
                         f"(target < {TARGET_P99_MS:g} ms)")
    lines.append(f"  every client ends with the truth: "
                 f"{'yes' if all(r['ok'] for r in runs) else 'NO'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = parser("churn", __doc__)
    p.add_argument("--services", type=int, default=1000)
    p.add_argument("--endpoints", type=int, default=20)
    p.add_argument("--rate", type=float, default=50.0)
    p.add_argument("--clients", type=int, default=2000)
    p.add_argument("--targets", type=int, default=2)
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args(argv)
    from meshbridge.log import configure_logging

    configure_logging("console", "warning")
    return finish("churn", run(args), args.json, rows, report)


if __name__ == "__main__":
    sys.exit(main())
