"""Soak: a fixed number of changes (MESHBRIDGE_SOAK_CHANGES, 2,400 in `make test`; or
MESHBRIDGE_SOAK_SECONDS of them at the churn rate, see docs/reliability.md for the long
run) against mixed, restarting clients. Every client must end with the truth, and the
server's memory must stay flat: no growth beyond noise between the second and the last
third of the changes.

The churn is paced at RATE, but the test counts changes, not time: on a busy machine
the run takes longer and checks the same thing.
"""

from __future__ import annotations

import asyncio
import gc
import os
import statistics
import sys
import time
from itertools import islice
from pathlib import Path

from bridge.sources.sim import Churn, ClusterShape, Scenario, SimCluster
from testkit.fleet import truth
from testkit.polling import eventually
from testkit.processes import REPO, Child, pid_rss_kib, rss_kib
from testkit.serving import serve_objects, worker_pids

RATE = 40.0  # changes per second, at most
CHANGES = int(os.environ.get("MESHBRIDGE_SOAK_CHANGES")
              or RATE * float(os.environ.get("MESHBRIDGE_SOAK_SECONDS", "60")))
SAMPLES = 120  # memory samples over the run, one every CHANGES / SAMPLES changes
CLIENTS = int(os.environ.get("MESHBRIDGE_SOAK_CLIENTS", "300"))
SERVICES = 10
NOISE_KIB = 6 * 1024


async def test_a_soak_with_churn_and_restarting_clients_converges_in_flat_memory(
    tmp_path: Path,
) -> None:
    sim = SimCluster(Scenario(seed=1, cluster=ClusterShape(
        namespaces=2, services=SERVICES, endpoints_per_service=10, zones=3),
        churn=Churn(rate=RATE, patterns={"rolling_restart": 3, "scale": 2, "flap": 1,
                                         "zone_loss": 0.1})))
    app = await serve_objects(sim.initial_objects())
    child = await _clients(f"127.0.0.1:{app.grpc_port}")
    samples: list[tuple[int, int]] = []  # (changes applied, RSS KiB)
    every = max(1, CHANGES // SAMPLES)
    try:
        await child.line(60)
        start = time.monotonic()
        for index, (_, events) in enumerate(islice(sim.changes(), CHANGES)):
            # Never ahead of the rate; behind it (a busy machine) at once, so a slow run
            # is a longer run of the same changes.
            await asyncio.sleep(max(0.0, start + index / RATE - time.monotonic()))
            app.cluster.apply(events)
            if index % every == 0:
                gc.collect()
                # The server's memory: this process's, and its workers' if it has any.
                samples.append((index, rss_kib() + sum(map(pid_rss_kib, worker_pids(app)))))
        await child.send(cmd="quiet")
        await child.line(30)
        bad: list[str] = []

        async def converged() -> bool:
            await child.send(cmd="report")
            states = (await child.line(60))["states"]
            bad[:] = [f"{t}: {s} != {sorted(truth(app, t))}" for t, s in states
                      if s is None or frozenset(s) != truth(app, t)]
            return not bad

        await eventually(converged, 60, lambda: f"{len(bad)} clients differ: {bad[:3]}",
                         period=0.2)
    finally:
        await child.close()
        await app.stop(grace=0.5)
    thirds = len(samples) // 3
    second = statistics.median(r for _, r in samples[thirds:2 * thirds])
    last = statistics.median(r for _, r in samples[2 * thirds:])
    (tmp_path / "rss.txt").write_text("\n".join(f"{i} {r}" for i, r in samples))
    assert last - second <= max(NOISE_KIB, 0.05 * second), (
        f"memory grew from {second} KiB to {last} KiB over {CHANGES} changes")


async def _clients(server: str) -> Child:
    """The client process (tests/reliability/soak_clients.py), JSON lines both ways."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.reliability.soak_clients", server, str(CLIENTS),
        str(SERVICES), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        env=env, limit=1 << 24)
    return Child(proc)
