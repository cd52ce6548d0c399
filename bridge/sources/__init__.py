"""Sources: where Kubernetes objects come from. Each feeds the same Cluster the same way,
so nothing downstream can tell a manifest folder from a live API server."""

from __future__ import annotations

import asyncio
from importlib import resources
from pathlib import Path
from typing import Protocol

from bridge.cluster import Cluster


def _demo_dir() -> Path:
    # Package data (pyproject.toml), so it is there wherever the package is installed.
    # The files source polls paths; an installed or source-tree package is a folder on
    # disk, so its resource is one too.
    return Path(str(resources.files(__name__) / "demo"))


DEMO_DIR = _demo_dir()


class Source(Protocol):
    """Runs until cancelled, applying batches of events to the cluster.

    `synced` is set once the initial state has been applied in full; `stale` tells
    readiness whether the last-known state may be out of date (e.g. the API is down).
    A source may also have a `stale_reason` (str | None) that /ready shows with it.
    """

    name: str

    async def run(self, cluster: Cluster, synced: asyncio.Event) -> None: ...

    @property
    def stale(self) -> bool: ...


class SourceSpecError(ValueError):
    pass


def make_source(spec: str, **options: object) -> Source:
    """Build a source from its command-line form: demo | files:DIR | sim:FILE | kube."""
    kind, _, arg = spec.partition(":")
    if kind == "demo" and not arg:
        from bridge.sources.files import FilesSource, manifest_files

        if not manifest_files(DEMO_DIR):
            raise SourceSpecError(f"demo source: no manifests in {DEMO_DIR} (the package "
                                  "was installed without its data)")
        return FilesSource(DEMO_DIR, name="demo")
    if kind == "files" and arg:
        from bridge.sources.files import FilesSource, manifest_files

        path = Path(arg)
        if not path.is_dir():
            raise SourceSpecError(f"files source: {arg} is not a directory")
        if not manifest_files(path):
            # Serving nothing and calling it ready is worse than not starting.
            raise SourceSpecError(f"files source: {arg} holds no *.yaml, *.yml or *.json "
                                  "manifests")
        return FilesSource(path)
    if kind == "sim" and arg:
        from bridge.sources.sim import SimSource, load_scenario

        return SimSource(load_scenario(Path(arg)))
    if kind == "kube":
        from bridge.sources.kube import KubeSource

        if arg:
            raise SourceSpecError("kube source takes no argument; use --kubeconfig/--context")
        return KubeSource(**options)  # type: ignore[arg-type]
    raise SourceSpecError(
        f"unknown source {spec!r}: expected demo, files:DIR, sim:FILE or kube"
    )
