"""`meshbridge serve` as a user runs it: a real process, real ports, real signals."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.polling import HANG, eventually_sync


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=HANG) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def ready(admin_port: int, proc: subprocess.Popen[Any] | None = None) -> bool:
    """/ready answers 200; a server `proc` that exited instead fails the wait at once."""
    assert proc is None or proc.poll() is None, f"the server exited ({proc}) before /ready"
    try:
        return http_get(f"http://127.0.0.1:{admin_port}/ready")[0] == 200
    except OSError:
        return False


def test_serve_runs_the_demo_reports_ready_and_exits_cleanly_on_sigterm() -> None:
    grpc_port, admin_port = free_port(), free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "meshbridge.cli",
            "serve",
            "--listen",
            f"127.0.0.1:{grpc_port}",
            "--admin",
            f"127.0.0.1:{admin_port}",
            "--log-format",
            "json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        eventually_sync(lambda: ready(admin_port, proc), 2 * HANG,  # a whole start-up
                        "/ready never answered 200")
        assert http_get(f"http://127.0.0.1:{admin_port}/live")[0] == 200
        code, metrics = http_get(f"http://127.0.0.1:{admin_port}/metrics")
        assert code == 200 and "process_resident_memory_bytes" in metrics
        assert http_get(f"http://127.0.0.1:{admin_port}/nope")[0] == 404
        with socket.create_connection(("127.0.0.1", grpc_port), timeout=HANG):
            pass
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=HANG)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
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
    proc = subprocess.Popen(
        [sys.executable, "-m", "meshbridge.cli", "serve", "--event-loop", "uvloop",
         "--listen", f"127.0.0.1:{grpc_port}", "--admin", f"127.0.0.1:{admin_port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        eventually_sync(lambda: ready(admin_port, proc), 2 * HANG,  # a whole start-up
                        "/ready never answered 200")
        got = subprocess.run(
            [sys.executable, "-m", "meshbridge.cli", "xds", "catalog.shop.svc.cluster.local:80",
             "--server", f"127.0.0.1:{grpc_port}", "--json", "--count", "1"],
            capture_output=True, text=True, timeout=60)
        assert got.returncode == 0, got.stderr
        assert '"address": "10.244.1.20"' in got.stdout
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=HANG)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0
