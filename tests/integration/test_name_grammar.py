"""One name grammar for every subcommand: `get`, `profile`, `xds` and `shadow`, run as
a person runs them against a real `meshbridge serve`, take the same spellings of a
service port and refuse a bad one with the same line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.net import free_port, ready
from testkit.polling import HANG
from testkit.processes import running, stop

SPELLINGS = ["web.emojivoto:80", "web.emojivoto", "web.emojivoto.svc:80",
             "web.emojivoto.svc.cluster.local:80",
             "outbound|80||web.emojivoto.svc.cluster.local", "outbound|80||web.emojivoto"]
CANONICAL = "web.emojivoto.svc.cluster.local:80"


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    grpc_port, admin_port = free_port(), free_port()
    with running([sys.executable, "-m", "meshbridge", "serve",
                  "--listen", f"127.0.0.1:{grpc_port}", "--admin", f"127.0.0.1:{admin_port}",
                  "--log-level", "warning"], lambda: ready(admin_port),
                 "/ready never answered 200", stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL) as proc:
        yield f"127.0.0.1:{grpc_port}"
        stop(proc)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHBRIDGE_")}
    return subprocess.run([sys.executable, "-m", "meshbridge", *args], capture_output=True,
                          text=True, timeout=2 * HANG, env=env, check=False)


@pytest.mark.parametrize("name", SPELLINGS)
def test_get_profile_and_xds_take_every_spelling_of_a_service_port(
        server: str, name: str) -> None:
    got = cli("get", name, "--server", server, "--count", "1", "--json", "--timeout", "60")
    assert got.returncode == 0, got.stderr
    assert "add" in json.loads(got.stdout.splitlines()[0])
    profile = cli("profile", name, "--server", server, "--count", "1", "--json",
                  "--timeout", "60")
    assert profile.returncode == 0, profile.stderr
    assert json.loads(profile.stdout.splitlines()[0])["fully_qualified_name"] == \
        CANONICAL.rsplit(":", 1)[0]
    xds = cli("xds", name, "--server", server, "--count", "1", "--json", "--timeout", "60")
    assert xds.returncode == 0, xds.stderr
    assert [r["name"] for r in json.loads(xds.stdout)["resources"]] == [CANONICAL]


@pytest.mark.parametrize(("name", "says"), [
    ("web", "expected <svc>.<ns>[:port]"),
    ("web.emojivoto.", "empty DNS label"),
    ("web.emojivoto:0", "invalid port 0"),
    ("outbound|80|v1|web.emojivoto.svc.cluster.local", "serves no subsets"),
    ("inbound|80||web.emojivoto.svc.cluster.local", "use outbound"),
])
def test_every_subcommand_refuses_a_bad_name_with_the_same_line(
        server: str, tmp_path: Path, name: str, says: str) -> None:
    targets = tmp_path / "targets"
    targets.write_text(f"{name}\n")
    runs = {
        "get": cli("get", name, "--server", server, "--timeout", "60"),
        "profile": cli("profile", name, "--server", server, "--timeout", "60"),
        "xds": cli("xds", name, "--server", server, "--timeout", "60"),
        "shadow": cli("shadow", "--api", "xds", "--ours", server, "--theirs", server,
                      "--targets", str(targets), "--duration", "5"),
    }
    for command, proc in runs.items():
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        assert proc.stderr.strip().splitlines()[-1] == \
            f"meshbridge {command}: error: name {name!r}: " + \
            proc.stderr.strip().splitlines()[-1].split(": ", 3)[-1]
        assert says in proc.stderr and "Traceback" not in proc.stderr, (command, proc.stderr)
    reasons = {p.stderr.strip().splitlines()[-1].split(": error: ", 1)[1] for p in runs.values()}
    assert len(reasons) == 1, reasons


def test_xds_says_when_a_query_matches_nothing(server: str) -> None:
    lds = cli("xds", "--type", "lds", "--server", server, "--count", "1", "--timeout", "60")
    assert lds.returncode == 1 and lds.stdout == ""
    assert lds.stderr.strip() == "meshbridge xds: no lds resource matches *"
    cds = cli("xds", "--type", "cds", "nosuch.emojivoto:80", "--server", server,
              "--count", "1", "--timeout", "60")
    assert cds.returncode == 1
    assert cds.stderr.strip() == \
        "meshbridge xds: no cds resource matches nosuch.emojivoto.svc.cluster.local:80"
