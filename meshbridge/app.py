"""The composition root: source -> cluster -> views -> both gRPC services + admin HTTP.

`App` owns every long-lived task and server; `stop()` ends them all. It is also what
the tests and `meshbridge compare` run in-process. Each protocol layer is given a
`LayerHost` of its own (the `meshbridge.host.Host` interface), never the App, and is
held to that interface at start (`LayerError`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import prometheus_client
import structlog
from prometheus_client.metrics_core import Metric

from bridge.authority import format_authority
from bridge.cluster import Cluster
from bridge.model import FilterKey, MeshConfig, ServiceKey, ViewKey
from bridge.multicluster import DEFAULT_SYNC_TIMEOUT
from bridge.multicluster.links import Link
from bridge.multicluster.store import ClusterStore
from bridge.multicluster.views import MultiClusterViews
from bridge.sources.base import Source
from bridge.sources.kube import KubeSource
from bridge.sources.kube_api import Credentials
from h2grpc.limits import H2Limits
from h2grpc.server import Server as NativeServer
from h2grpc.server import tls_context
from meshbridge import debug, exposition, h2metrics
from meshbridge.admin import AdminServer, Request, Response
from meshbridge.debug_access import DebugAccess
from meshbridge.host import (
    GrpcServer,
    Host,
    Layer,
    LayerError,
    LayerHooks,
    Renderer,
    RouteRenderer,
    check_hooks,
    split_listen_address,
)
from meshbridge.limits import Limits
from meshbridge.rpcguard import GrpcMetrics, RpcGuard
from meshbridge.stream_registry import StreamInfo, StreamRegistry
from meshbridge.workers.gather import Families

if TYPE_CHECKING:
    from meshbridge.workers.watcher import Watcher

log = structlog.get_logger("meshbridge.app")

T = TypeVar("T")


# Service ports up to which `serve` logs a line each once synced.
SUMMARY_PORTS = 100


@dataclass(frozen=True, slots=True)
class ServeOptions:
    listen: str = "0.0.0.0:8086"
    admin: str = "0.0.0.0:9996"
    limits: Limits = field(default_factory=Limits)
    tls: TlsFiles | None = None
    # "native": meshbridge's own gRPC server (h2grpc); "grpcio": grpc.aio's.
    grpc_transport: str = "native"
    # Each layer's typed options (the class its Layer declares), found by type:
    # Host.options_for. Options no mounted layer declares stop the start (LayerError).
    layer_options: tuple[object, ...] = ()
    # Who may read the admin port's debug pages and the layers' debug types.
    debug_access: DebugAccess = field(default_factory=DebugAccess)
    # Clusters linked by flag (`--link`), besides the Secrets the source carries, and
    # how long a linked cluster may hold /ready at start (docs/multicluster.md).
    links: tuple[Link, ...] = ()
    link_sync_timeout: float = DEFAULT_SYNC_TIMEOUT
    # Processes serving the gRPC port (docs/workers.md): 1 is this process alone;
    # above 1, this process keeps the source, the Cluster and the Views (the watcher)
    # and that many worker processes serve the clients (meshbridge.workers).
    workers: int = 1


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files for the gRPC port; with `client_ca`, clients must present a cert."""

    cert: str
    key: str
    client_ca: str | None = None

    def credentials(self) -> grpc.ServerCredentials:
        def read(path: str) -> bytes:
            with open(path, "rb") as f:
                return f.read()

        ca = read(self.client_ca) if self.client_ca else None
        return grpc.ssl_server_credentials(
            [(read(self.key), read(self.cert))], root_certificates=ca,
            require_client_auth=ca is not None)

    def context(self) -> ssl.SSLContext:
        return tls_context(self.cert, self.key, self.client_ca)


def _grpcio_lifecycle(h2: H2Limits) -> list[tuple[str, int]]:
    """The --h2-* timeouts that grpc.aio's server has an option for."""
    options = []
    if h2.keepalive_time:
        options += [("grpc.keepalive_time_ms", int(h2.keepalive_time * 1000)),
                    ("grpc.keepalive_timeout_ms", int(h2.keepalive_timeout * 1000))]
    if h2.idle_timeout:
        options.append(("grpc.max_connection_idle_ms", int(h2.idle_timeout * 1000)))
    return options


