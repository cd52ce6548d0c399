"""`meshbridge serve` as a user runs it: a real process, real ports, real signals."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from meshbridge import cli
from testkit.net import free_port, http_get, ready
from testkit.polling import HANG
from testkit.processes import running, stop


def test_serve_runs_the_demo_reports_ready_and_exits_cleanly_on_sigterm() -> None:
    grpc_port, admin_port = free_port(), free_port()
    with running([sys.executable, "-m", "meshbridge.cli", "serve",
                  "--listen", f"127.0.0.1:{grpc_port}", "--admin", f"127.0.0.1:{admin_port}",
                  "--log-format", "json"], lambda: ready(admin_port),
                 # what must happen at all: start-up takes tens of seconds on a loaded machine
                 "/ready never answered 200", timeout=120, stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT, text=True,
                 env={**os.environ, "PYTHONUNBUFFERED": "1"}) as proc:
        if "PYTHONMALLOC" not in os.environ:
            # serve executed itself again on malloc (meshbridge.allocator): same process
            environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
            assert b"PYTHONMALLOC=malloc" in environ
        assert http_get(f"http://127.0.0.1:{admin_port}/live")[0] == 200
        code, metrics = http_get(f"http://127.0.0.1:{admin_port}/metrics")
        assert code == 200 and "process_resident_memory_bytes" in metrics
        assert http_get(f"http://127.0.0.1:{admin_port}/nope")[0] == 404
        with socket.create_connection(("127.0.0.1", grpc_port), timeout=HANG):
            pass
        out = stop(proc)
    assert proc.returncode == 0
    # Every demo service port is announced with its endpoint count.
    assert '"service": "catalog"' in out and '"endpoints": 6' in out
    assert '"service": "mail"' in out and "ExternalName" in out
    assert "shutting down" in out


@pytest.mark.parametrize("folder", ["missing", "empty"])
def test_serve_refuses_a_folder_with_nothing_to_serve_in_one_line(
        tmp_path: Path, folder: str) -> None:
    root = tmp_path / "manifests"
    if folder == "empty":
        root.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "meshbridge.cli", "serve", "--source", f"files:{root}",
         "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--log-format", "json"],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and str(root) in lines[0], lines
    assert "serving" not in lines[0]


def test_serve_on_uvloop_answers_an_xds_client_and_exits_cleanly_on_sigterm() -> None:
    grpc_port, admin_port = free_port(), free_port()
    with running([sys.executable, "-m", "meshbridge.cli", "serve", "--event-loop", "uvloop",
                  "--listen", f"127.0.0.1:{grpc_port}", "--admin", f"127.0.0.1:{admin_port}"],
                 lambda: ready(admin_port), "/ready never answered 200", timeout=90,
                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                 env={**os.environ, "PYTHONUNBUFFERED": "1"}) as proc:
        got = subprocess.run(
            [sys.executable, "-m", "meshbridge.cli", "xds", "catalog.shop.svc.cluster.local:80",
             "--server", f"127.0.0.1:{grpc_port}", "--json", "--count", "1"],
            capture_output=True, text=True, timeout=60)
        assert got.returncode == 0, got.stderr
        assert '"address": "10.244.1.20"' in got.stdout
        stop(proc)
    assert proc.returncode == 0


def test_version_prints_the_package_version() -> None:
    proc = subprocess.run([sys.executable, "-m", "meshbridge", "--version"],
                          capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == f"meshbridge {cli.version()}"
    assert cli.version() != "unknown"
