"""meshbridge beside go-control-plane's LinearCache: one EDS change fanned out to N
SotW (or delta) ADS streams of each, side by side in one run.

    python -m bench.gcp_compare [--streams 5000] [--runs 5] [--protocol sotw|delta]

The peer is `bench/gcp_peer/main.go` (our own program on go-control-plane's
LinearCache, built from the Go module proxy by `scripts/gcp_peer.sh` and cached): it
serves the very ClusterLoadAssignment bytes meshbridge serves, so both send
identical resources. Each server gets its own client process of the same shape
(`bench.fanout`'s lean clients: every response decoded and ACKed, N streams over
`--channels` connections). Runs alternate between the two servers; each run is one
change (one pod added or removed), and measures

* the time from the change to the last stream having it;
* the server's CPU time (user + system, every thread) from the change until it is
  idle again (every ACK read): meshbridge's in this process (the change applied to
  its cluster cache, as `bench.fanout` does), the peer's from /proc;

and, once all streams are open, each server's resident memory per idle stream
(growth between N/5 and N streams). Figures are medians over the runs, and the
report gives meshbridge / peer ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.common import finish, parser, row
from bench.fanout import TARGET, idle_check, open_streams, scenario
from meshbridge import eventloop, gctune
from meshbridge.eventloop import EVENT_LOOPS, default_loop
from testkit.polling import eventually
from testkit.processes import REPO, Child, rss_kib

EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
TARGET_CPU_RATIO = 0.5  # issue 27: server CPU per change at most half the peer's
TARGET_KIB = 4.0


def build_peer() -> str:
    """The peer's executable (built and cached by scripts/gcp_peer.sh)."""
    out = subprocess.run(["bash", str(REPO / "scripts" / "gcp_peer.sh")], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return out.strip().splitlines()[-1]


def peer_version() -> str:
    text = (REPO / "scripts" / "gcp_peer.sh").read_text()
    for line in text.splitlines():
        if line.startswith('GCP_VERSION="${GCP_VERSION:-'):
            return line.split(":-", 1)[1].rstrip('}"')
    return "?"


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def proc_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Peer:
    """The go-control-plane process: `set NAME BASE64` in, `ok` out."""

    def __init__(self, proc: asyncio.subprocess.Process, port: int) -> None:
        self.proc = proc
        self.port = port

    @classmethod
    async def start(cls, binary: str) -> Peer:
        proc = await asyncio.create_subprocess_exec(
            binary, "-listen", "127.0.0.1:0", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE)
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        if not line.startswith("listening "):
            raise RuntimeError(f"gcp-peer did not start: {line!r}")
        return cls(proc, int(line.split()[1]))

    async def set(self, name: str, cla: bytes) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"set {name} {base64.b64encode(cla).decode()}\n".encode())
        await self.proc.stdin.drain()
        ok = await asyncio.wait_for(self.proc.stdout.readline(), 30)
        if ok.strip() != b"ok":
            raise RuntimeError(f"gcp-peer: {ok!r}")

    def cpu(self) -> float:
        return proc_cpu_seconds(self.proc.pid)

    def rss_kib(self) -> int:
        return proc_rss_kib(self.proc.pid)

    async def quiet(self, period: float = 0.05, timeout: float = 60.0) -> None:
        """Until the peer spends no CPU for a period (it has read every ACK)."""
        deadline = time.monotonic() + timeout
        before = self.cpu()
        while time.monotonic() < deadline:
            await asyncio.sleep(period)  # a measuring window, not synchronisation
            now = self.cpu()
            if now == before:
                return
            before = now
        raise TimeoutError("gcp-peer did not go idle")

    async def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()


def cla_bytes(app: Any) -> bytes:
    """The ClusterLoadAssignment meshbridge serves for TARGET now (the Any's value)."""
    from google.protobuf import any_pb2

    res = app.service("xds").cache.get(EDS, TARGET)
    assert res is not None
    value: bytes = any_pb2.Any.FromString(res.any_bytes).value
    return value


