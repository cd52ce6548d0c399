"""The measuring clients of a route-edit run, in a process of their own (one per model):

    python -m harness.compare.route_clients CONFIG.json

CONFIG names the server, the model and each client's targets. Every client follows
every one of its targets' routes as a proxy of its model would:

    linkerd  one `OutboundPolicies.Watch` stream per target (a client's own channel)
    sotw     one SotW ADS stream per client, RDS for its targets, every response ACKed
    delta    one delta ADS stream per client, RDS likewise

Each message is decoded, and for each target it names the route's weights are kept
with the arrival time (`time.monotonic_ns()`, the clock the server's process stamps
its edits with) and the message's size. Prints `{"event": "ready"}` once every client
holds every target's routes, then waits for `stop` on stdin and writes what it
received to the results file.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.config.route.v3 import route_pb2
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import struct_pb2

from harness.clients import ADS_SOTW
from linkerd_api.proto import outbound_pb2

RDS_TYPE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
ADS_DELTA = ("/envoy.service.discovery.v3.AggregatedDiscoveryService/"
             "DeltaAggregatedResources")
WATCH = "/io.linkerd.proxy.outbound.OutboundPolicies/Watch"
WORKLOAD = '{"ns":"clients","pod":"route-client"}'


def policy_weights(raw: bytes) -> tuple[int, ...]:
    """The weights of a policy's first HTTP route's first rule."""
    policy = outbound_pb2.OutboundPolicy.FromString(raw)
    proto = policy.protocol
    routes = (proto.detect.http1.routes if proto.WhichOneof("kind") == "detect"
              else proto.http1.routes or proto.http2.routes)
    if not routes or not routes[0].rules:
        return ()
    backends = routes[0].rules[0].backends.random_available.backends
    return tuple(b.weight for b in backends)


def rds_weights(config: route_pb2.RouteConfiguration) -> tuple[int, ...]:
    """The weighted clusters of a RouteConfiguration's first route."""
    if not config.virtual_hosts or not config.virtual_hosts[0].routes:
        return ()
    action = config.virtual_hosts[0].routes[0].route
    return tuple(c.weight.value for c in action.weighted_clusters.clusters)


class Received:
    """What one process's clients received: (client, target, weights, t_ns, bytes)."""

    def __init__(self, expected: int, ready: Callable[[], None]) -> None:
        self.records: list[tuple[str, str, list[int], int, int]] = []
        self.latest: dict[tuple[str, str], list[int]] = {}
        self.messages = 0
        self.bytes = 0
        self.expected = expected  # (client, target) pairs
        self._ready = ready

    def message(self, size: int) -> None:
        self.messages += 1
        self.bytes += size

    def route(self, client: str, target: str, weights: tuple[int, ...], at: int,
              size: int) -> None:
        first = (client, target) not in self.latest
        self.latest[(client, target)] = list(weights)
        self.records.append((client, target, list(weights), at, size))
        if first and len(self.latest) == self.expected:
            self._ready()


async def linkerd_client(channel: grpc.aio.Channel, name: str, targets: list[str],
                         got: Received) -> None:
    watch = channel.unary_stream(WATCH, request_serializer=None, response_deserializer=None)

    async def follow(target: str) -> None:
        spec = outbound_pb2.TrafficSpec(source_workload=WORKLOAD, authority=target)
        async for raw in watch(spec.SerializeToString()):
            at = time.monotonic_ns()
            got.message(len(raw))
            got.route(name, target, policy_weights(raw), at, len(raw))

    await asyncio.gather(*(follow(t) for t in targets))


def _node(name: str) -> base_pb2.Node:
    # The node id tells the server's stream counts which model a stream is.
    return base_pb2.Node(id=name, cluster="compare", user_agent_name="envoy",
                         metadata=struct_pb2.Struct(fields={
                             "NAMESPACE": struct_pb2.Value(string_value="clients")}))


def ads_call(channel: grpc.aio.Channel, method: str, first: bytes
             ) -> tuple[asyncio.Queue[bytes], Any]:
    """An ADS call whose requests are what is put on the returned queue (`first`
    already is); iterate the call for the responses' raw bytes."""
    requests: asyncio.Queue[bytes] = asyncio.Queue()

    async def outgoing() -> AsyncIterator[bytes]:
        while True:
            yield await requests.get()

    requests.put_nowait(first)
    call = channel.stream_stream(method, request_serializer=None,
                                 response_deserializer=None)(outgoing())
    return requests, call


