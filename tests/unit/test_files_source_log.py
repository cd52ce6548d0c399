"""The files source says what it sees: one log line per file added, changed, removed
or unreadable, once per change (not once per poll)."""

from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import structlog
import yaml

from bridge.cluster import Cluster
from bridge.sources.files import FilesSource
from testkit.builders import service


def lines(logs: list[MutableMapping[str, Any]]) -> list[tuple[str, str]]:
    return [(e["event"], Path(e["file"]).name) for e in logs if "file" in e]


def test_each_file_added_changed_or_removed_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(service("a")))
    cluster = Cluster()
    source = FilesSource(tmp_path)
    with structlog.testing.capture_logs() as logs:
        source.sync(cluster)
        (tmp_path / "b.yaml").write_text(yaml.safe_dump(service("b")))
        source.sync(cluster)
        (tmp_path / "a.yaml").write_text(yaml.safe_dump_all([service("a"), service("a2")]))
        source.sync(cluster)
        (tmp_path / "b.yaml").unlink()
        source.sync(cluster)
        source.sync(cluster)  # nothing changed: nothing said
    assert lines(logs) == [("manifest file added", "a.yaml"), ("manifest file added", "b.yaml"),
                           ("manifest file changed", "a.yaml"),
                           ("manifest file removed", "b.yaml")]
    changed = next(e for e in logs if e["event"] == "manifest file changed")
    assert changed["objects"] == 2 and changed["log_level"] == "info"


def test_an_unreadable_file_is_one_line_per_edit_not_per_poll(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(service("a")))
    bad = tmp_path / "b.yaml"
    bad.write_bytes(b"\xff\xfe not utf-8")
    cluster = Cluster()
    source = FilesSource(tmp_path)
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):
            source.sync(cluster)
    assert lines(logs) == [("manifest file added", "a.yaml"),
                           ("manifest file unreadable; keeping its last good state", "b.yaml")]
