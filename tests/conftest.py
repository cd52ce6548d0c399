"""Shared fixtures: meshbridge Apps served on loopback (`apps`), from a manifest folder
(`make_app`)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from bridge.model import MeshConfig
from bridge.sources.catalog import DEMO_DIR
from bridge.sources.files import FilesSource
from meshbridge.app import App
from meshbridge.host import Layer
from testkit.serving import Apps

AppFactory = Callable[..., Any]


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
