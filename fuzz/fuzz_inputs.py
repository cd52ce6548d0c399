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
    5  a sequence of HTTP/2 frames (each: kind, flags, stream, length, payload — see
       `frame_sequence`) into the sans-IO core (h2grpc.core) alone, with the server's
       side answering: headers, data and trailers sent back, streams reset, time
       passing, the peer reading or not. The core must never raise, and its
       bookkeeping (streams, windows, budgets) must stay consistent

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
    import hpack
    import yaml

    from bridge.authority import AuthorityError
    from bridge.cluster import Cluster, Event, EventType
    from bridge.model import MeshConfig, ViewKey
    from bridge.sources.files import read_manifest_file
    from bridge.views import ViewRegistry
    from h2grpc import frames as f
    from h2grpc.connection import Connection
    from h2grpc.core import H2Connection
    from h2grpc.frames import PREFACE
    from h2grpc.limits import H2Limits
    from h2grpc.server import Server
    from h2grpc.streams import H2Stream
    from linkerd_api.authority import parse_context_token, parse_service_name, split_host_port
    from linkerd_api.errors import BadRequest as LinkerdBadRequest
    from linkerd_api.writer import decode_request as decode_get
    from xds_api.metrics import XdsMetrics
    from xds_api.service import decode as decode_xds
    from xds_api.stream import DeltaStream, SotwStream, StreamError

from envoy.service.discovery.v3 import discovery_pb2

from testkit.xds_model import World

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
    server = Server(limits=H2Limits(max_concurrent_streams=16, max_message_bytes=1 << 16))
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

# Small budgets, so that the fuzzer reaches each one's end within a short input.
CORE_LIMITS = H2Limits(max_concurrent_streams=8, stream_window=4096, connection_window=65535,
                       max_header_list=2048, max_header_fields=16, max_continuations=4,
                       max_resets=20, max_settings=20, max_window_updates=40,
                       max_priority=20, max_empty_frames=20, max_failed_requests=20,
                       max_control_replies=50)
REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/f.F/Echo"),
           (b":authority", b"x"), (b"content-type", b"application/grpc")]


class _CoreSink:
    """The layer above the fuzzed core: answers the way the gRPC shell would."""

    def __init__(self) -> None:
        self.core: H2Connection | None = None
        self.open: list[H2Stream] = []

    def request_received(self, stream: H2Stream, request: object, end_stream: bool) -> None:
        self.open.append(stream)

    def stream_data(self, stream: H2Stream, data: bytes) -> None:
        assert data

    def stream_ended(self, stream: H2Stream) -> None:
        pass

    def stream_reset(self, stream: H2Stream, code: int) -> None:
        assert stream.closed

    def stream_drained(self, stream: H2Stream) -> None:
        pass

    def handshake_done(self) -> None:
        pass

    def ping_acked(self, payload: bytes) -> None:
        assert len(payload) == 8

    def terminated(self, code: int, reason: str) -> None:
        assert reason


def frame_sequence(data: bytes, encoder: hpack.Encoder) -> list[bytes]:
    """Frames from the fuzzer's bytes, 4 header bytes and a payload each: kind (10 and up:
    a well-formed request's HEADERS, or a gRPC message), flags, stream id, length."""
    frames: list[bytes] = []
    i = 0
    while i + 4 <= len(data) and len(frames) < 200:
        kind, flags, sid, n = data[i], data[i + 1], data[i + 2] % 16, data[i + 3] % 80
        payload = data[i + 4:i + 4 + n]
        i += 4 + n
        if kind % 13 == 10:
            frames.append(f.frame(f.HEADERS, f.END_HEADERS | (flags & f.END_STREAM), sid,
                                  encoder.encode(REQUEST)))
        elif kind % 13 == 11:
            frames.append(f.frame(f.DATA, flags & f.END_STREAM, sid,
                                  f.GRPC_PREFIX.pack(0, len(payload)) + payload))
        elif kind % 13 == 12:
            frames.append(b"")  # a marker: the server side acts (see core_session)
        else:
            frames.append(f.frame(kind % 13, flags, sid, payload))
    return frames


def core_session(data: bytes) -> None:
    now = [1000.0]
    sink = _CoreSink()
    core = H2Connection(sink, CORE_LIMITS, lambda: now[0])
    sink.core = core
    core.initiate()
    core.feed(PREFACE + f.settings_frame({}) + f.frame(f.SETTINGS, f.ACK, 0))
    core.process(1 << 16)
    for n, frame in enumerate(frame_sequence(data, hpack.Encoder())):
        if not frame:  # the server's turn: answer, reset, let time pass, read or not
            for stream in [s for s in sink.open if not s.closed][:3]:
                if n % 3 == 0:
                    core.send_headers(stream)
                    core.send_data(stream, b"\0\0\0\0\x02ok" * (n % 7))
                    core.send_trailers(stream, f.trailers_block(0, "", True))
                elif n % 3 == 1:
                    core.acknowledge(stream)
                else:
                    core.reset_stream(stream)
            now[0] += n % 11
            if n % 2:
                core.peer_reading()
            continue
        core.feed(frame)
        while core.process(97):  # small slices: frames are split across calls
            pass
        core.data_to_send()
        assert core.windows.blocked >= 0 and len(core.streams) <= CORE_LIMITS.max_concurrent_streams
        assert all(not s.closed for s in core.streams.values())
        if core.terminated is not None:
            assert core.process(1 << 16) is False and not core.buffered
            return


def http2(data: bytes) -> None:
    LOOP.run_until_complete(_http2_session(data))


def test_one_input(data: bytes) -> None:
    if not data:
        return
    which, rest = data[0] % 6, data[1:]
    if which == 0:
        xds(rest, delta=False)
    elif which == 1:
        xds(rest, delta=True)
    elif which == 2:
        linkerd(rest)
    elif which == 3:
        manifest(rest)
    elif which == 4:
        http2(rest)
    else:
        core_session(rest)


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
