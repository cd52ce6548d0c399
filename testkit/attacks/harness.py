"""One measured attack run against a real `meshbridge serve`.

    Server        a `meshbridge serve` subprocess on a private copy of the demo
                  manifests: /ready, /metrics, RSS (VmRSS), one churned EndpointSlice
    GoodClients   a Linkerd `Get` stream and an ADS SotW EDS stream (grpc.aio, the
                  harness's measuring clients) on the churned service; an endpoint
                  change is a manifest rewrite, timed until each client holds it
    run_attack    baseline, then the attacker subprocess while endpoints change every
                  ~0.5 s and /ready is polled, then recovery (RSS, gauges): a Report

Waiting is always polling with a deadline (testkit/polling.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import grpc
import yaml

from bridge.sources.catalog import DEMO_DIR
from harness.clients import LinkerdClient, Received, XdsClient
from testkit import net
from testkit.net import free_port
from testkit.polling import eventually, eventually_sync
from testkit.processes import tree_rss_kib
from testkit.serving import workers_flag

REPO = Path(__file__).resolve().parents[2]
# Where `meshbridge serve` runs from (its cwd, so `-m meshbridge.cli` imports that tree):
# this repository, or another checkout to compare against (e.g. `git archive HEAD`).
SERVER_ROOT = Path(os.environ.get("MESHBRIDGE_ATTACK_SERVER_ROOT", str(REPO)))

# The native server's defences, as flags of `meshbridge serve`. ONE place: the
# attack budgets in budgets.py are derived from these values. Flags that
# `meshbridge serve --help` does not list (yet) are left out (see server_flags()).
SERVER_FLAGS: dict[str, str] = {
    "--h2-handshake-timeout": "2",
    "--h2-idle-timeout": "4",
    "--h2-keepalive-time": "1",
    "--h2-keepalive-timeout": "20",
    "--max-connections-per-client": "200",
    # The budgets count per window of this many seconds: long, so that an attack
    # reaches its budget's count however slowly a loaded machine lets the server read
    # it (with the default 10 s, a flood the server cannot read fast enough never
    # exceeds a rate; tests/unit/test_h2core.py covers the window itself).
    "--h2-window": "300",
}

# The churned service: web.emojivoto (demo), plus one EndpointSlice of ours whose
# addresses (10.250.x.y, never in the demo) the test rewrites.
TARGET = "web.emojivoto.svc.cluster.local:80"
CHURN_FILE = "90-attack-churn.yaml"
CHURN_PREFIX = "10.250."

# Gauges of the native server that must come back to their baseline after an attack.
GAUGES = ("meshbridge_http2_open_streams", "meshbridge_http2_handler_tasks")
# The server's trims after bursts (h2grpc.heap), reported with RSS.
HEAP_COUNTERS = ("meshbridge_http2_heap_trims_total", "meshbridge_http2_heap_trim_seconds_total")

# Deadlines are for what must happen at all (a /ready answer, a change delivered): a
# loaded machine makes them slower, never red. Latencies are reported, not judged.
READY_TIMEOUT = 20.0  # each /ready poll
CHANGE_DEADLINE = 30.0  # each endpoint change, for both good clients
CHANGE_PERIOD = 0.5
OBSERVE = 3.0  # seconds of churn and /ready polls at least, however soon the attack ends
RSS_SLACK = 20 * 1024 * 1024
RECOVERY_DEADLINE = 5.0  # RSS and gauges, after the attack


@cache
def serve_help() -> str:
    proc = subprocess.run([sys.executable, "-m", "meshbridge.cli", "serve", "--help"],
                          capture_output=True, text=True, cwd=SERVER_ROOT, timeout=600, check=False)
    return proc.stdout


def server_flags(transport: str = "native") -> list[str]:
    """SERVER_FLAGS as arguments, without those this `meshbridge serve` lacks."""
    text = serve_help()
    out: list[str] = []
    for flag, value in SERVER_FLAGS.items():
        if flag in text.split():
            out += [flag, value]
    return out


def missing_flags() -> list[str]:
    text = serve_help().split()
    return [f for f in SERVER_FLAGS if f not in text]


def get_if_up(url: str, timeout: float) -> tuple[int, str]:
    """(status, body); (0, "") when nothing answers (the server may be down)."""
    try:
        return net.http_get(url, timeout)
    except (OSError, ValueError):
        return 0, ""


def churn_slice(addresses: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-attack-churn", "namespace": "emojivoto",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": True, "serving": True,
                                                          "terminating": False}}
                      for ip in addresses],
    }


def churn_addresses(k: int) -> list[str]:
    """The churned slice's addresses for change number k (each change differs)."""
    return [f"{CHURN_PREFIX}{(k // 250) % 250}.{k % 250 + 1}"]


