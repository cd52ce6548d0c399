"""Big clusters: start-up, memory and first answers on a real API server full of pods.

    python -m bench.big_cluster [--pods 10000,50000] [--runs 3] [--per-service 20]
                                [--nodes 100] [--data-dir DIR [--fill-only]]
                                [--before REV] [--json]

A real kube-apiserver (with its watch cache, as in a real cluster) and etcd
(scripts/envtest.sh) are filled with a meshed cluster (bench/meshed_cluster.py:
Linkerd-injected pods with the proxy's environment and owner references, their
ReplicaSets, Services and EndpointSlices, Nodes), through the API. Then, per run,
`meshbridge serve --source kube` starts as a fresh process (its imports count) and
is measured from outside, as an operator would see it:

    start-up      from the process's start to its admin port's /ready answering 200,
                  and the CPU time the process used until then (user + system, every
                  thread): on a loaded machine the wall time is mostly waiting for a
                  core, the CPU time is the work
    RSS ready     its resident memory at that moment (/proc/PID/status VmRSS), and
                  its peak so far (VmHWM)
    first answers one Linkerd `Get` stream per service, opened at once from a client
                  process (bench/h2client.py); the time until every stream has had
                  its first answer, and the server's RSS then
    API server    the floor: how long the API server itself takes to stream the Pods'
                  state as meshbridge asks for it (a watch with sendInitialEvents, in
                  protobuf) to a reader that only splits the frames up to the bookmark
                  that ends it, and the API server's CPU meanwhile; measured before each
                  run, so "start-up minus the API server" is what meshbridge adds

With `--data-dir DIR`, each size's etcd data is kept in a directory of its own under
DIR, filled on first use and started on as it is afterwards (when etcd there holds
exactly the cluster of that shape: counted and read back, else an error); a fill of
50,000 pods is minutes of load, a start on kept data seconds, plus the minute or
more the API server's watch cache takes to list the pods again. `--fill-only` makes
the clusters and stops, so that the measuring invocation alone runs under the bench
lock. Before the first run the benchmark waits (polling, with a deadline) until the
API server streams every pod, and reports how long that took.

With `--before REV` (e.g. `--before main`), every run also starts the code of that git
revision (exported and byte-compiled, run by the same Python ahead of the installed
code on PYTHONPATH), alternated with this code's start-up on the same API server,
and its start-up, CPU and RSS are rows of their own: a change measured side by side.

Every row is the median of the runs. Linkerd 2.20's destination controller, measured
with the same kind of probe on the same kind of cluster at 10,000 pods (issue 27):
start-up 2.15 / 2.5 s, RSS once ready 350 / 342 MiB, with 500 `Get` streams 450 /
440 MiB, first answers 0.93 / 0.53 s.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from bench.common import print_json, row
from testkit.processes import REPO, Child, commands, out_line

TARGET_STARTUP_S = 2.5  # Linkerd's start-up at 10,000 pods (issue 27)
TARGET_RSS_MIB = 171.0  # half of Linkerd's RSS once ready at 10,000 pods
LINKERD = {"startup_s": (2.15, 2.5), "rss_ready_mib": (350, 342),
           "rss_streams_mib": (450, 440), "first_answers_s": (0.93, 0.53)}
GET = "/io.linkerd.proxy.destination.Destination/Get"


def runtime_python() -> Path:
    """A Python with meshbridge's runtime dependencies only, as the image has them. A
    development venv is not what a deployment runs: with `rich` installed, for one,
    structlog imports it. The venv is kept under ~/.cache/meshbridge-bench-runtime,
    keyed by the dependency list, and shared by every worktree; meshbridge itself is
    not installed in it (`installed_tree`)."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    key = hashlib.sha256(json.dumps([sys.version_info[:2], sorted(deps)]).encode())
    venv = Path.home() / ".cache" / "meshbridge-bench-runtime" / key.hexdigest()[:16]
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = venv / ".installed"
    if not done.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([*pip, "setuptools>=77", "wheel", *deps], check=True)
        done.touch()
    return python


