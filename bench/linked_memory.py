"""What a linked cluster costs: memory grows with what is served from it, not its size.

    python -m bench.linked_memory [--pods 10000] [--served 100] [--runs 3] [--json]

A real kube-apiserver (with its watch cache, as in a real cluster) plays the linked
cluster. It first holds only the served pods (`--served`, behind five services that
local mirror Services want), then as many more pods (and their services and slices)
as make `--pods` in all, spread over the served namespace and four others. Each
reading is a fresh process that links the cluster, waits until its watches have
listed, and reports how much its resident memory grew (after a full collection):

    scoped      meshbridge's linked-cluster watches (bridge/multicluster/remote.py),
                wanting the five services;
    everything  every Pod, Service, EndpointSlice, ReplicaSet and Server of the
                cluster cached, as Linkerd 2.20's destination controller does for each
                linked cluster (the same watcher code, told to watch all of it).

The figure is the difference between the big and the small cluster, median of the
runs; the target (issue #25) is 10 MiB for the scoped watches.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.common import print_json, row
from testkit.processes import rss_kib

SERVED_NS = "shop"
OTHER_NAMESPACES = ("ads", "billing", "search", "media")
SERVED_SERVICES = 5
PODS_PER_SERVICE = 20
TARGET_MIB = 10.0
MODES = ("scoped", "everything")


# ---------------------------------------------------------------------- the cluster


def _pod(ns: str, name: str, app: str, ip: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    labels = {"app": app, "linkerd.io/control-plane-ns": "linkerd",
              "pod-template-hash": "5d8f7c"}
    body = {"metadata": {"name": name, "labels": labels,
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                              "name": f"{app}-5d8f7c", "uid": "u" * 8}]},
            "spec": {"serviceAccountName": app, "containers": [
                {"name": "app", "image": "app", "ports": [{"name": "http",
                                                            "containerPort": 8080}]},
                {"name": "linkerd-proxy", "image": "proxy", "env": [
                    {"name": "LINKERD2_PROXY_INBOUND_LISTEN_ADDR", "value": "0.0.0.0:4143"},
                    {"name": "LINKERD2_PROXY_ADMIN_LISTEN_ADDR", "value": "0.0.0.0:4191"},
                    {"name": "LINKERD2_PROXY_CONTROL_LISTEN_ADDR",
                     "value": "0.0.0.0:4190"}]}]}}
    status = {"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}
    return ns, body, status


def populate(api: Any, ns: str, services: list[str], first_ip: int) -> int:
    """Services of PODS_PER_SERVICE pods each, with their slices; the next free IP."""
    from kubernetes import client

    core, discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)
    ip = first_ip
    pods: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    slices = []
    for svc in services:
        core.create_namespaced_service(ns, {
            "metadata": {"name": svc},
            "spec": {"selector": {"app": svc},
                     "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
        endpoints = []
        for i in range(PODS_PER_SERVICE):
            address = f"10.{(ip >> 16) & 255}.{(ip >> 8) & 255}.{ip & 255}"
            ip += 1
            pods.append(_pod(ns, f"{svc}-{i}", svc, address))
            endpoints.append({"addresses": [address], "conditions": {"ready": True},
                              "zone": f"zone-{i % 3}",
                              "targetRef": {"kind": "Pod", "name": f"{svc}-{i}",
                                            "namespace": ns}})
        slices.append({"metadata": {"name": f"{svc}-a",
                                    "labels": {"kubernetes.io/service-name": svc}},
                       "addressType": "IPv4",
                       "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                       "endpoints": endpoints})

    def create_pod(item: tuple[str, dict[str, Any], dict[str, Any]]) -> None:
        pod_ns, body, status = item
        core.create_namespaced_pod(pod_ns, body)
        core.patch_namespaced_pod_status(body["metadata"]["name"], pod_ns, status)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create_pod, pods))
        list(pool.map(lambda s: discovery.create_namespaced_endpoint_slice(ns, s), slices))
    return ip


# ---------------------------------------------------------------------- one reading


async def _reading(mode: str, kubeconfig: str, wanted: list[str]) -> dict[str, Any]:
    from bridge.cluster import Cluster
    from bridge.model import ServiceKey
    from bridge.multicluster.links import Link, link_credentials
    from bridge.multicluster.remote import REMOTE_KINDS, RemoteKubeSource
    from bridge.sources.kube import KINDS, KubeSource

    with open(kubeconfig, "rb") as f:
        creds = link_credentials(Link("east", "cluster.local", "east.local", "bench",
                                      f.read()))
    cluster = Cluster()
    gc.collect()
    before = rss_kib()
    synced = asyncio.Event()
    source: Any
    if mode == "scoped":
        source = RemoteKubeSource("east", creds, lambda _c, _d: None)
        source.want(ServiceKey(*w.split("/", 1)) for w in wanted)
    else:
        source = KubeSource(credentials=creds, kinds=[KINDS[k] for k in REMOTE_KINDS])
    task = asyncio.create_task(source.run(cluster, synced))
    await asyncio.wait_for(synced.wait(), 600)
    gc.collect()
    after = rss_kib()
    counts = {k: len(cluster.objects(k)) for k in REMOTE_KINDS}
    task.cancel()
    return {"mode": mode, "kib": after - before, "objects": counts}


def reading(mode: str, kubeconfig: str, wanted: list[str]) -> dict[str, Any]:
    """One reading in a fresh process (so nothing of an earlier one stays resident)."""
    proc = subprocess.run(
        [sys.executable, "-m", "bench.linked_memory", "--child", mode, "--kubeconfig",
         kubeconfig, "--wanted", ",".join(wanted)],
        stdout=subprocess.PIPE, text=True, check=True)
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


# ---------------------------------------------------------------------- the run


def run(pods: int, served: int, runs: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    from kubernetes import client, config

    from testkit.kubeapi import KubeAPIServer

    per_service = PODS_PER_SERVICE
    served_services = [f"svc-{i}" for i in range(max(1, served // per_service))]
    wanted = [f"{SERVED_NS}/{s}" for s in served_services]
    readings: dict[str, dict[str, list[dict[str, Any]]]] = {"small": {}, "big": {}}
    with KubeAPIServer(watch_cache=True) as server:
        api = config.new_client_from_config(str(server.kubeconfig_path))
        core = client.CoreV1Api(api)
        for ns in (SERVED_NS, *OTHER_NAMESPACES):
            core.create_namespace({"metadata": {"name": ns}})
        ip = populate(api, SERVED_NS, served_services, 1)
        kubeconfig = str(server.kubeconfig_path)
        for _ in range(runs):
            for mode in MODES:
                readings["small"].setdefault(mode, []).append(
                    reading(mode, kubeconfig, wanted))
        # The rest of the cluster: a fifth of it beside the served services (other
        # labels, same namespace), the rest in other namespaces.
        rest = (pods - len(served_services) * per_service) // per_service
        namespaces = [SERVED_NS, *OTHER_NAMESPACES]
        for n in range(rest):
            ns = namespaces[n % len(namespaces)]
            ip = populate(api, ns, [f"other-{n}"], ip)
        for _ in range(runs):
            for mode in MODES:
                readings["big"].setdefault(mode, []).append(reading(mode, kubeconfig, wanted))
        total = sum(1 for ns in namespaces for _ in core.list_namespaced_pod(ns).items)
        api.close()
    rows = []
    details: dict[str, Any] = {"pods": total, "served_pods": len(served_services) * per_service,
                               "readings": readings}
    for mode in MODES:
        small = [r["kib"] / 1024 for r in readings["small"][mode]]
        big = [r["kib"] / 1024 for r in readings["big"][mode]]
        growth = [b - statistics.median(small) for b in big]
        name = ("linked cluster, meshbridge's scoped watches" if mode == "scoped"
                else "linked cluster, everything cached (as Linkerd 2.20)")
        rows.append(row(name, f"memory growth from {details['served_pods']} to {total:,} "
                              "pods", growth, "MiB",
                        TARGET_MIB if mode == "scoped" else None))
        details[f"{mode}_small_mib"] = statistics.median(small)
        details[f"{mode}_big_mib"] = statistics.median(big)
    return rows, details


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pods", type=int, default=10_000)
    p.add_argument("--served", type=int, default=100)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    p.add_argument("--wanted", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    from meshbridge.log import configure_logging

    configure_logging("console", "warning")  # stdout is the JSON
    if args.child:
        result = asyncio.run(_reading(args.child, args.kubeconfig,
                                      [w for w in args.wanted.split(",") if w]))
        print(json.dumps(result))
        sys.exit(0)
    rows, details = run(args.pods, args.served, args.runs)
    if args.json:
        print_json("linked_memory", rows, details)
        return
    for r in rows:
        runs = ", ".join(f"{v:.1f}" for v in r["runs"])
        print(f"{r['name']}: {r['value']:.1f} MiB (runs {runs})")
    for mode in MODES:
        print(f"  {mode}: {details[f'{mode}_small_mib']:.1f} MiB with "
              f"{details['served_pods']} pods, {details[f'{mode}_big_mib']:.1f} MiB with "
              f"{details['pods']:,}")


if __name__ == "__main__":
    main()
