"""Linkerd `Get` past one cluster, against two real kube-apiservers: the rows of the
test table in docs/multicluster.md ("Tested behaviour") that Linkerd 2.20's destination
controller fixes, field for field, and where meshbridge does better, that.

L is the shared kube-apiserver, R (`east`) a second one; a third cluster (`north`),
where a row needs one, is a folder of manifests linked with `--link north=files:DIR`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from bridge.multicluster.links import Link
from linkerd_api.proto import destination_pb2 as dst
from meshbridge.app import App
from testkit import kubeapi, multicluster
from testkit.kubeapi import KubeAPIServer
from testkit.linkerd import Stream, addrs, by_addr, channel_to, kind
from testkit.multicluster import (
    Endpoint,
    Objects,
    linked,
    mirror_labels,
    serving,
    token,
)
from testkit.polling import eventually

kube_apiserver = kubeapi.kube_apiserver
remote_apiserver = multicluster.remote_apiserver

WAIT = 20.0


@dataclass
class Table:
    """The table's setup: ns/foo in R (port 80 -> http 8080, pods in z1 and z2), a
    node in z1 in L for the client, and a controller namespace of the test's own."""

    local: Objects
    east: Objects
    controller: Objects
    node: str

    @property
    def ns(self) -> str:
        return self.local.ns

    def target(self, name: str, port: int = 80) -> str:
        return f"{name}.{self.ns}.svc.cluster.local:{port}"

    def identity(self, sa: str = "foo", trust_domain: str = "east.local") -> str:
        return (f"{sa}.{self.ns}.serviceaccount.identity.{self.controller.ns}."
                f"{trust_domain}")

    def token(self) -> str:
        return token(self.ns, self.node)

    def foo_in_east(self) -> None:
        cp = self.controller.ns
        self.east.service("foo", selector={"app": "foo"})
        self.east.pod("foo-0", "10.2.0.1", labels={"app": "foo"}, control_plane_ns=cp)
        self.east.pod("foo-1", "10.2.0.2", labels={"app": "foo"}, control_plane_ns=cp)
        self.east.slice("foo-abc", "foo", [Endpoint("foo-0", "10.2.0.1", "z1", hostname="pod-0"),
                                           Endpoint("foo-1", "10.2.0.2", "z2",
                                                    hostname="pod-1")])


@pytest.fixture
def table(kube_apiserver: KubeAPIServer, remote_apiserver: KubeAPIServer) -> Iterator[Table]:
    local = Objects(kube_apiserver)
    t = Table(local, Objects(remote_apiserver, local.ns), Objects(kube_apiserver),
              local.node("z1"))
    t.foo_in_east()
    try:
        yield t
    finally:
        local.delete_nodes()
        for objs in (t.local, t.east, t.controller):
            objs.close()


@contextlib.asynccontextmanager
async def app_linked_to_east(t: Table, remote: KubeAPIServer, kube: KubeAPIServer,
                             **options: object) -> AsyncIterator[tuple[App, grpc.aio.Channel]]:
    """meshbridge linked to east by its Secret, synced, and a channel to it."""
    t.local.link_secret(t.controller.ns, "east", remote)
    async with serving(kube, t.controller.ns, **options) as app:  # type: ignore[arg-type]
        await linked(app, "east")
        async with channel_to(app) as ch:
            yield app, ch


def served(updates: list[dst.Update]) -> set[str]:
    out: set[str] = set()
    for u in updates:
        if kind(u) == "add":
            out |= set(addrs(u))
        elif kind(u) == "remove":
            out -= set(addrs(u))
        elif kind(u) == "no_endpoints":
            out.clear()
    return out