def installed_tree(python: Path) -> Path:
    """meshbridge built from this tree and installed as the image installs it
    (byte-compiled: pip's default, the image's too) into a directory of this
    invocation's own, run from there on PYTHONPATH, outside the tree. On a machine
    that sets PYTHONDONTWRITEBYTECODE (this one does), an uncompiled install compiles
    every module at every start (over a second of it). Installed into the shared venv
    instead, as before, an invocation from another worktree reinstalled its own code
    under a running benchmark's feet."""
    target = Path(tempfile.mkdtemp(prefix="meshbridge-installed-"))
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-deps", "--no-build-isolation", "--target", str(target), str(REPO)],
                   check=True, capture_output=True)
    return target


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (every thread) so far, and of its
    children that have ended (meshbridge's Pod relay ends once the Pods' state is in,
    before /ready: its CPU counts)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def ready(admin: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/ready", timeout=1) as r:
            return int(r.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def targets(shape: Any) -> list[str]:
    from bench.meshed_cluster import namespace_of, service_name

    return [f"{service_name(s)}.{namespace_of(shape, s)}.svc.cluster.local:80"
            for s in range(shape.services)]


def stream_pods(api: Any, deadline_s: float = 1800.0,
                pause_s: float = 1.0) -> dict[str, Any]:
    """The API server alone: the Pods' initial state streamed (WatchList, protobuf) to
    a reader that decodes nothing, frames split until the bookmark that ends it.

    Tried until a watch reaches that bookmark (polling, a pause between tries, within
    `deadline_s`): until the API server's watch cache holds every pod, it refuses
    such a watch at once. Right after a start on kept data the cache is still listing
    them from etcd (HTTP 429, "storage is (re)initializing"); right after a fill
    through etcd it is still catching up with what was written (an ERROR event after
    about three seconds, "Too large resource version"). At 50,000 pods on two busy
    cores either lasts minutes, far beyond the ten immediate tries this probe used to
    make. The result is the successful try's, with how long the waiting took and why
    the tries before it failed."""
    started = time.monotonic()
    failures: list[str] = []
    while True:
        waited = time.monotonic() - started  # until this try began
        outcome = _stream_pods_once(api)
        if isinstance(outcome, dict):
            return {**outcome, "waited_s": waited, "failed_tries": len(failures),
                    "failures": failure_summary(failures)}
        failures.append(outcome)
        if len(failures) == 1 or len(failures) % 30 == 0:
            print(f"  the API server cannot stream the Pods yet ({waited:.0f} s, "
                  f"{len(failures)} tries): {outcome}", file=sys.stderr)
        if waited > deadline_s:
            raise RuntimeError(f"the API server would not stream the Pods' state within "
                               f"{deadline_s:.0f} s: {failure_summary(failures)}")
        time.sleep(pause_s)  # polling with a deadline, between whole tries


def failure_summary(failures: list[str]) -> dict[str, int]:
    """How often each reason came, its numbers left out (they differ per try)."""
    out: dict[str, int] = {}
    for f in failures:
        key = re.sub(r"\d+(\.\d+)?", "N", f)
        out[key] = out.get(key, 0) + 1
    return out


def _stream_pods_once(api: Any) -> dict[str, float] | str:
    """One try: the figures if the bookmark came, else why not."""
    import urllib3

    from bridge.sources import kube_wire
    from bridge.sources.kube import INITIAL_EVENTS_END
    from bridge.sources.kube_proto import MESSAGES

    pool = urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_certs=str(api.ca_path))
    pid = api.apiserver_pid
    cpu, started = proc_cpu_s(pid), time.monotonic()
    received = events = 0
    try:
        resp = pool.request(
            "GET", f"{api.url}/api/v1/pods", preload_content=False,
            fields={"watch": "1", "sendInitialEvents": "true",
                    "allowWatchBookmarks": "true", "resourceVersionMatch": "NotOlderThan",
                    "timeoutSeconds": "1800"},
            headers={"Authorization": f"Bearer {api.token}",
                     "Accept": kube_wire.PROTOBUF})
        try:
            if resp.status != 200:
                body = resp.read()
                return (f"HTTP {resp.status} "
                        f"{kube_wire.status_message(body, resp.headers.get('Content-Type'))}")
            for frame in kube_wire.proto_frames(resp.stream(1 << 20)):
                received += len(frame) + 4
                events += 1
                # Only a small frame is looked into: the bookmark that ends the state
                # (no pod's frame is that small), or an error.
                if len(frame) >= 4096:
                    continue
                event = MESSAGES["WatchEvent"].FromString(frame)
                if event.type == "ERROR":
                    return (f"ERROR event "
                            f"{kube_wire.status_message(event.object.raw, kube_wire.PROTOBUF)}"
                            f" after {events} events, {time.monotonic() - started:.1f} s")
                if INITIAL_EVENTS_END.encode() in bytes(frame):
                    return {"seconds": time.monotonic() - started,
                            "cpu_s": proc_cpu_s(pid) - cpu, "mib": received / 2**20,
                            "events": events}
        finally:
            resp.release_conn()
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        return f"{type(exc).__name__}: {exc} after {events} events"
    return (f"the stream ended without the end-of-state bookmark after {events} events, "
            f"{time.monotonic() - started:.1f} s")


async def one_run(python: Path, kubeconfig: Path, shape: Any, workdir: Path,
                  run: int, tree: Path, before: bool = False) -> dict[str, Any]:
    """One start-up of the code in `tree` (this tree's installed, or with `before`
    another revision's), run by `python` with `tree` first on PYTHONPATH."""
    grpc_port, admin = free_port(), free_port()
    log = workdir / f"serve-{shape.pods}-{run}{'-before' if before else ''}.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    with log.open("wb") as out:
        started = time.monotonic()
        proc = subprocess.Popen(
            [str(python), "-m", "meshbridge.cli", "serve", "--source", "kube",
             "--kubeconfig", str(kubeconfig), "--listen", f"127.0.0.1:{grpc_port}",
             "--admin", f"127.0.0.1:{admin}", "--log-format", "json"],
            stdout=out, stderr=subprocess.STDOUT, cwd=workdir, env=env)
    child: Child | None = None
    try:
        deadline = started + 600
        while not ready(admin):
            if proc.poll() is not None:
                raise RuntimeError(f"meshbridge exited with {proc.returncode}; see {log}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"meshbridge not ready within 600 s; see {log}")
            await asyncio.sleep(0.01)  # polling /ready with a deadline
        startup = time.monotonic() - started
        cpu_ready = proc_cpu_s(proc.pid)
        rss_ready = proc_kib(proc.pid, "VmRSS") / 1024
        load = os.getloadavg()[0]
        peak_ready = proc_kib(proc.pid, "VmHWM") / 1024
        child = await Child.start("bench.big_cluster", "--server", f"127.0.0.1:{grpc_port}",
                                  "--pods", str(shape.pods),
                                  "--per-service", str(shape.pods_per_service))
        answered = await child.line(timeout=600)
        rss_streams = proc_kib(proc.pid, "VmRSS") / 1024
        return {"startup_s": startup, "cpu_ready_s": cpu_ready, "load": load,
                "rss_ready_mib": rss_ready,
                "peak_ready_mib": peak_ready, "rss_streams_mib": rss_streams,
                "first_answers_s": answered["seconds"], "streams": answered["answered"],
                "log": str(log)}
    finally:
        if child is not None:
            await child.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def before_tree(python: Path, rev: str) -> Path:
    """The code of git revision `rev` of this repository, byte-compiled by `python`
    (as the installed code is), for side-by-side runs on the same API server."""
    tree = Path(tempfile.mkdtemp(prefix="meshbridge-before-"))
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    subprocess.run([str(python), "-m", "compileall", "-q", str(tree)], check=True,
                   capture_output=True)
    return tree


def size_dir(root: Path, shape: Any) -> Path:
    """Where under `--data-dir` the cluster of `shape` is kept (one per shape)."""
    return root / (f"{shape.pods}-pods-{shape.pods_per_service}-per-service-"
                   f"{shape.nodes}-nodes-{shape.namespaces}-namespaces")


def holds_etcd_data(directory: Path) -> bool:
    return (directory / "member").is_dir()


def object_counts(shape: Any) -> dict[str, int]:
    """How many objects of each kind a cluster of `shape` holds (what `fill` says)."""
    from bench.meshed_cluster import expected_counts

    kinds = {"pods": "Pod", "replicasets": "ReplicaSet", "services": "Service",
             "endpointslices": "EndpointSlice", "minions": "Node", "namespaces": "Namespace"}
    out: dict[str, int] = {}
    for prefix, n in expected_counts(shape).items():
        kind = kinds[prefix.split("/")[2]]
        out[kind] = out.get(kind, 0) + n
    return out


async def prepared_cluster(api: Any, shape: Any, kept: Path | None) -> dict[str, Any]:
    """Fill the started API server with `shape`, unless it started on etcd data kept
    in `kept`, which must then hold that cluster (checked in etcd: every prefix's key
    count and two pods read back, not a stamp). Data of another shape, or a fill that
    stopped half-way, is an error that names what differs."""
    from bench.meshed_cluster import Etcd, Rest, fill, shape_mismatches

    etcd = Etcd(api.etcd_url)
    if kept is not None:
        problems = await asyncio.to_thread(shape_mismatches, etcd, shape)
        if problems:
            raise SystemExit(f"{kept} holds another cluster than {shape}: "
                             + "; ".join(problems[:8])
                             + " (remove that directory to fill it afresh)")
        print(f"  {shape.pods:,} pods kept in {kept}: shape checked",
              file=sys.stderr)
        return {"objects": object_counts(shape), "fill_seconds": None, "kept": True}
    rest = Rest(api.url, api.token, str(api.ca_path), threads=16)
    t0 = time.monotonic()
    counts = await asyncio.to_thread(fill, rest, etcd, shape, 16,
                                     lambda m: print(f"  filled {m}", file=sys.stderr))
    filled = time.monotonic() - t0
    print(f"  {shape.pods:,} pods filled in {filled:.0f} s", file=sys.stderr)
    problems = await asyncio.to_thread(shape_mismatches, etcd, shape)
    if problems:
        raise RuntimeError("the fill left another cluster than asked: " + "; ".join(problems))
    return {"objects": counts, "fill_seconds": filled, "kept": False}


def api_server(data_dir: Path | None) -> Any:
    """The API server a size is measured on: with its watch cache (as in a cluster),
    and, with a data dir, etcd's data kept there (created if missing). etcd's quota is
    raised from its 2 GiB default: 50,000 pods weigh about 1.3 GB in it."""
    from testkit.kubeapi import KubeAPIServer

    return KubeAPIServer(
        watch_cache=True, startup_timeout=600, etcd_data_dir=data_dir,
        extra_etcd_args=[f"--quota-backend-bytes={8 << 30}"],
        extra_apiserver_args=["--max-requests-inflight=1000",
                              "--max-mutating-requests-inflight=1000"])


async def measure(python: Path, shape: Any, runs: int, current: Path | None = None,
                  before: Path | None = None,
                  data_root: Path | None = None) -> dict[str, Any]:
    """Fill (or find kept) a cluster of `shape`, then `runs` start-ups of the code in
    `current` on it (with `before`, alternated with that code's); with `runs` 0, only
    the cluster is made."""
    data_dir = size_dir(data_root, shape) if data_root is not None else None
    kept = data_dir is not None and holds_etcd_data(data_dir)
    if data_dir is not None:
        data_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="meshbridge-bigcluster-"))
    t0 = time.monotonic()
    with api_server(data_dir) as api:
        api_start = time.monotonic() - t0
        print(f"  etcd + kube-apiserver {'on kept data ' if kept else ''}ready in "
              f"{api_start:.1f} s", file=sys.stderr)
        made = await prepared_cluster(api, shape, data_dir if kept else None)
        results: list[dict[str, Any]] = []
        before_results: list[dict[str, Any]] = []
        cache = None
        for i in range(runs):
            floor = await asyncio.to_thread(stream_pods, api)
            if cache is None:
                cache = {"waited_s": floor["waited_s"], "failed_tries": floor["failed_tries"],
                         "failures": floor["failures"],
                         "since_start_s": time.monotonic() - t0}
                print(f"  the API server's watch cache answered a WatchList of every pod "
                      f"{cache['since_start_s']:.0f} s after the start "
                      f"({floor['waited_s']:.0f} s of waiting, {floor['failed_tries']} "
                      f"tries refused: {floor['failures']})", file=sys.stderr)
            print(f"  run {i + 1}: the API server alone streams the pods in "
                  f"{floor['seconds']:.2f} s ({floor['events']:,} events, "
                  f"{floor['mib']:.0f} MiB, {floor['cpu_s']:.2f} s of its CPU, "
                  f"load {os.getloadavg()[0]:.1f})", file=sys.stderr)
            # With --before, that code's start-up first, then this code's: alternated,
            # on the same API server, so that the two see the same machine.
            assert current is not None
            for tree in ([before] if before else []) + [current]:
                is_before = tree is before
                r = await one_run(python, api.kubeconfig_path, shape, workdir, i, tree,
                                  is_before)
                r["apiserver"] = floor
                print(f"  run {i + 1}{' (before)' if is_before else ''}: ready in "
                      f"{r['startup_s']:.2f} s ({r['cpu_ready_s']:.2f} s "
                      f"of CPU, load {r['load']:.1f}), RSS "
                      f"{r['rss_ready_mib']:.0f} MiB (peak {r['peak_ready_mib']:.0f}), "
                      f"{r['streams']} Get streams answered in "
                      f"{r['first_answers_s']:.2f} s, RSS {r['rss_streams_mib']:.0f} MiB",
                      file=sys.stderr)
                (before_results if is_before else results).append(r)
    return {"pods": shape.pods, "services": shape.services, "nodes": shape.nodes,
            **made, "data_dir": str(data_dir) if data_dir else None,
            "apiserver_start_s": api_start, "watch_cache": cache,
            "runs": results, "before_runs": before_results}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for size in result["sizes"]:
        runs, pods = size["runs"], size["pods"]
        at10k = pods == 10_000
        name = f"{pods:,} meshed pods, {size['services']:,} services"
        out.append(row(name, "start-up to /ready", [r["startup_s"] for r in runs], "s",
                       TARGET_STARTUP_S if at10k else None))
        out.append(row(name, "CPU until /ready", [r["cpu_ready_s"] for r in runs], "s"))
        out.append(row(name, "API server alone: the Pods' state streamed (WatchList, "
                       "protobuf)", [r["apiserver"]["seconds"] for r in runs], "s"))
        out.append(row(name, "start-up minus the API server's own streaming",
                       [r["startup_s"] - r["apiserver"]["seconds"] for r in runs], "s"))
        out.append(row(name, "RSS once ready", [r["rss_ready_mib"] for r in runs], "MiB",
                       TARGET_RSS_MIB if at10k else None))
        out.append(row(name, "peak RSS until ready", [r["peak_ready_mib"] for r in runs],
                       "MiB"))
        out.append(row(name, f"RSS with one Get stream per service ({size['services']:,})",
                       [r["rss_streams_mib"] for r in runs], "MiB"))
        out.append(row(name, "first answers on those streams",
                       [r["first_answers_s"] for r in runs], "s"))
        if size.get("before_runs"):
            before = size["before_runs"]
            name += f", the code of {result['before']} (alternated runs)"
            out.append(row(name, "start-up to /ready", [r["startup_s"] for r in before],
                           "s"))
            out.append(row(name, "CPU until /ready", [r["cpu_ready_s"] for r in before],
                           "s"))
            out.append(row(name, "RSS once ready", [r["rss_ready_mib"] for r in before],
                           "MiB"))
    out.extend(per_pod_rows(result["sizes"]))
    return out


