"""The Linkerd destination service (`io.linkerd.proxy.destination.Destination`) on the
shared gRPC port: Get and GetProfile, wire-compatible with linkerd2-proxy-api v0.20.

This module is the protocol layer's front door: it reads requests, turns a bad one
into a gRPC status (the one place that does, `STATUS_OF`), logs it once with the
peer, and runs each stream's writer. What to send comes from `endpoint_streams` and
`profile_streams`; how it is encoded from `translate` and `profiles`.

Responses are written as pre-encoded bytes (the method handlers have no serializer):
a View change is serialized once, then the same bytes go to every stream.

The layer is given a `meshbridge.host.Host`, never the App: `register(host, server)`
reads its `LinkerdOptions` from the host, keeps its service there as "linkerd"
(`app.service("linkerd")`) and hangs its stop hook and renderer on it.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
import prometheus_client
import structlog

from bridge.authority import AuthorityError, view_authority
from bridge.model import FilterKey, ServiceKey, ViewKey
from bridge.multicluster.views import MissingRemoteService
from bridge.multicluster.views import UnknownCluster as UnknownClusterError
from bridge.views import InvalidService, View, ViewSubscriber
from linkerd_api.authority import (
    ContextToken,
    parse_context_token,
    parse_service_name,
    split_host_port,
)
from linkerd_api.endpoint_streams import SEMANTICS, EndpointStream, Semantics, UpdateEncoder
from linkerd_api.errors import (
    AmbiguousAddress,
    BadRequest,
    DestinationError,
    NoSuchWorkload,
    NotRemoteDiscoverable,
    UnknownCluster,
    UnknownService,
)
from linkerd_api.get_feeds import GetFeeds, MirroredGet
from linkerd_api.profile_streams import (
    EndpointProfileKey,
    ProfileKey,
    ProfileRegistry,
    ProfileStream,
    ServiceProfileKey,
    instance_ip,
    profile_name,
)
from linkerd_api.proto import destination_pb2 as dst
from linkerd_api.queue import UpdateQueue
from linkerd_api.render import to_dict
from linkerd_api.translate import Translator, address_text, ready_endpoints, set_labels
from linkerd_api.writer import DestinationWriter, decode_request, endpoint_overflow_counter
from meshbridge.host import FeedHub, GrpcServer, Host, Layer, WorkerHost

log = structlog.get_logger("meshbridge.linkerd")

SERVICE_NAME = "io.linkerd.proxy.destination.Destination"
DEFAULT_STREAM_QUEUE_CAPACITY = 100  # Linkerd's default (§3.1)

# The one place a refusal becomes a status: the domain code raises errors and knows no gRPC.
STATUS_OF: dict[type[DestinationError], grpc.StatusCode] = {
    BadRequest: grpc.StatusCode.INVALID_ARGUMENT,
    UnknownService: grpc.StatusCode.NOT_FOUND,
    NoSuchWorkload: grpc.StatusCode.NOT_FOUND,
    AmbiguousAddress: grpc.StatusCode.FAILED_PRECONDITION,
    NotRemoteDiscoverable: grpc.StatusCode.FAILED_PRECONDITION,
    UnknownCluster: grpc.StatusCode.NOT_FOUND,
}

# A real linkerd2-proxy retries a refused Get with backoff for as long as its balancer
# lives, so a NOT_FOUND is logged once per target per window; every refusal is still
# counted in meshbridge_destination_requests_refused_total{code="NOT_FOUND"}.
NOT_FOUND_LOG_WINDOW = 60.0


@dataclass(frozen=True, slots=True)
class LinkerdOptions:
    """The layer's options (`--destination-semantics`, `--stream-queue-capacity`)."""

    semantics: Semantics = "proto"
    stream_queue_capacity: int = DEFAULT_STREAM_QUEUE_CAPACITY

    def __post_init__(self) -> None:
        if self.semantics not in SEMANTICS:
            raise ValueError(f"destination semantics {self.semantics!r}: expected one of "
                             f"{', '.join(SEMANTICS)}")
        capacity: object = self.stream_queue_capacity
        # bool is an int to Python, and "9" may come from an untyped caller.
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 1:
            raise ValueError(f"stream queue capacity {capacity!r}: must be at least 1")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Linkerd destination API")
    group.add_argument(
        "--destination-semantics", choices=SEMANTICS, default="proto",
        help="proto (default): the API's contract, no_endpoints{exists} for missing or "
             "empty services; linkerd-2.20: Linkerd 2.20's controller, NOT_FOUND for a "
             "missing service and silence for an empty one")
    group.add_argument(
        "--stream-queue-capacity", type=_positive_int, default=DEFAULT_STREAM_QUEUE_CAPACITY,
        help="updates a stream may have waiting; a stream whose queue overflows is ended "
             "(status OK) and counted in endpoint_updates_queue_overflow")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def options_from_args(args: argparse.Namespace) -> LinkerdOptions:
    """The layer's options from its flags (see `add_arguments`)."""
    return LinkerdOptions(args.destination_semantics, args.stream_queue_capacity)


