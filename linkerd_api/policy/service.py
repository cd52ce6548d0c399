"""The Linkerd policy services on the shared gRPC port: OutboundPolicies (Get, Watch)
and InboundServerPolicies (GetPort, WatchPort), wire-compatible with
linkerd2-proxy-api v0.20 (§12).

A Watch stream holds the policy it last sent; every Cluster batch that may change
it recomputes it, and a policy whose bytes differ is sent on the same stream. Only
the newest policy matters to a proxy, so a stream keeps one pending message, never a
queue: a slow reader cannot make the process hold more than one policy per stream.

The layer is given a `meshbridge.host.Host`; it keeps its service there as "policy".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import prometheus_client
import structlog
from google.protobuf.message import DecodeError, Message

from bridge.cluster import ClusterChange, ListenerStage
from bridge.model import ServiceKey
from bridge.policy_objects import AUTH_KINDS, ROUTE_KINDS
from bridge.routes.index import PortKey, route_index
from bridge.routes.text import RouteRow
from linkerd_api.policy import inbound, outbound
from linkerd_api.policy.outbound import DEFAULT_CLUSTER_NETWORKS, Network, UnknownTarget
from linkerd_api.policy.text import policy_rows
from linkerd_api.policy.workload import BadWorkload, Workload, parse_workload
from linkerd_api.proto import inbound_pb2 as ib
from linkerd_api.proto import outbound_pb2 as ob
from linkerd_api.service import LinkerdOptions
from meshbridge.host import (
    GrpcServer,
    Host,
    Layer,
    NowaitWriter,
    Sender,
    StreamInfo,
    nowait_writer,
    sender,
)

log = structlog.get_logger("meshbridge.linkerd.policy")

DEFAULT_PROBE_NETWORKS = ("0.0.0.0/0", "::/0")  # Linkerd's Helm value

OUTBOUND_SERVICE = "io.linkerd.proxy.outbound.OutboundPolicies"
INBOUND_SERVICE = "io.linkerd.proxy.inbound.InboundServerPolicies"

# The protocol a Watch is listed under on /debug/streams.
STREAM_PROTOCOLS = {"Watch": "linkerd-outbound-policy", "WatchPort": "linkerd-inbound-policy"}
# What an outbound stream asked, as plain values: the target Service's namespace and
# name, the port, whether the Service declares it, and the client's namespace.
RequestKey = tuple[str, str, int, bool, str]
MAX_REQUEST_KEYS = 100_000


class BadPolicyRequest(ValueError):
    """INVALID_ARGUMENT, with this message."""


@dataclass(frozen=True, slots=True)
class PolicyOptions:
    """`--default-inbound-policy`, `--cluster-networks` and `--probe-networks`, named
    after Linkerd's flags (the probe networks default to Helm's value)."""

    default_inbound_policy: str = "all-unauthenticated"
    cluster_networks: tuple[str, ...] = DEFAULT_CLUSTER_NETWORKS
    probe_networks: tuple[str, ...] = DEFAULT_PROBE_NETWORKS
    networks: tuple[Network, ...] = field(init=False, default=(), compare=False)
    probes: tuple[Network, ...] = field(init=False, default=(), compare=False)

    def __post_init__(self) -> None:
        if self.default_inbound_policy not in inbound.DEFAULT_POLICIES:
            raise ValueError(f"default inbound policy {self.default_inbound_policy!r}: "
                             f"expected one of {', '.join(inbound.DEFAULT_POLICIES)}")
        for attr, given in (("networks", self.cluster_networks),
                            ("probes", self.probe_networks)):
            try:
                nets = tuple(ipaddress.ip_network(n, strict=False) for n in given)
            except ValueError as e:
                raise ValueError(f"{attr}: {e}") from None
            object.__setattr__(self, attr, nets)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("Linkerd policy API")
    group.add_argument(
        "--default-inbound-policy", choices=inbound.DEFAULT_POLICIES,
        default="all-unauthenticated",
        help="who may connect to a workload port no Server selects (Linkerd's "
             "--default-policy); the config.linkerd.io/default-inbound-policy annotation "
             "of a pod or its namespace overrides it")
    group.add_argument(
        "--cluster-networks", type=_networks, default=DEFAULT_CLUSTER_NETWORKS,
        help="comma-separated CIDRs of the cluster's pods and services: an address in them "
             "that is no Service gets NOT_FOUND from OutboundPolicies, any other the "
             "egress fallback (default: %(default)s)")
    group.add_argument(
        "--probe-networks", type=_networks_or_none, default=DEFAULT_PROBE_NETWORKS,
        help="comma-separated CIDRs kubelet probes come from: a pod's httpGet probe paths "
             "are authorized from them on every port without a route of its own "
             "(default: %(default)s, as Linkerd's Helm chart; 'none' for no probe route)")


def _networks(text: str) -> tuple[str, ...]:
    items = tuple(t.strip() for t in text.split(",") if t.strip())
    for item in items:
        try:
            ipaddress.ip_network(item, strict=False)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is not a CIDR") from None
    if not items:
        raise argparse.ArgumentTypeError("no networks given")
    return items


def _networks_or_none(text: str) -> tuple[str, ...]:
    return () if text.strip() == "none" else _networks(text)


def options_from_args(args: argparse.Namespace) -> PolicyOptions:
    return PolicyOptions(args.default_inbound_policy, tuple(args.cluster_networks),
                         tuple(args.probe_networks))


def register(host: Host, server: GrpcServer) -> None:
    service = PolicyService(host, host.options_for(PolicyOptions),
                            host.options_for(LinkerdOptions).semantics)
    server.add_generic_rpc_handlers(service.handlers())
    host.on_stop(service.stop)
    host.keep("policy", service)
    host.add_route_renderer("linkerd", service.render_routes)


# The destination semantics (--destination-semantics) shape its answers too.
LAYER = Layer("linkerd_api.policy.service", register, (PolicyOptions, LinkerdOptions))


class PolicyStream:
    """One Watch/WatchPort stream: how to compute its policy, and the newest one not
    yet written. A new policy is written at once, without waking the stream's task,
    when the server can take it now (meshbridge.host.nowait_writer) and nothing is in
    flight."""

    __slots__ = ("compute", "ended", "last", "on_sent", "pending", "send_now", "wake",
                 "wants", "write_now", "writing")

    def __init__(self, compute: Callable[[], bytes],
                 wants: Callable[[ClusterChange], bool]) -> None:
        self.compute = compute
        self.wants = wants
        self.last: bytes | None = None
        self.pending: bytes | None = None
        self.ended = False
        self.wake = asyncio.Event()
        self.write_now: NowaitWriter = nowait_writer(None)
        self.send_now: Sender = sender(None)
        self.on_sent: Callable[[bytes], None] = lambda _message: None
        self.writing = False  # the task is awaiting a write: keep the order

    def refresh(self) -> bool:
        """Compute the policy again; True if a new one was written now."""
        try:
            message = self.compute()
        except UnknownTarget:
            return False  # the target went away: keep the last policy, as Linkerd's does
        if message == self.last:
            return False
        self.last = message
        if self.pending is None and not self.writing and self.write_now(message):
            self.on_sent(message)
            return True
        self.pending = message
        self.wake.set()
        return False

    def end(self) -> None:
        self.ended = True
        self.wake.set()

    async def next(self) -> bytes | None:
        while self.pending is None and not self.ended:
            self.wake.clear()
            await self.wake.wait()
        if self.ended:
            return None
        message, self.pending = self.pending, None
        return message


class PolicyService:
    def __init__(self, host: Host, options: PolicyOptions, semantics: str = "proto") -> None:
        self.host = host
        self.cluster = host.cluster
        self.config = host.config
        self.options = options
        self.semantics = semantics
        self.routes = route_index(host.cluster)
        # One encoding per (target, client namespace) per cluster change, whatever the
        # number of streams watching it; emptied when the cluster changes, or, for a
        # change of routes alone, only for the ports whose tables it changed.
        self._encoded: dict[tuple[outbound.ServiceTarget, str], bytes] = {}
        # The same policies by what a stream asked (target and client namespace, as
        # plain values): one look-up per stream when a change fans out to thousands.
        # Emptied whenever `_encoded` loses anything, and when it grows past a bound
        # (the client namespace is the client's to say).
        self._by_request: dict[RequestKey, bytes] = {}
        # The ports the route index recomputed during the change being applied (the
        # index hears of a change at an earlier stage than this service, Routes §4),
        # and the ports whose watchers look at that change (None: every port's).
        self._route_ports: set[PortKey] = set()
        self._scope: set[PortKey] | None = None
        self.routes.add_listener(self._route_ports.update)
        self.encodings = 0  # policies encoded (tests and benchmarks read it)
        self.settings = inbound.InboundSettings(options.default_inbound_policy,
                                                options.networks, options.probes)
        self.streams: set[PolicyStream] = set()
        self.stopping = False
        self.noted: set[tuple[str, ...]] = set()  # problems already logged once
        self.open_streams = prometheus_client.Gauge(
            "meshbridge_policy_streams", "Open Linkerd policy API streams", ["method"],
            registry=host.metrics)
        self.refused = prometheus_client.Counter(
            "meshbridge_policy_requests_refused",
            "Linkerd policy API requests refused, by status",
            ["method", "code"], registry=host.metrics)
        host.cluster.add_listener(self._on_change, ListenerStage.RESOURCES)

    def handlers(self) -> tuple[grpc.GenericRpcHandler, ...]:
        # Bytes in and out, as the destination service: an undecodable request gets a
        # precise status, and a policy is encoded once per change.
        return (
            grpc.method_handlers_generic_handler(OUTBOUND_SERVICE, {
                "Get": grpc.unary_unary_rpc_method_handler(self.get),
                "Watch": grpc.unary_stream_rpc_method_handler(self.watch),
            }),
            grpc.method_handlers_generic_handler(INBOUND_SERVICE, {
                "GetPort": grpc.unary_unary_rpc_method_handler(self.get_port),
                "WatchPort": grpc.unary_stream_rpc_method_handler(self.watch_port),
            }),
        )

    def stop(self) -> None:
        self.stopping = True
        for stream in list(self.streams):
            stream.end()
        with contextlib.suppress(ValueError):  # stopped twice
            self.cluster.remove_listener(self._on_change)
            self.routes.remove_listener(self._route_ports.update)

    def _on_change(self, change: ClusterChange) -> None:
        ports = set(self._route_ports)
        self._route_ports.clear()
        if _outbound_change(change):
            self._by_request.clear()
        if _routes_only(change):
            # Routes §4: a route edit changes the policies of the ports it attaches
            # to (their tables), nothing else: only those are encoded again, and
            # only their watchers look.
            self._scope = ports
            for key in [k for k in self._encoded if (k[0].service, k[0].port) in ports]:
                del self._encoded[key]
        else:
            self._scope = None
            if _outbound_change(change):
                self._encoded.clear()
        written = []
        for stream in list(self.streams):
            if not stream.wants(change):
                continue
            try:
                if stream.refresh():
                    written.append(stream)
            except Exception:  # a bug here must not stop the source applying changes
                log.exception("policy recomputation failed; the stream keeps its last policy")
        # Out now, not after the rest of this loop turn (the xDS streams' writes of the
        # same change, say): one write per connection either way.
        for stream in written:
            stream.send_now()

    # ------------------------------------------------------------------ outbound

    def _outbound(self, raw: bytes) -> tuple[Callable[[], bytes], Callable[[ClusterChange], bool]]:
        """How to compute the policy a TrafficSpec asks for, and which changes may
        change it. Raises BadPolicyRequest or UnknownTarget."""
        spec = _decode(ob.TrafficSpec, raw, "TrafficSpec")
        target_kind = spec.WhichOneof("target")
        if target_kind is None:
            raise BadPolicyRequest("target is required")
        source = _workload(spec.source_workload)
        target: outbound.ServiceTarget | outbound.EgressTarget
        if target_kind == "authority":
            try:
                target = outbound.lookup_authority(self.cluster, spec.authority,
                                                   self.config.cluster_domain)
            except UnknownTarget:
                raise
            except ValueError as e:
                raise BadPolicyRequest(str(e)) from None
        else:
            addr = spec.addr
            if not 1 <= addr.port <= 65535:
                raise BadPolicyRequest("port outside valid range" if addr.port
                                       else "port cannot be zero")
            try:
                ip = outbound.address_of(addr)
            except ValueError as e:
                raise BadPolicyRequest(f"failed to parse target addr: {e}") from None
            target = outbound.lookup_addr(self.cluster, ip, addr.port, self.options.networks)
        if isinstance(target, outbound.EgressTarget):
            message = outbound.egress_fallback(target.ip, target.port).SerializeToString()
            return (lambda: message), (lambda change: False)
        service_target = target
        client_ns = source.namespace

        request_key = (service_target.service.namespace, service_target.service.name,
                       service_target.port, service_target.declared, client_ns)

        def compute() -> bytes:
            encoded = self._by_request.get(request_key)
            if encoded is None:
                encoded = self._service_policy(service_target, client_ns)
                if len(self._by_request) >= MAX_REQUEST_KEYS:
                    self._by_request.clear()
                self._by_request[request_key] = encoded
            return encoded

        port_key = (service_target.service, service_target.port)

        def wants(change: ClusterChange) -> bool:
            scope = self._scope
            return _outbound_change(change) and (scope is None or port_key in scope)

        compute()  # a Service that vanished between lookup and now is still served
        return compute, wants

    def render_routes(self, service: ServiceKey, port: int,
                      client_ns: str) -> tuple[list[RouteRow], list[str]]:
        """The port's policy as a proxy in `client_ns` is told it, as route-table rows,
        and what it is not told (for /debug/endpoints)."""
        svc = self.cluster.services.get(service)
        if svc is None:
            return [], []
        target = outbound.ServiceTarget(service, port, svc.port(port) is not None)
        # Built afresh and kept nowhere: a debug read encodes and counts nothing.
        policy = outbound.service_policy(self.cluster, self.config, target,
                                         self.routes.port(service, port), client_ns,
                                         self.semantics)
        _, rows = policy_rows(policy)
        return rows, outbound.left_out(self.routes.port(service, port), client_ns,
                                       self.semantics)

    def _service_policy(self, target: outbound.ServiceTarget, client_ns: str) -> bytes:
        """The encoded policy, shared by every stream of the same target whose client
        namespace reads the same route table (Routes §1.2)."""
        routes = self.routes.port(target.service, target.port)
        group = "" if routes is None else routes.group_of(
            client_ns, profiles=self.semantics != outbound.LINKERD_2_20)
        memo_key = (target, group)
        encoded = self._encoded.get(memo_key)
        if encoded is None:
            encoded = outbound.service_policy(self.cluster, self.config, target, routes,
                                              client_ns, self.semantics).SerializeToString()
            self._encoded[memo_key] = encoded
            self.encodings += 1
        return encoded

    async def get(self, raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        try:
            compute, _ = self._outbound(raw)
            return compute()
        except (BadPolicyRequest, UnknownTarget) as e:
            await self._refuse(context, "Get", e)
            raise AssertionError("unreachable") from None

    async def watch(self, raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        try:
            compute, wants = self._outbound(raw)
        except (BadPolicyRequest, UnknownTarget) as e:
            await self._refuse(context, "Watch", e)
            return
        spec = ob.TrafficSpec.FromString(raw)  # decoded once already: it is valid
        target = (spec.authority if spec.WhichOneof("target") == "authority"
                  else _addr_text(spec.addr))
        await self._pump("Watch", PolicyStream(compute, wants), context, target,
                         spec.source_workload)

    # ------------------------------------------------------------------ inbound

    def _inbound(self, raw: bytes) -> tuple[Callable[[], bytes], Callable[[ClusterChange], bool]]:
        spec = _decode(ib.PortSpec, raw, "PortSpec")
        workload = _workload(spec.workload)
        if not 1 <= spec.port <= 65535:
            raise BadPolicyRequest(f"Invalid port: {spec.port}")
        port = spec.port

        def compute() -> bytes:
            return inbound.server_policy(self.cluster, self.config, self.settings, workload,
                                         port, self._unusable).SerializeToString()

        def wants(change: ClusterChange) -> bool:
            return bool(change.all_services or change.kinds & AUTH_KINDS
                        or (workload.namespace, workload.name) in change.pods
                        or workload.namespace in change.namespaces)

        compute()  # raises UnknownTarget for a workload we do not know
        return compute, wants

    def _unusable(self, kind: str, name: str, why: str) -> None:
        key = ("unusable", kind, name, why)
        if key not in self.noted:
            self.noted.add(key)
            log.warning("authorization left out", kind=kind, object=name, reason=why)

    async def get_port(self, raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        try:
            compute, _ = self._inbound(raw)
            return compute()
        except (BadPolicyRequest, UnknownTarget) as e:
            await self._refuse(context, "GetPort", e)
            raise AssertionError("unreachable") from None

    async def watch_port(self, raw: bytes,
                         context: grpc.aio.ServicerContext[Any, Any]) -> None:
        try:
            compute, wants = self._inbound(raw)
        except (BadPolicyRequest, UnknownTarget) as e:
            await self._refuse(context, "WatchPort", e)
            return
        spec = ib.PortSpec.FromString(raw)
        await self._pump("WatchPort", PolicyStream(compute, wants), context,
                         f"port {spec.port}", spec.workload)

    # ------------------------------------------------------------------ shared

    async def _pump(self, method: str, stream: PolicyStream,
                    context: grpc.aio.ServicerContext[Any, Any], target: str,
                    workload: str) -> None:
        if self.stopping:
            return
        stream.refresh()
        self.streams.add(stream)
        # Listed on /debug/streams with the destination streams, so that an operator
        # sees a proxy's policy watches next to the Get they lead to.
        info = self.host.streams.add(StreamInfo(
            STREAM_PROTOCOLS[method], context.peer(), client=workload.strip()[:500]))
        info.state(target).subscribed = (target,)
        gauge = self.open_streams.labels(method)
        gauge.inc()
        sent = 0

        def on_sent(message: bytes) -> None:
            nonlocal sent
            sent += 1
            info.sent(target, str(sent), "", len(message))

        stream.on_sent = on_sent
        stream.write_now = nowait_writer(context)
        stream.send_now = sender(context)
        try:
            while (message := await stream.next()) is not None:
                stream.writing = True
                if not stream.write_now(message):
                    await context.write(message)
                stream.writing = False
                on_sent(message)
        finally:
            gauge.dec()
            self.streams.discard(stream)
            self.host.streams.remove(info)

    async def _refuse(self, context: grpc.aio.ServicerContext[Any, Any], method: str,
                      error: Exception) -> None:
        code = (grpc.StatusCode.NOT_FOUND if isinstance(error, UnknownTarget)
                else grpc.StatusCode.INVALID_ARGUMENT)
        self.refused.labels(method, code.name).inc()
        if code is grpc.StatusCode.INVALID_ARGUMENT:
            # A proxy retries NOT_FOUND for as long as it wants the target; only a
            # malformed request is worth a line (it is a bug in the client).
            log.warning("policy request refused", method=method, peer=context.peer(),
                        code=code.name, reason=str(error))
        await context.abort(code, str(error))


def _routes_only(change: ClusterChange) -> bool:
    """Whether the only part of a change an outbound policy reads is its routes: then
    the route index's recomputed ports are the policies it may change."""
    return bool(change.kinds & ROUTE_KINDS) and not (
        change.all_services or change.profiles or change.service_objects
        or change.namespaces)


def _outbound_change(change: ClusterChange) -> bool:
    """Whether a change may change an outbound policy: a route, a ServiceProfile (one
    may route the port, Routes §7.1), or a Service object (its ports and annotations,
    or its coming and going as a route's backend). An endpoint change is not one: a
    policy names its backends, not their endpoints."""
    return bool(change.all_services or change.kinds & ROUTE_KINDS or change.profiles
                or change.service_objects or change.namespaces)


M = TypeVar("M", bound=Message)


def _decode(kind: type[M], raw: bytes, name: str) -> M:
    try:
        return kind.FromString(raw)
    except DecodeError:
        raise BadPolicyRequest(f"request is not a {name} message") from None


def _workload(text: str) -> Workload:
    try:
        return parse_workload(text)
    except BadWorkload as e:
        raise BadPolicyRequest(str(e)) from None



def _addr_text(addr: Any) -> str:
    """A TrafficSpec's address as ip:port, for a page (already parsed by _outbound)."""
    ip = outbound.address_of(addr)
    return f"[{ip}]:{addr.port}" if ":" in ip else f"{ip}:{addr.port}"
