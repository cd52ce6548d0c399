"""`meshbridge serve --source files:DIR` as a person runs it: every file added,
changed or removed is a log line, and a folder that disappears or empties is logged
and turns /ready to 503 (the last state is still served) until manifests are back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from testkit.builders import service
from testkit.net import free_port, http_get, ready
from testkit.polling import HANG, eventually_sync
from testkit.processes import running, stop


def logged(log: Path, event: str, file: Path | None = None) -> bool:
    for line in log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("event") == event and (file is None or entry.get("file") == str(file)):
            return True
    return False


@pytest.mark.parametrize("how", ["removed", "emptied"])
def test_the_files_source_logs_each_file_and_a_lost_folder_turns_ready_503(
        tmp_path: Path, how: str) -> None:
    root = tmp_path / "manifests"
    root.mkdir()
    a, b = root / "a.yaml", root / "b.yaml"
    a.write_text(yaml.safe_dump(service("a")))
    log = tmp_path / "serve.log"
    admin_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MESHBRIDGE_")}
    with log.open("w") as out, running(
            [sys.executable, "-m", "meshbridge", "serve", "--source", f"files:{root}",
             "--listen", "127.0.0.1:0", "--admin", f"127.0.0.1:{admin_port}",
             "--log-format", "json"], lambda: ready(admin_port),
            "/ready never answered 200", stdout=out, stderr=subprocess.STDOUT,
            env=env) as proc:
        assert logged(log, "manifest file added", a)
        b.write_text(yaml.safe_dump(service("b")))
        eventually_sync(lambda: logged(log, "manifest file added", b), HANG, log.read_text())
        a.write_text(yaml.safe_dump_all([service("a"), service("a2")]))
        eventually_sync(lambda: logged(log, "manifest file changed", a), HANG, log.read_text())
        b.unlink()
        eventually_sync(lambda: logged(log, "manifest file removed", b), HANG, log.read_text())
        if how == "removed":
            shutil.rmtree(root)
        else:
            a.unlink()
        eventually_sync(lambda: logged(log, "no manifests in the folder; serving its last "
                                            "state"), HANG, log.read_text())
        code, body = http_get(f"http://127.0.0.1:{admin_port}/ready")
        assert code == 503 and str(root) in body
        assert ("is missing" if how == "removed" else "holds no manifests") in body
        root.mkdir(exist_ok=True)
        a.write_text(yaml.safe_dump(service("a")))
        eventually_sync(lambda: ready(admin_port), HANG, "/ready did not come back")
        assert logged(log, "manifest folder has manifests again")
        stop(proc)
    assert proc.returncode == 0
