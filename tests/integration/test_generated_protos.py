"""The generated Linkerd bindings are what scripts/gen_protos.py makes of
linkerd_api/proto/*.proto today (it runs protoc in a process of its own)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
GEN_SCRIPT = REPO_ROOT / "scripts" / "gen_protos.py"


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_protos", GEN_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_modules_import_siblings_as_package() -> None:
    gen = _load_generator()
    proto_dir = REPO_ROOT / "linkerd_api" / "proto"
    for name in gen.expected_outputs():
        text = (proto_dir / name).read_text()
        for line in text.splitlines():
            assert not (line.startswith("import ") and "_pb2" in line), f"{name}: {line}"
    dst_py = (proto_dir / "destination_pb2.py").read_text()
    assert "from linkerd_api.proto import net_pb2 as net__pb2" in dst_py
    grpc_py = (proto_dir / "destination_pb2_grpc.py").read_text()
    assert "from linkerd_api.proto import destination_pb2 as destination__pb2" in grpc_py


def test_generated_code_is_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, str(GEN_SCRIPT), "--check"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, (
        "generated protos are stale; run `python scripts/gen_protos.py`\n"
        + result.stdout
        + result.stderr
    )


def test_check_mode_reports_stale_missing_and_extra_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gen = _load_generator()
    proto_dir = tmp_path / "linkerd_api" / "proto"
    shutil.copytree(REPO_ROOT / "linkerd_api" / "proto", proto_dir)
    monkeypatch.setattr(gen, "REPO_ROOT", tmp_path)
    monkeypatch.setattr(gen, "PROTO_DIR", proto_dir)
    assert gen.main(["--check"]) == 0

    with (proto_dir / "net_pb2.py").open("a") as f:
        f.write("# hand edit\n")
    (proto_dir / "meta_pb2.pyi").unlink()
    (proto_dir / "old_pb2.py").write_text("")
    assert gen.main(["--check"]) == 1
    out = capsys.readouterr().out
    for name in ("net_pb2.py", "meta_pb2.pyi", "old_pb2.py"):
        assert f"linkerd_api/proto/{name}" in out
    assert "destination_pb2.py" not in out
