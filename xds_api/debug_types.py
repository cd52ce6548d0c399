"""istiod's debug resource types on the xDS port (§9.2): what `istioctl proxy-status`
and `meshbridge status` ask meshbridge's gRPC port for.

    istio.io/debug/syncz        one envoy.service.status.v3.ClientConfig per client
                                stream: its node, and per xDS type (or Linkerd target)
                                SYNCED / STALE / ERROR / NOT_SENT and when it was last
                                sent; the node metadata also carries the stream's
                                /debug/syncz entry, so `meshbridge status` prints the
                                same table from either port
    istio.io/debug/config_dump  for the one connected proxy whose node id contains the
                                resource name: the clusters, listeners, routes and
                                endpoints it holds, as Envoy's admin config dump
                                sections (what `istioctl proxy-status POD` compares
                                with the proxy's own dump)

Debug answers reveal configuration: they are given only where the admin port's debug
pages would be (`--debug-access`, and a client certificate when `--client-ca` is
set: `meshbridge.debug_access`); elsewhere the stream ends with PERMISSION_DENIED
naming the type. Clients that ask only for debug types (istioctl, `meshbridge
status`) are not proxies and are left out of syncz, as istiod leaves them out.

With `--workers N` a worker holds only its share of the streams: it answers with every
process's (`GatheredDebugTypes`, the watcher adding them up with `merged`;
docs/workers.md).
"""

from __future__ import annotations

import importlib.metadata
import json
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Final, Protocol

from envoy.admin.v3 import config_dump_shared_pb2 as dump_pb2
from envoy.config.core.v3 import base_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.service.status.v3 import csds_pb2
from google.protobuf import any_pb2, json_format, struct_pb2, timestamp_pb2

from meshbridge.host import (
    NACKED,
    NOT_SENT,
    STALE,
    SYNCED,
    DebugAccess,
    StreamInfo,
    StreamRegistry,
)
from xds_api import resource_types as rt
from xds_api.stream import DEBUG_TYPE, DebugReply, Forbidden, XdsStream
from xds_api.subscription import ABSENT, RESEND


class HeldResources(Protocol):
    """Where a config dump finds the resources a stream holds: the resource cache,
    or a worker's mirror of it."""

    def cache_of(self, type_url: str) -> Any: ...


SYNCZ: Final = DEBUG_TYPE + "/syncz"
CONFIG_DUMP: Final = DEBUG_TYPE + "/config_dump"
# The ClientConfig node metadata key that holds the stream's /debug/syncz entry.
SYNCZ_METADATA: Final = "MESHBRIDGE_SYNCZ"
# What a Linkerd stream's "type" is called in syncz: the gRPC method it is a call of.
LINKERD_TYPES: Final = {
    "linkerd-get": "io.linkerd.proxy.destination.Destination/Get",
    "linkerd-profile": "io.linkerd.proxy.destination.Destination/GetProfile",
    "linkerd-outbound-policy": "io.linkerd.proxy.outbound_policy.OutboundPolicies/Watch",
    "linkerd-inbound-policy": "io.linkerd.proxy.inbound.InboundServerPolicies/WatchPort",
}
_STATUS = {SYNCED: csds_pb2.SYNCED, STALE: csds_pb2.STALE, NACKED: csds_pb2.ERROR,
           NOT_SENT: csds_pb2.NOT_SENT}
_CLIENT_STATUS = {SYNCED: csds_pb2.CLIENT_ACKED, NACKED: csds_pb2.CLIENT_NACKED}
_DUMPED = (rt.CLUSTER, rt.LISTENER, rt.ROUTE, rt.ENDPOINT)


def control_plane_id() -> str:
    """The control_plane identifier of debug answers, as istioctl parses istiod's:
    JSON naming the component, this instance and its version."""
    try:
        version = importlib.metadata.version("meshbridge")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        version = "unknown"
    return json.dumps({"Component": "meshbridge", "ID": socket.gethostname(),
                       "Info": {"version": version}}, sort_keys=True)


def _timestamp(at: float) -> timestamp_pb2.Timestamp | None:
    if not at:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(at * 1e9))
    return ts


def _any(message: Any) -> bytes:
    packed = any_pb2.Any()
    packed.Pack(message)
    return bytes(packed.SerializeToString())


class Refusal:
    """Debug answers for a client that may not have them: the stream ends with
    PERMISSION_DENIED saying why (§9.2)."""

    def __init__(self, reason: str, control_plane: str) -> None:
        self.reason = reason
        self.control_plane = control_plane

    def answer(self, stream: XdsStream, type_url: str, names: Sequence[str]) -> DebugReply:
        raise Forbidden(f"{type_url}: {self.reason}")


