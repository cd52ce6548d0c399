"""A pod going unready in either cluster of a federated service, to a Linkerd `Get`
stream and to a real Envoy.

    python -m bench.multicluster_follow [--flips 10] [--runs 3] [--json]

Two real kube-apiservers (tests/integration/kubeapi.py, with their watch caches, as
in a real cluster): the local one and a linked one, `east`, each holding a pod of
`foo`; `foo-federated` names both. meshbridge serves the local cluster in this
process, linked to east by its cluster-credentials Secret; a `Get` stream and an
Envoy (ADS delta) follow `foo-federated`. Each flip marks one cluster's pod not ready
(or ready again) by rewriting its EndpointSlice, alternating between the clusters;
the figure is the time from the start of that write to the `Get` stream having the
update, and to Envoy's admin /clusters showing the host's new health (polled every
10 ms, so up to 10 ms late). Median of the flips of one run; the row is the median of
the runs. The target (issue #25) is one second.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import print_json, row

TARGET_MS = 1000.0


async def one_run(flips: int) -> dict[str, list[float]]:
    import grpc

    from linkerd_api.proto import destination_pb2 as dst
    from linkerd_api.translate import address_text
    from testkit.envoy import Envoy, envoy_binary
    from testkit.kubeapi import KubeAPIServer
    from testkit.multicluster import Endpoint, Objects, linked, serving

    binary = envoy_binary()
    got: dict[str, list[float]] = {"get": [], "envoy": []}
    with KubeAPIServer(watch_cache=True) as local_api, \
            KubeAPIServer(watch_cache=True) as east_api:
        ns = f"bench-{uuid.uuid4().hex[:6]}"
        local, east = Objects(local_api, ns), Objects(east_api, ns)
        controller = Objects(local_api)
        for objs, ip in ((local, "10.1.0.1"), (east, "10.2.0.1")):
            objs.service("foo", selector={"app": "foo"})
            objs.pod("foo-0", ip, labels={"app": "foo"}, control_plane_ns=None)
            objs.slice("foo", "foo", [Endpoint("foo-0", ip, "z1")])
        local.service("foo-federated", annotations={
            "multicluster.linkerd.io/remote-discovery": "foo@east",
            "multicluster.linkerd.io/local-discovery": "foo"})
        local.link_secret(controller.ns, "east", east_api)
        target = f"foo-federated.{ns}.svc.cluster.local:80"
        async with serving(local_api, controller.ns) as app:
            await linked(app, "east")
            ready = {"10.1.0.1:8080": True, "10.2.0.1:8080": True}
            seen: dict[str, bool] = {}
            async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
                call = ch.unary_stream(
                    "/io.linkerd.proxy.destination.Destination/Get",
                    request_serializer=dst.GetDestination.SerializeToString,
                    response_deserializer=dst.Update.FromString)(
                    dst.GetDestination(scheme="k8s", path=target))

                async def read() -> None:
                    async for update in call:
                        for a in update.add.addrs:
                            seen[address_text(a.addr)] = True
                        for r in update.remove.addrs:
                            seen[address_text(r)] = False

                reader = asyncio.create_task(read())
                workdir = Path(tempfile.mkdtemp(prefix="bench-envoy-"))
                envoy = Envoy(binary, workdir, app.grpc_port, "DELTA_GRPC") if binary else None
                if envoy is not None:
                    await envoy.start()
                try:
                    await _until(lambda: seen == ready, 30)
                    for flip in range(flips):
                        objs, ip = (local, "10.1.0.1") if flip % 2 == 0 else (east, "10.2.0.1")
                        address = f"{ip}:8080"
                        ready[address] = not ready[address]
                        start = time.monotonic()
                        await asyncio.to_thread(objs.slice, "foo", "foo", [
                            Endpoint("foo-0", ip, "z1", ready=ready[address])])
                        await _until(lambda a=address: seen.get(a, False) == ready[a], 30)
                        got["get"].append((time.monotonic() - start) * 1000)
                        if envoy is not None:
                            await _until_envoy(envoy, target, ip, ready[address], 30)
                            got["envoy"].append((time.monotonic() - start) * 1000)
                finally:
                    reader.cancel()
                    if envoy is not None:
                        await envoy.stop()
        for objs in (local, east, controller):
            objs.close()
    return got


async def _until(check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("the change never arrived")
        await asyncio.sleep(0.002)  # polling the reader's state, under the deadline


async def _until_envoy(envoy: Any, cluster: str, ip: str, healthy: bool,
                       timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        hosts = (await envoy.clusters()).get(cluster, {})
        host = hosts.get((ip, 8080))
        if (host is not None) == healthy:
            return
        if time.monotonic() > deadline:
            raise TimeoutError("Envoy never had the change")
        await asyncio.sleep(0.01)  # polling Envoy's admin, under the deadline


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--flips", type=int, default=10)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    from meshbridge.log import configure_logging

    configure_logging("console", "warning")  # stdout is the JSON
    runs = [asyncio.run(one_run(args.flips)) for _ in range(args.runs)]
    rows = [row("federated service, a pod unready in either cluster",
                f"write to {who} has it (median of {args.flips} flips)",
                [statistics.median(r[key]) for r in runs if r[key]], "ms", TARGET_MS)
            for key, who in (("get", "Linkerd Get"), ("envoy", "Envoy"))]
    details = {"runs": runs}
    if args.json:
        print_json("multicluster_follow", rows, details)
        return
    for r in rows:
        runs_text = ", ".join(f"{v:.0f}" for v in r["runs"])
        print(f"{r['name']}: {r['metric']}: {r['value']:.0f} ms (runs {runs_text})")


if __name__ == "__main__":
    main()
