"""Fuzz target (atheris) for everything meshbridge decodes from the outside world.

    python fuzz/fuzz_inputs.py -atheris_runs=20000          # a short run
    python fuzz/fuzz_inputs.py -max_total_time=3600 fuzz/corpus   # a long one, with a corpus

The first byte of an input picks the decoder, the rest is its input:

    0  an xDS SotW DiscoveryRequest, as bytes off the wire, into a live SotwStream
    1  an xDS delta DeltaDiscoveryRequest into a live DeltaStream
    2  a Linkerd GetDestination: request decoding, authority and context-token parsing
    3  a manifest file (YAML or JSON), read as the files source reads it, and whatever
       decodes applied to a cluster and served through its Views

Each decoder may refuse its input only with its own domain error (a clear gRPC status
or a logged, skipped object): any other exception is a crash atheris reports, with
the input that caused it. See docs/reliability.md.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports():
    import yaml

    from bridge.authority import AuthorityError
    from bridge.cluster import Cluster, Event, EventType
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


def test_one_input(data: bytes) -> None:
    if not data:
        return
    which, rest = data[0] % 4, data[1:]
    if which == 0:
        xds(rest, delta=False)
    elif which == 1:
        xds(rest, delta=True)
    elif which == 2:
        linkerd(rest)
    else:
        manifest(rest)


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