class Server:
    """`meshbridge serve` as a subprocess, on 127.0.0.1 only."""

    def __init__(self, workdir: Path, transport: str = "native") -> None:
        self.workdir = workdir
        self.transport = transport
        self.manifests = workdir / "manifests"
        self.log_path = workdir / "serve.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.admin_port = 0
        self.changes = 0
        self.flags: list[str] = []
        self.restarts = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        if self.manifests.exists():
            shutil.rmtree(self.manifests)
        shutil.copytree(DEMO_DIR, self.manifests, ignore=shutil.ignore_patterns("*.md"))
        self.set_endpoints(churn_addresses(self.changes))
        self.port, self.admin_port = free_port(), free_port()
        self.flags = server_flags(self.transport)
        cmd = [sys.executable, "-m", "meshbridge.cli", "serve",
               "--source", f"files:{self.manifests}",
               "--listen", f"127.0.0.1:{self.port}", "--admin", f"127.0.0.1:{self.admin_port}",
               "--log-format", "json", "--grpc-transport", self.transport,
               "--shutdown-grace", "1", *workers_flag(self.transport), *self.flags]
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=SERVER_ROOT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()
        proc = self.proc

        def ready() -> bool:
            if self.ready() == 200:
                return True
            if proc.poll() is not None:
                raise RuntimeError(f"meshbridge serve exited {proc.returncode}: "
                                   f"{self.log_tail()}")
            return False

        eventually_sync(ready, 300, lambda: f"meshbridge serve not ready: {self.log_tail()}\n")

    def ensure_running(self) -> None:
        """Restart the server if an earlier attack killed or wedged it."""
        if self.proc is not None and self.proc.poll() is None and self.ready() == 200:
            return
        self.stop()
        self.restarts += 1
        self.start()

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def ready(self, timeout: float = READY_TIMEOUT) -> int:
        return get_if_up(f"http://127.0.0.1:{self.admin_port}/ready", timeout)[0]

    def metrics(self) -> str:
        return get_if_up(f"http://127.0.0.1:{self.admin_port}/metrics", 5.0)[1]

    def gauges(self, names: tuple[str, ...] = GAUGES) -> dict[str, float | None]:
        """Each gauge's value (summed over its label sets); None if absent."""
        out: dict[str, float | None] = dict.fromkeys(names)
        for line in self.metrics().splitlines():
            if line.startswith("#"):
                continue
            metric, _, value = line.rpartition(" ")
            name = metric.split("{", 1)[0]
            if name in out:
                with contextlib.suppress(ValueError):
                    out[name] = (out[name] or 0.0) + float(value)
        return out

    def rss(self) -> int:
        """VmRSS in bytes, summed over the server and its worker processes if it has
        any (MESHBRIDGE_TEST_WORKERS); 0 if it is gone."""
        return 0 if self.proc is None else tree_rss_kib(self.proc.pid) * 1024

    def set_endpoints(self, addresses: list[str]) -> None:
        """Rewrite the churned slice (atomically: the source never reads half a file)."""
        tmp = self.manifests / (CHURN_FILE + ".tmp")
        tmp.write_text(yaml.safe_dump(churn_slice(addresses), sort_keys=False))
        os.replace(tmp, self.manifests / CHURN_FILE)


