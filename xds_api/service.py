"""The xDS gRPC services on the shared port: ADS (SotW and delta) and EDS alone.

This is the only module that knows gRPC. It reads requests, hands them to the stream
state machines (`stream.py`), writes what they say is due, and maps their errors to
statuses. Requests and responses travel as bytes: requests are decoded here so that
one that does not decode gets a clear INVALID_ARGUMENT, and responses are assembled
by the streams from resources encoded once for everyone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import grpc
import structlog
from envoy.config.core.v3 import health_check_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.config.route.v3 import route_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2, json_format
from google.protobuf.message import DecodeError

from bridge.authority import view_authority
from bridge.model import ResolvedEndpoint, ServiceKey, ViewKey
from bridge.routes.text import RouteRow
from bridge.views import View
from meshbridge.host import (
    FeedHub,
    GrpcServer,
    Host,
    Layer,
    Limits,
    StreamInfo,
    StreamRegistry,
    WorkerHost,
    sender,
)
from xds_api import resource_types as rt
from xds_api.cache import ResourceCache
from xds_api.caches.endpoints import DEFAULT_LEDS_THRESHOLD
from xds_api.debug_types import DebugTypes, GatheredDebugTypes, merged
from xds_api.feeds import XdsFeeds
from xds_api.metrics import XdsMetrics
from xds_api.mirror import MirrorCache
from xds_api.resources import (
    DEFAULT_ISTIO_CLUSTER_ID,
    DEFAULT_METADATA_PROFILE,
    METADATA_NAMESPACE,
    METADATA_PROFILES,
    MetadataEncoder,
)
from xds_api.route_config import ClientKind
from xds_api.route_text import route_config_rows
from xds_api.shared_responses import SharedResponses
from xds_api.stream import (
    DEFAULT_MAX_NAMES,
    BadRequest,
    DebugReply,
    DeltaStream,
    Forbidden,
    Resources,
    SotwStream,
    StreamError,
    TooManyNames,
    XdsStream,
)

log = structlog.get_logger("meshbridge.xds")

ADS_SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"
EDS_SERVICE = "envoy.service.endpoint.v3.EndpointDiscoveryService"
DEFAULT_WRITE_TIMEOUT = 30.0
CUT_OFF_GRACE = 1.0  # seconds a cut-off stream's status may take to leave
MULTICLUSTER_MODES = ("none", "istio")
# The stream protocols istiod-style merging applies to (SotW and delta, LEDS included).
XDS_PROTOCOLS = ("xds-sotw", "xds-delta")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("xDS")
    group.add_argument("--xds-draining", action="store_true",
                       help="send terminating endpoints that still serve as DRAINING "
                            "(default: leave them out)")
    group.add_argument("--xds-write-timeout", type=float, default=DEFAULT_WRITE_TIMEOUT,
                       help="seconds a response may wait for a client that does not read "
                            "before its stream is cut off")
    group.add_argument("--xds-endpoint-metadata", choices=METADATA_PROFILES,
                       default=DEFAULT_METADATA_PROFILE,
                       help="what each LbEndpoint carries as metadata: none; istio (what "
                            "istiod sends a sidecar: tlsMode and workload); linkerd (the "
                            "Linkerd enrichment) (default: %(default)s)")
    group.add_argument("--xds-istio-cluster-id", default=DEFAULT_ISTIO_CLUSTER_ID,
                       help="the cluster id in the istio profile's `workload` "
                            "(default: %(default)s, istiod's)")
    group.add_argument("--xds-leds-threshold", type=_non_negative_int,
                       default=DEFAULT_LEDS_THRESHOLD,
                       help="a delta client gets a service port of at least this many "
                            "endpoints over LEDS, one resource per endpoint (0: only "
                            "clients whose node metadata says meshbridge.io/leds: always) "
                            "(default: %(default)s)")
    group.add_argument("--xds-multicluster", choices=MULTICLUSTER_MODES, default="none",
                       help="istio: a service's ClusterLoadAssignment also holds the "
                            "endpoints of the same namespace and name in every linked "
                            "cluster (istiod's namespace sameness), cluster-local hosts "
                            "excepted; none: only remote-discovery and federated services "
                            "are served from linked clusters (default: %(default)s)")
    group.add_argument("--xds-cluster-local", default="",
                       help="comma-separated hosts (globs: *.ns.svc.cluster.local) never "
                            "merged across clusters, besides istiod's defaults (kube-system "
                            "and kubernetes.default)")


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


@dataclass(frozen=True, slots=True)
class XdsOptions:
    """The xDS layer's options (`--xds-*`)."""

    # Send terminating endpoints that still serve as DRAINING instead of leaving them out.
    draining: bool = False
    # Seconds a response may wait for a client that does not read before its stream
    # is cut off.
    write_timeout: float = DEFAULT_WRITE_TIMEOUT
    # What each LbEndpoint carries as metadata (resources.METADATA_PROFILES).
    endpoint_metadata: str = DEFAULT_METADATA_PROFILE
    # The cluster id in the istio profile's `workload` field.
    istio_cluster_id: str = DEFAULT_ISTIO_CLUSTER_ID
    # Endpoints from which a delta client gets a service port over LEDS (0: on request).
    leds_threshold: int = DEFAULT_LEDS_THRESHOLD
    # "istio": merge a service with its namesakes in every linked cluster.
    multicluster: str = "none"
    # Hosts never merged, besides istiod's defaults (globs).
    cluster_local: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.endpoint_metadata not in METADATA_PROFILES:
            raise ValueError(f"unknown xDS endpoint metadata profile "
                             f"{self.endpoint_metadata!r}; choose one of "
                             f"{', '.join(METADATA_PROFILES)}")
        if isinstance(self.leds_threshold, bool) or not isinstance(self.leds_threshold, int) \
                or self.leds_threshold < 0:
            raise ValueError(f"the LEDS threshold must be a whole number, 0 or more, not "
                             f"{self.leds_threshold!r}")
        if self.multicluster not in MULTICLUSTER_MODES:
            raise ValueError(f"xDS multicluster mode {self.multicluster!r}: choose one of "
                             f"{', '.join(MULTICLUSTER_MODES)}")
        if not isinstance(self.draining, bool):
            raise ValueError(f"xDS draining must be true or false, not {self.draining!r}")
        if isinstance(self.write_timeout, bool) \
                or not isinstance(self.write_timeout, (int, float)) \
                or not (math.isfinite(self.write_timeout) and self.write_timeout > 0):
            raise ValueError(f"the xDS write timeout must be a positive number of seconds, "
                             f"not {self.write_timeout!r}")