async def start_clients(port: int, args: argparse.Namespace) -> Child:
    return await Child.start(
        "bench.fanout", "--protocol", args.protocol, "--server", f"127.0.0.1:{port}",
        "--streams", str(args.streams), "--first-phase", str(max(1, args.streams // 5)),
        "--channels", str(args.channels), "--clients", "lean")


async def memory_phases(child: Child, rss: Callable[[], int],
                        settle: Callable[[int], Awaitable[None]]) -> float:
    """KiB of server RSS per stream between the client's two phases."""
    readings: list[tuple[int, int]] = []
    for _ in range(2):
        ready = (await child.line())["ready"]
        await settle(ready)
        readings.append((ready, rss()))
        await child.send(next=True)
    (n1, r1), (n2, r2) = readings
    return (r2 - r1) / (n2 - n1)


async def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    from meshbridge.log import configure_logging
    from testkit.serving import serve_objects

    configure_logging("console", "warning")
    binary = build_peer()
    sim = scenario(args.endpoints)
    app = await serve_objects(sim.initial_objects(), args.streams * 2 + 100)
    gctune.settle_heap()
    peer = await Peer.start(binary)
    await peer.set(TARGET, cla_bytes(app))
    mb_child = peer_child = None
    try:
        idle = idle_check(app, args.protocol)

        async def mb_settle(n: int) -> None:
            await eventually(lambda: open_streams(app, args.protocol) >= n and idle(), 300,
                       "meshbridge streams open and idle")
            gc.collect()

        async def peer_settle(_n: int) -> None:
            await peer.quiet()

        mb_child = await start_clients(app.grpc_port, args)
        mb_kib = await memory_phases(mb_child, rss_kib, mb_settle)
        peer_child = await start_clients(peer.port, args)
        peer_kib = await memory_phases(peer_child, peer.rss_kib, peer_settle)

        svc = sim.services[0]
        figures: dict[str, dict[str, list[float]]] = {
            side: {"all_received_ms": [], "server_cpu_ms": []} for side in ("meshbridge", "peer")}
        for run in range(1, args.runs + 1):
            events = sim._step_scale(svc, up=run % 2 == 1)
            # meshbridge: the change applied to its cluster cache.
            await eventually(idle, 120, "meshbridge idle before a run")
            cpu0, t0 = time.process_time(), time.monotonic()
            app.cluster.apply(events)
            got = await mb_child.line()
            assert got["run"] == run, got
            await eventually(idle, 120, "meshbridge idle after a run", period=0.001)
            figures["meshbridge"]["server_cpu_ms"].append((time.process_time() - cpu0) * 1e3)
            figures["meshbridge"]["all_received_ms"].append((got["last"] - t0) * 1e3)
            # The peer: the same CLA bytes meshbridge now serves.
            cla = cla_bytes(app)
            await peer.quiet()
            cpu0, t0 = peer.cpu(), time.monotonic()
            await peer.set(TARGET, cla)
            got = await peer_child.line()
            assert got["run"] == run, got
            await peer.quiet(period=0.02)
            figures["peer"]["server_cpu_ms"].append((peer.cpu() - cpu0) * 1e3)
            figures["peer"]["all_received_ms"].append((got["last"] - t0) * 1e3)
    finally:
        for child in (mb_child, peer_child):
            if child is not None:
                await child.close()
        await peer.close()
        await app.stop(grace=0.5)
        gctune.release_heap()
    return {"protocol": args.protocol, "streams": args.streams, "channels": args.channels,
            "runs": args.runs, "endpoints": args.endpoints, "event_loop": args.event_loop,
            "peer": f"go-control-plane {peer_version()} LinearCache",
            "memory_per_idle_stream_kib": {"meshbridge": mb_kib, "peer": peer_kib},
            "figures": figures}


def ratios(result: dict[str, Any]) -> dict[str, float]:
    f = result["figures"]
    med = {side: {k: statistics.median(v) for k, v in f[side].items()} for side in f}
    mem = result["memory_per_idle_stream_kib"]
    return {"cpu": med["meshbridge"]["server_cpu_ms"] / med["peer"]["server_cpu_ms"],
            "fanout": med["meshbridge"]["all_received_ms"] / med["peer"]["all_received_ms"],
            "memory": mem["meshbridge"] / mem["peer"] if mem["peer"] else float("nan")}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    f, n, p = result["figures"], result["streams"], result["protocol"]
    cpu_ratios = [m / q for m, q in zip(f["meshbridge"]["server_cpu_ms"],
                                        f["peer"]["server_cpu_ms"], strict=True)]
    return [
        row(f"{n:,} {p} EDS streams, meshbridge / {result['peer']}: server CPU per change",
            "ratio (per run)", cpu_ratios, "x", TARGET_CPU_RATIO,
            meshbridge_ms=f["meshbridge"]["server_cpu_ms"], peer_ms=f["peer"]["server_cpu_ms"]),
        row(f"{n:,} {p} EDS streams, meshbridge / {result['peer']}: last stream has it",
            "ratio (per run)",
            [m / q for m, q in zip(f["meshbridge"]["all_received_ms"],
                                   f["peer"]["all_received_ms"], strict=True)], "x"),
        row(f"{n:,} {p} EDS streams: memory per idle stream, meshbridge", "RSS growth",
            [result["memory_per_idle_stream_kib"]["meshbridge"]], "KiB", TARGET_KIB,
            peer_kib=result["memory_per_idle_stream_kib"]["peer"]),
    ]


def report(result: dict[str, Any]) -> str:
    f = result["figures"]
    r = ratios(result)
    med = {side: {k: statistics.median(v) for k, v in f[side].items()} for side in f}
    mem = result["memory_per_idle_stream_kib"]
    return "\n".join([
        f"{result['streams']:,} {result['protocol']} EDS streams over {result['channels']} "
        f"connections each, {result['runs']} runs per server, interleaved; meshbridge on "
        f"{result['event_loop']}, peer {result['peer']}",
        f"  last stream has the change: meshbridge {med['meshbridge']['all_received_ms']:.0f}"
        f" ms, peer {med['peer']['all_received_ms']:.0f} ms ({r['fanout']:.2f}x)",
        f"  server CPU per change:      meshbridge {med['meshbridge']['server_cpu_ms']:.0f} ms,"
        f" peer {med['peer']['server_cpu_ms']:.0f} ms ({r['cpu']:.2f}x; target "
        f"<= {TARGET_CPU_RATIO}x)",
        f"  memory per idle stream:     meshbridge {mem['meshbridge']:.1f} KiB, peer "
        f"{mem['peer']:.1f} KiB ({r['memory']:.2f}x)",
    ])


def main(argv: list[str] | None = None) -> int:
    p = parser("gcp_compare", __doc__)
    p.add_argument("--protocol", choices=("sotw", "delta"), default="sotw")
    p.add_argument("--streams", type=int, default=5000)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--channels", type=int, default=50)
    p.add_argument("--endpoints", type=int, default=10)
    p.add_argument("--event-loop", choices=EVENT_LOOPS, default=default_loop(),
                   help="meshbridge's event loop")
    args = p.parse_args(argv)
    return finish("gcp_compare", eventloop.run(run_bench(args), args.event_loop), args.json,
                  rows, report)


if __name__ == "__main__":
    sys.exit(main())
