"""`meshbridge serve --source kube` as a process on a real kube-apiserver: its watches
open before the rest of the server is imported and built (meshbridge.cli's
early_kube_source), so the state they read first waits for the Cluster; what it serves
once ready is that state, and a change made after start follows. The Objects
fixtures of test_kube_source."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from testkit.kubeapi import KubeAPIServer
from testkit.net import free_port, ready
from testkit.polling import eventually_sync
from testkit.processes import running, stop
from testkit.serving import workers_flag
from tests.integration import test_kube_source as kube
from tests.integration.test_kube_source import WAIT, Objects

kube_apiserver = kube.kube_apiserver
api = kube.api
objs = kube.objs


def eds_addresses(grpc_port: int, cluster: str) -> set[str]:
    """The endpoints' addresses of one EDS answer (`meshbridge xds`, a real ADS client)."""
    got = subprocess.run(
        [sys.executable, "-m", "meshbridge.cli", "xds", cluster, "--server",
         f"127.0.0.1:{grpc_port}", "--json", "--count", "1", "--timeout", "60"],
        capture_output=True, text=True, timeout=90, check=False)
    assert got.returncode == 0, got.stderr
    found: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("address"), str):
                found.add(node["address"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for line in got.stdout.splitlines():
        walk(json.loads(line))
    return found


def test_serve_answers_with_the_state_read_before_it_was_built_and_follows_changes(
        objs: Objects, kube_apiserver: KubeAPIServer) -> None:
    node = objs.node("zone-a")
    objs.pod("web-1", "10.1.0.1", node)
    objs.pod("web-2", "10.1.0.2", node)
    objs.service()
    objs.put_slice("web-a", [("web-1", "10.1.0.1")])
    grpc_port, admin_port = free_port(), free_port()
    with running([sys.executable, "-m", "meshbridge.cli", "serve", "--source", "kube",
                  "--kubeconfig", str(kube_apiserver.kubeconfig_path),
                  "--listen", f"127.0.0.1:{grpc_port}", "--admin", f"127.0.0.1:{admin_port}",
                  "--log-format", "json", *workers_flag()], lambda: ready(admin_port),
                 "/ready never answered 200", timeout=120, stdout=subprocess.PIPE,
                 stderr=subprocess.STDOUT, text=True,
                 env={**os.environ, "PYTHONUNBUFFERED": "1"}) as proc:
        cluster = f"web.{objs.ns}.svc.cluster.local:80"
        assert eds_addresses(grpc_port, cluster) == {"10.1.0.1"}
        objs.put_slice("web-a", [("web-1", "10.1.0.1"), ("web-2", "10.1.0.2")])
        eventually_sync(lambda: eds_addresses(grpc_port, cluster) == {"10.1.0.1", "10.1.0.2"},
                        WAIT)
        out = stop(proc)
    assert proc.returncode == 0, out
    # The watches were read before the Cluster existed, then applied as one change.
    assert "initial list applied" in out
