"""What a protocol layer builds against: the one module of the process a layer imports.

A layer module exposes `LAYER = Layer(name, register, (Options, ...))`. The App calls
`register(host, server)` with a `Host` of that layer's own (the cluster cache, the
Views, the mesh configuration, the metrics registry, the stream registry, the gRPC
port's limits, who may read debug answers, its own typed options, what identity
needs to know of the source and of the port) and the gRPC server to add handlers
to — never the App itself, so that a layer depends on what it uses and nothing else,
and does not know which server runs it. Beyond handlers, a layer may hang on the
port's life through typed hooks (`LayerHooks`, given to `Host.add_hooks`): the port's
TLS, listeners of its own.

The App checks what a layer does against this interface when it starts, and stops
with one line naming the layer (`LayerError`) when a layer asks for options it does
not declare, is given options no mounted layer declares, or hands over hooks of the
wrong shape.

Nothing here imports the App, the admin server or the debug pages:
`meshbridge.app.App` implements the hosts; a layer only needs this module.
"""

from __future__ import annotations

import inspect
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import prometheus_client

from bridge.cluster import Cluster
from bridge.model import MeshConfig, ServiceKey
from bridge.multicluster.views import MultiClusterViews
from bridge.routes.text import RouteRow
from bridge.views import View
from meshbridge.debug_access import DebugAccess
from meshbridge.limits import Limits
from meshbridge.stream_registry import (
    NACKED,
    NOT_SENT,
    STALE,
    SYNCED,
    StreamInfo,
    StreamRegistry,
)
from meshbridge.workers.link import Link

if TYPE_CHECKING:
    from bridge.sources.kube_api import Credentials

__all__ = [
    "NACKED",
    "NOT_SENT",
    "STALE",
    "SYNCED",
    "DebugAccess",
    "FeedHub",
    "GrpcServer",
    "Host",
    "Layer",
    "LayerError",
    "LayerHooks",
    "Limits",
    "Link",
    "NowaitWriter",
    "Renderer",
    "RouteRenderer",
    "Sender",
    "StreamInfo",
    "StreamRegistry",
    "WorkerHost",
    "check_hooks",
    "nowait_writer",
    "sender",
    "split_listen_address",
]

T = TypeVar("T")

# How a layer encodes a View for /debug/endpoints: (the endpoints that protocol
# carries, by "ip:port", with their fields; the encoded message as proto-JSON).
Renderer = Callable[[View], tuple[dict[str, dict[str, Any]], Any]]
# A Service port's routes as one client kind is told them, for a client namespace:
# the route-table rows and what that kind is not told (Routes §3.4).
RouteRenderer = Callable[[ServiceKey, int, str], tuple[list[RouteRow], list[str]]]


# ---------------------------------------------------------------- listen addresses


def split_listen_address(addr: str) -> tuple[str, int]:
    """`host:port` to bind (`:8086` is every address, port 0 any free port); not an
    authority (`bridge.authority.split_authority`)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {addr!r} is not host:port")
    return host.strip("[]") or "0.0.0.0", int(port)


# ---------------------------------------------------------------- writing without awaiting

# (bytes) -> True if the message was queued now; False if the caller must await
# `context.write(message)` instead (the message was not taken).
NowaitWriter = Callable[[bytes], bool]


def _never(message: bytes) -> bool:
    return False


# () -> None: write what the call's connection has queued now (see `sender`).
Sender = Callable[[], None]


def _nothing() -> None:
    pass


def sender(context: object) -> Sender:
    """The call's "write what is queued now" if its server has one, else a no-op.

    The native server writes what one loop turn queued on a connection in one socket
    write at the end of the turn (h2grpc.connection). A layer that has just written one
    change to many streams, inside a turn with more to do (another layer's fan-out
    of the same change), calls this for the streams it wrote: their clients start
    reading at once, in the same one write per connection, instead of after the rest
    of the turn. grpc.aio sends as it goes: nothing to do."""
    send: Sender | None = getattr(context, "send_now", None)
    return send if send is not None else _nothing


def nowait_writer(context: object) -> NowaitWriter:
    """The call's synchronous write if its server has one, else one that never writes.

    The native server (h2grpc) takes a serialized message at once, without a task
    switch, while its client keeps up (`ServerCall.write_nowait`): that is what makes
    a push to thousands of streams cheap. grpc.aio has no such call; a layer always
    calls what this returns and awaits `context.write` only when it says False."""
    write: NowaitWriter | None = getattr(context, "write_nowait", None)
    return write if write is not None else _never


# ---------------------------------------------------------------- the seam


class GrpcServer(Protocol):
    """What a protocol layer registers its services with (either gRPC server)."""

    def add_generic_rpc_handlers(self, handlers: Any) -> None: ...


class LayerHooks(Protocol):
    """What a layer hangs on the gRPC port's life besides its handlers (the identity
    layer: the port's certificates from its own CA, Certify on a listener of its own)."""

    def grpc_port_tls(self) -> ssl.SSLContext | None:
        """The gRPC port's TLS, or None to leave it to the App (--tls-cert, or none)."""

    async def start_listeners(self, listen: str, port: int) -> None:
        """Called once the gRPC port (`listen` as given, `port` as bound) is serving."""

    async def stop_listeners(self, grace: float) -> None:
        """Called when the process stops, after the gRPC port has."""


