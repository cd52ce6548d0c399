"""`meshbridge shadow --routes`: each target's routes as both sides serve them, as flat
fields beside its endpoints.

    Linkerd  OutboundPolicy      policy.<its fields>: one `OutboundPolicies.Watch`
                                 stream per target, for the `--workload` client
    xDS      RouteConfiguration  rds.<the target's virtual host's fields but its name
                                 and domains>: one ADS stream asking RDS for every
                                 target (`RouteWatch`)

Every field is compared, as for endpoints. The one translation: theirs' cluster names
(Istio's `outbound|80||web.ns.svc.cluster.local`) are read back to the authority they
name (`web.ns.svc.cluster.local:80`) through the same `--theirs-eds-name` template
that names their clusters, so that a weighted cluster compares by what it sends to;
and a match's `case_sensitive: true` is Envoy's default, read as unset.
A RouteConfiguration that holds the virtual hosts of many services (istiod names one
per port number) is compared on the target's own virtual host.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.config.route.v3 import route_pb2
from envoy.service.discovery.v3 import discovery_pb2

from harness.clients import ADS_SOTW
from harness.shadow.fields import ROUTES_STATUS, VHOST_SKIP, Flat, flatten
from linkerd_api.proto import outbound_pb2

RDS_TYPE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
WATCH = "/io.linkerd.proxy.outbound.OutboundPolicies/Watch"

RoutesSink = Callable[[str, Flat], None]  # (target, fields)


def policy_fields(raw: bytes) -> Flat:
    return flatten(outbound_pb2.OutboundPolicy.FromString(raw), "policy")


def policy_status(code: str) -> Flat:
    return {f"policy.{ROUTES_STATUS}": code}


def traffic_spec(target: str, workload: str) -> bytes:
    return outbound_pb2.TrafficSpec(source_workload=workload,
                                    authority=target).SerializeToString()


def authority_reader(template: str) -> Callable[[str], str]:
    """The inverse of an EDS name template (`outbound|{port}||{host}`): a cluster name
    back to the authority it names; a name the template does not produce stays itself."""
    parts = re.split(r"(\{authority\}|\{host\}|\{port\})", template)
    pattern = "".join(
        {"{authority}": "(?P<authority>.+)", "{host}": "(?P<host>.+?)",
         "{port}": "(?P<port>[0-9]+)"}.get(p, re.escape(p)) for p in parts)
    compiled = re.compile(f"^{pattern}$")

    def read(name: str) -> str:
        m = compiled.match(name)
        if m is None:
            return name
        found = m.groupdict()
        if found.get("authority"):
            return found["authority"]
        if found.get("host") and found.get("port"):
            return f"{found['host']}:{found['port']}"
        return name

    return read


def rds_fields(config: route_pb2.RouteConfiguration, target: str,
               cluster_authority: Callable[[str], str] = str) -> Flat:
    """The target's virtual host in `config`, its clusters named by authority."""
    host = target.rpartition(":")[0]
    vhost = _virtual_host(config, host, target)
    if vhost is None:
        return {f"rds.{ROUTES_STATUS}": f"no virtual host for {host}"}
    copy = route_pb2.RouteConfiguration()
    copy.virtual_hosts.add().CopyFrom(vhost)
    mine = copy.virtual_hosts[0]
    for route in mine.routes:
        # Read as Envoy reads it: a match is case-sensitive unless it says otherwise.
        if route.match.HasField("case_sensitive") and route.match.case_sensitive.value:
            route.match.ClearField("case_sensitive")
        action = route.route
        if action.cluster:
            action.cluster = cluster_authority(action.cluster)
        for weighted in action.weighted_clusters.clusters:
            weighted.name = cluster_authority(weighted.name)
        for mirror in action.request_mirror_policies:
            mirror.cluster = cluster_authority(mirror.cluster)
    return flatten(mine, "rds", skip=VHOST_SKIP)


def _virtual_host(config: route_pb2.RouteConfiguration, host: str,
                  authority: str) -> Any | None:
    if len(config.virtual_hosts) == 1 and list(config.virtual_hosts[0].domains) == ["*"]:
        return config.virtual_hosts[0]  # a configuration of this one service port
    for vh in config.virtual_hosts:
        if host in vh.domains or authority in vh.domains:
            return vh
    return None