class App:
    def __init__(
        self,
        source: Source,
        config: MeshConfig | None = None,
        options: ServeOptions | None = None,
        layers: Sequence[Layer] = (),
        registry: prometheus_client.CollectorRegistry | None = None,
    ) -> None:
        from bridge.views.metrics import ViewMetrics

        self.config = config or MeshConfig()
        self.options = options or ServeOptions()
        self.source = source
        self.cluster = Cluster(self.config.local_cluster())
        self.metrics = registry or prometheus_client.CollectorRegistry()
        # Linked clusters (their Secrets in the controller namespace, `--link`), and
        # the Views of every cluster, which the layers subscribe through.
        self.clusters = ClusterStore(self.cluster, self.config.controller_namespace,
                                     self.metrics, flag_links=self.options.links,
                                     sync_timeout=self.options.link_sync_timeout)
        self.views = MultiClusterViews(self.cluster, self.config, ViewMetrics(self.metrics),
                                       self.clusters)
        if registry is None:
            prometheus_client.ProcessCollector(registry=self.metrics)
            prometheus_client.PlatformCollector(registry=self.metrics)
        register_metrics = getattr(source, "register_metrics", None)
        if register_metrics is not None:
            register_metrics(self.metrics)
        self.synced = asyncio.Event()
        self.admin = AdminServer()
        self.layers = list(layers)
        self.grpc_server: NativeServer | grpc.aio.Server | None = None
        self.grpc_port = 0
        self.admin_port = 0
        self.started_at = time.monotonic()
        self._source_task: asyncio.Task[None] | None = None
        # Shutdown hooks the protocol layers add (e.g. end every stream cleanly).
        self.stop_hooks: list[Callable[[], None]] = []
        # What the layers hang on the gRPC port's life (Host.add_hooks).
        self.layer_hooks: list[LayerHooks] = []
        # Each layer's service, by name (Host.keep / Host.service).
        self._services: dict[str, object] = {}
        # Every client stream, for /debug/streams; each protocol layer keeps its own.
        self.streams = StreamRegistry(self.metrics)
        # How each protocol layer encodes a View, for /debug/endpoints.
        self.renderers: dict[str, Renderer] = {}
        self.route_renderers: dict[str, RouteRenderer] = {}
        # With --workers above 1: the worker processes and what they are sent.
        self.watcher: Watcher | None = None
        self._install_admin_routes()

    # ------------------------------------------------------------------ lifecycle

    async def start(self, wait_synced: bool = True) -> None:
        if self.options.workers > 1:
            from meshbridge.workers.watcher import Watcher

            self.watcher = Watcher(self)
            self.grpc_port = await self.watcher.start(self._start_source)
        else:
            await self._serve_grpc()
        for hooks in self.layer_hooks:
            await hooks.start_listeners(self.options.listen, self.grpc_port)
        host, port = split_listen_address(self.options.admin)
        self.admin_port = await self.admin.start(host, port)
        if wait_synced:
            await self.wait_synced()
        log.info("serving", grpc=self.grpc_port, admin=self.admin_port, source=self.source.name,
                 workers=self.options.workers)

    def _start_source(self) -> None:
        """Start the source and the linked clusters; after the layers are mounted, so
        that their cluster listeners are in place before the first event."""
        self._source_task = asyncio.create_task(self._run_source(), name="source")
        self.clusters.start()

    async def _serve_grpc(self) -> None:
        """The gRPC port in this process, every layer mounted on it."""
        limits = self.options.limits
        self.rpc_guard = RpcGuard(limits.max_streams_per_client, GrpcMetrics(self.metrics))
        server = self._grpc_server(limits)
        self._mount(server)
        self._start_source()
        tls = self.options.tls
        layer_tls = self.port_tls()
        if layer_tls is not None and isinstance(server, NativeServer):
            self.grpc_port = server.add_secure_port(self.options.listen, layer_tls)
        elif tls is None:
            self.grpc_port = server.add_insecure_port(self.options.listen)
        elif isinstance(server, NativeServer):
            self.grpc_port = server.add_secure_port(self.options.listen, tls.context())
        else:
            self.grpc_port = server.add_secure_port(self.options.listen, tls.credentials())
        if self.grpc_port == 0:
            raise OSError(f"cannot listen on {self.options.listen}")
        await server.start()
        self.grpc_server = server

    def _grpc_server(self, limits: Limits) -> NativeServer | grpc.aio.Server:
        """The server both protocol layers are mounted on (ServeOptions.grpc_transport)."""
        if self.options.grpc_transport == "grpcio":
            return grpc.aio.server(
                interceptors=[self.rpc_guard],
                options=[
                    *limits.server_options(),
                    ("grpc.so_reuseport", 0),
                    ("grpc.keepalive_permit_without_calls", 1),
                    ("grpc.http2.min_ping_interval_without_data_ms", 5000),
                    *_grpcio_lifecycle(limits.h2),
                ],
            )
        server = NativeServer(interceptors=[self.rpc_guard], limits=dataclasses.replace(
            limits.h2, max_concurrent_streams=limits.max_streams_per_connection,
            max_message_bytes=limits.max_message_bytes))
        h2metrics.register(server, self.metrics)
        return server

    async def wait_synced(self) -> None:
        synced = asyncio.create_task(self.synced.wait())
        assert self._source_task is not None
        done, _ = await asyncio.wait({synced, self._source_task},
                                     return_when=asyncio.FIRST_COMPLETED)
        if self._source_task in done and not self.synced.is_set():
            synced.cancel()
            self._source_task.result()  # re-raise why the source died
            raise RuntimeError("source ended before its initial sync")

    async def _run_source(self) -> None:
        await self.source.run(self.cluster, self.synced)

    async def stop(self, grace: float = 1.0) -> None:
        """Stop taking new RPCs (GOAWAY), end every stream with OK so proxies reconnect
        to another replica, and give the handlers `grace` to write their status."""
        stopping = None
        if self.watcher is not None:
            # The workers end their streams (GOAWAY, then OK) while the hooks below
            # end the streams the watcher serves for them (the relayed ones).
            stopping = asyncio.ensure_future(self.watcher.stop(grace))
            await asyncio.sleep(0)
        elif self.grpc_server is not None:
            # Started first, so that no client can open a stream the hooks below would
            # miss; grpc.aio lets in-flight RPCs finish within the grace.
            stopping = asyncio.ensure_future(self.grpc_server.stop(grace))
            await asyncio.sleep(0)  # one loop turn: the shutdown has begun
        for hook in self.stop_hooks:
            hook()
        self._services.clear()  # a stopped App and its cluster cache can be freed
        if stopping is not None:
            await stopping
        for hooks in self.layer_hooks:
            await hooks.stop_listeners(grace)
        self.layer_hooks.clear()
        self.clusters.stop()
        if self._source_task is not None:
            self._source_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._source_task
        await self.admin.stop()

    # ------------------------------------------------------------------ the layers

    def _mount(self, server: GrpcServer) -> None:
        """Register every layer, each with a host of its own; LayerError, naming the
        layer, when one does not keep to meshbridge.host's interface."""
        declared = tuple({kind for layer in self.layers for kind in layer.options})
        for given in self.options.layer_options:
            if not isinstance(given, declared):
                mounted = ", ".join(layer.name for layer in self.layers) or "none"
                raise LayerError(f"options {type(given).__name__} given, but no mounted "
                                 f"layer declares them (mounted: {mounted})")
        for layer in self.layers:
            layer.register(self.host_for(layer), server)

    def host_for(self, layer: Layer) -> Host:
        """What `layer` is given: this App, seen through meshbridge.host.Host."""
        return LayerHost(self, layer)

    def port_tls(self) -> ssl.SSLContext | None:
        """The gRPC port's TLS as a layer brings it (--tls-from-identity), or None."""
        return next((c for hooks in self.layer_hooks
                     if (c := hooks.grpc_port_tls()) is not None), None)

    def options_for(self, kind: type[T]) -> T:
        for value in self.options.layer_options:
            if isinstance(value, kind):
                return value
        return kind()

    def kube_credentials(self) -> Callable[[], Credentials] | None:
        return self.source.credentials if isinstance(self.source, KubeSource) else None

    def keep(self, name: str, service: object) -> None:
        self._services[name] = service

    def service(self, name: str) -> Any:
        return self._services[name]

    # ------------------------------------------------------------------ reporting

    def service_port_summary(self) -> list[tuple[str, int, int, int]]:
        """(service, port, ready endpoints, all endpoints) for every service port."""
        rows = []
        for key, svc in sorted(self.cluster.services.items()):
            if svc.type == "ExternalName":
                continue
            for sp in svc.ports:
                _, merged = self.views.merge_endpoints(key, sp.port)
                filtered = self.views.filter_endpoints(
                    ViewKey(key, sp.port, FilterKey(filtering=False)), merged
                )
                ready = sum(1 for r in filtered.values() if r.endpoint.ready)
                rows.append((str(key), sp.port, ready, len(filtered)))
        return rows

    def log_summary(self, limit: int = SUMMARY_PORTS) -> None:
        """A line per service port, as the demo shows; a cluster with more service
        ports than `limit` gets one line of counts instead: a line per port of a big
        cluster is noise, and merging every port to count its endpoints would enrich
        every endpoint of the cluster before the first client asked for one."""
        ports = sum(len(s.ports) for s in self.cluster.services.values())
        if ports > limit:
            log.info("serving", service_ports=ports, **self.cluster.counts(),
                     note=f"one line per service port up to {limit}: see /debug/views")
            return
        for service, port, ready, total in self.service_port_summary():
            ns, name = service.split("/", 1)
            log.info("service port", namespace=ns, service=name, port=port,
                     endpoints=ready, draining=total - ready)
        for key, svc in sorted(self.cluster.services.items()):
            if svc.type == "ExternalName":
                log.info("service port", namespace=key.namespace, service=key.name,
                         external_name=svc.external_name, note="ExternalName: not served")

    def authority(self, service: ServiceKey, port: int) -> str:
        return format_authority(service, port, self.config.cluster_domain)

    # ------------------------------------------------------------------ admin

    def _install_admin_routes(self) -> None:
        self.admin.route("/metrics", self._metrics)
        self.admin.route("/live", lambda _r: Response.text(200, "live"))
        self.admin.route("/ready", self._ready)
        self.admin.route("/ping", lambda _r: Response.text(200, "pong"))
        debug.install(self)

    async def _metrics(self, _req: Request) -> Response:
        # Linkerd's and Istio's counters under their own names (no `_total`).
        return Response(200, exposition.generate(Families(await self.metric_families())),
                        prometheus_client.CONTENT_TYPE_LATEST)

    async def metric_families(self) -> list[Metric]:
        """This process's metric families; with workers, every worker's series added
        to the watcher's (meshbridge.workers.gather)."""
        families = list(self.metrics.collect())
        if self.watcher is not None:
            families = await self.watcher.metric_families(families)
        return families

    async def sample_value(self, name: str, labels: dict[str, str] | None = None
                           ) -> float | None:
        """One sample of `metric_families`, as `CollectorRegistry.get_sample_value`
        reads one of a registry."""
        wanted = labels or {}
        for family in await self.metric_families():
            for sample in family.samples:
                if sample.name == name and sample.labels == wanted:
                    return float(sample.value)
        return None

    async def stream_infos(self) -> list[StreamInfo]:
        """Every client stream, in this process and in its workers (ordered by id)."""
        infos = self.streams.all()
        if self.watcher is not None:
            infos += await self.watcher.stream_infos()
        return sorted(infos, key=lambda s: s.id)

    def _ready(self, _req: Request) -> Response:
        if not self.synced.is_set():
            return Response.text(503, f"not ready: source {self.source.name} has not synced")
        if self.source.stale:
            why = getattr(self.source, "stale_reason", None)  # optional on a Source
            return Response.text(503, f"not ready: source {self.source.name} is stale"
                                      + (f": {why}" if why else ""))
        waiting = self.clusters.ready()
        if waiting:
            return Response.text(503, "not ready: linked cluster(s) not synced yet: "
                                      + ", ".join(waiting))
        return Response.text(200, "ready")


