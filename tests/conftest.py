"""Shared fixtures: a meshbridge App served on loopback from a manifest folder.

`MESHBRIDGE_TEST_WORKERS=N` serves every App the fixtures start with N worker
processes (docs/workers.md); `make test` runs the protocol and reliability tiers so
as well as with the default, one process."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from bridge.model import MeshConfig
from bridge.sources.catalog import DEMO_DIR
from bridge.sources.files import FilesSource
from meshbridge.app import App, ProtocolLayer, ServeOptions
from meshbridge.layers import protocol_layers

AppFactory = Callable[..., Any]


def serving_workers(grpc_transport: str = "native") -> int:
    """How many processes serve a test's gRPC port (MESHBRIDGE_TEST_WORKERS; grpc.aio's
    server is served by one process only)."""
    if grpc_transport != "native":
        return 1
    return int(os.environ.get("MESHBRIDGE_TEST_WORKERS", "1"))


@pytest.fixture
def demo_dir(tmp_path: Path) -> Path:
    """A private, editable copy of the bundled demo cluster."""
    target = tmp_path / "manifests"
    shutil.copytree(DEMO_DIR, target, ignore=shutil.ignore_patterns("*.md"))
    return target


@pytest.fixture
async def make_app() -> AsyncIterator[AppFactory]:
    """Start Apps on 127.0.0.1 with ephemeral ports; all are stopped at teardown.

    make_app(manifests_dir, config=MeshConfig(...), layers=[...], grpc_transport=...,
             layer_options=(XdsOptions(...), ...), **extra_options)
    """
    apps: list[App] = []

    async def factory(
        manifests: Path,
        config: MeshConfig | None = None,
        layers: Iterable[ProtocolLayer] | None = None,
        grpc_transport: str = "native",
        layer_options: tuple[object, ...] = (),
        **extra: object,
    ) -> App:
        source = FilesSource(manifests, poll_interval=0.05)
        options = ServeOptions("127.0.0.1:0", "127.0.0.1:0", dict(extra),
                               grpc_transport=grpc_transport, layer_options=layer_options,
                               workers=serving_workers(grpc_transport))
        app = App(source, config, options,
                  list(layers) if layers is not None else protocol_layers())
        apps.append(app)
        await app.start()
        return app

    yield factory
    for app in apps:
        await app.stop(grace=0.5)
