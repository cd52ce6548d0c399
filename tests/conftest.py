"""Shared fixtures: a meshbridge App served on loopback from a manifest folder."""

from __future__ import annotations

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
                               grpc_transport=grpc_transport, layer_options=layer_options)
        app = App(source, config, options,
                  list(layers) if layers is not None else protocol_layers())
        apps.append(app)
        await app.start()
        return app

    yield factory
    for app in apps:
        await app.stop(grace=0.5)
