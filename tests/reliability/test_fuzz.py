"""A short run of the fuzz target (fuzz/fuzz_inputs.py) on every `make test`, seeded
with one well-formed input per decoder so the mutations start deep; the long run is
in docs/reliability.md. Also the bad inputs the fuzzer found, kept as tests."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import h2.config
import h2.connection
import pytest
from envoy.service.discovery.v3 import discovery_pb2

from bridge.cluster import Cluster
from bridge.model import ServiceKey
from bridge.sources.catalog import DEMO_DIR
from bridge.sources.files import FilesSource
from linkerd_api.proto import destination_pb2
from testkit.polling import eventually

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "fuzz" / "fuzz_inputs.py"
EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
WEB = "web.app.svc.cluster.local:80"
RUNS = int(os.environ.get("MESHBRIDGE_FUZZ_RUNS", "30000"))


def http2_session() -> bytes:
    """A client's side of a short gRPC session, after its preface (the target adds it)."""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":path", "/f.F/Echo"),
                            (":authority", "x"), ("content-type", "application/grpc"),
                            ("te", "trailers"), ("grpc-timeout", "5S")])
    client.send_data(1, b"\x00\x00\x00\x00\x05hello", pad_length=3)
    client.ping(b"8 bytes!")
    client.increment_flow_control_window(1000)
    client.end_stream(1)
    data: bytes = client.data_to_send()
    return data[len(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"):]


def core_frames() -> bytes:
    """A frame sequence in fuzz_inputs.frame_sequence's spelling: two requests with a
    message each, a PING, a WINDOW_UPDATE, the server's turn, a reset."""
    def rec(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
        return bytes((kind, flags, sid, len(payload))) + payload

    return b"".join([rec(10, 0, 1), rec(11, 0, 1, b"hello"), rec(10, 1, 3),
                     rec(6, 0, 0, b"8 bytes!"), rec(8, 0, 1, b"\0\0\1\0"), rec(12, 0, 0),
                     rec(11, 1, 1, b"bye"), rec(3, 0, 3, b"\0\0\0\x08"), rec(12, 0, 0)])


def seeds(folder: Path) -> None:
    folder.mkdir()
    sotw = discovery_pb2.DiscoveryRequest(type_url=EDS, resource_names=[WEB, "x:1"])
    sotw.node.id = "fuzz"
    delta = discovery_pb2.DeltaDiscoveryRequest(type_url=EDS, resource_names_subscribe=[WEB],
                                                initial_resource_versions={WEB: "v"})
    get = destination_pb2.GetDestination(
        scheme="k8s", path=WEB, context_token='{"ns":"app","nodeName":"node-a"}')
    manifest = DEMO_DIR / "10-emojivoto.yaml"
    inputs = {
        "http2": b"\x04" + http2_session(),
        "h2core": b"\x05" + core_frames(),
        "sotw": b"\x00" + sotw.SerializeToString(),
        "delta": b"\x01" + delta.SerializeToString(),
        "get": b"\x02" + get.SerializeToString(),
        "manifest": b"\x03" + (manifest.read_bytes() if manifest.exists()
                               else b"kind: Service\nmetadata: {name: a, namespace: b}\n"),
    }
    for name, data in inputs.items():
        (folder / name).write_bytes(data)


# The run's own guard (the subprocess timeout below), not pytest's default 300 s: the
# count of inputs bounds the run, and on a loaded 2-core machine it takes longer.
@pytest.mark.timeout(1800)
def test_a_short_fuzz_run_finds_no_crash(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    seeds(corpus)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, str(TARGET), f"-atheris_runs={RUNS}", "-max_len=4096",
         "-timeout=20", "-rss_limit_mb=3072", f"-artifact_prefix={tmp_path}/", str(corpus)],
        # The run is bounded by its count of inputs; the timeout only guards against a
        # hang, far above what the count takes on a loaded 2-core machine.
        capture_output=True, text=True, timeout=1800, env=env, cwd=tmp_path)
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, tail
    assert f"Done {RUNS}" in tail, tail
    assert not list(tmp_path.glob("crash-*")), tail


async def test_a_manifest_nested_too_deeply_keeps_the_last_good_state(tmp_path: Path) -> None:
    # Found by the fuzzer: the YAML parser recursed out of the stack and ended the source.
    (tmp_path / "web.yaml").write_text(
        "kind: Service\nmetadata: {name: web, namespace: app}\n"
        "spec: {ports: [{name: http, port: 80}]}\n")
    source = FilesSource(tmp_path, poll_interval=0.01)
    cluster = Cluster()
    synced = asyncio.Event()
    task = asyncio.create_task(source.run(cluster, synced))
    try:
        await asyncio.wait_for(synced.wait(), 10)
        assert ServiceKey("app", "web") in cluster.services
        (tmp_path / "web.yaml").write_text("[" * 20000 + "]" * 20000)
        (tmp_path / "api.yaml").write_text(
            "kind: Service\nmetadata: {name: api, namespace: app}\n"
            "spec: {ports: [{name: http, port: 80}]}\n")

        def followed() -> bool:
            assert not task.done(), task
            return ServiceKey("app", "api") in cluster.services

        await eventually(followed, 10, "the source stopped following the folder")
        assert ServiceKey("app", "web") in cluster.services  # its last good state
        assert not task.done()
    finally:
        task.cancel()