def options_from_args(args: argparse.Namespace) -> XdsOptions:
    """The options `add_arguments` parsed."""
    return XdsOptions(draining=bool(args.xds_draining),
                      write_timeout=float(args.xds_write_timeout),
                      endpoint_metadata=str(args.xds_endpoint_metadata),
                      istio_cluster_id=str(args.xds_istio_cluster_id),
                      leds_threshold=int(args.xds_leds_threshold),
                      multicluster=str(args.xds_multicluster),
                      cluster_local=tuple(h.strip() for h in args.xds_cluster_local.split(",")
                                          if h.strip()))


def register(host: Host, server: GrpcServer) -> None:
    """Mount the xDS services on the host's gRPC server; the service is kept on the
    host as "xds" (tests and tools reach it with `host.service("xds")`)."""
    service = XdsService(host, host.options_for(XdsOptions))
    server.add_generic_rpc_handlers(service.handlers())
    host.on_stop(service.stop)
    host.add_renderer("xds", service.render_view)
    host.add_route_renderer("envoy", partial(service.render_routes, ClientKind.ENVOY))
    host.add_route_renderer("grpc", partial(service.render_routes, ClientKind.GRPC))
    host.keep("xds", service)


def register_feeds(host: Host, hub: FeedHub) -> None:
    """The watcher's side of xDS over workers: a subscription of its own per feed a
    worker asks for (xds_api.feeds)."""
    service: XdsService = host.service("xds")
    hub.on_link(XdsFeeds(service.cache).attach)
    debug = service.debug
    assert isinstance(debug, DebugTypes)  # where the Views are: this process's streams

    async def gather(type_url: str, names: tuple[str, ...]) -> DebugReply:
        # A worker's debug client asks for every process's streams: the watcher's
        # (the relayed ones) and each worker's, its own included.
        return merged(type_url, [debug.reply(type_url, names),
                                 *await hub.ask("xds.debug", type_url, names)])

    hub.on_link(lambda link: link.on_call("xds.debug.all", gather))