class DebugTypes:
    """Answers the debug types from the stream registry (every protocol's streams) and
    the xDS streams' own state."""

    def __init__(self, streams: StreamRegistry, xds_streams: Callable[[], Iterable[XdsStream]],
                 cache: HeldResources, *, access: DebugAccess, cluster_id: str) -> None:
        self.streams = streams
        self.xds_streams = xds_streams
        self.cache = cache
        self.access = access
        self.cluster_id = cluster_id
        self.control_plane = control_plane_id()

    def for_client(self, peer: str, certified: bool) -> DebugTypes | Refusal:
        """What a client at `peer` gets when it asks for a debug type."""
        reason = self.access.grpc_refusal(peer, certified)
        return self if reason is None else Refusal(reason, self.control_plane)

    def answer(self, stream: XdsStream, type_url: str, names: Sequence[str]) -> DebugReply:
        return self.reply(type_url, names)

    def reply(self, type_url: str, names: Sequence[str]) -> DebugReply:
        """The answer from this process's streams."""
        if type_url == SYNCZ:
            return self.syncz(), ""
        if type_url == CONFIG_DUMP:
            return self.config_dump(names)
        # Another istiod debug type (its generic `istio.io/debug` pages, say): nothing.
        return (), f"{type_url} is not answered by meshbridge (it answers {SYNCZ} and " \
                   f"{CONFIG_DUMP})"

    # ------------------------------------------------------------------ syncz

    def syncz(self) -> tuple[tuple[str, bytes], ...]:
        xds = {id(s.info): s for s in self.xds_streams() if s.info is not None}
        out = []
        for info in sorted(self.streams.all(), key=lambda i: i.id):
            stream = xds.get(id(info))
            if stream is not None and stream.debug_only:
                continue
            config = (self._xds_client(info, stream) if stream is not None
                      else self._linkerd_client(info))
            out.append((config.node.id, _any(config)))
        return tuple(out)

    def _xds_client(self, info: StreamInfo, stream: XdsStream) -> csds_pb2.ClientConfig:
        labels = stream.node_labels
        config = self._client(stream.node_id or f"{info.protocol}~{info.peer}", info,
                              labels.get("NAMESPACE", ""), labels.get("CLUSTER_ID"),
                              labels.get("ISTIO_VERSION", ""))
        for name, state in sorted(info.types.items()):
            self._type(config, rt.BY_SHORT.get(name, name), "", info, state.sync_state(True),
                       name)
        return config

    def _linkerd_client(self, info: StreamInfo) -> csds_pb2.ClientConfig:
        # A Linkerd stream is one target: its context token names the pod, when set.
        token = _token(info.client)
        who = f"{token['pod']}.{token.get('ns', '')}" if token.get("pod") else info.peer
        target = next(iter(sorted(info.types)), "")
        config = self._client(f"{info.protocol}~{who}~{target}", info, token.get("ns", ""),
                              None, "")
        for name, state in sorted(info.types.items()):
            # No ACK in Linkerd's API: written and caught up is as synced as it gets.
            written = state.sync_state(False) != NOT_SENT
            status = NOT_SENT if not written else STALE if info.behind() else SYNCED
            self._type(config, LINKERD_TYPES.get(info.protocol, info.protocol), name, info,
                       status, name)
        return config

    def _client(self, node_id: str, info: StreamInfo, namespace: str, cluster: str | None,
                version: str) -> csds_pb2.ClientConfig:
        meta = struct_pb2.Struct()
        json_format.ParseDict({
            "NAMESPACE": namespace, "CLUSTER_ID": cluster or self.cluster_id,
            "ISTIO_VERSION": version, SYNCZ_METADATA: info.syncz()}, meta)
        return csds_pb2.ClientConfig(node=base_pb2.Node(id=node_id, metadata=meta))

    def _type(self, config: csds_pb2.ClientConfig, type_url: str, name: str,
              info: StreamInfo, status: str, key: str) -> None:
        state = info.types[key]
        entry = config.generic_xds_configs.add(
            type_url=type_url, name=name, version_info=state.last_sent_version,
            config_status=_STATUS.get(status, csds_pb2.UNKNOWN),
            client_status=_CLIENT_STATUS.get(status, csds_pb2.CLIENT_REQUESTED))
        sent = _timestamp(state.last_sent_at)
        if sent is not None:
            entry.last_updated.CopyFrom(sent)
        if status == NACKED:
            entry.error_state.details = state.last_nack_error
            nacked = _timestamp(state.last_nack_at)
            if nacked is not None:
                entry.error_state.last_update_attempt.CopyFrom(nacked)

    # ------------------------------------------------------------------ config dump

    def config_dump(self, names: Sequence[str]) -> DebugReply:
        if len(names) != 1:
            return (), f"{CONFIG_DUMP} takes exactly one resource name (a proxy's node " \
                       f"id or part of it), not {len(names)}"
        wanted = names[0]
        stream = next((s for s in sorted(self.xds_streams(), key=_stream_id)
                       if not s.debug_only and wanted and wanted in s.node_id), None)
        if stream is None:
            return (), f"proxy {wanted!r} is not connected to this meshbridge"
        sections = self._dump(stream)
        return tuple((type(s).DESCRIPTOR.full_name, _any(s)) for s in sections), ""

    def _dump(self, stream: XdsStream) -> list[Any]:
        held = {t: self._held(stream, t) for t in _DUMPED}
        info = stream.info
        at = {t: _timestamp(info.types[rt.short_name(t)].last_sent_at)
              if info is not None and rt.short_name(t) in info.types else None
              for t in _DUMPED}
        clusters = dump_pb2.ClustersConfigDump(version_info=self._version(stream, rt.CLUSTER))
        for version, body in held[rt.CLUSTER]:
            clusters.dynamic_active_clusters.add(
                version_info=version, cluster=body, last_updated=at[rt.CLUSTER])
        listeners = dump_pb2.ListenersConfigDump(
            version_info=self._version(stream, rt.LISTENER))
        for version, body in held[rt.LISTENER]:
            entry = listeners.dynamic_listeners.add(name=_name(body))
            entry.active_state.version_info = version
            entry.active_state.listener.CopyFrom(body)
            if at[rt.LISTENER] is not None:
                entry.active_state.last_updated.CopyFrom(at[rt.LISTENER])
        routes = dump_pb2.RoutesConfigDump()
        for version, body in held[rt.ROUTE]:
            routes.dynamic_route_configs.add(
                version_info=version, route_config=body, last_updated=at[rt.ROUTE])
        endpoints = dump_pb2.EndpointsConfigDump()
        for version, body in held[rt.ENDPOINT]:
            endpoints.dynamic_endpoint_configs.add(
                version_info=version, endpoint_config=body, last_updated=at[rt.ENDPOINT])
        return [clusters, listeners, routes, endpoints]

    def _held(self, stream: XdsStream, type_url: str) -> list[tuple[str, any_pb2.Any]]:
        """What the client holds of a type: each resource it was sent (and did not
        drop), as it is now, in name order."""
        sub = stream.subs.get(type_url)
        cache = self.cache.cache_of(type_url)
        if sub is None or cache is None:
            return []
        out = []
        for name, version in sorted(sub.sent.items()):
            res = cache.resource(sub, name) if version not in (ABSENT, RESEND) else None
            if res is not None:
                out.append((sub.version_sent, any_pb2.Any.FromString(res.any_bytes)))
        return out

    @staticmethod
    def _version(stream: XdsStream, type_url: str) -> str:
        sub = stream.subs.get(type_url)
        return sub.version_sent if sub is not None else ""


