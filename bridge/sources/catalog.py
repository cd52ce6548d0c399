"""The sources by their command-line names: demo | files:DIR | sim:FILE | kube.

Each source's module is imported only when that source is made, so a process
serving manifests never loads the Kubernetes client."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from bridge.sources.base import Source, SourceSpecError


def _demo_dir() -> Path:
    # Package data (pyproject.toml), so it is there wherever the package is installed.
    # The files source polls paths; an installed or source-tree package is a folder on
    # disk, so its resource is one too.
    return Path(str(resources.files("bridge.sources") / "demo"))


DEMO_DIR = _demo_dir()


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
