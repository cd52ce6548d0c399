"""`meshbridge serve` as a user runs it: a real process, real ports, real signals."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


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
        deadline = time.monotonic() + 30
        status = 0
        while time.monotonic() < deadline:
            try:
                status, _ = http_get(f"http://127.0.0.1:{admin_port}/ready")
            except OSError:
                status = 0
            if status == 200:
                break
            time.sleep(0.05)  # polling a real process with a deadline
        assert status == 200
        assert http_get(f"http://127.0.0.1:{admin_port}/live")[0] == 200
        code, metrics = http_get(f"http://127.0.0.1:{admin_port}/metrics")
        assert code == 200 and "process_resident_memory_bytes" in metrics
        assert http_get(f"http://127.0.0.1:{admin_port}/nope")[0] == 404
        with socket.create_connection(("127.0.0.1", grpc_port), timeout=2):
            pass
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0
    # Every demo service port is announced with its endpoint count.
    assert '"service": "catalog"' in out and '"endpoints": 6' in out
    assert '"service": "mail"' in out and "ExternalName" in out
    assert "shutting down" in out
