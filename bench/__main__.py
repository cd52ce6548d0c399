"""`make bench` / `python -m bench`: every headline figure in one table.

    python -m bench [--quick] [--only fanout,memory,churn,connect,encode,bigservice,routes,
                                     gcp,failover,parallel,workers,multicluster] [--out FILE]
    python -m bench NAME...      run benchmark modules by name, each printing its own
                                 report (e.g. `python -m bench big_service`)

The table is built by running benchmark modules, each in its own process (so one
benchmark's memory and threads cannot skew the next one's figures) with `--json`,
and collecting their rows (see bench/common.py). Every row is the median of several
runs and says how many. The table is printed and, with the raw figures of every run
and a description of the machine, written to bench/results.json.

`--quick` runs every suite at a small size (seconds, not minutes): a smoke test of the
benchmarks themselves, not figures to quote; its results are not written unless
`--out` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import fmt

HERE = Path(__file__).parent
NOT_BENCHMARKS = {"__init__", "__main__", "common"}
RESULTS = HERE / "results.json"

# (suite, module, arguments) for the full table and for --quick. A suite may run its
# module several times (fan-out: once per protocol and stream count).
FULL: dict[str, list[list[str]]] = {
    # Lean load clients (bench/h2client.py) measure the server; the grpc.aio rows show
    # what one Python process of grpc.aio clients adds on the same two cores.
    "fanout": [["fanout", "--protocol", p, "--streams", str(n), "--runs", "7"]
               for n in (1000, 5000, 10000) for p in ("get", "sotw", "delta")]
    + [["fanout", "--protocol", p, "--streams", "5000", "--runs", "7", "--clients", "grpcio"]
       for p in ("get", "sotw", "delta")],
    "churn": [["churn", "--runs", "3"]],
    "connect": [["connect", "--runs", "3"], ["connect", "--runs", "3",
                                             "--clients-kind", "grpcio"]],
    "encode": [["encode", "--runs", "5"]],
    # The second: compare's one-big-service shape (a flap in 5,000 endpoints), the
    # server process's CPU per change beside compare --isolate's (docs/performance.md).
    "bigservice": [["big_service", "--runs", "5"],
                   ["big_service", "--endpoints", "5000", "--runs", "3", "--latency-endpoints",
                    "5000", "--pattern", "flap", "--latency-runs", "3"]],
    "routes": [["route_edit", "--streams", "1000", "--runs", "5"]],
    # Beside go-control-plane's LinearCache (built from the Go module proxy), one run.
    "gcp": [["gcp_compare", "--protocol", p, "--streams", "5000", "--runs", "5"]
            for p in ("sotw", "delta")],
    "failover": [["failover", "--clients", "5000", "--runs", "3"]],
    "parallel": [["parallel", "--runs", "5"]],
    # The 10,000-stream SotW fan-out served by 2 worker processes (docs/workers.md),
    # beside the fan-out suite's 1-process row of the same shape.
    "workers": [["fanout", "--protocol", "sotw", "--streams", "10000", "--runs", "7",
                 "--workers", "2"]],
    # Two real kube-apiservers: what a linked cluster costs, and how fast a federated
    # service's change reaches a Get stream and an Envoy.
    "multicluster": [["linked_memory", "--runs", "3"],
                     ["multicluster_follow", "--flips", "10", "--runs", "3"]],
}
QUICK: dict[str, list[list[str]]] = {
    "fanout": [["fanout", "--protocol", p, "--streams", "100", "--runs", "3",
                "--channels", "5"] for p in ("get", "sotw", "delta")],
    "churn": [["churn", "--runs", "1", "--services", "50", "--clients", "30",
               "--duration", "3", "--rate", "20"]],
    "connect": [["connect", "--runs", "1", "--clients", "60", "--services", "50",
                 "--procs", "1"]],
    "encode": [["encode", "--runs", "2", "--changes", "20", "--endpoints", "10,100"]],
    "bigservice": [["big_service", "--runs", "1", "--changes", "20", "--endpoints",
                    "100,1000", "--latency-endpoints", "1000", "--latency-changes", "10",
                    "--latency-runs", "1"]],
    "gcp": [["gcp_compare", "--streams", "200", "--runs", "2", "--channels", "5"]],
    "failover": [["failover", "--clients", "100", "--names", "3", "--services", "20",
                  "--channels", "5", "--runs", "1"]],
    "parallel": [["parallel", "--streams", "500", "--rounds", "2", "--runs", "1"]],
    "workers": [["fanout", "--protocol", "sotw", "--streams", "100", "--runs", "3",
                 "--channels", "5", "--workers", "2"]],
    "routes": [["route_edit", "--streams", "100", "--runs", "2", "--channels", "5"]],
    "multicluster": [["linked_memory", "--runs", "1", "--pods", "1000"],
                     ["multicluster_follow", "--flips", "4", "--runs", "1"]],
}
SUITES = ("fanout", "memory", "churn", "connect", "encode", "bigservice", "routes", "gcp",
          "failover", "parallel", "workers", "multicluster")


def discover() -> list[str]:
    return sorted(
        p.stem for p in HERE.glob("*.py")
        if p.stem not in NOT_BENCHMARKS and not p.stem.startswith("_")
        and "def main(" in p.read_text(encoding="utf-8")
    )


def run_module(args: list[str]) -> dict[str, Any]:
    """Run `python -m bench.<module> ARGS --json`; its JSON, or an error record."""
    module, rest = args[0], args[1:]
    print(f"--- bench.{module} {' '.join(rest)}", file=sys.stderr, flush=True)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", f"bench.{module}", *rest, "--json"],
                          stdout=subprocess.PIPE, text=True, cwd=HERE.parent)
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        return {"bench": module, "args": rest, "error": f"exit status {proc.returncode}",
                "rows": [], "seconds": seconds}
    try:
        result: dict[str, Any] = json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        return {"bench": module, "args": rest, "error": f"output is not JSON: {e}",
                "rows": [], "seconds": seconds}
    result["args"] = rest
    result["seconds"] = seconds
    return result


def memory_rows(fanout_results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Memory per idle subscriber, per protocol: the median over the fan-out runs (one
    reading per stream count)."""
    from bench.common import row
    from bench.fanout import TARGET_KIB, TITLES

    by_protocol: dict[str, list[float]] = {}
    counts: dict[str, list[int]] = {}
    for r in fanout_results:
        d = r.get("details")
        if not d:
            continue
        by_protocol.setdefault(d["protocol"], []).append(d["memory_per_idle_stream_kib"])
        counts.setdefault(d["protocol"], []).append(d["streams"])
    return [row(f"memory per idle {TITLES[p]} subscriber",
                "server RSS growth per stream (" + " / ".join(f"{n:,}" for n in counts[p])
                + " streams)", values, "KiB", TARGET_KIB)
            for p, values in by_protocol.items()]


