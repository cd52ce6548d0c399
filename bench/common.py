"""What the benchmarks share: the result rows `python -m bench` tabulates, CPU and GC
readings, and how a benchmark prints its result. (What tests share with benchmarks —
client processes, memory readings, a static source, polling — is in `testkit`.)

A benchmark module prints its own report, or with `--json` one JSON object:

    {"bench": "fanout", "rows": [ROW, ...], "details": {...}}

where each ROW is one line of the `make bench` table:

    {"name": "fan-out to 5,000 Get streams", "metric": "last stream has the change",
     "value": 180.2, "unit": "ms", "target": 250, "better": "lower",
     "runs": [170.1, 180.2, 191.0]}

`value` is the median of `runs` (each run one full measurement), so every figure in
the table is a median of several runs and says how many.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any


def row(name: str, metric: str, runs: Sequence[float], unit: str,
        target: float | None = None, better: str = "lower", **extra: Any) -> dict[str, Any]:
    """One table row from the per-run figures (the value is their median)."""
    values = [float(v) for v in runs]
    out: dict[str, Any] = {
        "name": name, "metric": metric, "unit": unit,
        "value": statistics.median(values) if values else None,
        "runs": values, "target": target, "better": better,
    }
    out["ok"] = meets(out["value"], target, better)
    out.update(extra)
    return out


def meets(value: float | None, target: float | None, better: str) -> bool | None:
    if value is None or target is None:
        return None
    return value <= target if better == "lower" else value >= target


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process and all its threads so far."""
    return time.process_time()


class GcPauses:
    """The cyclic collector's pauses in this process while open: count, total and
    longest, per generation (wall time from the collector's start to its end)."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.total = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]
        self._started = 0.0

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *_exc: object) -> None:
        gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        gen, took = info["generation"], time.perf_counter() - self._started
        self.count[gen] += 1
        self.total[gen] += took
        self.longest[gen] = max(self.longest[gen], took)

    def figures(self) -> dict[str, Any]:
        """{"gen2": {"count": 3, "total_ms": 410.2, "max_ms": 180.4}, ...}"""
        return {f"gen{g}": {"count": self.count[g], "total_ms": round(self.total[g] * 1e3, 1),
                            "max_ms": round(self.longest[g] * 1e3, 1)} for g in range(3)}


def print_json(bench: str, rows: list[dict[str, Any]], details: dict[str, Any]) -> None:
    print(json.dumps({"bench": bench, "rows": rows, "details": details}, indent=1))


def parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """`python -m bench.NAME`'s command line, with `--json` (the rows for `python -m
    bench`) already on it."""
    p = argparse.ArgumentParser(prog=f"python -m bench.{name}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    return p


def client_arguments(p: argparse.ArgumentParser) -> None:
    """The hidden arguments a benchmark's client process is started with (`Child`)."""
    p.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--server", help=argparse.SUPPRESS)


def finish(bench: str, result: dict[str, Any], as_json: bool,
           rows: Callable[[dict[str, Any]], list[dict[str, Any]]],
           report: Callable[[dict[str, Any]], str]) -> int:
    """Print a benchmark's result: its rows as JSON for `python -m bench`, else its
    report; the exit status."""
    if as_json:
        print_json(bench, rows(result), result)
    else:
        print(report(result))
    return 0


class Profile:
    """`--profile FILE`: this process profiled (pyinstrument, 0.5 ms samples) from
    `Profile(path)` until `save()` writes the report; nothing when no file is given."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._profiler: Any = None
        if path:
            from pyinstrument import Profiler

            self._profiler = Profiler(interval=0.0005, async_mode="disabled")
            self._profiler.start()

    def save(self) -> None:
        if self._profiler is None or not self.path:
            return
        self._profiler.stop()
        with open(self.path, "w", encoding="utf-8") as f:
            f.write(self._profiler.output_text(unicode=True, show_all=False))


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit in ("ms", "KiB", "µs", "s"):
        return f"{value:,.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"
    if unit == "%":
        return f"{value:.1f}%"
    return f"{value:,.2f} {unit}".rstrip()
