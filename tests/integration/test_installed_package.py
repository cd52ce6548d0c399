"""The package as a user installs it: a wheel built from the tree, installed (not
editable) into a venv of its own and run from a folder that is not the repository, so
nothing can come from the source tree.

The venv and the package's dependencies are installed once and kept under
~/.cache/meshbridge-wheeltest, keyed by the Python version and the dependency list;
each run builds the wheel afresh and reinstalls only it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.net import free_port, ready
from testkit.processes import running, stop

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "meshbridge-wheeltest"
WEB = "web.emojivoto.svc.cluster.local:80"

# A first run downloads the dependencies (grpcio, kubernetes, ...): minutes, not seconds.
pytestmark = pytest.mark.timeout(1200)


def run(argv: list[str | Path], timeout: float, **kwargs: object) -> str:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                          timeout=timeout, check=False, **kwargs)  # type: ignore[call-overload]
    assert proc.returncode == 0, f"{argv[:4]} failed:\n{proc.stdout}\n{proc.stderr}"
    return str(proc.stdout)


def build_wheel(out: Path, work: Path) -> Path:
    """The wheel of a clean copy of the tree (only what the package is made of), so that
    a build folder or stray file in the worktree cannot leak into it."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    src = work / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]:
        package = pattern.rstrip("*")
        shutil.copytree(REPO / package, src / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # The tree's own setuptools (a test dependency) builds it, with no download.
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", out, src], timeout=300)
    (wheel,) = out.glob("meshbridge-*.whl")
    return wheel


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # two test runs must not build one venv at once
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def venv_with(wheel: Path) -> Path:
    """A venv holding `wheel` and its dependencies; the dependencies are reused."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    key = hashlib.sha256(json.dumps([sys.version_info[:2], sorted(deps)]).encode())
    venv = CACHE / key.hexdigest()[:16]
    python = venv / "bin" / "python"
    complete = venv / ".dependencies-installed"
    with locked(CACHE / "lock"):
        if not complete.exists():
            shutil.rmtree(venv, ignore_errors=True)  # a run cut off half-way
            run([sys.executable, "-m", "venv", venv], timeout=120)
            try:
                run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                     wheel], timeout=900)
            except (AssertionError, subprocess.TimeoutExpired):
                shutil.rmtree(venv, ignore_errors=True)  # the next run starts clean
                raise
            complete.touch()
        run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check",
             "--no-deps", "--force-reinstall", wheel], timeout=300)
    return venv


def test_the_installed_wheel_serves_the_demo_from_anywhere(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "dist", tmp_path)
    venv = venv_with(wheel)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONUNBUFFERED"] = "1"
    where = run([venv / "bin" / "python", "-c",
                 "import bridge.sources.catalog as s; print(s.__file__); print(s.DEMO_DIR)"],
                timeout=60, cwd=elsewhere, env=env).split()
    assert all(Path(p).is_relative_to(venv) for p in where), where  # not the repository's

    grpc_port, admin_port = free_port(), free_port()
    meshbridge = venv / "bin" / "meshbridge"
    with running([meshbridge, "serve", "--listen", f"127.0.0.1:{grpc_port}",
                  "--admin", f"127.0.0.1:{admin_port}", "--log-format", "json"],
                 lambda: ready(admin_port), "meshbridge serve never became ready",
                 timeout=60, cwd=elsewhere, env=env, stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT, text=True) as proc:
        out = run([meshbridge, "get", WEB, "--server", f"127.0.0.1:{grpc_port}",
                   "--count", "1", "--json", "--timeout", "30"],
                  timeout=60, cwd=elsewhere, env=env)
        first = json.loads(out.splitlines()[0])
        assert len(first["add"]["addrs"]) == 2, first  # bridge/sources/demo/README.md
        log = stop(proc, timeout=30)
    assert proc.returncode == 0, log
    assert '"service": "web"' in log and '"service": "catalog"' in log