def register(host: Host, server: GrpcServer) -> None:
    """Mount the destination service on the host's gRPC server."""
    options = host.options_for(LinkerdOptions)
    if options.semantics == "linkerd-2.20" and host.views.store is not None:
        # Linkerd 2.20 leaves an unlinked cluster's endpoints on open streams.
        host.views.store.keep_on_unlink = True
    service = DestinationService(host, options)
    server.add_generic_rpc_handlers((service.handler(),))
    host.on_stop(service.stop)
    host.add_renderer("linkerd", service.render_view)
    host.keep("linkerd", service)


def register_feeds(host: Host, hub: FeedHub) -> None:
    """The watcher's side of Get over workers (linkerd_api.get_feeds)."""
    hub.on_link(GetFeeds(host.service("linkerd")).attach)


def register_worker(host: WorkerHost, server: GrpcServer) -> None:
    """A worker's side: Get from the watcher's feeds (GetProfile is relayed whole)."""
    get = MirroredGet(host, host.options_for(LinkerdOptions).stream_queue_capacity)
    server.add_generic_rpc_handlers((get.handler(),))
    host.on_stop(get.stop)
    host.keep("linkerd", get)


LAYER = Layer("linkerd_api.service", register, (LinkerdOptions,),
              feeds=register_feeds, worker=register_worker)