def register_worker(host: WorkerHost, server: GrpcServer) -> None:
    """A worker's side: the same streams over a mirror of the watcher's resources
    (xds_api.mirror); FetchEndpoints is relayed whole, and istiod's debug types are
    answered with every process's streams, which the watcher gathers
    (docs/workers.md)."""
    options = host.options_for(XdsOptions)
    metrics = XdsMetrics(host.metrics)
    cache = MirrorCache(host.link, metrics)
    streams = XdsStreams(cache, metrics, host.streams, host.limits, options)
    local = DebugTypes(host.streams, lambda: [r.stream for r in streams.runners], cache,
                       access=host.debug_access, cluster_id=options.istio_cluster_id)
    host.link.on_call("xds.debug", local.reply)
    streams.debug = GatheredDebugTypes(
        local, lambda type_url, names: host.link.call("xds.debug.all", type_url, names))
    server.add_generic_rpc_handlers(streams.handlers())
    host.on_stop(streams.stop)
    host.on_stop(cache.close)
    host.keep("xds", streams)


LAYER = Layer("xds_api.service", register, (XdsOptions,), feeds=register_feeds,
              worker=register_worker)


def status_of(error: StreamError) -> tuple[grpc.StatusCode, str]:
    """The one place a protocol error becomes a gRPC status."""
    if isinstance(error, TooManyNames):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(error)
    if isinstance(error, BadRequest):
        return grpc.StatusCode.INVALID_ARGUMENT, str(error)
    if isinstance(error, Forbidden):
        return grpc.StatusCode.PERMISSION_DENIED, str(error)
    return grpc.StatusCode.INTERNAL, str(error)


