"""The fan-out benchmark's load clients check what they are sent: a SotW stream handed
a message that does not say the change fails the run (`--corrupt-run N`), with the
Python client (bench/sotw_check.py) and with the compiled one (bench/sotw_client,
built from the Go module proxy by scripts/bench_go.sh); the same run without it
passes. A few hundred streams against the real server, one process each."""

from __future__ import annotations

import subprocess
import sys

import pytest

from testkit.processes import REPO

STREAMS = 120


def fanout(clients: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.fanout", "--protocol", "sotw", "--streams", str(STREAMS),
         "--runs", "3", "--channels", "6", "--clients", clients, *extra],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.parametrize("clients", ["lean", "go"])
def test_a_stream_sent_the_change_before_fails_the_run(clients: str) -> None:
    done = fanout(clients, "--corrupt-run", "2")
    assert done.returncode != 0, done.stdout
    assert (f"fan-out run 2: 1 of {STREAMS} streams were sent a message that does not "
            "say the change") in done.stderr, done.stderr


@pytest.mark.parametrize("clients", ["lean", "go"])
def test_every_stream_sent_the_change_passes(clients: str) -> None:
    done = fanout(clients)
    assert done.returncode == 0, done.stderr
    assert f"fan-out: {STREAMS} xDS SotW EDS streams over 6 connections ({clients} clients)" \
        in done.stdout, done.stdout