def merged(type_url: str, replies: Sequence[DebugReply]) -> DebugReply:
    """Several processes' answers as one (`--workers N`, docs/workers.md): syncz lists
    every process's streams; a config dump is the one process's that has the proxy
    (or, when none has, the first's reason)."""
    if not replies:
        return (), f"{type_url}: no process answered"
    if type_url == SYNCZ:
        return tuple(entry for resources, _ in replies for entry in resources), ""
    return next((r for r in replies if r[0]), replies[0])


class GatheredDebugTypes:
    """A worker's debug answers (docs/workers.md): it holds only its own streams, so
    it asks the watcher (`gather`), which adds up every process's `DebugTypes.reply`.
    The answer is an awaitable the stream writes when it resolves."""

    def __init__(self, local: DebugTypes,
                 gather: Callable[[str, tuple[str, ...]], Awaitable[DebugReply]]) -> None:
        self.local = local
        self.gather = gather
        self.control_plane = local.control_plane

    def for_client(self, peer: str, certified: bool) -> GatheredDebugTypes | Refusal:
        reason = self.local.access.grpc_refusal(peer, certified)
        return self if reason is None else Refusal(reason, self.control_plane)

    def answer(self, stream: XdsStream, type_url: str,
               names: Sequence[str]) -> Awaitable[DebugReply]:
        return self._gathered(type_url, tuple(names))

    async def _gathered(self, type_url: str, names: tuple[str, ...]) -> DebugReply:
        try:
            return await self.gather(type_url, names)
        except Exception as e:  # the watcher gone or stopping: say so, in the answer
            return (), f"{type_url}: the other processes did not answer ({e!r})"


def _stream_id(stream: XdsStream) -> int:
    return stream.info.id if stream.info is not None else 0


def _name(body: any_pb2.Any) -> str:
    listener = listener_pb2.Listener()
    body.Unpack(listener)
    return str(listener.name)


def _token(text: str) -> dict[str, str]:
    """A Linkerd context token's fields, or nothing if it is not JSON."""
    try:
        parsed = json.loads(text) if text.startswith("{") else {}
    except ValueError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    return {k: v for k, v in parsed.items() if isinstance(k, str) and isinstance(v, str)}