class XdsStreams:
    """The xDS streams of one process: the gRPC handlers, a runner per stream and the
    write path, over whatever `Resources` says what is due — the resource cache where
    the Views are, a worker's mirror of it elsewhere (xds_api.mirror)."""

    def __init__(self, cache: Resources, metrics: XdsMetrics, streams: StreamRegistry,
                 limits: Limits, options: XdsOptions) -> None:
        self.options = options
        self.metrics = metrics
        self.cache = cache
        self.streams = streams
        # Names per xDS request: the core's --max-resource-names.
        self.max_names = limits.max_resource_names or DEFAULT_MAX_NAMES
        self.write_timeout = options.write_timeout
        self.runners: set[StreamRunner] = set()
        # istiod's debug types (§9.2), where the admin port's debug pages would be;
        # None where they are not served (a worker: docs/workers.md).
        self.debug: DebugTypes | GatheredDebugTypes | None = None
        # Streams with something to write, written in one callback at the end of this
        # loop turn (one change to 5,000 streams: one callback).
        self._due: list[StreamRunner] = []
        # One nonce clock for the streams, ticked per write batch, so that the streams
        # of a batch share their encoded responses (xds_api.shared_responses).
        self.shared = SharedResponses()
        # Plain ACKs by their bytes, per variant: the ACKs of one fan-out are thousands
        # of equal small messages, each decoded once (XdsStream.ack_key).
        self.acks: dict[str, dict[bytes, Hashable]] = {"sotw": {}, "delta": {}}
        self._sweeper: asyncio.Task[None] | None = None

    def handlers(self) -> tuple[grpc.GenericRpcHandler, ...]:
        return self._handlers({})

    def _handlers(self, eds_extra: dict[str, grpc.RpcMethodHandler]
                  ) -> tuple[grpc.GenericRpcHandler, ...]:
        # grpc.aio runs a handler with the reader/writer API only if it is a coroutine
        # function; `partial` keeps that visible to it.
        def stream(cls: type[SotwStream] | type[DeltaStream], ads: bool) -> Any:
            return grpc.stream_stream_rpc_method_handler(partial(self._run, cls, ads))

        return (
            grpc.method_handlers_generic_handler(ADS_SERVICE, {
                "StreamAggregatedResources": stream(SotwStream, True),
                "DeltaAggregatedResources": stream(DeltaStream, True),
            }),
            grpc.method_handlers_generic_handler(EDS_SERVICE, {
                "StreamEndpoints": stream(SotwStream, False),
                "DeltaEndpoints": stream(DeltaStream, False),
                **eds_extra,
            }),
        )

    async def _run(self, stream_cls: type[SotwStream] | type[DeltaStream], ads: bool,
                   _requests: object, context: grpc.aio.ServicerContext) -> None:
        self._ensure_sweeper()
        runner = StreamRunner(self, stream_cls, ads, context)
        self.runners.add(runner)
        self.streams.add(runner.info)
        self.metrics.streams[stream_cls.api].inc()
        detach = getattr(context, "detach", None)
        if detach is not None:
            # The native server: the stream goes on in its callbacks, with no task.
            runner.detach(detach)
            return
        try:
            await runner.run(context)
        finally:
            runner.close()

    def stream_closed(self, runner: StreamRunner) -> None:
        self.metrics.streams[runner.stream.api].dec()
        self.streams.remove(runner.info)
        self.runners.discard(runner)

    # ------------------------------------------------------------ slow consumers

    def write_soon(self, runner: StreamRunner) -> None:
        if not self._due:
            asyncio.get_running_loop().call_soon(self._write_due)
        self._due.append(runner)

    def _write_due(self) -> None:
        due, self._due = self._due, []
        self.shared.tick()
        try:
            written = [runner for runner in due if runner.write_now()]
        finally:
            self.shared.end_batch()
        # Out now rather than after the rest of this loop turn: one write per
        # connection either way (meshbridge.host.sender). Not in parts as it goes:
        # clients woken mid fan-out take CPU from it (measured, docs/performance.md).
        for runner in written:
            runner.send_now()

    def _ensure_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep(), name="xds-write-sweeper")

    async def _sweep(self) -> None:
        """Cut off streams whose client has stopped reading: a response has waited
        longer than the write timeout. Memory is bounded regardless (responses are
        computed when written, never queued); this frees the stream for a client
        that will reconnect and get a full snapshot."""
        loop = asyncio.get_running_loop()
        period = max(0.05, min(1.0, self.write_timeout / 4))
        while True:
            await asyncio.sleep(period)  # a polling period, not synchronisation
            now = loop.time()
            for runner in list(self.runners):
                started = runner.write_started
                if started is not None and now - started > self.write_timeout \
                        and runner.cut_off():
                    self.metrics.write_timeouts.inc()
                    log.warning("xds stream cut off: client not reading",
                                node=runner.stream.node_id, peer=runner.stream.peer,
                                waited=round(now - started, 3))

    def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for runner in list(self.runners):
            runner.end()