def churn_set(state: frozenset[Any]) -> frozenset[str]:
    return frozenset(e.address for e in state if str(e.address).startswith(CHURN_PREFIX))


class GoodClients:
    """One Linkerd Get stream and one ADS SotW stream, each on its own channel."""

    MODELS = ("linkerd", "sotw")

    def __init__(self, server: Server) -> None:
        self.server = server
        self.channels = [grpc.aio.insecure_channel(server.address,
                                                   options=[("grpc.use_local_subchannel_pool",
                                                             1)])
                         for _ in self.MODELS]
        self.linkerd = LinkerdClient(self.channels[0], [TARGET], observe=self._seen)
        self.xds = XdsClient(self.channels[1], [TARGET], observe=self._seen)
        self.tasks: list[asyncio.Task[None]] = []
        self.expected: frozenset[str] = frozenset()
        self.change_started = 0
        self.got: dict[str, float] = {}

    def _seen(self, r: Received) -> None:
        for target, state in r.states:
            if target == TARGET and r.model not in self.got and churn_set(state) == self.expected:
                self.got[r.model] = (r.at_ns - self.change_started) / 1e9

    def holds(self, model: str) -> bool:
        client: LinkerdClient | XdsClient = self.linkerd if model == "linkerd" else self.xds
        st = client.state.get(TARGET)
        return st is not None and churn_set(st.state()) == self.expected

    async def start(self) -> None:
        self.expected = frozenset(churn_addresses(self.server.changes))
        self.change_started = time.monotonic_ns()
        self.tasks = [asyncio.create_task(self.linkerd.run()),
                      asyncio.create_task(self.xds.run())]
        await self._wait(10.0)

    async def _wait(self, timeout: float) -> dict[str, float | None]:
        """Until both clients hold the expected set, or `timeout`: each one's latency
        (None: not within the deadline)."""
        with contextlib.suppress(AssertionError):  # a passed deadline is a None latency
            await eventually(lambda: all(self.holds(m) for m in self.MODELS)
                             or all(t.done() for t in self.tasks), timeout, period=0.01)
        out: dict[str, float | None] = {}
        for m in self.MODELS:
            if m in self.got:
                out[m] = self.got[m]
            elif self.holds(m):  # held before this change's message (should not happen)
                out[m] = (time.monotonic_ns() - self.change_started) / 1e9
            else:
                out[m] = None
        return out

    async def change(self) -> dict[str, float | None]:
        """One endpoint change, timed until each client holds it."""
        self.server.changes += 1
        self.expected = frozenset(churn_addresses(self.server.changes))
        self.got = {}
        self.change_started = time.monotonic_ns()
        await asyncio.to_thread(self.server.set_endpoints, sorted(self.expected))
        return await self._wait(CHANGE_DEADLINE)

    def status(self) -> str:
        return (f"linkerd: {self.linkerd.state[TARGET].status or 'streaming'}, "
                f"sotw: {self.xds.status or 'streaming'}")

    async def close(self) -> None:
        await self.xds.close()
        for ch in self.channels:
            await ch.close(grace=None)
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Report:
    attack: str
    transport: str
    seconds: float = 0.0
    ready: list[tuple[float, int]] = field(default_factory=list)  # (t, status)
    baseline_latency: dict[str, list[float]] = field(default_factory=dict)
    attack_latency: dict[str, list[float]] = field(default_factory=dict)
    missed: list[str] = field(default_factory=list)  # changes a client did not get in time
    rss_baseline: int = 0
    rss_reference: int = 0  # what RSS must come back near: this run's baseline, or the
    # first of a series of runs (repeating an attack must not ratchet memory up)
    rss_peak: int = 0
    rss_after: int = 0
    rss_recovered_in: float | None = None
    rss_series: list[float] = field(default_factory=list)  # MiB, polled after the attack
    gauges_baseline: dict[str, float | None] = field(default_factory=dict)
    gauges_after: dict[str, float | None] = field(default_factory=dict)
    heap: dict[str, float | None] = field(default_factory=dict)  # HEAP_COUNTERS at the end
    attacker: dict[str, Any] = field(default_factory=dict)
    attacker_error: str = ""
    clients_status: str = ""
    server_alive: bool = True

    @property
    def ready_throughout(self) -> bool:
        return bool(self.ready) and all(s == 200 for _, s in self.ready)

    def latency(self, which: str, q: float) -> float | None:
        source = self.attack_latency if which == "attack" else self.baseline_latency
        return percentile([x for v in source.values() for x in v], q)

    def health_problems(self, check_gauges: bool) -> list[str]:
        """What (a), (b), (c) and (e) of the suite found wrong."""
        problems = []
        bad = [(round(t, 2), s) for t, s in self.ready if s != 200]
        if not self.ready:
            problems.append("/ready was never polled during the attack")
        elif bad:
            problems.append(f"/ready not 200 during the attack ({len(bad)} of "
                            f"{len(self.ready)} polls; (t, status): {bad[:5]})")
        if self.missed:
            problems.append(f"good clients missed changes (deadline {CHANGE_DEADLINE:g}s): "
                            f"{self.missed[:5]}; {self.clients_status}")
        if not self.server_alive:
            problems.append("the server process died")
        if self.rss_recovered_in is None:
            problems.append(f"RSS {self.rss_after / 2**20:.1f} MiB, baseline "
                            f"{self.rss_reference / 2**20:.1f} MiB: not within "
                            f"{RSS_SLACK / 2**20:.0f} MiB {RECOVERY_DEADLINE:g}s after the "
                            "attack")
        if check_gauges:
            for name in GAUGES:
                base, after = self.gauges_baseline.get(name), self.gauges_after.get(name)
                if base is None or after is None:
                    problems.append(f"gauge {name} missing from /metrics")
                elif after > base:
                    problems.append(f"gauge {name} at {after:g} after the attack, baseline "
                                    f"{base:g}")
        if self.attacker_error:
            problems.append(f"attacker: {self.attacker_error}")
        return problems

    def text(self) -> str:
        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v * 1000:.0f}ms"
        a = self.attacker
        per_client = {k: [round(x, 3) for x in v] for k, v in self.attack_latency.items()}
        return "\n".join([
            f"[{self.transport}] {self.attack}: {self.seconds:.1f}s",
            f"  ready: {sum(s == 200 for _, s in self.ready)}/{len(self.ready)} polls 200",
            f"  change latency p50/p99: baseline {ms(self.latency('baseline', .5))}/"
            f"{ms(self.latency('baseline', .99))}, under attack "
            f"{ms(self.latency('attack', .5))}/{ms(self.latency('attack', .99))}; per "
            f"client under attack: {per_client}; "
            f"missed: {self.missed}",
            f"  RSS MiB: baseline {self.rss_baseline / 2**20:.1f} (held to "
            f"{self.rss_reference / 2**20:.1f}), peak "
            f"{self.rss_peak / 2**20:.1f}, after {self.rss_after / 2**20:.1f}"
            + (f" (back within {RSS_SLACK // 2**20} MiB in {self.rss_recovered_in}s)"
               if self.rss_recovered_in is not None else
               f" (NOT back within {RSS_SLACK // 2**20} MiB in {RECOVERY_DEADLINE:g}s)")
            + f"; heap trims so far: {self.heap}; polled after: {self.rss_series[:12]}"
            + ("..." if len(self.rss_series) > 12 else ""),
            f"  gauges: baseline {self.gauges_baseline}, after {self.gauges_after}",
            f"  attacker: {json.dumps(a)}" + (f" ERROR {self.attacker_error}"
                                              if self.attacker_error else ""),
        ])