class LayerHost:
    """meshbridge.host.Host for one layer: the App's parts, that layer's options only,
    and its hooks checked before the App takes them."""

    def __init__(self, app: App, layer: Layer) -> None:
        self._app = app
        self._layer = layer
        self.cluster = app.cluster
        self.views = app.views
        self.config = app.config
        self.metrics = app.metrics
        self.streams = app.streams

    @property
    def limits(self) -> Limits:
        return self._app.options.limits

    @property
    def debug_access(self) -> DebugAccess:
        return self._app.options.debug_access

    @property
    def sni_certificates(self) -> bool:
        # The native server takes an SSLContext (its SNI callback picks the chain);
        # grpc.aio's server credentials hold one fixed chain.
        return self._app.options.grpc_transport == "native"

    def kube_credentials(self) -> Callable[[], Credentials] | None:
        return self._app.kube_credentials()

    def options_for(self, kind: type[T]) -> T:
        if kind not in self._layer.options:
            declared = ", ".join(k.__name__ for k in self._layer.options) or "none"
            raise LayerError(f"layer {self._layer.name}: asks for {kind.__name__}, but "
                             f"declares {declared} as its options")
        return self._app.options_for(kind)

    def on_stop(self, hook: Callable[[], None]) -> None:
        self._app.stop_hooks.append(hook)

    def add_hooks(self, hooks: LayerHooks) -> None:
        check_hooks(self._layer.name, hooks)
        self._app.layer_hooks.append(hooks)

    def add_renderer(self, name: str, renderer: Renderer) -> None:
        self._app.renderers[name] = renderer

    def add_route_renderer(self, name: str, renderer: RouteRenderer) -> None:
        self._app.route_renderers[name] = renderer

    def keep(self, name: str, service: object) -> None:
        self._app.keep(name, service)

    def service(self, name: str) -> Any:
        return self._app.service(name)


def _is_a_host(host: LayerHost) -> Host:
    """A LayerHost is what every layer is given (checked by mypy here)."""
    return host
