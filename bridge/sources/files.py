"""The files source: a folder of ordinary Kubernetes manifests, re-read on change.

Every `*.yaml`, `*.yml` and `*.json` file below the folder is read as a stream of
documents (`kind: List` items included). The folder is polled, which is portable and
costs one `stat` per file per tick; a change is seen within `poll_interval`.

Every file added, changed, removed or unreadable is one log line naming it.

Bad input never loses good state: a file that does not parse keeps the objects it
last parsed to (the error names the file and line); an object that does not decode is
logged with its file and name and skipped, and the rest of the file is used.

A folder that is missing when the source starts is an error. One that goes missing or
holds no manifests later is taken for an outage, not for an empty cluster (a volume
being remounted looks like that): the last state is kept, the source is `stale` (so
/ready says why) until manifests are back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
import yaml

from bridge.cluster import Cluster, Event, EventType
from bridge.objects import KubeObject, ObjectError, decode_object, display_name, object_key
from bridge.sources.base import SourceSpecError

log = structlog.get_logger("meshbridge.sources.files")

ObjKey = tuple[str, str, str]
_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(slots=True)
class _FileState:
    stamp: tuple[int, int]  # (mtime_ns, size): re-read when either moves
    objects: dict[ObjKey, KubeObject] = field(default_factory=dict)


def _yaml_line(err: yaml.YAMLError) -> int | None:
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    return mark.line + 1 if mark is not None else None


def _documents(raw: Any) -> Iterator[Any]:
    if raw is None:
        return
    if isinstance(raw, dict) and raw.get("kind") == "List" and isinstance(raw.get("items"), list):
        yield from raw["items"]
    else:
        yield raw


def manifest_files(root: Path) -> list[Path]:
    """The manifest files below `root`, in the order they are applied; [] if it is not
    a folder (or cannot be listed)."""
    try:
        return sorted(p for p in root.rglob("*") if p.suffix in _SUFFIXES and p.is_file())
    except OSError:
        return []


def read_manifest_file(path: Path) -> dict[ObjKey, KubeObject]:
    """Decode every usable object in one file. Raises yaml.YAMLError (or OSError) when
    the file as a whole cannot be read; skips, with a log line, each object that fails."""
    text = path.read_text(encoding="utf-8")
    docs = list(yaml.safe_load_all(text))
    out: dict[ObjKey, KubeObject] = {}
    for raw in (d for doc in docs for d in _documents(doc)):
        try:
            obj = decode_object(raw)
        except ObjectError as e:
            log.warning("manifest object skipped", file=str(path), object=f"{e.kind} {e.name}",
                        reason=e.reason)
            continue
        if obj is None:
            log.debug("manifest object ignored", file=str(path), object=display_name(raw))
            continue
        key = object_key(obj)
        if key in out:
            log.warning("manifest object defined twice; the later one wins", file=str(path),
                        object=f"{key[0]} {key[1]}/{key[2]}")
        out[key] = obj
    return out


class FilesSource:
    def __init__(self, root: Path, name: str = "files", poll_interval: float = 0.2) -> None:
        self.root = root
        self.name = name
        self.poll_interval = poll_interval
        self._files: dict[Path, _FileState] = {}
        self._state: dict[ObjKey, KubeObject] = {}
        self.reloads = 0
        self.stale_reason: str | None = None

    @property
    def stale(self) -> bool:
        return self.stale_reason is not None

    async def run(self, cluster: Cluster, synced: asyncio.Event) -> None:
        if not self.root.is_dir():
            raise SourceSpecError(f"{self.name} source: {self.root} is not a directory")
        self.sync(cluster)
        synced.set()
        while True:
            await asyncio.sleep(self.poll_interval)  # polling period, not synchronisation
            self.sync(cluster)

    def sync(self, cluster: Cluster) -> bool:
        """Re-read what changed on disk and apply the difference. True if anything did."""
        if not self._scan():
            return False
        desired: dict[ObjKey, KubeObject] = {}
        for path in sorted(self._files):
            for key, obj in self._files[path].objects.items():
                if key in desired:
                    log.warning("object defined in two files; the later file wins",
                                file=str(path), object=f"{key[0]} {key[1]}/{key[2]}")
                desired[key] = obj
        events = [Event(EventType.DELETED, o) for k, o in self._state.items() if k not in desired]
        events += [
            Event(EventType.ADDED if k not in self._state else EventType.MODIFIED, o)
            for k, o in desired.items()
            if self._state.get(k) != o
        ]
        self._state = desired
        self.reloads += 1
        if events:
            cluster.apply(events)
        return bool(events)

    def _scan(self) -> bool:
        paths = manifest_files(self.root)
        if not paths:
            self._lost("is missing" if not self.root.is_dir() else "holds no manifests")
            return False
        if self.stale_reason is not None:
            log.info("manifest folder has manifests again", folder=str(self.root),
                     files=len(paths))
            self.stale_reason = None
        changed = False
        seen: set[Path] = set()
        for path in paths:
            seen.add(path)
            try:
                st = path.stat()
            except OSError:
                continue  # gone since the listing: the next tick sees it removed
            stamp = (st.st_mtime_ns, st.st_size)
            old = self._files.get(path)
            if old is not None and old.stamp == stamp:
                continue
            try:
                objects = read_manifest_file(path)
            except yaml.YAMLError as e:
                log.error("manifest file does not parse; keeping its last good state",
                          file=str(path), line=_yaml_line(e), reason=str(e).splitlines()[0])
                # Remember the stamp so the error is logged once per edit, not per tick.
                self._files[path] = _FileState(stamp, old.objects if old else {})
                continue
            except RecursionError:
                # Nested deeper than the YAML parser can follow: as unparseable as bad
                # YAML (found by fuzz/fuzz_inputs.py; it used to end the source).
                log.error("manifest file nests too deeply to parse; keeping its last good "
                          "state", file=str(path))
                self._files[path] = _FileState(stamp, old.objects if old else {})
                continue
            except (OSError, UnicodeDecodeError) as e:
                log.error("manifest file unreadable; keeping its last good state",
                          file=str(path), reason=str(e))
                self._files[path] = _FileState(stamp, old.objects if old else {})
                continue
            log.info("manifest file added" if old is None else "manifest file changed",
                     file=str(path), objects=len(objects))
            self._files[path] = _FileState(stamp, objects)
            changed = True
        for gone in sorted(set(self._files) - seen):
            log.info("manifest file removed", file=str(gone),
                     objects=len(self._files[gone].objects))
            del self._files[gone]
            changed = True
        return changed

    def _lost(self, what: str) -> None:
        reason = f"folder {self.root} {what}"
        if reason != self.stale_reason:  # logged once per outage, not per tick
            log.error("no manifests in the folder; serving its last state",
                      folder=str(self.root), reason=what)
            self.stale_reason = reason