class DestinationService:
    def __init__(self, host: Host, options: LinkerdOptions) -> None:
        self.host = host
        self.cluster = host.cluster
        self.config = host.config
        self.semantics: Semantics = options.semantics
        self.capacity = options.stream_queue_capacity
        self.translator = Translator(host.config)
        self.encoder = UpdateEncoder(self.translator, self.semantics, host.views)
        self.profiles = ProfileRegistry(host.cluster, host.config, self.translator,
                                        self.semantics)
        self.writer = DestinationWriter(host.metrics, host.streams)
        self.streams: set[UpdateQueue] = self.writer.live
        self.not_found_log = RepeatLog(NOT_FOUND_LOG_WINDOW)
        registry = host.metrics
        self.endpoint_overflows = endpoint_overflow_counter(registry)
        self.profile_overflows = prometheus_client.Counter(
            "profile_updates_queue_overflow",
            "GetProfile (service) streams ended because their queue was full",
            ["fqn", "port"], registry=registry)
        self.endpoint_profile_overflows = prometheus_client.Counter(
            "endpoint_profile_updates_queue_overflow",
            "GetProfile (endpoint) streams ended because their queue was full",
            registry=registry)
        self.refused_total = prometheus_client.Counter(
            "meshbridge_destination_requests_refused",
            "Destination API requests refused, by status",
            ["method", "code"], registry=registry)

    def handler(self) -> grpc.GenericRpcHandler:
        # No (de)serializers: requests arrive as bytes, so that an undecodable one gets
        # a precise status, and responses are written as the bytes encoded once per
        # change (gRPC passes bytes through when there is no serializer).
        return grpc.method_handlers_generic_handler(SERVICE_NAME, {
            "Get": grpc.unary_stream_rpc_method_handler(self.get),
            "GetProfile": grpc.unary_stream_rpc_method_handler(self.get_profile),
        })

    def stop(self) -> None:
        """End every stream with status OK; proxies reconnect elsewhere. The profile
        registry stops listening to the cluster."""
        self.writer.stop()
        self.profiles.close()

    # ------------------------------------------------------------------ Get

    async def get(self, raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        peer = context.peer()
        path = ""
        try:
            request = decode_request(raw)
            path = request.path
            key, label = self.open_get(request, peer)
            stream = EndpointStream(self.capacity, self.encoder, key, label, peer,
                                    self._endpoint_overflow)
            view = self.subscribe_get(key, stream, path)
            stream.ends_with_service = self.ends_with_service(view)
        except DestinationError as e:
            await context.abort(*self.refused("Get", peer, path, e))
            return
        try:
            for message in self.encoder.snapshot(view):
                stream.push(message)
            await self.writer.pump("Get", stream, stream.label, request, context)
        finally:
            self.host.views.unsubscribe(key, stream)

    def open_get(self, request: dst.GetDestination, peer: str) -> tuple[ViewKey, str]:
        """A Get's View key and the `service` label of its metrics, or the
        DestinationError that refuses it (§2.4)."""
        token = self._token(request, peer, "Get")
        key = self._endpoint_key(request.path, token, peer)
        return key, view_authority(key, self.config.cluster_domain)

    def subscribe_get(self, key: ViewKey, subscriber: ViewSubscriber, path: str) -> View:
        """Join the View a Get streams from, or the DestinationError that refuses it:
        a remote-discovery target's refusals first (Linkerd §2.4), BadRequest for a
        service that cannot be watched (ExternalName)."""
        try:
            self.host.views.check(key)
            return self.host.views.subscribe(key, subscriber, "linkerd")
        except InvalidService as e:
            raise BadRequest(f"Invalid authority: {path}: {e}") from None
        except MissingRemoteService as e:
            raise NotRemoteDiscoverable(str(e)) from None
        except UnknownClusterError as e:
            raise UnknownCluster(str(e)) from None

    def ends_with_service(self, view: View) -> bool:
        """A federated Service that goes ends its streams (Linkerd §2.4)."""
        merged = self.host.views.merged_port(view)
        return merged is not None and merged.kind == "federated"

    def _endpoint_key(self, path: str, token: ContextToken, peer: str) -> ViewKey:
        """Get's request checks, in Linkerd's order (§2.4)."""
        try:
            hp = split_host_port(path)
        except AuthorityError as e:
            raise BadRequest(f"Invalid authority: {path}: {e}") from None
        if hp.ip is not None:
            raise BadRequest(f"IP queries not supported by Get API: host={hp.host}")
        try:
            name = parse_service_name(hp.host, self.config.cluster_domain)
        except AuthorityError as e:
            raise BadRequest(f"Invalid authority: {path}: {e}") from None
        svc = self.cluster.services.get(name.service)
        if svc is None and self.semantics == "linkerd-2.20":
            raise UnknownService(
                f"Service {name.service.name}.{name.service.namespace} not found")
        self._note_undeclared_port("Get", name.service, hp.port, peer)
        return ViewKey(name.service, hp.port,
                       FilterKey(node_name=token.node_name, hostname=name.instance))

    def _endpoint_overflow(self, stream: EndpointStream) -> None:
        self.endpoint_overflows.labels(stream.label).inc()
        log.warning("endpoint update queue full; ending stream", peer=stream.peer,
                    namespace=stream.key.service.namespace, service=stream.key.service.name,
                    port=stream.key.port, capacity=self.capacity)
        self.host.views.unsubscribe(stream.key, stream)

    # ------------------------------------------------------------------ GetProfile

    async def get_profile(self, raw: bytes,
                          context: grpc.aio.ServicerContext[Any, Any]) -> None:
        peer = context.peer()
        path = ""
        try:
            request = decode_request(raw)
            path = request.path
            token = self._token(request, peer, "GetProfile")
            key = self._profile_key(path, token, peer)
            stream = ProfileStream(self.capacity, key, peer, self._profile_overflow)
            self.profiles.subscribe(stream)
        except DestinationError as e:
            await context.abort(*self.refused("GetProfile", peer, path, e))
            return
        try:
            await self.writer.pump("GetProfile", stream, _target(key), request, context)
        finally:
            self.profiles.unsubscribe(stream)

    def _profile_key(self, path: str, token: ContextToken, peer: str) -> ProfileKey:
        """GetProfile's request checks and lookups, in Linkerd's order (§2.6)."""
        try:
            hp = split_host_port(path)
        except AuthorityError as e:
            raise BadRequest(f'invalid authority: "{path}": "{e}"') from None
        ip = hp.ip
        if ip is not None:
            services = self.cluster.services_with_cluster_ip(ip)
            if len(services) > 1:
                raise AmbiguousAddress(
                    f"found {len(services)} services with conflicting cluster IP {ip}")
            if services:
                svc = ServiceKey(services[0].meta.namespace, services[0].meta.name)
                fqn = profile_name(svc, self.config.cluster_domain)
                return ServiceProfileKey(svc, fqn, hp.port, token.ns)
            return EndpointProfileKey(ip, hp.port)
        try:
            name = parse_service_name(hp.host, self.config.cluster_domain)
        except AuthorityError as e:
            raise BadRequest(f'invalid service "{hp.host}": "{e}"') from None
        if name.instance:
            return EndpointProfileKey(instance_ip(self.cluster, name.service, name.instance),
                                      hp.port)
        svc_obj = self.cluster.services.get(name.service)
        if svc_obj is not None and svc_obj.type == "ExternalName":
            raise BadRequest(f"Invalid authority: {path}: {name.service} is an ExternalName "
                             "service")
        self._note_undeclared_port("GetProfile", name.service, hp.port, peer)
        return ServiceProfileKey(name.service, hp.host, hp.port, token.ns)

    def _profile_overflow(self, stream: ProfileStream) -> None:
        key = stream.key
        if isinstance(key, ServiceProfileKey):
            self.profile_overflows.labels(key.fqn, str(key.port)).inc()
        else:
            self.endpoint_profile_overflows.inc()
        log.warning("profile update queue full; ending stream", peer=stream.peer,
                    target=_target(key), capacity=self.capacity)
        self.profiles.unsubscribe(stream)

    # ------------------------------------------------------------------ debug

    def render_view(self, view: View) -> tuple[dict[str, dict[str, Any]], Any]:
        """The View as a new Get stream would be told it, for /debug/endpoints: the
        endpoints Linkerd announces (the ready ones) by "ip:port", and the first
        messages of a stream as JSON."""
        endpoints: dict[str, dict[str, Any]] = {}
        for r in ready_endpoints(view.snapshot):
            ep = r.endpoint
            wa = self.translator.weighted_addr(r)
            hint = wa.protocol_hint.WhichOneof("protocol") if wa.HasField("protocol_hint") \
                else None
            endpoints[address_text(wa.addr)] = {
                "weight": wa.weight, "identity": wa.tls_identity.dns_like_identity.name,
                "hint": hint or "", "zone": ep.zone or "", "zone_locality": r.zone_locality,
            }
        # Encoded afresh and kept nowhere: a debug read changes nothing a stream sees.
        def labels(member_cluster: str) -> dict[str, str]:
            return set_labels(*self.encoder.labels_source(view, member_cluster))

        messages = [to_dict(dst.Update.FromString(m))
                    for m in self.encoder.snapshot_messages(view, labels)]
        return endpoints, {"version": view.version, "semantics": self.semantics,
                           "messages": messages}

    # ------------------------------------------------------------------ shared

    def _token(self, request: dst.GetDestination, peer: str, method: str) -> ContextToken:
        token = parse_context_token(request.context_token)
        if token.form == "invalid":
            # Not an error (§2.2): the stream is served with no client context.
            log.warning("context token not understood; serving without it", method=method,
                        peer=peer, authority=request.path,
                        token=request.context_token[:200])
        elif token.form == "legacy":
            log.info("legacy context token", method=method, peer=peer,
                     authority=request.path, ns=token.ns)
        return token

    def _note_undeclared_port(self, method: str, service: ServiceKey, port: int,
                              peer: str) -> None:
        svc = self.cluster.services.get(service)
        if svc is not None and svc.type != "ExternalName" and svc.port(port) is None:
            # Served anyway, with the port itself as the target port (§4.3).
            log.info("port not declared by the service; using it as the target port",
                     method=method, peer=peer, namespace=service.namespace,
                     service=service.name, port=port)

    def refused(self, method: str, peer: str, path: str, error: DestinationError
                ) -> tuple[grpc.StatusCode, str]:
        """The status a refusal ends its call with, counted and logged (a NOT_FOUND
        once per target per window: proxies retry it for as long as they want it)."""
        code = STATUS_OF[type(error)]
        self.refused_total.labels(method, code.name).inc()
        fields: dict[str, object] = {}
        if code is grpc.StatusCode.NOT_FOUND:
            # Proxies retry a missing target for as long as they want it: say so once
            # per window, with how many repeats went unlogged since the last line.
            repeats = self.not_found_log.admit((method, path[:300]))
            if repeats is None:
                return code, str(error)
            fields["unlogged_repeats"] = repeats
        log.warning("destination request refused", method=method, peer=peer,
                    authority=path[:300], code=code.name, reason=str(error), **fields)
        return code, str(error)


class RepeatLog:
    """Which repeated events to log: the first of a key, then one per `window` seconds.

    Bounded: past `max_keys` keys still inside their window, a new key is logged but
    not remembered (each line is still one request, as without this filter).
    """

    __slots__ = ("clock", "max_keys", "seen", "window")

    def __init__(self, window: float, max_keys: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window = window
        self.max_keys = max_keys
        self.clock = clock
        # key -> (when it was last logged, repeats not logged since)
        self.seen: dict[object, tuple[float, int]] = {}

    def admit(self, key: object) -> int | None:
        """None: do not log this one. Otherwise log it, and the int is how many
        repeats of `key` were not logged since its last line."""
        now = self.clock()
        last = self.seen.get(key)
        if last is not None and now - last[0] < self.window:
            self.seen[key] = (last[0], last[1] + 1)
            return None
        if last is None and len(self.seen) >= self.max_keys:
            self._forget_older_than(now - self.window)
            if len(self.seen) >= self.max_keys:
                return 0
        self.seen[key] = (now, 0)
        return 0 if last is None else last[1]

    def _forget_older_than(self, cutoff: float) -> None:
        for key in [k for k, (at, _) in self.seen.items() if at <= cutoff]:
            del self.seen[key]


def _target(key: ProfileKey) -> str:
    if isinstance(key, ServiceProfileKey):
        return f"{key.fqn}:{key.port}"
    return f"[{key.ip}]:{key.port}" if ":" in key.ip else f"{key.ip}:{key.port}"