class RouteWatch:
    """One SotW ADS stream asking RDS for every target's RouteConfiguration (by
    `rds_name`), telling `sink` each target's route fields whenever they change;
    names not answered within `settle` seconds are said so. Reconnects with backoff."""

    def __init__(self, channel: grpc.aio.Channel, sink: RoutesSink, *,
                 rds_name: Callable[[str], str] = str,
                 cluster_authority: Callable[[str], str] = str,
                 node_id: str = "meshbridge-shadow", zone: str = "", settle: float = 2.0,
                 retry: Any = None) -> None:
        self.channel = channel
        self.sink = sink
        self.rds_name = rds_name
        self.cluster_authority = cluster_authority
        self.node = base_pb2.Node(id=node_id, cluster="meshbridge-shadow")
        if zone:
            self.node.locality.zone = zone
        self.settle = settle
        self.retry = retry
        self.targets: list[str] = []
        self.status = ""
        self._changed = asyncio.Event()
        self._last: dict[str, Flat] = {}

    def add(self, targets: Iterable[str]) -> None:
        new = [t for t in targets if t not in self.targets]
        self.targets.extend(new)
        if new:
            self._changed.set()

    def _tell(self, target: str, fields: Flat) -> None:
        if self._last.get(target) != fields:
            self._last[target] = fields
            self.sink(target, fields)

    async def run(self) -> None:
        while True:
            if not self.targets:
                await self._changed.wait()
            self._changed.clear()
            heard = await self._stream()
            if heard is None:
                continue  # new targets: ask again at once
            for t in self.targets:
                self._tell(t, {f"rds.{ROUTES_STATUS}": self.status or "ended"})
            if heard and self.retry is not None:
                self.retry.reset()
            await asyncio.sleep(self.retry.next() if self.retry is not None else 1.0)

    async def _stream(self) -> bool | None:
        """One stream until it ends (whether it said anything) or the targets change
        (None)."""
        names = sorted({self.rds_name(t) for t in self.targets})
        requests: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def outgoing() -> AsyncIterator[bytes]:
            while (item := await requests.get()) is not None:
                yield item

        requests.put_nowait(discovery_pb2.DiscoveryRequest(
            node=self.node, type_url=RDS_TYPE, resource_names=names).SerializeToString())
        call = self.channel.stream_stream(ADS_SOTW)(outgoing())
        answered: set[str] = set()

        def unanswered() -> None:
            # xDS §1.7: SotW never says a name does not exist; a client stops waiting.
            for t in self.targets:
                if self.rds_name(t) not in answered:
                    self._tell(t, {f"rds.{ROUTES_STATUS}": "no answer"})

        timer = asyncio.get_running_loop().call_later(self.settle, unanswered)
        reading = asyncio.create_task(self._read(call, requests, answered))
        again = asyncio.create_task(self._changed.wait())
        try:
            await asyncio.wait({reading, again}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            again.cancel()
            requests.put_nowait(None)
            if not reading.done():
                call.cancel()
                reading.cancel()
        if self._changed.is_set():
            return None
        try:
            return reading.result()
        except asyncio.CancelledError:
            return False

    async def _read(self, call: Any, requests: asyncio.Queue[bytes | None],
                    answered: set[str]) -> bool:
        heard = False
        try:
            async for raw in call:
                heard = True
                resp = discovery_pb2.DiscoveryResponse.FromString(raw)
                configs = {}
                for any_ in resp.resources:
                    config = route_pb2.RouteConfiguration.FromString(any_.value)
                    configs[config.name] = config
                answered.update(configs)
                for t in self.targets:
                    config = configs.get(self.rds_name(t))
                    if config is not None:
                        self._tell(t, rds_fields(config, t, self.cluster_authority))
                requests.put_nowait(discovery_pb2.DiscoveryRequest(
                    type_url=RDS_TYPE, version_info=resp.version_info,
                    response_nonce=resp.nonce,
                    resource_names=sorted({self.rds_name(t) for t in self.targets}),
                ).SerializeToString())
            self.status = (await call.code()).name
        except grpc.aio.AioRpcError as e:
            self.status = f"{e.code().name}: {e.details() or ''}".rstrip(": ")
        except Exception as e:  # a message that does not decode: not the server we think
            self.status = f"UNKNOWN: {type(e).__name__}: {e}"
            call.cancel()
        return heard
