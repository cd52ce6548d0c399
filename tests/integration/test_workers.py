"""`meshbridge serve --workers 2` as a user runs it (docs/workers.md): a watcher process
and two worker processes on one gRPC port, real clients of every protocol over many
connections, real signals.

The clients are the reliability tier's followers (a Linkerd `Get`, an xDS SotW or an
xDS delta stream each, reopened whenever it ends, as a proxy reconnects); what each
holds is compared with what the manifests say after every edit."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from testkit.fleet import MODELS, Fleet
from testkit.net import free_port, http_text, ready
from testkit.polling import HANG, eventually, eventually_sync
from testkit.processes import children, running, stop
from tests.integration.xds_helpers import DEMO, Manifests

CATALOG = "catalog.shop.svc.cluster.local:80"
CORES = len(os.sched_getaffinity(0))  # this machine and CI's have 2


class Served:
    """A `meshbridge serve --workers 2` process and what its admin port says."""

    def __init__(self, proc: subprocess.Popen[str], grpc_port: int, admin_port: int) -> None:
        self.proc = proc
        self.grpc_port = grpc_port
        self.admin_port = admin_port

    def streams(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = json.loads(
            http_text(f"http://127.0.0.1:{self.admin_port}/debug/streams"))
        return rows

    def metric(self, name: str, labels: str = "") -> float:
        """One sample of /metrics (summed over the processes by the watcher), 0 if
        absent."""
        wanted = f"{name}{{{labels}}}" if labels else name
        for line in http_text(f"http://127.0.0.1:{self.admin_port}/metrics").splitlines():
            if line.startswith(wanted + " "):
                return float(line.split()[-1])
        return 0.0

    def workers(self) -> list[int]:
        """The worker processes' pids: the children of the watcher's fork server
        (multiprocessing's, which the workers are forked from)."""
        servers = [p for p in children(self.proc.pid) if b"forkserver" in _cmdline(p)]
        return sorted(w for p in servers for w in children(p))


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def serve_argv(folder: Path, grpc_port: int, admin_port: int, workers: str) -> list[str]:
    return [sys.executable, "-m", "meshbridge.cli", "serve", "--source", f"files:{folder}",
            "--workers", workers, "--listen", f"127.0.0.1:{grpc_port}",
            "--admin", f"127.0.0.1:{admin_port}", "--log-format", "json"]


@contextmanager
def served(folder: Path) -> Iterator[Served]:
    grpc_port, admin_port = free_port(), free_port()
    with running(serve_argv(folder, grpc_port, admin_port, "2"), lambda: ready(admin_port),
                 # start-up takes tens of seconds on a loaded machine
                 "/ready never answered 200", timeout=120, stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT, text=True,
                 env={**os.environ, "PYTHONUNBUFFERED": "1"}) as proc:
        yield Served(proc, grpc_port, admin_port)


@asynccontextmanager
async def fleet(server: Served, per_model: int = 6) -> AsyncIterator[Fleet]:
    """`per_model` followers of each model on CATALOG, over 12 connections."""
    clients = Fleet(f"127.0.0.1:{server.grpc_port}", per_model * len(MODELS),
                    lambda i: CATALOG, channels=12)
    clients.start()
    try:
        yield clients
    finally:
        for f in clients.followers:
            await f.stop()
        for channel in clients.channels:
            await channel.close()


# The kernel gives each new connection to a worker by a hash of its addresses, so the
# 12 connections of a fleet all land on one worker about once in 2,048 runs. A fleet
# that did is replaced by a new one (new connections) until both workers serve
# streams; the chance that every attempt lands on one worker is 2**-66.
SPREAD_ATTEMPTS = 6


def served_by(server: Served) -> set[int | None]:
    """The workers serving the fleet's streams (GetProfile's are the watcher's)."""
    return {r.get("worker") for r in server.streams() if r["protocol"] != "linkerd-profile"}


@asynccontextmanager
async def fleet_on_both_workers(server: Served) -> AsyncIterator[Fleet]:
    """`fleet(server)`, its followers holding catalog's endpoints, on both workers."""
    seen: list[set[int | None]] = []
    for _ in range(SPREAD_ATTEMPTS):
        async with fleet(server) as clients:
            await all_hold(clients, catalog(), "the first answers")
            seen.append(served_by(server))
            if seen[-1] == {0, 1}:
                yield clients
                return
        await eventually(lambda: not server.streams(), HANG,
                         lambda: f"the replaced fleet's streams still listed: {server.streams()}")
    raise AssertionError(f"{SPREAD_ATTEMPTS} fleets of 12 connections, each served by "
                         f"one worker only: {seen}")


async def all_hold(clients: Fleet, expected: set[str], what: str) -> None:
    def wrong() -> list[str]:
        return [f"{f.model}-{f.index}: {sorted(f.state() or ())}" for f in clients.followers
                if f.state() != frozenset(expected)]
    await eventually(lambda: not wrong(), HANG, lambda: f"{what}: {wrong()[:3]}", period=0.05)


def catalog() -> set[str]:
    return {ip for ip, _ in DEMO[CATALOG]}


async def test_clients_over_both_workers_follow_an_add_and_a_remove(demo_dir: Path) -> None:
    edits = Manifests(demo_dir)
    with served(demo_dir) as server:
        async with fleet_on_both_workers(server) as clients:
            expected = catalog()
            # Both workers serve streams, and the watcher's pages list and count them all.
            rows = [r for r in server.streams() if r["protocol"] != "linkerd-profile"]
            assert len(rows) == len(clients.followers)
            assert {r["worker"] for r in rows} == {0, 1}
            assert server.metric("pilot_xds", 'api="sotw"') == 6
            assert server.metric("pilot_xds", 'api="delta"') == 6
            assert server.metric("meshbridge_destination_streams", 'method="Get"') == 6
            assert server.metric("meshbridge_worker_up", 'worker="0"') == 1
            assert server.metric("meshbridge_worker_up", 'worker="1"') == 1
            # The watcher's Views count each worker's streams, not its one feed.
            views = json.loads(http_text(f"http://127.0.0.1:{server.admin_port}/debug/views"))
            assert sum(n for v in views if v["authority"] == CATALOG
                       for n in v["subscribers"].values()) == len(clients.followers), views

            edits.remove_endpoint("20-shop.yaml", "shop", "catalog-5m7kp", "10.244.3.21")
            expected.discard("10.244.3.21")
            await all_hold(clients, expected, "after a remove")

            edits.add_pod_endpoint("20-shop.yaml", "shop", "catalog-5m7kp",
                                   "catalog-8d6f9c7b5-w2hzb", "catalog-8d6f9c7b5-new01",
                                   "10.244.3.22", "zone-c", "node-c")
            expected.add("10.244.3.22")
            await all_hold(clients, expected, "after an add")
            assert not any(f.statuses for f in clients.followers), \
                "a stream ended while every process stayed up"
        stop(server.proc)
    assert server.proc.returncode == 0


async def test_a_killed_worker_is_restarted_and_its_clients_reconnect_to_current_state(
        demo_dir: Path) -> None:
    edits = Manifests(demo_dir)
    with served(demo_dir) as server:
        async with fleet_on_both_workers(server) as clients:
            expected = catalog()
            first = server.workers()
            assert len(first) == 2, first
            assert {r.get("worker") for r in server.streams()} == {0, 1}

            # Each worker serves streams: whichever this is, its clients lose theirs.
            os.kill(first[0], signal.SIGKILL)
            # Changed while they reconnect: they must end on this, not what they had.
            edits.remove_endpoint("20-shop.yaml", "shop", "catalog-5m7kp", "10.244.3.21")
            expected.discard("10.244.3.21")
            await eventually(lambda: server.metric("meshbridge_worker_restarts_total") == 1,
                             HANG, "the watcher counted the restart")
            await eventually(lambda: len(server.workers()) == 2
                             and first[0] not in server.workers(), HANG,
                             lambda: f"a new worker beside {first[1]}: {server.workers()}")
            await all_hold(clients, expected, "after the restart and a remove")
            ended = [f for f in clients.followers if f.statuses]
            assert 0 < len(ended) < len(clients.followers), \
                "the killed worker's clients reconnected, the other's kept their streams"
            await eventually(lambda: server.metric("meshbridge_worker_up", 'worker="0"') == 1
                             and server.metric("meshbridge_worker_up", 'worker="1"') == 1,
                             HANG, "both workers up again")
        stop(server.proc)
    assert server.proc.returncode == 0


async def test_the_workers_exit_when_the_watcher_is_killed(demo_dir: Path) -> None:
    with served(demo_dir) as server:
        workers = server.workers()
        assert len(workers) == 2
        server.proc.kill()
        server.proc.communicate()
        eventually_sync(lambda: not any(_alive(w) for w in workers), HANG,
                        lambda: f"workers still running: {[w for w in workers if _alive(w)]}")


@pytest.mark.parametrize("value", ["0", "abc", str(CORES + 1)])
def test_bad_worker_counts_are_refused_naming_the_limit(value: str) -> None:
    proc = subprocess.run(serve_argv(Path("unused"), 0, 0, value), capture_output=True,
                          text=True, timeout=HANG, check=False)
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert f"argument --workers: {value!r}: " in line, line
    assert f"this process may use {CORES} cores" in line and f"use 1..{CORES} or auto" in line


def test_a_port_the_workers_cannot_bind_fails_the_start_in_one_line(demo_dir: Path) -> None:
    # Taken without SO_REUSEPORT: neither the watcher's hold on the port nor a worker
    # can bind it (the start-up check says so first, before any worker starts).
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.Popen(serve_argv(demo_dir, port, free_port(), "2"),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    errors = [x for x in lines if x.get("level") == "error"]
    assert len(errors) == 1, errors
    assert errors[0]["event"] == f"--listen 127.0.0.1:{port}: cannot listen: " \
                                 "Address already in use"
    assert not any(x.get("event") == "serving" for x in lines)


async def test_a_worker_that_cannot_bind_after_the_watcher_has_fails_the_start_in_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The watcher holds its port and worker 0 binds it beside it; worker 1 is steered
    # to a port taken without SO_REUSEPORT, so its own bind, in its own process,
    # fails after the watcher's has succeeded (as a worker's bind failing for any
    # reason would). The start must fail naming worker 1, and leave nothing serving.
    from meshbridge.workers import watcher
    from meshbridge.workers.pool import WorkerFailed, WorkerPool
    from testkit.serving import StaticSource, loopback_app

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        taken_at = f"127.0.0.1:{taken.getsockname()[1]}"

        class SteeredPool(WorkerPool):
            def __init__(self, count: int, listen: str, spec: Any, registry: Any) -> None:
                super().__init__(count, listen,
                                 lambda i, at: spec(i, taken_at if i == 1 else at), registry)

        monkeypatch.setattr(watcher, "WorkerPool", SteeredPool)
        app = loopback_app(StaticSource([]), workers=2)
        with pytest.raises(WorkerFailed) as failed:
            await app.start()
        pool = app.watcher.pool if app.watcher is not None else None
        assert pool is not None
        port, workers = pool.port, [w.process for w in pool._workers]
        await app.stop(0)
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(f"worker 1: cannot listen on {taken_at}: "), message
    assert "Address already in use" in message, message
    # Not half started: no worker process is left, and the port takes no connection.
    assert all(w is not None and not w.is_alive() for w in workers)

    def refused() -> bool:
        with socket.socket() as probe:
            return probe.connect_ex(("127.0.0.1", port)) != 0
    await eventually(refused, HANG, f"port {port} still takes connections")
