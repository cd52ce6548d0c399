"""Shared fixtures: meshbridge Apps served on loopback (`apps`), from a manifest folder
(`make_app`)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from bridge.model import MeshConfig
from bridge.sources.catalog import DEMO_DIR
from bridge.sources.files import FilesSource
from meshbridge.app import App
from meshbridge.host import Layer
from testkit.serving import Apps

AppFactory = Callable[..., Any]

# What the launchers of the shared peers allow their start-up, each a hang guard of its
# own (tests/integration/kubeapi.py: etcd, then kube-apiserver, 120 s each; istiod.py:
# Istio's CRDs 60 s, pilot-discovery 120 s).
PEER_STARTUP_BOUND = 2 * 120 + 60 + 120


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Whichever test first asks for the shared kube-apiserver (or an istiod on it) pays
    for its start-up inside its own pytest-timeout, which would then be a time budget
    for a start-up the launchers already bound: on a loaded machine one took over 300 s.
    Such tests get the launchers' bound on top of their timeout."""
    default = float(config.getini("timeout") or 0)
    for item in items:
        if "kube_apiserver" not in getattr(item, "fixturenames", ()):
            continue
        marker = item.get_closest_marker("timeout")
        timeout = float(marker.args[0]) if marker is not None and marker.args else default
        if timeout:
            item.add_marker(pytest.mark.timeout(timeout + PEER_STARTUP_BOUND), append=False)


@pytest.fixture(autouse=True)
def logging_restored() -> Iterator[None]:
    """Each test ends with structlog configured as it began: a test that runs a command
    in this process (`meshbridge compare` sets the level to warning) must not silence
    the info lines a later test captures, which made such a test pass or fail with the
    order and the `-k` subset the tests ran in."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


@pytest.fixture
def demo_dir(tmp_path: Path) -> Path:
    """A private, editable copy of the bundled demo cluster."""
    target = tmp_path / "manifests"
    shutil.copytree(DEMO_DIR, target, ignore=shutil.ignore_patterns("*.md"))
    return target


@pytest.fixture
async def apps() -> AsyncIterator[Apps]:
    """Start Apps on 127.0.0.1 with ephemeral ports (`apps.start(source, ...)`); all
    are stopped at teardown."""
    started = Apps()
    yield started
    await started.stop_all()


@pytest.fixture
def make_app(apps: Apps) -> AppFactory:
    """make_app(manifests_dir, config=MeshConfig(...), layers=[...], and ServeOptions'
    fields: grpc_transport=..., layer_options=(XdsOptions(...), ...), debug_access=...):
    an App on a manifest folder, started."""

    async def factory(manifests: Path, config: MeshConfig | None = None,
                      layers: Iterable[Layer] | None = None, **options: Any) -> App:
        return await apps.start(FilesSource(manifests, poll_interval=0.05), config, layers,
                                **options)

    return factory