class Follower:
    """Reads one Get stream in the background, keeping every update."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.updates: list[dst.Update] = []
        self.status: grpc.StatusCode | None = None
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for update in self.stream.call:
                self.updates.append(update)
            self.status = await self.stream.call.code()
        except grpc.aio.AioRpcError as e:
            self.status = e.code()

    @property
    def addresses(self) -> set[str]:
        return served(self.updates)

    async def until(self, wanted: set[str], timeout: float = WAIT) -> None:
        await eventually(lambda: self.addresses == wanted, timeout,
                         lambda: f"addresses {sorted(self.addresses)}, wanted "
                                 f"{sorted(wanted)}")

    async def close(self) -> None:
        self.stream.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


# ---------------------------------------------------------------- remote discovery


async def test_row_2_remote_discovery_answers_as_linkerd_does_and_row_8_follows_readiness(
        table: Table, kube_apiserver: KubeAPIServer, remote_apiserver: KubeAPIServer) -> None:
    t = table
    t.local.service("foo-east", labels=mirror_labels("east", "foo"))
    async with app_linked_to_east(t, remote_apiserver, kube_apiserver) as (_app, ch):
        get = Follower(Stream(ch, "Get", t.target("foo-east"), t.token()))
        await get.until({"10.2.0.1:8080", "10.2.0.2:8080"})
        (add,) = get.updates
        assert dict(add.add.metric_labels) == {"service": "foo", "namespace": t.ns}
        addresses = by_addr(add)
        for address, zone, locality in (("10.2.0.1:8080", "z1", "local"),
                                        ("10.2.0.2:8080", "z2", "remote")):
            wa = addresses[address]
            assert wa.tls_identity.dns_like_identity.name == t.identity()
            assert wa.tls_identity.server_name.name == t.identity()
            assert wa.protocol_hint.WhichOneof("protocol") == "h2"
            assert wa.protocol_hint.opaque_transport.inbound_port == 4143
            assert wa.weight == 10000
            assert wa.metric_labels["zone"] == zone
            assert wa.metric_labels["zone_locality"] == locality
            assert wa.metric_labels["serviceaccount"] == "foo"
        # Row 8: a pod of R goes NotReady: a Remove for that address.
        t.east.slice("foo-abc", "foo", [Endpoint("foo-0", "10.2.0.1", "z1"),
                                        Endpoint("foo-1", "10.2.0.2", "z2", ready=False)])
        await get.until({"10.2.0.1:8080"})
        assert kind(get.updates[-1]) == "remove"
        assert addrs(get.updates[-1]) == ["10.2.0.2:8080"]
        # The remote Service goes: its addresses go, the stream stays (as in 2.20).
        t.east.delete_service("foo")
        await get.until(set())
        assert get.status is None
        await get.close()


async def test_rows_3_4_5_12_a_remote_discovery_target_that_cannot_be_served_is_refused(
        table: Table, kube_apiserver: KubeAPIServer, remote_apiserver: KubeAPIServer) -> None:
    t = table
    t.local.service("foo-east", labels={"multicluster.linkerd.io/remote-discovery": "east"})
    t.local.service("foo-west", labels=mirror_labels("west", "foo"))
    t.local.service("bar-east", labels=mirror_labels("east", "bar"))
    t.east.service("bar", spec={"type": "ExternalName", "externalName": "bar.example.com"},
                   ports=())
    # Row 5: west's Secret lacks its trust-domain annotation: west is not linked.
    t.local.link_secret(t.controller.ns, "west", remote_apiserver,
                        omit=("multicluster.linkerd.io/trust-domain",))
    async with app_linked_to_east(t, remote_apiserver, kube_apiserver) as (app, ch):
        code, details = await Stream(ch, "Get", t.target("foo-east")).error()
        assert code == grpc.StatusCode.FAILED_PRECONDITION  # row 3
        assert "remote-service" in details
        code, details = await Stream(ch, "Get", t.target("foo-west")).error()
        assert (code, details) == (grpc.StatusCode.NOT_FOUND,  # rows 4, 5
                                   "Remote cluster not found: west")
        await eventually(lambda: "bar" in {
            s.name for s in app.clusters.get("east").cluster.services}, WAIT)  # type: ignore[union-attr]
        code, _ = await Stream(ch, "Get", t.target("bar-east")).error()
        assert code == grpc.StatusCode.INVALID_ARGUMENT  # row 12


async def test_rows_9_10_11_remote_endpoints_are_not_filtered_but_hostnames_and_identity(
        table: Table, kube_apiserver: KubeAPIServer, remote_apiserver: KubeAPIServer) -> None:
    t = table
    # Row 9: hints for z9 only, internalTrafficPolicy Local: both still sent.
    t.east.service("foo", selector={"app": "foo"}, spec={"internalTrafficPolicy": "Local"})
    t.east.slice("foo-abc", "foo", [Endpoint("foo-0", "10.2.0.1", "z1", hostname="pod-0"),
                                    Endpoint("foo-1", "10.2.0.2", "z2", hostname="pod-1")],
                 hints=["z9"])
    # Row 11: a pod of another control plane: a hint, no identity.
    t.east.pod("foo-2", "10.2.0.3", labels={"app": "foo"}, control_plane_ns="other")
    t.east.slice("foo-other", "foo", [Endpoint("foo-2", "10.2.0.3", "z1")])
    t.local.service("foo-east", labels=mirror_labels("east", "foo"))
    async with app_linked_to_east(t, remote_apiserver, kube_apiserver) as (_app, ch):
        get = Follower(Stream(ch, "Get", t.target("foo-east"), t.token()))
        await get.until({"10.2.0.1:8080", "10.2.0.2:8080", "10.2.0.3:8080"})
        other = {a: wa for u in get.updates if kind(u) == "add"
                 for a, wa in by_addr(u).items()}["10.2.0.3:8080"]
        assert not other.HasField("tls_identity")
        assert other.HasField("protocol_hint")
        # Row 10: one StatefulSet pod by its hostname.
        pod = Follower(Stream(ch, "Get", f"pod-0.{t.target('foo-east')}", t.token()))
        await pod.until({"10.2.0.1:8080"})
        for f in (get, pod):
            await f.close()


# ---------------------------------------------------------------- federated


async def test_rows_13_14_15_16_a_federated_stream_is_the_union_and_follows_its_members(
        table: Table, kube_apiserver: KubeAPIServer, remote_apiserver: KubeAPIServer,
        tmp_path: Path) -> None:
    t = table
    north = tmp_path / "north"
    north.mkdir()
    (north / "foo.yaml").write_text(NORTH.format(ns=t.ns))
    t.local.service("foo", selector={"app": "foo"})
    t.local.pod("foo-l", "10.1.0.1", labels={"app": "foo"}, control_plane_ns=t.controller.ns)
    t.local.slice("foo-l", "foo", [Endpoint("foo-l", "10.1.0.1", "z1")])
    # Row 16: the remote-discovery label too; the federated annotations win.
    t.local.service("foo-federated", labels=mirror_labels("east", "foo"), annotations={
        "multicluster.linkerd.io/remote-discovery": "foo@east,foo@north",
        "multicluster.linkerd.io/local-discovery": "foo"})
    async with app_linked_to_east(t, remote_apiserver, kube_apiserver) as (app, ch):
        # Row 15: north is not linked yet: the stream has L and east.
        fed = Follower(Stream(ch, "Get", t.target("foo-federated"), t.token()))
        await fed.until({"10.1.0.1:8080", "10.2.0.1:8080", "10.2.0.2:8080"})
        # The local member's identity is the local trust domain, east's its own.
        idents = {a: wa.tls_identity.dns_like_identity.name for u in fed.updates
                  if kind(u) == "add" for a, wa in by_addr(u).items()}
        assert idents["10.1.0.1:8080"] == t.identity(trust_domain="cluster.local")
        assert idents["10.2.0.1:8080"] == t.identity()
        # Linked now: the open stream gets north too (Linkerd 2.20 would not).
        app.clusters.set_flag_links([Link("north", "cluster.local", "north.local",
                                          "--link north", dev_source=f"files:{north}")])
        await fed.until({"10.1.0.1:8080", "10.2.0.1:8080", "10.2.0.2:8080",
                         "10.3.0.1:8080"})
        # Row 14: north leaves the annotation: a Remove for its addresses.
        t.local.service("foo-federated", annotations={
            "multicluster.linkerd.io/remote-discovery": "foo@east",
            "multicluster.linkerd.io/local-discovery": "foo"})
        await fed.until({"10.1.0.1:8080", "10.2.0.1:8080", "10.2.0.2:8080"})
        assert (kind(fed.updates[-1]), addrs(fed.updates[-1])) == ("remove",
                                                                   ["10.3.0.1:8080"])
        # A pod going unready in either cluster leaves the stream.
        t.local.slice("foo-l", "foo", [Endpoint("foo-l", "10.1.0.1", "z1", ready=False)])
        t.east.slice("foo-abc", "foo", [Endpoint("foo-0", "10.2.0.1", "z1")])
        await fed.until({"10.2.0.1:8080"})
        # The federated Service goes: the stream ends, OK.
        t.local.delete_service("foo-federated")
        await eventually(lambda: fed.status is not None, WAIT)
        assert fed.status == grpc.StatusCode.OK


NORTH = """\
apiVersion: v1
kind: Service
metadata: {{name: foo, namespace: {ns}}}
spec:
  selector: {{app: foo}}
  ports: [{{name: http, port: 80, targetPort: 8080}}]