class Host(Protocol):
    cluster: Cluster
    views: MultiClusterViews  # the local cluster's Views and every linked cluster's
    config: MeshConfig
    metrics: prometheus_client.CollectorRegistry
    streams: StreamRegistry

    @property
    def limits(self) -> Limits: ...

    @property
    def debug_access(self) -> DebugAccess:
        """Who may read debug answers (`--debug-access`, and whether the gRPC port asks
        for client certificates): one setting for the admin port's pages and a layer's
        debug types."""

    @property
    def sni_certificates(self) -> bool:
        """Whether the gRPC port can present a certificate chosen by the client's SNI
        (the native server can; grpc.aio's cannot)."""

    def kube_credentials(self) -> Callable[[], Credentials] | None:
        """How to reach the Kubernetes API the source watches (its credentials, as they
        rotate), e.g. for a TokenReview; None when the source is not a Kubernetes API."""

    def options_for(self, kind: type[T]) -> T:
        """This layer's options of a class its `Layer` declares (built from flags);
        `kind()` when none were given."""

    def on_stop(self, hook: Callable[[], None]) -> None:
        """Call `hook` when the process stops (end every stream, say)."""

    def add_hooks(self, hooks: LayerHooks) -> None:
        """Hang `hooks` on the gRPC port's life (checked: see `check_hooks`)."""

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
# mounts every layer as above, and also its `Layer.feeds(host, hub)` if it has one:
# what it sends each worker over that worker's link. Each worker mounts each layer's
# `Layer.worker(host, server)`, given a `WorkerHost`; a method no layer serves in the
# worker is relayed to the watcher whole (meshbridge.workers.relay).


class FeedHub(Protocol):
    """What a layer's watcher side is given: each worker's link as it starts."""

    def on_link(self, attach: Callable[[Link], None]) -> None:
        """Call `attach(link)` for every worker's link, now and as workers (re)start;
        a link's `on_closed` says when its worker is gone."""

    async def ask(self, kind: str, *arguments: Any, timeout: float = 1.0) -> list[Any]:
        """Every live worker's answer to the call `kind(*arguments)` (one that does
        not answer within `timeout` is left out)."""


class WorkerHost(Protocol):
    """What a layer's worker side is given: no Cluster and no Views, the link to the
    watcher instead."""

    config: MeshConfig
    metrics: prometheus_client.CollectorRegistry
    streams: StreamRegistry
    link: Link

    @property
    def limits(self) -> Limits: ...

    @property
    def debug_access(self) -> DebugAccess: ...

    def options_for(self, kind: type[T]) -> T:
        """This layer's options; `kind()` when none were given."""

    def on_stop(self, hook: Callable[[], None]) -> None:
        """Call `hook` when the worker stops (end every stream, say)."""

    def keep(self, name: str, service: object) -> None:
        """Keep the layer's worker-side service (found by name, as on a Host)."""


@dataclass(frozen=True, slots=True)
class Layer:
    """A protocol layer as the App mounts it: its name (for messages), what registers
    it on the gRPC server, and the classes of options it reads (`Host.options_for`):
    its own, and any it shares with a sibling layer. With `--workers N` the watcher
    also calls `feeds` (what it sends each worker) and each worker calls `worker`
    instead of `register`; a layer without `worker` is relayed to the watcher whole
    (docs/workers.md)."""

    name: str
    register: Callable[[Host, GrpcServer], None]
    options: tuple[type[Any], ...] = ()
    feeds: Callable[[Host, FeedHub], None] | None = None
    worker: Callable[[WorkerHost, GrpcServer], None] | None = None


class LayerError(ValueError):
    """A layer does not keep to this interface; the message is one line naming it."""


# name -> (the arguments it is called with, whether it is a coroutine function)
_HOOKS: dict[str, tuple[tuple[str, ...], bool]] = {
    "grpc_port_tls": ((), False),
    "start_listeners": (("listen", "port"), True),
    "stop_listeners": (("grace",), True),
}


def check_hooks(layer: str, hooks: object) -> None:
    """Raise LayerError, naming `layer`, unless `hooks` has every LayerHooks method,
    callable with the arguments the App passes and async where the App awaits it."""
    for name, (arguments, is_async) in _HOOKS.items():
        wanted = f"{'async ' if is_async else ''}{name}({', '.join(arguments)})"
        method = getattr(hooks, name, None)
        if not callable(method):
            raise LayerError(f"layer {layer}: its hooks have no {wanted}")
        signature = inspect.signature(method)
        try:
            signature.bind(*arguments)
        except TypeError:
            takes = ", ".join(signature.parameters)
            raise LayerError(f"layer {layer}: hook {name}({takes}) cannot be called as "
                             f"{wanted}") from None
        if inspect.iscoroutinefunction(method) != is_async:
            raise LayerError(f"layer {layer}: hook {name} must be {wanted}")