async def _poll_ready(server: Server, report: Report, t0: float, done: asyncio.Event) -> None:
    while not done.is_set():
        status = await asyncio.to_thread(server.ready, READY_TIMEOUT)
        report.ready.append((time.monotonic() - t0, status))
        report.rss_peak = max(report.rss_peak, server.rss())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), 0.2)  # the polling period


async def _churn(clients: GoodClients, report: Report, done: asyncio.Event) -> None:
    while not done.is_set():
        started = time.monotonic()
        got = await clients.change()
        for model, latency in got.items():
            if latency is None:
                report.missed.append(f"change {clients.server.changes} to {model}")
            else:
                report.attack_latency.setdefault(model, []).append(latency)
        rest = CHANGE_PERIOD - (time.monotonic() - started)
        if rest > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), rest)  # the churn period


async def _recover(server: Server, report: Report, check_gauges: bool) -> None:
    end = time.monotonic() + RECOVERY_DEADLINE

    def rss_recovered() -> bool:
        report.rss_after = server.rss()
        report.rss_peak = max(report.rss_peak, report.rss_after)
        report.rss_series.append(round(report.rss_after / 2**20, 1))
        return report.rss_after <= report.rss_reference + RSS_SLACK

    async def gauges_recovered() -> bool:
        report.gauges_after = await asyncio.to_thread(server.gauges)
        return all(report.gauges_after.get(g) is not None
                   and (report.gauges_after[g] or 0) <= (report.gauges_baseline.get(g) or 0)
                   for g in GAUGES)

    # Not recovering by the deadline is what the report records, not a failure here.
    with contextlib.suppress(AssertionError):
        took = await eventually(rss_recovered, RECOVERY_DEADLINE, period=0.1)
        report.rss_recovered_in = round(took, 2)
    if not check_gauges:
        return
    with contextlib.suppress(AssertionError):
        await eventually(gauges_recovered, max(0.0, end - time.monotonic()), period=0.1)