def per_pod_rows(sizes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a pod (with its share of services, slices and ReplicaSets) adds to the RSS
    once ready, between each two sizes measured: the fixed cost falls out."""
    out = []
    for small, big in itertools.pairwise(sizes):
        extra = big["pods"] - small["pods"]
        per_run = [(b["rss_ready_mib"] - a["rss_ready_mib"]) * 1024 / extra
                   for a, b in zip(small["runs"], big["runs"], strict=False)]
        out.append(row(f"{small['pods']:,} -> {big['pods']:,} meshed pods",
                       "RSS once ready per added pod", per_run, "KiB"))
    return out


async def run_client(server: str, names: list[str]) -> int:
    """Open one Get stream per name at once; say when every one has had an answer."""
    from bench.h2client import LeanConnection
    from linkerd_api.proto import destination_pb2

    host, port = server.rsplit(":", 1)
    waiting: set[tuple[int, int]] = set()
    done = asyncio.Event()

    def on_message_of(ci: int) -> Any:
        def on_message(sid: int, raw: bytes) -> None:
            destination_pb2.Update.FromString(raw)
            waiting.discard((ci, sid))
            if not waiting:
                done.set()
        return on_message

    def on_end(sid: int, status: str) -> None:
        out_line(error=f"stream {sid} ended: {status}")

    conns = [await LeanConnection.connect(host, int(port), on_message_of(ci), on_end)
             for ci in range(min(10, len(names)))]
    start = time.monotonic()
    for i, name in enumerate(names):
        request = destination_pb2.GetDestination(scheme="k8s", path=name).SerializeToString()
        ci = i % len(conns)
        waiting.add((ci, conns[ci].open(GET, request, end_stream=True)))
    await asyncio.wait_for(done.wait(), 600)
    out_line(seconds=time.monotonic() - start, answered=len(names))
    reader = await commands()
    await reader.read()  # until the parent closes stdin
    for c in conns:
        c.close()
    return 0


def pod_sizes(text: str) -> list[int]:
    """`--pods`: cluster sizes, comma-separated positive numbers (10000,50000)."""
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: pod counts separated by commas, e.g. 10000,50000") from None
    if any(n < 1 for n in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: every pod count must be at least 1")
    return sizes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.big_cluster", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", type=pod_sizes, default=[10_000, 50_000],
                   help="cluster sizes, comma-separated")
    p.add_argument("--per-service", type=int, default=20, help="pods per service")
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--runs", type=int, default=3, help="start-ups per size")
    p.add_argument("--data-dir", type=Path, metavar="DIR",
                   help="keep each size's etcd data under DIR (one directory per shape) "
                   "and start on it when it already holds that cluster, instead of "
                   "filling a throwaway one every time")
    p.add_argument("--fill-only", action="store_true",
                   help="with --data-dir: make the clusters (or check the kept ones) and "
                   "stop, measuring nothing (a fill is minutes of load; the measuring "
                   "invocation then takes the bench lock)")
    p.add_argument("--python", help="the Python to run meshbridge with (default: a venv "
                   "of the runtime dependencies only, made once); this tree is installed "
                   "for it into a directory of the invocation's own")
    p.add_argument("--before", metavar="REV", help="also start the code of git revision "
                   "REV (e.g. main) in every run, alternated with this code's start-up on "
                   "the same API server: a change measured side by side")
    p.add_argument("--json", action="store_true")
    p.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--server", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.fill_only and args.data_dir is None:
        p.error("--fill-only needs --data-dir: a filled cluster is kept nowhere else")
    if not args.fill_only and args.runs < 1:
        p.error("--runs must be at least 1 (or --fill-only to only make the clusters)")
    if args.client and len(args.pods) != 1:
        p.error("--client takes one size")
    return args


def main(argv: list[str] | None = None) -> int:
    from bench.meshed_cluster import Shape

    args = parse_args(argv)
    if args.client:
        shape = Shape(pods=args.pods[0], pods_per_service=args.per_service)
        return asyncio.run(run_client(args.server, targets(shape)))
    shapes = [Shape(pods=n, pods_per_service=args.per_service, nodes=args.nodes)
              for n in args.pods]
    if args.fill_only:
        for shape in shapes:
            made = asyncio.run(measure(Path(sys.executable), shape, 0,
                                       data_root=args.data_dir))
            print(json.dumps({k: made[k] for k in
                              ("pods", "data_dir", "kept", "fill_seconds", "objects")}))
        return 0
    python = Path(args.python) if args.python else runtime_python()
    current = installed_tree(python)
    before = before_tree(python, args.before) if args.before else None
    try:
        sizes = [asyncio.run(measure(python, shape, args.runs, current, before,
                                     args.data_dir))
                 for shape in shapes]
    finally:
        for tree in (current, before):
            if tree is not None:
                shutil.rmtree(tree, ignore_errors=True)
    result = {"sizes": sizes, "linkerd_at_10000": LINKERD, "before": args.before}
    if args.json:
        print_json("big_cluster", rows(result), result)
        return 0
    for r in rows(result):
        print(f"{r['name']}: {r['metric']}: {r['value']:.2f} {r['unit']} "
              f"(runs {', '.join(f'{v:.2f}' for v in r['runs'])})")
    print(json.dumps({"linkerd_at_10000": LINKERD}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
