"""Threads or processes for the serving workers: the same serving-path work, on 1 and 2
threads and on 1 and 2 processes (docs/workers.md, "Processes, not threads").

    python -m bench.parallel [--streams 5000] [--rounds 20] [--runs 5] [--json]

The work is what one xDS stream costs the server per change, without the sockets:
decode the client's ACK (a `DiscoveryRequest`, as the stream does) and frame the
response (version, the shared ClusterLoadAssignment bytes, type, nonce; gRPC's
length prefix), `--streams` times per round. One unit of work is split into equal
halves given to two threads or two processes; the figure is the wall time of the
whole, median of `--runs`. Under the GIL two threads cannot beat one; two processes
can, up to the cores they are given (the machine's other load shares them too). The
report also says whether this interpreter runs without the GIL and which protobuf
implementation it uses: a free-threaded CPython would be the one way threads could
scale.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import sysconfig
import threading
import time
from typing import Any

from bench.common import finish, parser, row

EDS = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"


def _payloads() -> tuple[bytes, bytes]:
    """An ACK as an Envoy sends it, and a 10-endpoint CLA's bytes."""
    from envoy.config.endpoint.v3 import endpoint_pb2
    from envoy.service.discovery.v3 import discovery_pb2

    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name="svc-0.ns-0.svc.cluster.local:8080")
    group = cla.endpoints.add()
    for i in range(10):
        sock = group.lb_endpoints.add().endpoint.address.socket_address
        sock.address = f"10.0.0.{i}"
        sock.port_value = 8080
    ack = discovery_pb2.DiscoveryRequest(type_url=EDS, resource_names=[cla.cluster_name],
                                         version_info="a" * 32, response_nonce="7")
    ack.node.id = "sidecar~10.0.0.1~pod.ns~ns.svc.cluster.local"
    return ack.SerializeToString(), cla.SerializeToString()


def serve_streams(streams: int, rounds: int) -> int:
    """`rounds` changes to `streams` streams: decode each ACK, frame each response."""
    from envoy.service.discovery.v3 import discovery_pb2

    from h2grpc.frames import GRPC_PREFIX
    from xds_api import wire

    ack, cla = _payloads()
    decode = discovery_pb2.DiscoveryRequest.FromString
    written = 0
    for r in range(rounds):
        for s in range(streams):
            req = decode(ack)
            parts = [wire.string_field(1, req.version_info), wire.length_delimited(2, cla),
                     wire.string_field(4, EDS), wire.string_field(5, str(r * streams + s))]
            body = b"".join(parts)
            written += len(GRPC_PREFIX.pack(0, len(body)) + body)
    return written


def _timed(kind: str, ways: int, streams: int, rounds: int) -> float:
    share = streams // ways
    started = time.perf_counter()
    if ways == 1:
        serve_streams(streams, rounds)
    elif kind == "threads":
        threads = [threading.Thread(target=serve_streams, args=(share, rounds))
                   for _ in range(ways)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        with multiprocessing.get_context("fork").Pool(ways) as pool:
            started = time.perf_counter()  # the pool's start-up is not serving work
            pool.starmap(serve_streams, [(share, rounds)] * ways)
    return time.perf_counter() - started


def run(args: argparse.Namespace) -> dict[str, Any]:
    serve_streams(100, 1)  # imports and first calls out of the timing
    figures: dict[str, list[float]] = {"one": [], "threads": [], "processes": []}
    for _ in range(args.runs):  # interleaved, so load changes hit every kind alike
        figures["one"].append(_timed("one", 1, args.streams, args.rounds))
        figures["threads"].append(_timed("threads", 2, args.streams, args.rounds))
        figures["processes"].append(_timed("processes", 2, args.streams, args.rounds))
    from google.protobuf.internal import api_implementation

    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    return {"streams": args.streams, "rounds": args.rounds, "runs": args.runs,
            "seconds": figures, "gil": gil,
            "free_threaded_build": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
            "protobuf": api_implementation.Type(), "python": sys.version.split()[0]}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    one = statistics.median(result["seconds"]["one"])
    out = []
    for kind in ("threads", "processes"):
        speedups = [one / s for s in result["seconds"][kind]]
        out.append(row(f"serving-path work on 2 {kind} against 1 ({result['streams']:,} "
                       "streams)", "speed-up", speedups, "x", better="higher"))
    return out


def report(result: dict[str, Any]) -> str:
    med = {k: statistics.median(v) for k, v in result["seconds"].items()}
    return "\n".join([
        f"serving-path work, {result['streams']:,} streams x {result['rounds']} changes, "
        f"{result['runs']} runs (Python {result['python']}, GIL "
        f"{'on' if result['gil'] else 'off'}, protobuf {result['protobuf']})",
        f"  1 thread:      {med['one'] * 1e3:.0f} ms",
        f"  2 threads:     {med['threads'] * 1e3:.0f} ms ({med['one'] / med['threads']:.2f}x)",
        f"  2 processes:   {med['processes'] * 1e3:.0f} ms "
        f"({med['one'] / med['processes']:.2f}x)",
    ])


def main(argv: list[str] | None = None) -> int:
    p = parser("parallel", __doc__)
    p.add_argument("--streams", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args(argv)
    return finish("parallel", run(args), args.json, rows, report)


if __name__ == "__main__":
    sys.exit(main())