def machine() -> dict[str, Any]:
    import google.protobuf
    import grpc

    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = 0.0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": round(mem_gib, 1),
            "python": platform.python_version(), "grpcio": grpc.__version__,
            "protobuf": google.protobuf.__version__, "platform": platform.platform()}


def table(rows: list[dict[str, Any]]) -> str:
    header = ("benchmark", "measure", "median", "runs", "target", "")
    lines = [[r["name"], r["metric"], fmt(r["value"], r["unit"]), str(len(r["runs"])),
              ("-" if r["target"] is None else
               ("<= " if r["better"] == "lower" else ">= ") + fmt(r["target"], r["unit"])),
              {True: "ok", False: "MISSED", None: ""}[r["ok"]]] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(header, *lines, strict=True)]
    out = []
    for i, line in enumerate([list(header), *lines]):
        out.append("  ".join(c.ljust(w) if j < 2 else c.rjust(w)
                             for j, (c, w) in enumerate(zip(line, widths, strict=True)))
                   .rstrip())
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def run_table(args: argparse.Namespace) -> int:
    plan = QUICK if args.quick else FULL
    wanted = args.only.split(",") if args.only else list(SUITES)
    unknown = sorted(set(wanted) - set(SUITES))
    if unknown:
        print(f"unknown suite {unknown[0]!r}: expected {', '.join(SUITES)}", file=sys.stderr)
        return 2
    results: dict[str, list[dict[str, Any]]] = {}
    started = time.time()
    for suite in SUITES:
        if suite not in wanted and not (suite == "fanout" and "memory" in wanted):
            continue
        if suite == "memory":
            continue  # read from the fan-out runs
        results[suite] = [run_module(a) for a in plan[suite]]
    rows: list[dict[str, Any]] = []
    errors = []
    for suite in SUITES:
        if suite == "memory":
            if "memory" in wanted:
                rows.extend(memory_rows(results.get("fanout", [])))
            continue
        if suite not in wanted:
            continue
        for r in results.get(suite, []):
            rows.extend(r["rows"])
            if "error" in r:
                errors.append(f"bench.{r['bench']} {' '.join(r['args'])}: {r['error']}")
    info = machine()
    print()
    print(f"meshbridge benchmarks{' (quick: smoke sizes, not figures)' if args.quick else ''}"
          f" — {info['cores']} cores, {info['cpu']}, {info['memory_gib']} GiB; Python "
          f"{info['python']}, grpcio {info['grpcio']}")
    print(table(rows))
    for e in errors:
        print(f"FAILED: {e}")
    out = Path(args.out) if args.out else (None if args.quick else RESULTS)
    if out is not None:
        out.write_text(json.dumps({
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "seconds": round(time.time() - started, 1), "quick": args.quick,
            "machine": info, "rows": rows, "suites": results, "errors": errors,
        }, indent=1) + "\n", encoding="utf-8")
        print(f"results: {out}")
    others = [m for m in discover()
              if m not in {"fanout", "churn", "connect", "encode", "big_service"}]
    if others and not args.quick:
        print("also: " + ", ".join(f"python -m bench {m}" for m in others))
    return 1 if errors else 0


def run_named(names: list[str]) -> int:
    failed = []
    for name in names:
        print(f"=== bench.{name}", flush=True)
        rc = subprocess.call([sys.executable, "-m", f"bench.{name}"], cwd=HERE.parent)
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", help="benchmark modules to run on their own")
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke test")
    p.add_argument("--only", help=f"comma-separated suites of the table ({', '.join(SUITES)})")
    p.add_argument("--out", help=f"results file (default {RESULTS.relative_to(HERE.parent)})")
    args = p.parse_args(argv)
    if args.names:
        return run_named(args.names)
    return run_table(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
