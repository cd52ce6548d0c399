"""Soak: churn and mixed, restarting clients for a while (MESHBRIDGE_SOAK_SECONDS, 60 in
`make test`; see docs/reliability.md for the long run). Every client must end with the
truth, and the server's memory must stay flat: no growth beyond noise between the
second and the last third of the run."""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import sys
import time
from pathlib import Path

from bench.common import REPO, Child, rss_kib
from bridge.sources.sim import Churn, ClusterShape, Scenario, SimCluster
from tests.reliability.support import start_app, truth

SECONDS = float(os.environ.get("MESHBRIDGE_SOAK_SECONDS", "60"))
CLIENTS = int(os.environ.get("MESHBRIDGE_SOAK_CLIENTS", "300"))
SERVICES = 10
RATE = 40.0  # changes per second
NOISE_KIB = 6 * 1024


async def test_a_soak_with_churn_and_restarting_clients_converges_in_flat_memory(
    tmp_path: Path,
) -> None:
    sim = SimCluster(Scenario(seed=1, cluster=ClusterShape(
        namespaces=2, services=SERVICES, endpoints_per_service=10, zones=3),
        churn=Churn(rate=RATE, patterns={"rolling_restart": 3, "scale": 2, "flap": 1,
                                         "zone_loss": 0.1})))
    app = await start_app(sim.initial_objects())
    child = await _clients(f"127.0.0.1:{app.grpc_port}")
    samples: list[tuple[float, int]] = []
    try:
        await child.line(60)
        changes = sim.changes()
        start = time.monotonic()
        next_sample = start
        index = 0
        while (now := time.monotonic()) - start < SECONDS:
            due = start + index / RATE
            if now >= due:
                app.cluster.apply(next(changes)[1])
                index += 1
            if now >= next_sample:
                gc.collect()
                samples.append((now - start, rss_kib()))
                next_sample += 0.5
            await asyncio.sleep(max(0.0, min(due, next_sample) - time.monotonic()))
        await child.send(cmd="quiet")
        await child.line(30)

        async def wrong() -> list[str]:
            await child.send(cmd="report")
            states = (await child.line(60))["states"]
            return [f"{t}: {s} != {sorted(truth(app, t))}" for t, s in states
                    if s is None or frozenset(s) != truth(app, t)]

        deadline = time.monotonic() + 60
        while (bad := await wrong()):
            assert time.monotonic() < deadline, f"{len(bad)} clients differ: {bad[:3]}"
            await asyncio.sleep(0.2)  # polling with a deadline
    finally:
        await child.close()
        await app.stop(grace=0.5)
    assert index >= RATE * SECONDS * 0.9, index
    thirds = len(samples) // 3
    second = statistics.median(r for _, r in samples[thirds:2 * thirds])
    last = statistics.median(r for _, r in samples[2 * thirds:])
    (tmp_path / "rss.txt").write_text("\n".join(f"{t:.1f} {r}" for t, r in samples))
    assert last - second <= max(NOISE_KIB, 0.05 * second), (
        f"memory grew from {second} KiB to {last} KiB over the run")


async def _clients(server: str) -> Child:
    """The client process (tests/reliability/soak_clients.py), JSON lines both ways."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.reliability.soak_clients", server, str(CLIENTS),
        str(SERVICES), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        env=env, limit=1 << 24)
    return Child(proc)