---
apiVersion: v1
kind: Pod
metadata: {{name: foo-0, namespace: {ns}, labels: {{app: foo}}}}
spec: {{containers: [{{name: app, image: app}}]}}
status: {{podIP: 10.3.0.1, podIPs: [{{ip: 10.3.0.1}}]}}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: foo-n, namespace: {ns}, labels: {{kubernetes.io/service-name: foo}}}}
addressType: IPv4
ports: [{{name: http, port: 8080}}]
endpoints:
- {{addresses: [10.3.0.1], conditions: {{ready: true}}, zone: z3,
   targetRef: {{kind: Pod, name: foo-0, namespace: {ns}}}}}
"""


# ---------------------------------------------------------------- unlinking, profiles


@pytest.mark.parametrize("semantics", ["proto", "linkerd-2.20"])
async def test_row_7_deleting_the_secret_removes_east_from_open_streams_unless_2_20(
        table: Table, kube_apiserver: KubeAPIServer, remote_apiserver: KubeAPIServer,
        semantics: str) -> None:
    t = table
    t.local.service("foo-east", labels=mirror_labels("east", "foo"))
    async with app_linked_to_east(t, remote_apiserver, kube_apiserver,
                                  semantics=semantics) as (app, ch):
        get = Follower(Stream(ch, "Get", t.target("foo-east"), t.token()))
        await get.until({"10.2.0.1:8080", "10.2.0.2:8080"})
        t.local.delete_secret(t.controller.ns, "cluster-credentials-east")
        await eventually(lambda: app.clusters.get("east") is None, WAIT)
        # A new Get: the cluster is not found (both semantics).
        code, details = await Stream(ch, "Get", t.target("foo-east")).error()
        assert (code, details) == (grpc.StatusCode.NOT_FOUND,
                                   "Remote cluster not found: east")
        if semantics == "proto":
            await get.until(set())
        else:  # Linkerd 2.20: the open stream keeps what it had, and hears nothing
            assert get.addresses == {"10.2.0.1:8080", "10.2.0.2:8080"}
            assert len(get.updates) == 1
        await get.close()


async def test_row_17_a_mirrors_cluster_ip_gets_its_profile_with_its_opaque_ports(
        table: Table, kube_apiserver: KubeAPIServer, remote_apiserver: KubeAPIServer) -> None:
    t = table
    t.local.service("foo-east", labels=mirror_labels("east", "foo"),
                    annotations={"config.linkerd.io/opaque-ports": "80"})
    ip = t.local.core.read_namespaced_service("foo-east", t.ns).spec.cluster_ip
    async with app_linked_to_east(t, remote_apiserver, kube_apiserver) as (_app, ch):
        profile = await Stream(ch, "GetProfile", f"{ip}:80", t.token()).next()
        assert profile.fully_qualified_name == f"foo-east.{t.ns}.svc.cluster.local"
        assert profile.opaque_protocol


async def test_row_18_an_unreachable_linked_cluster_keeps_its_addresses_and_resumes_quietly(
        table: Table, kube_apiserver: KubeAPIServer, remote_apiserver: KubeAPIServer) -> None:
    t = table
    t.local.service("foo-east", labels=mirror_labels("east", "foo"))
    async with app_linked_to_east(t, remote_apiserver, kube_apiserver) as (app, ch):
        get = Follower(Stream(ch, "Get", t.target("foo-east"), t.token()))
        await get.until({"10.2.0.1:8080", "10.2.0.2:8080"})
        lc = app.clusters.get("east")
        assert lc is not None
        remote_apiserver.stop_apiserver(kill=True)
        try:
            await eventually(lambda: lc.state == "stale", WAIT)
            clusters = await asyncio.to_thread(_debug_clusters, app)
            assert clusters[0]["state"] == "stale"
        finally:
            remote_apiserver.start_apiserver()
        await eventually(lambda: lc.state == "synced", 60.0)
        assert get.addresses == {"10.2.0.1:8080", "10.2.0.2:8080"}
        assert len(get.updates) == 1  # no remove, no empty answer, no resend
        await get.close()


def _debug_clusters(app: App) -> list[dict[str, object]]:
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{app.admin_port}/debug/clusters",
                                timeout=10) as resp:
        data: list[dict[str, object]] = json.load(resp)
        return data
