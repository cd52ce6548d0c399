"""The container's entrypoint, run as the image would run it (no Docker engine here:
the command line is read from deploy/Dockerfile and run against the test API server),
and its build stage's wheel, built as that stage builds it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from testkit import kubeapi
from testkit.kubeapi import KubeAPIServer
from testkit.net import free_port, ready
from testkit.processes import running, stop

kube_apiserver = kubeapi.kube_apiserver  # the shared session fixture

DOCKERFILE = Path(__file__).resolve().parents[2] / "deploy" / "Dockerfile"


def instruction(name: str) -> list[str]:
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith(name + " "):
            value = json.loads(line[len(name) + 1:])
            assert isinstance(value, list), f"{name} must use the exec form"
            return [str(v) for v in value]
    raise AssertionError(f"no {name} in {DOCKERFILE}")


def test_dockerfile_is_non_root_and_exposes_both_ports() -> None:
    text = DOCKERFILE.read_text()
    assert "USER 10001" in text
    assert "EXPOSE 8086 9996" in text
    assert instruction("CMD")[:3] == ["serve", "--source", "kube"]


def stages() -> list[list[str]]:
    """The Dockerfile's instructions, one list per FROM."""
    out: list[list[str]] = []
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("FROM "):
            out.append([])
        if line and not line.startswith("#") and out:
            out[-1].append(line)
    return out


def test_everything_the_dockerfile_copies_is_in_the_tree() -> None:
    # The package's data (the demo cluster) lives inside the packages it copies.
    sources = [s for line in DOCKERFILE.read_text().splitlines()
               if line.startswith("COPY ") and "--from=" not in line
               for s in line.split()[1:-1]]
    missing = [s for s in sources if not (DOCKERFILE.parents[1] / s).exists()]
    assert sources and missing == [], missing
    assert "LICENSE" in sources


def test_the_image_installs_the_wheel_its_build_stage_builds() -> None:
    build, final = stages()
    assert build[0].endswith(" AS build")
    assert any(line.startswith("RUN pip wheel ") for line in build)
    # The final stage has no source tree: only the wheel comes in, from the build stage.
    copies = [line for line in final if line.startswith("COPY ")]
    assert copies and all(line.startswith("COPY --from=build ") for line in copies)
    assert any(line.startswith("RUN pip install ") and ".whl" in line for line in final)


def test_the_build_stage_command_makes_a_wheel_with_the_license_and_the_demo(
        tmp_path: Path) -> None:
    build = stages()[0]
    src = tmp_path / "src"
    src.mkdir()
    for line in build:
        if line.startswith("COPY "):
            *what, dest = line.split()[1:]
            for name in what:
                path = DOCKERFILE.parents[1] / name
                target = src / (dest if dest not in ("./", ".") else name).removeprefix("./")
                if path.is_dir():
                    shutil.copytree(path, target,
                                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
                else:
                    shutil.copy2(path, src / name)
    (command,) = [line.removeprefix("RUN ").split() for line in build
                  if line.startswith("RUN pip wheel ")]
    dist = tmp_path / "dist"
    argv = [sys.executable, "-m", *command]
    argv[argv.index("--wheel-dir") + 1] = str(dist)
    # The tree's own setuptools builds it here (the image's stage fetches its own).
    argv.append("--no-build-isolation")
    subprocess.run(argv, cwd=src, check=True, capture_output=True, timeout=300)
    (wheel,) = dist.glob("meshbridge-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert any(n.startswith("bridge/sources/demo/") and n.endswith(".yaml") for n in names)
    assert any(n.endswith(".dist-info/entry_points.txt") for n in names)


def test_the_entrypoint_serves_the_kube_source_until_sigterm(
    kube_apiserver: KubeAPIServer
) -> None:
    # The venv's scripts sit beside its python, whether or not the venv is on PATH.
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    entrypoint = shutil.which(instruction("ENTRYPOINT")[0], path=search)
    assert entrypoint is not None, "the meshbridge console script is installed"
    grpc_port, admin_port = free_port(), free_port()
    argv = [entrypoint, *instruction("CMD"), "--listen", f"127.0.0.1:{grpc_port}",
            "--admin", f"127.0.0.1:{admin_port}"]
    env = {**os.environ, "KUBECONFIG": str(kube_apiserver.kubeconfig_path)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    with running(argv, lambda: ready(admin_port), "/ready never answered 200", env=env,
                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        out = stop(proc, timeout=30)
    assert proc.returncode == 0
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    events = [line["event"] for line in lines]
    assert "initial list applied" in events and "shutting down" in events