async def run_attack(server: Server, name: str, seconds: float,
                     args: tuple[str, ...] = (), check_gauges: bool = False,
                     baseline_changes: int = 3, rss_reference: int = 0) -> Report:
    """Baseline, attack (churn + /ready polls), recovery: one Report. `seconds` caps the
    attacker, which stops as soon as it has its answer."""
    report = Report(name, server.transport)
    started = time.monotonic()
    server.ensure_running()
    clients = GoodClients(server)
    try:
        await clients.start()
        for _ in range(baseline_changes):
            for model, latency in (await clients.change()).items():
                if latency is not None:
                    report.baseline_latency.setdefault(model, []).append(latency)
        report.rss_baseline = server.rss()
        report.rss_reference = rss_reference or report.rss_baseline
        report.rss_peak = report.rss_baseline
        if check_gauges:
            report.gauges_baseline = await asyncio.to_thread(server.gauges)

        cmd = [sys.executable, "-m", "testkit.attacks.attackers", name, "--host", "127.0.0.1",
               "--port", str(server.port), "--seconds", str(seconds), *args]
        done = asyncio.Event()
        t0 = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *cmd, cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        pollers = [asyncio.create_task(_poll_ready(server, report, t0, done)),
                   asyncio.create_task(_churn(clients, report, done))]
        try:
            out, err = await asyncio.wait_for(proc.communicate(), seconds + 20)
        except TimeoutError:
            proc.kill()
            out, err = await proc.communicate()
            report.attacker_error = f"attacker still running {seconds + 20:g}s on: killed"
        # Keep churning and polling /ready for OBSERVE seconds at least, even when the
        # server cut the attacker off at once.
        rest = OBSERVE - (time.monotonic() - t0)
        if rest > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(pollers[0]), rest)  # the window
        done.set()
        await asyncio.gather(*pollers)
        lines = out.decode(errors="replace").strip().splitlines()
        try:
            report.attacker = json.loads(lines[-1]) if lines else {}
        except json.JSONDecodeError:
            report.attacker = {}
        if not report.attacker and not report.attacker_error:
            report.attacker_error = (f"no JSON (exit {proc.returncode}): "
                                     f"{err.decode(errors='replace')[-500:]}")
        await _recover(server, report, check_gauges)
        report.heap = await asyncio.to_thread(server.gauges, HEAP_COUNTERS)
        report.clients_status = clients.status()
        report.server_alive = server.proc is not None and server.proc.poll() is None
    finally:
        await clients.close()
    report.seconds = time.monotonic() - started
    return report