class XdsService(XdsStreams):
    """The xDS layer where the Views are: the resource cache and its streams, the
    unary FetchEndpoints, and how xDS clients see a View or a port's routes (the
    debug pages)."""

    cache: ResourceCache

    def __init__(self, host: Host, options: XdsOptions | None = None) -> None:
        options = options or XdsOptions()
        metrics = XdsMetrics(host.metrics)
        views = host.views
        if options.multicluster == "istio":
            views.enable_istio_merge(XDS_PROTOCOLS, options.cluster_local)

        def pod_labels(resolved: ResolvedEndpoint) -> Mapping[str, str]:
            ep = resolved.endpoint
            if not ep.pod_name:
                return {}
            # A linked cluster's endpoint is its own cluster's pod.
            source = views.cluster_named(ep.id.cluster)
            pod = source.pods.get((ep.id.namespace, ep.pod_name)) if source else None
            return pod.meta.labels if pod is not None else {}

        metadata = MetadataEncoder(options.endpoint_metadata, options.istio_cluster_id,
                                   pod_labels)
        cache = ResourceCache(host.cluster, views, host.config.cluster_domain,
                              draining=options.draining, metrics=metrics,
                              metadata=metadata, leds_threshold=options.leds_threshold)
        super().__init__(cache, metrics, host.streams, host.limits, options)
        self.debug = DebugTypes(host.streams, lambda: [r.stream for r in self.runners],
                                cache, access=host.debug_access,
                                cluster_id=options.istio_cluster_id)

    def handlers(self) -> tuple[grpc.GenericRpcHandler, ...]:
        return self._handlers({"FetchEndpoints": grpc.unary_unary_rpc_method_handler(
            self._fetch_endpoints)})

    async def _fetch_endpoints(self, raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
        stream = SotwStream(self.cache, ads=False, metrics=self.metrics,
                            max_names=self.max_names, peer=context.peer())
        try:
            stream.handle(decode(discovery_pb2.DiscoveryRequest, raw, self.metrics))
            responses = stream.take_responses()
        except StreamError as e:
            await context.abort(*status_of(e))
        finally:
            stream.close()
        if responses:
            return responses[0]
        empty: bytes = discovery_pb2.DiscoveryResponse(type_url=rt.ENDPOINT).SerializeToString()
        return empty

    def stop(self) -> None:
        super().stop()
        self.cache.close()

    # ------------------------------------------------------------ debugging

    def render_routes(self, client: ClientKind, service: ServiceKey, port: int,
                      client_namespace: str) -> tuple[list[RouteRow], list[str]]:
        """A Service port's RouteConfiguration as this client kind in this namespace is
        sent it, as route-table rows, and what it is not told (for /debug/endpoints)."""
        name = view_authority(ViewKey(service, port), self.cache.cluster_domain)
        # Read-only: what is kept, or built afresh and kept nowhere (nothing counted).
        found = self.cache.routes.preview(name, client, client_namespace)
        if found is None:
            return [], []
        res, left_out = found
        config = route_pb2.RouteConfiguration()
        any_msg = any_pb2.Any.FromString(res.any_bytes)
        any_msg.Unpack(config)
        return route_config_rows(config), [str(x) for x in left_out]

    def render_view(self, view: View) -> tuple[dict[str, dict[str, Any]], Any]:
        """The View as xDS clients get it, for /debug/endpoints: the CLA's endpoints
        keyed by "ip:port", and the CLA as proto-JSON."""
        res = self.cache.endpoints.preview(view)
        cla = endpoint_pb2.ClusterLoadAssignment()
        any_msg = any_pb2.Any.FromString(res.any_bytes)
        any_msg.Unpack(cla)
        endpoints: dict[str, dict[str, Any]] = {}
        for loc in cla.endpoints:
            for lb in loc.lb_endpoints:
                sa = lb.endpoint.address.socket_address
                addr = f"[{sa.address}]:{sa.port_value}" if ":" in sa.address else \
                    f"{sa.address}:{sa.port_value}"
                # Only the linkerd metadata profile carries the identity.
                meta = lb.metadata.filter_metadata.get(METADATA_NAMESPACE)
                endpoints[addr] = {
                    "health": health_check_pb2.HealthStatus.Name(lb.health_status),
                    "zone": loc.locality.zone, "region": loc.locality.region,
                    "weight": lb.load_balancing_weight.value,
                    "identity": meta.fields["identity"].string_value
                    if meta is not None and "identity" in meta.fields else "",
                }
        message = json_format.MessageToDict(cla, preserving_proto_field_name=True)
        return endpoints, {"view_version": view.version, "resource_version": res.version,
                           "cla": message}


def decode(message: Any, raw: bytes, metrics: XdsMetrics) -> Any:
    try:
        return message.FromString(raw)
    except (DecodeError, ValueError) as e:
        metrics.bad_requests.labels("undecodable").inc()
        raise BadRequest(f"request does not decode as {message.DESCRIPTOR.full_name}: "
                         f"{e}") from None


# ACKs remembered by their bytes: small ones only, and a bounded number of them
# (cleared when full).
MAX_ACK_BYTES = 1024
MAX_ACKS_KEPT = 4096
# How long a shutting-down stream waits for its write in progress to finish.
SHUTDOWN_WRITE_GRACE = 2.0
# How long a shutting-down stream waits for the client to answer its last response.
SHUTDOWN_ANSWER_GRACE = 0.5


class StreamRunner:
    """One gRPC stream: its reader (the handler itself) and, while there is something
    to send, a writer task. An idle stream has no writer and holds no response: with
    thousands of streams per process, what one idle stream costs is what matters."""

    __slots__ = (
        "_acks",
        "_context",
        "_cut_off",
        "_detached",
        "_ending",
        "_message",
        "_nowait",
        "_scheduled",
        "_soon",
        "_task",
        "_writer",
        "info",
        "service",
        "stream",
        "write_started",
    )

    def __init__(self, service: XdsStreams,
                 stream_cls: type[SotwStream] | type[DeltaStream], ads: bool,
                 context: grpc.aio.ServicerContext) -> None:
        self.service = service
        peer = context.peer()
        self.info = StreamInfo(stream_cls.protocol, peer)
        certified = bool(context.auth_context().get("x509_pem_cert"))
        self.stream: XdsStream = stream_cls(
            service.cache, ads=ads, waker=self, metrics=service.metrics,
            max_names=service.max_names, peer=peer, info=self.info,
            debug=None if service.debug is None else service.debug.for_client(peer, certified),
            shared=service.shared)
        self._message: Any = (discovery_pb2.DiscoveryRequest if stream_cls is SotwStream
                              else discovery_pb2.DeltaDiscoveryRequest)
        self._acks = service.acks[stream_cls.api]
        self._context = context
        # Whether the server takes a message now when it can (`write_nowait`; never
        # grpc.aio); when it cannot, a writer task awaits `context.write`. A flag, and
        # the method looked up per write: no bound method held per stream.
        self._nowait = hasattr(context, "write_nowait")
        self._soon = False  # queued for the service's write_now callback
        self._writer: asyncio.Task[None] | None = None
        self._scheduled = False
        self._task: asyncio.Task[Any] | None = None
        self._ending = False
        self._cut_off = False
        # Served in the native server's callbacks (`detach`): no task of its own.
        self._detached = False
        self.write_started: float | None = None

    def wake(self) -> None:
        """Something may be due: write it at the end of this loop turn (so that wakes
        from one change coalesce), or have the running writer look again."""
        if self._writer is not None:
            self._scheduled = True
        elif not (self._ending or self._cut_off or self._soon):
            self._soon = True
            self.service.write_soon(self)

    def write_now(self) -> bool:
        """Write what is due without a task while the server takes messages at once
        (the native one does while its client keeps up); a writer task starts only
        when the stream must wait. A fan-out to thousands of streams creates no task.
        True if something was written now."""
        self._soon = False
        if self._writer is not None:
            self._scheduled = True
            return False
        if self._ending or self._cut_off:
            return False
        wrote = False
        try:
            responses = self.stream.take_responses()
            while responses:
                if not (self._nowait and self._context.write_nowait(responses[0])):
                    self._writer = asyncio.get_running_loop().create_task(
                        self._flush(responses))
                    return wrote
                responses.pop(0)
                wrote = True
        except Exception as e:  # the call is broken: end the reader too
            log.debug("xds stream write failed", peer=self.stream.peer, error=repr(e))
            self._break()
        return wrote

    def send_now(self) -> None:
        """Send what the call's connection has queued (meshbridge.host.sender); looked
        up when called, not kept: one bound method less per idle stream."""
        sender(self._context)()

    def _break(self) -> None:
        """The call is broken: reset it (detached), or cancel its handler."""
        if self._detached:
            self.close()
            self._context.cancel()
        elif self._task is not None:
            self._task.cancel()

    def end(self) -> None:
        """Server shutdown: end the stream with OK so the client reconnects. A client
        still to answer a response is given a moment to: its ACK would otherwise be
        written into a stream that has just ended, which some clients (grpc.aio's)
        report as an error instead of the OK they were sent."""
        self._ending = True
        stop: Callable[[], object]
        if self._detached:
            stop = self._end_detached
        elif self._task is not None:
            stop = self._task.cancel
        else:
            return
        if self.stream.awaiting_answer() and not self._cut_off:
            asyncio.get_running_loop().call_later(SHUTDOWN_ANSWER_GRACE, stop)
        else:
            stop()

    def cut_off(self) -> bool:
        """End a stream whose client stopped reading; False if already done."""
        if self._cut_off:
            return False
        self._cut_off = True
        if self._detached:
            # The status queues behind the unread data (as the task's abort does).
            self._end_detached(grpc.StatusCode.UNAVAILABLE,
                               "stream cut off: the client stopped reading")
        elif self._task is not None:
            self._task.cancel()
        return True

    # ------------------------------------------------------------ detached (native)

    def detach(self, detach: Any) -> None:
        """Serve the stream in the server's callbacks: each request in the callback
        that read it, the end when the server says (h2grpc's ServerCall.detach)."""
        self._detached = True
        detach(self)

    def on_done(self) -> None:
        """The call ended from outside: the client is done, or gone."""
        self.close()

    def _end_detached(self, code: grpc.StatusCode = grpc.StatusCode.OK,
                      details: str = "") -> None:
        self.close()
        self._context.end(code, details)

    def close(self) -> None:
        """The stream is over: no writer, no watches, off the service's books."""
        if self.stream.closed:
            return
        self._ending = True
        writer = self._writer
        if writer is not None and self._detached:
            # What it handed the server is queued whole; what it had not is dropped
            # (responses are computed when written: the client reconnects).
            writer.cancel()
        self.stream.close()
        self.service.stream_closed(self)

    async def run(self, context: grpc.aio.ServicerContext) -> None:
        self._task = asyncio.current_task()
        try:
            read_into = getattr(context, "read_into", None)
            if read_into is not None:
                # The native server hands each request (an ACK, mostly) to `receive`
                # in the callback that read it: no task switch per message.
                await read_into(self.receive)
                return
            while (raw := await context.read()) is not grpc.aio.EOF:
                if self.receive(raw):
                    return
        except StreamError as e:
            log.info("xds stream refused", node=self.stream.node_id, peer=self.stream.peer,
                     reason=str(e))
            await context.abort(*status_of(e))
        except asyncio.CancelledError:
            if self._ending:
                return
            if self._cut_off:
                # The status queues behind the unread data; if it cannot go out soon,
                # the call is cancelled instead (the client sees CANCELLED).
                await asyncio.wait_for(context.abort(
                    grpc.StatusCode.UNAVAILABLE, "stream cut off: the client stopped reading"),
                    CUT_OFF_GRACE)
            raise
        finally:
            self._ending = True  # no new writer from here on
            writer = self._writer
            if writer is not None:
                if self._cut_off:
                    writer.cancel()
                # On shutdown the write in progress is finished, never cancelled: a write
                # cut in half breaks the call, and the client would see an error instead
                # of the OK that tells it to reconnect elsewhere.
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(writer, SHUTDOWN_WRITE_GRACE)

    def receive(self, raw: bytes) -> bool:
        """One request, decoded and applied; True when the stream reads no more
        (shutting down, and the client has answered everything). A request that
        breaks the protocol raises StreamError to the handler's task, or, on a
        detached stream, ends it here."""
        stream = self.stream
        known = self._acks.get(raw)  # a request seen before, as ack_key has it
        if known is not None and stream.take_ack(known):
            return self._ending and not stream.awaiting_answer()
        try:
            req = decode(self._message, raw, self.service.metrics)
            stream.handle(req)
        except StreamError as e:
            if not self._detached:
                raise
            log.info("xds stream refused", node=stream.node_id, peer=stream.peer,
                     reason=str(e))
            self._end_detached(*status_of(e))
            return True
        if known is None and len(raw) <= MAX_ACK_BYTES:
            key = stream.ack_key(req)
            if key is not None:
                if len(self._acks) >= MAX_ACKS_KEPT:
                    self._acks.clear()
                self._acks[raw] = key
        return self._ending and not stream.awaiting_answer()

    # A detached stream's requests come in the server's callback (one call less per
    # ACK than a method around `receive`).
    __call__ = receive

    async def _flush(self, due: list[bytes] | None = None) -> None:
        """Write what is due (`due`, then whatever is) until nothing is; responses are
        computed now, from the current state, so changes that came meanwhile are
        coalesced, never queued."""
        loop = asyncio.get_running_loop()
        context = self._context
        try:
            while True:
                self._scheduled = False
                responses, due = (due if due is not None else self.stream.take_responses()), None
                while responses and not self._ending:
                    self.write_started = loop.time()
                    await context.write(responses.pop(0))
                    self.write_started = None
                if not self._scheduled or self._ending:
                    return
        except asyncio.CancelledError:
            raise
        except Exception as e:  # the call is broken: end the reader too
            log.debug("xds stream write failed", peer=self.stream.peer, error=repr(e))
            self._break()
        finally:
            self._writer = None
