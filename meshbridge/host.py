"""What a protocol layer is given: the seam between the process and the layers.

A layer's `register(host, server)` receives a `Host` — the cluster cache, the Views,
the mesh configuration, the metrics registry, the stream registry, the gRPC port's
limits, its own typed options, and the hooks it may hang things on — never the App
itself, so that a layer depends on what it uses and nothing else. `meshbridge.app.App`
is the one implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import prometheus_client

from bridge.cluster import Cluster
from bridge.model import MeshConfig
from bridge.views import ViewRegistry
from meshbridge.debug import Renderer, RouteRenderer
from meshbridge.limits import Limits
from meshbridge.stream_registry import StreamRegistry

if TYPE_CHECKING:
    from meshbridge.workers.link import Link

T = TypeVar("T")

class GrpcServer(Protocol):
    """What a protocol layer registers its services with (either gRPC server)."""

    def add_generic_rpc_handlers(self, handlers: Any) -> None: ...


class Host(Protocol):
    cluster: Cluster
    views: ViewRegistry
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


# ---------------------------------------------------------------- workers (docs/workers.md)
# With `--workers N`, the process that has the Cluster and the Views (the watcher)
# mounts every layer as above, and also its `register_feeds(host, hub)` if it has
# one: what it sends each worker over that worker's link. Each worker mounts each
# layer's `register_worker(host, server)`, given a `WorkerHost`; a method no layer
# serves in the worker is relayed to the watcher whole (meshbridge.workers.relay).


class FeedHub(Protocol):
    """What a layer's watcher side is given: each worker's link as it starts."""

    def on_link(self, attach: Callable[[Link], None]) -> None:
        """Call `attach(link)` for every worker's link, now and as workers (re)start;
        a link's `on_closed` says when its worker is gone."""


class WorkerHost(Protocol):
    """What a layer's worker side is given: no Cluster and no Views, the link to the
    watcher instead."""

    config: MeshConfig
    metrics: prometheus_client.CollectorRegistry
    streams: StreamRegistry
    link: Link

    @property
    def limits(self) -> Limits: ...

    def options_for(self, kind: type[T]) -> T:
        """This layer's options; `kind()` when none were given."""

    def on_stop(self, hook: Callable[[], None]) -> None:
        """Call `hook` when the worker stops (end every stream, say)."""

    def keep(self, name: str, service: object) -> None:
        """Keep the layer's worker-side service (found by name, as on a Host)."""