async def sotw_client(channel: grpc.aio.Channel, name: str, targets: list[str],
                      got: Received) -> None:
    requests, call = ads_call(channel, ADS_SOTW, discovery_pb2.DiscoveryRequest(
        node=_node(name), type_url=RDS_TYPE, resource_names=targets).SerializeToString())
    async for raw in call:
        at = time.monotonic_ns()
        got.message(len(raw))
        resp = discovery_pb2.DiscoveryResponse.FromString(raw)
        for any_ in resp.resources:
            config = route_pb2.RouteConfiguration.FromString(any_.value)
            got.route(name, config.name, rds_weights(config), at, len(raw))
        requests.put_nowait(discovery_pb2.DiscoveryRequest(
            type_url=RDS_TYPE, resource_names=targets, version_info=resp.version_info,
            response_nonce=resp.nonce).SerializeToString())


async def delta_client(channel: grpc.aio.Channel, name: str, targets: list[str],
                       got: Received) -> None:
    requests, call = ads_call(channel, ADS_DELTA, discovery_pb2.DeltaDiscoveryRequest(
        node=_node(name), type_url=RDS_TYPE,
        resource_names_subscribe=targets).SerializeToString())
    async for raw in call:
        at = time.monotonic_ns()
        got.message(len(raw))
        resp = discovery_pb2.DeltaDiscoveryResponse.FromString(raw)
        for res in resp.resources:
            config = route_pb2.RouteConfiguration.FromString(res.resource.value)
            got.route(name, res.name, rds_weights(config), at, len(raw))
        requests.put_nowait(discovery_pb2.DeltaDiscoveryRequest(
            type_url=RDS_TYPE, response_nonce=resp.nonce).SerializeToString())


CLIENTS = {"linkerd": linkerd_client, "sotw": sotw_client, "delta": delta_client}


async def holds(got: Received, model: str, clients: list[dict[str, Any]],
                final: dict[str, int], timeout: float) -> bool:
    """Whether every client comes to hold `final` (a target's last canary weight; 1 for
    one never edited) within `timeout` seconds."""
    model_clients = [(f"compare-{model}-{c['index']}", c["targets"]) for c in clients]
    deadline = time.monotonic() + timeout
    while True:
        if all((w := got.latest.get((name, t))) and w[-1] == final.get(t, 1)
               for name, targets in model_clients for t in targets):
            return True
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)  # polling what the clients hold, with a deadline


def _report_failure(task: asyncio.Task[None]) -> None:
    """A client that ended before `stop` says why on stderr (the run's log file)."""
    if not task.cancelled() and task.exception() is not None:
        print(f"route client failed: {task.exception()!r}", file=sys.stderr, flush=True)


async def main(config_path: Path) -> int:
    config: dict[str, Any] = json.loads(config_path.read_text(encoding="utf-8"))
    model = config["model"]
    clients = config["clients"]
    out = sys.stdout

    def say(event: dict[str, Any]) -> None:
        out.write(json.dumps(event) + "\n")
        out.flush()

    got = Received(sum(len(c["targets"]) for c in clients),
                   lambda: say({"event": "ready"}))
    channels = [grpc.aio.insecure_channel(config["server"]) for _ in clients]
    run = CLIENTS[model]
    tasks = [asyncio.create_task(run(ch, f"compare-{model}-{c['index']}", c["targets"], got))
             for ch, c in zip(channels, clients, strict=True)]
    for t in tasks:
        t.add_done_callback(_report_failure)
    stdin = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    while (line := await stdin.readline()) and line.strip() != b"stop":
        if line.startswith(b"{"):
            command = json.loads(line)
            say({"event": "settled",
                 "ok": await holds(got, model, clients, command["settle"], command["timeout"])})
    failed = [repr(t.exception()) for t in tasks if t.done() and t.exception() is not None]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for ch in channels:
        await ch.close()
    Path(config["results"]).write_text(json.dumps({
        "records": got.records, "messages": got.messages, "bytes": got.bytes,
        "errors": failed, "cpu_seconds": time.process_time()}), encoding="utf-8")
    say({"event": "stopped"})
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(Path(sys.argv[1]))))
