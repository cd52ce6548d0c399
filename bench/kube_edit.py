"""Edit to first `Get` stream, through a real kube-apiserver (issue #17, row 9).

    python -m bench.kube_edit [--edits 40] [--runs 3] [--stages] [--streams 0] [--json]

A real kube-apiserver (with its watch cache, as in a real cluster) and etcd
(testkit/kubeapi.py, built by scripts/envtest.sh), meshbridge serving
`--source kube` on it in this process and one Linkerd `Get` stream. Each edit
replaces the service's EndpointSlice (an endpoint goes or comes back, alternately);
the figure is the time from the start of the write
to the moment the `Get` stream has decoded the update that carries it: what Linkerd's
"edit -> first Get stream has it" measures. With `--stages` each edit is also cut
into where the time goes:

    write      the write's start to its PUT returning (the writer's round trip)
    api        the write's start to the watch thread reading the event off the wire
    hand-off   the watch thread's read to the loop applying it to the Cluster
    serve      the Cluster apply to the Get stream having decoded the update

The figure is the median over the edits of one run; the table row is the median of
the runs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from typing import Any

from bench.common import print_json, row


async def one_run(edits: int, stages: bool, streams: int) -> dict[str, Any]:
    import grpc
    from kubernetes import client, config

    from bridge.cluster import Cluster
    from bridge.sources import kube as kube_source
    from harness.clients import LinkerdClient, Received
    from meshbridge.app import App, ServeOptions
    from meshbridge.layers import protocol_layers
    from testkit.kubeapi import KubeAPIServer

    marks: dict[str, list[int]] = {"read": [], "apply": []}
    if stages:  # wrap the two seams the stages are cut at, for this process only
        handle, apply = kube_source.KindWatcher._handle, Cluster.apply

        def timed_handle(self: Any, etype: str, raw: dict[str, Any]) -> None:
            if self.spec.kind == "EndpointSlice" and etype == "MODIFIED":
                marks["read"].append(time.monotonic_ns())
            handle(self, etype, raw)

        def timed_apply(self: Any, events: Any) -> Any:
            if any(e.obj.kind == "EndpointSlice" for e in events):
                marks["apply"].append(time.monotonic_ns())
            return apply(self, events)

        kube_source.KindWatcher._handle = timed_handle  # type: ignore[method-assign]
        Cluster.apply = timed_apply  # type: ignore[method-assign]

    with KubeAPIServer(watch_cache=True) as server:
        api = config.new_client_from_config(str(server.kubeconfig_path))
        core, disc = client.CoreV1Api(api), client.DiscoveryV1Api(api)
        ns = f"b-{uuid.uuid4().hex[:6]}"
        core.create_namespace({"metadata": {"name": ns}})
        core.create_namespaced_service(ns, {"metadata": {"name": "web"}, "spec": {
            "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})

        def slice_body(ips: list[str]) -> dict[str, Any]:
            return {"metadata": {"name": "web-a",
                                 "labels": {"kubernetes.io/service-name": "web"}},
                    "addressType": "IPv4",
                    "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                    "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}
                                  for ip in ips]}

        disc.create_namespaced_endpoint_slice(ns, slice_body(["10.9.0.1"]))
        app = App(kube_source.KubeSource(kubeconfig=str(server.kubeconfig_path)),
                  options=ServeOptions("127.0.0.1:0", "127.0.0.1:0"),
                  layers=protocol_layers())
        await app.start()
        target = f"web.{ns}.svc.cluster.local:80"
        got: list[int] = []
        arrived = asyncio.Event()

        def observe(msg: Received) -> None:
            got.append(msg.at_ns)
            arrived.set()

        totals: list[float] = []
        cut: dict[str, list[float]] = {"api": [], "hand-off": [], "serve": [], "write": []}
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
                get = LinkerdClient(ch, [target], observe=observe)
                task = asyncio.create_task(get.run())
                # Other proxies following the same service: the edit fans out to them too.
                others = [LinkerdClient(ch, [target], i + 1) for i in range(streams)]
                tasks = [asyncio.create_task(o.run()) for o in others]
                await asyncio.wait_for(arrived.wait(), 30)
                for i in range(edits):
                    ips = ["10.9.0.1"] + (["10.9.0.2"] if i % 2 == 0 else [])
                    body = slice_body(ips)
                    arrived.clear()
                    for m in marks.values():
                        m.clear()
                    start = time.monotonic_ns()
                    await asyncio.to_thread(disc.replace_namespaced_endpoint_slice,
                                            "web-a", ns, body)
                    written = time.monotonic_ns()
                    await asyncio.wait_for(arrived.wait(), 30)
                    end = got[-1]
                    totals.append((end - start) / 1e6)
                    if stages and marks["read"] and marks["apply"]:
                        read, applied = marks["read"][0], marks["apply"][0]
                        cut["api"].append((read - start) / 1e6)
                        cut["hand-off"].append((applied - read) / 1e6)
                        cut["serve"].append((end - applied) / 1e6)
                        cut["write"].append((written - start) / 1e6)
                for t in (task, *tasks):
                    t.cancel()
                await asyncio.gather(task, *tasks, return_exceptions=True)
        finally:
            await app.stop(0.2)
            api.close()
    out: dict[str, Any] = {"p50_ms": statistics.median(totals), "max_ms": max(totals),
                           "edits": len(totals)}
    if stages:
        out["stages_p50_ms"] = {k: round(statistics.median(v), 2) for k, v in cut.items() if v}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edits", type=int, default=40)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--stages", action="store_true",
                        help="also cut each edit into api / hand-off / serve")
    parser.add_argument("--streams", type=int, default=0,
                        help="more Get streams on the same service")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs = [asyncio.run(one_run(args.edits, args.stages, args.streams)) for _ in range(args.runs)]
    rows = [row("edit -> first Get stream (kube source, real API server)",
                "p50 over the edits of a run", [r["p50_ms"] for r in runs], "ms",
                target=49.0, edits=args.edits)]
    if args.json:
        print_json("kube_edit", rows, {"runs": runs})
        return
    for i, r in enumerate(runs):
        print(f"run {i + 1}: p50 {r['p50_ms']:.1f} ms, max {r['max_ms']:.1f} ms over "
              f"{r['edits']} edits" + (f"; stages p50 {r['stages_p50_ms']}" if args.stages
                                       else ""))
    print(f"median of the runs: {rows[0]['value']:.1f} ms (Linkerd 2.20: 49 ms)")


if __name__ == "__main__":
    main()
