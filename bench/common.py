"""What the benchmarks share: the result rows `python -m bench` tabulates, memory and
CPU readings, and the JSON-lines conversation with a client process.

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

import asyncio
import gc
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


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


def rss_kib() -> int:
    """This process's resident memory (Linux /proc), in KiB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


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


def out_line(**fields: Any) -> None:
    """A JSON line to the parent (client processes talk on stdout)."""
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


class Child:
    """A benchmark's client process: `python -m MODULE --client ARGS...`, JSON lines out,
    closed by closing its stdin."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, module: str, *args: str) -> Child:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH"))
                                            if p)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", module, "--client", *args,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
            limit=1 << 24)
        return cls(proc)

    async def line(self, timeout: float = 300.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not raw:
            raise RuntimeError(f"the client process exited (status {await self.proc.wait()})")
        parsed: dict[str, Any] = json.loads(raw)
        return parsed

    async def send(self, **fields: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(fields).encode() + b"\n")
        await self.proc.stdin.drain()

    async def close(self, timeout: float = 60.0) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


async def commands() -> asyncio.StreamReader:
    """The parent's commands on stdin, as an asyncio reader (client processes)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader


async def poll(check: Any, timeout: float, what: str, period: float = 0.01) -> None:
    """Wait until `check()` is true, polling, or fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:g}s")
        await asyncio.sleep(period)  # polling with a deadline


def print_json(bench: str, rows: list[dict[str, Any]], details: dict[str, Any]) -> None:
    print(json.dumps({"bench": bench, "rows": rows, "details": details}, indent=1))


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit in ("ms", "KiB", "µs", "s"):
        return f"{value:,.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"
    if unit == "%":
        return f"{value:.1f}%"
    return f"{value:,.2f} {unit}".rstrip()


class StaticSource:
    """A source that applies a fixed set of objects and then only what the benchmark
    applies to the cluster itself (so each measured change has a precise start)."""

    name = "bench"
    stale = False

    def __init__(self, objects: Sequence[Any]) -> None:
        self.objects = list(objects)

    async def run(self, cluster: Any, synced: asyncio.Event) -> None:
        from bridge.cluster import Event, EventType

        cluster.apply(Event(EventType.ADDED, o) for o in self.objects)
        synced.set()
        await asyncio.Event().wait()  # until cancelled by App.stop


def serving_layers() -> list[Any]:
    """Both protocol layers, as `meshbridge serve` mounts them."""
    from meshbridge.layers import protocol_layers

    return protocol_layers()
