"""Fuzz target (atheris) for everything meshbridge decodes from the outside world.

    python fuzz/fuzz_inputs.py -atheris_runs=20000          # a short run
    python fuzz/fuzz_inputs.py -max_total_time=3600 fuzz/corpus   # a long one, with a corpus

The first byte of an input picks the decoder, the rest is its input:

    0  an xDS SotW DiscoveryRequest, as bytes off the wire, into a live SotwStream
    1  an xDS delta DeltaDiscoveryRequest into a live DeltaStream
    2  a Linkerd GetDestination: request decoding, authority and context-token parsing
    3  a manifest file (YAML or JSON), read as the files source reads it, and whatever
       decodes applied to a cluster and served through its Views
    4  bytes from an HTTP/2 client (after its preface) into a connection of the gRPC
       server (h2grpc), whose echo handlers then run; the socket is a stand-in
       that keeps what the server writes

Each decoder may refuse its input only with its own domain error (a clear gRPC status,
an HTTP/2 GOAWAY or RST_STREAM, or a logged, skipped object): any other exception is
a crash atheris reports, with the input that caused it. See docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports():
    import grpc
    import yaml

    from bridge.authority import AuthorityError
    from bridge.cluster import Cluster, Event, EventType
    from h2grpc.connection import Connection
    from h2grpc.frames import PREFACE
    from h2grpc.server import Server
    from bridge.model import MeshConfig, ViewKey
    from bridge.sources.files import read_manifest_file
    from bridge.views import ViewRegistry
    from linkerd_api.authority import parse_context_token, parse_service_name, split_host_port
    from linkerd_api.errors import BadRequest as LinkerdBadRequest
    from linkerd_api.service import _decode as decode_get
    from xds_api.metrics import XdsMetrics
    from xds_api.service import decode as decode_xds
    from xds_api.stream import DeltaStream, SotwStream, StreamError

from envoy.service.discovery.v3 import discovery_pb2

from tests.unit.test_xds_support import World

WORLD = World()
METRICS = XdsMetrics()
MANIFEST = Path(tempfile.mkdtemp(prefix="meshbridge-fuzz-")) / "input.yaml"


def xds(data: bytes, delta: bool) -> None:
    stream = (DeltaStream if delta else SotwStream)(WORLD.cache, metrics=METRICS, max_names=64)
    message = discovery_pb2.DeltaDiscoveryRequest if delta else discovery_pb2.DiscoveryRequest
    try:
        for chunk in data.split(b"\xff\xfe")[:4]:  # a few requests on one stream
            stream.handle(decode_xds(message, chunk, METRICS))
            for payload in stream.take_responses():
                assert payload
    except StreamError:
        pass
    finally:
        stream.close()


def linkerd(data: bytes) -> None:
    try:
        request = decode_get(data)
    except LinkerdBadRequest:
        return
    token = parse_context_token(request.context_token)
    assert token.form in ("empty", "json", "legacy", "invalid"), token
    try:
        hp = split_host_port(request.path)
        if hp.ip is None:
            parse_service_name(hp.host, "cluster.local")
    except AuthorityError:
        pass


def manifest(data: bytes) -> None:
    MANIFEST.write_bytes(data)
    try:
        objects = read_manifest_file(MANIFEST)
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError):
        # What the files source catches: the file keeps its last good state.
        return
    cluster = Cluster()
    registry = ViewRegistry(cluster, MeshConfig())
    cluster.apply(Event(EventType.ADDED, o) for o in objects.values())
    for key, svc in list(cluster.services.items()):
        for sp in svc.ports:
            _, merged = registry.merge_endpoints(key, sp.port)
            registry.filter_endpoints(ViewKey(key, sp.port), merged)
    cluster.apply(Event(EventType.DELETED, o) for o in objects.values())


class _SocketStandIn(asyncio.Transport):
    """Where the fuzzed connection writes: kept, never sent."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closing = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def can_write_eof(self) -> bool:
        return False

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        return None

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 5555) if name == "peername" else default


async def _echo(_requests: object, context: grpc.aio.ServicerContext) -> None:
    while (message := await context.read()) is not grpc.aio.EOF:
        await context.write(message)


async def _http2_session(data: bytes) -> None:
    server = Server(max_concurrent_streams=16, max_message_bytes=1 << 16)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("f.F", {
        "Echo": grpc.stream_stream_rpc_method_handler(_echo)}),))
    conn = Connection(server)
    socket = _SocketStandIn()
    conn.connection_made(socket)
    for i in range(0, len(data), 512):  # frames split at arbitrary points
        conn.data_received(PREFACE + data[:512] if i == 0 else data[i:i + 512])
        await asyncio.sleep(0)
    for _ in range(3):  # let the calls' tasks run
        await asyncio.sleep(0)
    conn.connection_lost(None)
    await server.stop(0)


LOOP = asyncio.new_event_loop()


def http2(data: bytes) -> None:
    LOOP.run_until_complete(_http2_session(data))


def test_one_input(data: bytes) -> None:
    if not data:
        return
    which, rest = data[0] % 5, data[1:]
    if which == 0:
        xds(rest, delta=False)
    elif which == 1:
        xds(rest, delta=True)
    elif which == 2:
        linkerd(rest)
    elif which == 3:
        manifest(rest)
    else:
        http2(rest)


def main() -> None:
    logging.disable(logging.CRITICAL)
    import structlog

    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 3000))
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
