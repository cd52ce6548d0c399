"""What a protocol layer is given: the seam between the process and the layers.

A layer's `register(host, server)` receives a `Host` — the cluster cache, the Views,
the mesh configuration, the metrics registry, the stream registry, the gRPC port's
limits, its own typed options, and the hooks it may hang things on — never the App
itself, so that a layer depends on what it uses and nothing else. `meshbridge.app.App`
is the one implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import prometheus_client

from bridge.cluster import Cluster
from bridge.model import MeshConfig
from bridge.multicluster.views import MultiClusterViews
from meshbridge.debug import Renderer, RouteRenderer
from meshbridge.limits import Limits
from meshbridge.stream_registry import StreamRegistry

T = TypeVar("T")

class Host(Protocol):
    cluster: Cluster
    views: MultiClusterViews  # the local cluster's Views and every linked cluster's
    config: MeshConfig
    metrics: prometheus_client.CollectorRegistry
    streams: StreamRegistry

    @property
    def limits(self) -> Limits: ...

    def options_for(self, kind: type[T]) -> T:
        """This layer's options (a dataclass of its own, built from its own flags);
        `kind()` when none were given."""

    def on_stop(self, hook: Callable[[], None]) -> None:
        """Call `hook` when the process stops (end every stream, say)."""

    def add_renderer(self, name: str, renderer: Renderer) -> None:
        """How this layer encodes a View, for /debug/endpoints."""

    def add_route_renderer(self, name: str, renderer: RouteRenderer) -> None:
        """How this layer tells a client kind a Service port's routes, for
        /debug/endpoints."""

    def keep(self, name: str, service: object) -> None:
        """Keep the layer's service on the host (tests and tools find it by name)."""

    def service(self, name: str) -> Any:
        """A layer's service kept under `name`."""
