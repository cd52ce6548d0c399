"""Support for the shadow tests (no tests here): running `meshbridge shadow` in-process
against two Apps, planting differences in a manifest folder (the files source picks an
edit up within 50 ms), and an xDS relay that plants one in every answer."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
from envoy.config.endpoint.v3 import endpoint_pb2
from envoy.service.discovery.v3 import discovery_pb2

from harness.clients import ADS_SOTW, EDS_TYPE
from harness.shadow.cli import add_arguments, run_shadow
from meshbridge.app import App
from testkit.linkerd import read_docs, write_docs
from testkit.polling import HANG, eventually

DOMAIN = "svc.cluster.local"
WEB = f"web.emojivoto.{DOMAIN}:80"
BILLING = f"billing.legacy.{DOMAIN}:80"
CACHE = f"cache.shop.{DOMAIN}:6379"
CATALOG = f"catalog.shop.{DOMAIN}:80"
PAYMENTS = f"payments.shop.{DOMAIN}:8080"
REPORTS = f"reports.legacy.{DOMAIN}:8080"
MAIL = f"mail.legacy.{DOMAIN}:25"
NOSUCH = f"nosuch.shop.{DOMAIN}:80"
VOTING = f"voting.emojivoto.{DOMAIN}:8080"
CANARY = f"web-canary.emojivoto.{DOMAIN}:80"
DB = f"db.data.{DOMAIN}:5432"
DB_PODS = [f"db-{i}.{DB}" for i in range(3)]

IDENTITY = "{sa}.emojivoto.serviceaccount.identity.linkerd.cluster.local"
PLANTED_POD = "web-5d8f7b9c6-4xk2p"
EXTRA_ADDRESS = "10.0.5.21"


def edit(folder: Path, filename: str, change: Callable[[list[dict[str, Any]]], None]) -> None:
    path = folder / filename
    docs = read_docs(path)
    change(docs)
    write_docs(path, docs)


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for d in docs:
        if d.get("kind") == kind and d["metadata"]["name"] == name:
            return d
    raise LookupError(f"{kind} {name}")


def plant_in_pod(folder: Path, filename: str, name: str,
                 change: Callable[[dict[str, Any]], None]) -> str:
    """`change` one pod; returns its address (port 8080)."""
    found: list[str] = []

    def change_pod(docs: list[dict[str, Any]]) -> None:
        pod = find(docs, "Pod", name)
        change(pod)
        found.append(pod["status"]["podIP"])

    edit(folder, filename, change_pod)
    return f"{found[0]}:8080"


def plant_identity(folder: Path) -> str:
    """One web pod runs as another ServiceAccount; returns its address."""
    def change(pod: dict[str, Any]) -> None:
        pod["spec"]["serviceAccountName"] = "web-v2"

    return plant_in_pod(folder, "10-emojivoto.yaml", PLANTED_POD, change)


def plant_extra_endpoint(folder: Path) -> str:
    """billing gets a second VM address."""
    def change(docs: list[dict[str, Any]]) -> None:
        s = find(docs, "EndpointSlice", "billing-vm")
        s["endpoints"].append({"addresses": [EXTRA_ADDRESS],
                               "conditions": {"ready": True, "serving": True,
                                              "terminating": False}})

    edit(folder, "40-legacy.yaml", change)
    return f"{EXTRA_ADDRESS}:8080"


def plant_missing_service(folder: Path) -> None:
    """The cache Service is gone (its pods and slices stay)."""
    def change(docs: list[dict[str, Any]]) -> None:
        docs.remove(find(docs, "Service", "cache"))

    edit(folder, "20-shop.yaml", change)


def plant_external_name(folder: Path) -> None:
    """billing becomes an ExternalName Service, which both APIs refuse to resolve."""
    def change(docs: list[dict[str, Any]]) -> None:
        spec = find(docs, "Service", "billing")["spec"]
        for key in ("clusterIP", "clusterIPs", "selector", "ipFamilies", "ipFamilyPolicy",
                    "internalTrafficPolicy", "sessionAffinity"):
            spec.pop(key, None)
        spec["type"] = "ExternalName"
        spec["externalName"] = "billing.example.com"

    edit(folder, "40-legacy.yaml", change)


def plant_pod_label(folder: Path) -> str:
    """A voting pod's pod-template-hash label (its `pod_template_hash` metric label)."""
    def change(pod: dict[str, Any]) -> None:
        pod["metadata"]["labels"]["pod-template-hash"] = "planted"

    return plant_in_pod(folder, "10-emojivoto.yaml", "voting-7f5c6d9b8-bx4fw", change)


def plant_opaque_annotation(folder: Path) -> str:
    """A catalog pod's opaque-ports annotation names its http port (its protocol hint)."""
    def change(pod: dict[str, Any]) -> None:
        pod["metadata"]["annotations"]["config.linkerd.io/opaque-ports"] = "8080"

    return plant_in_pod(folder, "20-shop.yaml", "catalog-8d6f9c7b5-fk2wz", change)


def plant_slice_label(folder: Path) -> None:
    """web-canary's slice says it mirrors cluster `east` (the set's `target_cluster`)."""
    def change(docs: list[dict[str, Any]]) -> None:
        find(docs, "EndpointSlice", "web-canary-bl2nw")["metadata"]["labels"][
            "mirror.linkerd.io/cluster-name"] = "east"

    edit(folder, "10-emojivoto.yaml", change)


def plant_authority_override(folder: Path) -> str:
    """The billing VM's slice names a remote service (the VM's authority override)."""
    def change(docs: list[dict[str, Any]]) -> None:
        meta = find(docs, "EndpointSlice", "billing-vm")["metadata"]
        meta.setdefault("annotations", {})[
            "mirror.linkerd.io/remote-svc-fq-name"] = "billing.legacy.svc.east.example"

    edit(folder, "40-legacy.yaml", change)
    return "10.0.5.20:8080"


def plant_profile(folder: Path) -> None:
    """web's ServiceProfile: another retry ratio and its first route another timeout."""
    def change(docs: list[dict[str, Any]]) -> None:
        spec = find(docs, "ServiceProfile", f"web.emojivoto.{DOMAIN}")["spec"]
        spec["retryBudget"]["retryRatio"] = 0.5
        spec["routes"][0]["timeout"] = "1s"

    edit(folder, "10-emojivoto.yaml", change)


def plant_override_weight(folder: Path) -> None:
    """web's ServiceProfile sends 20% to web-canary, not 10%: every route of the
    profile carries the split (Routes §7.4)."""
    def change(docs: list[dict[str, Any]]) -> None:
        spec = find(docs, "ServiceProfile", f"web.emojivoto.{DOMAIN}")["spec"]
        spec["dstOverrides"][1]["weight"] = "200m"

    edit(folder, "10-emojivoto.yaml", change)


def plant_zone(folder: Path) -> str:
    """A web endpoint's slice says another zone (the xDS locality)."""
    found: list[str] = []

    def change(docs: list[dict[str, Any]]) -> None:
        for ep in find(docs, "EndpointSlice", "web-7xk9q")["endpoints"]:
            if ep["conditions"].get("ready", True):
                ep["zone"] = "zone-x"
                found.append(ep["addresses"][0])
                return

    edit(folder, "10-emojivoto.yaml", change)
    return f"{found[0]}:8080"


def restore(folder: Path, original: Path, filename: str) -> None:
    tmp = folder / (filename + ".tmp")
    shutil.copyfile(original / filename, tmp)
    tmp.replace(folder / filename)


class ShadowRun:
    """`meshbridge shadow ... --json` as a task; its events as they arrive."""

    def __init__(self, *argv: str) -> None:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        self.args = parser.parse_args(["--json", "--grace", "0.3", "--settle", "0.6",
                                       "--retry-max", "0.3", *argv])
        self.out = io.StringIO()
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(run_shadow(self.args, self.out, self.stop))

    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.getvalue().splitlines()]

    def events(self, target: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.lines() if e["event"] == "target"
                and (target is None or e["target"] == target)]

    def agreed(self, target: str) -> list[dict[str, Any]]:
        return [e for e in self.events(target) if e["status"] == "equal"]

    def latest(self) -> dict[str, dict[str, Any]]:
        return {e["target"]: e for e in self.events()}

    def targets(self) -> int:
        starts = [e for e in self.lines() if e["event"] == "start"]
        return int(starts[0]["targets"]) if starts else -1

    def settled(self) -> dict[str, dict[str, Any]] | None:
        """Every target's latest event once each has a final-looking status."""
        latest = self.latest()
        # Targets may join after the start (--all: services created, pod authorities).
        if len(latest) < self.targets() or any(
                e["status"] in ("pending", "converging") for e in latest.values()):
            return None
        return latest

    async def until(self, check: Callable[[], Any], what: str, timeout: float = HANG) -> Any:
        """What `check()` returned once truthy; fails at once if shadow ends first."""
        result: Any = None

        def holds() -> bool:
            nonlocal result
            if self.task.done():
                raise AssertionError(f"shadow ended ({self.task.result()}) before: {what}")
            result = check()
            return bool(result)

        def why() -> str:
            shown = {t: (e["status"], e.get("differences")) for t, e in self.latest().items()}
            return f"timed out waiting for: {what}; latest: {shown}"

        await eventually(holds, timeout, why, period=0.05)
        return result

    async def finish(self) -> tuple[int, dict[str, Any]]:
        self.stop.set()
        rc = await asyncio.wait_for(self.task, HANG)
        summary = self.lines()[-1]
        assert summary["event"] == "summary"
        return rc, summary


def fields_of(diffs: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """The field differences of an event: path -> (ours, theirs)."""
    return {d["field"]: (d["ours"], d["theirs"]) for d in diffs if d["kind"] == "field"}


def non_equal(latest: dict[str, dict[str, Any]]) -> dict[str, tuple[str, list[Any]]]:
    return {t: (e["status"], e.get("differences", [])) for t, e in latest.items()
            if e["status"] != "equal"}


def addr(app: App) -> str:
    """An in-process meshbridge's gRPC address."""
    return f"127.0.0.1:{app.grpc_port}"


def copy(folder: Path, to: Path) -> Path:
    """A copy of a manifest folder, for the other side to differ from."""
    shutil.copytree(folder, to)
    return to


@contextlib.asynccontextmanager
async def grpc_peer(service: str, handlers: dict[str, grpc.RpcMethodHandler]
                    ) -> AsyncIterator[str]:
    """A grpc.aio server on loopback with `handlers` for `service`: its address."""
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0.2)


@contextlib.asynccontextmanager
async def rewriting(upstream: str,
                    change: Callable[[endpoint_pb2.ClusterLoadAssignment], None]
                    ) -> AsyncIterator[str]:
    """A real xDS peer with a planted difference: SotW ADS passed through to `upstream`
    (a meshbridge), every ClusterLoadAssignment changed by `change` on the way."""
    channel = grpc.aio.insecure_channel(upstream)

    async def ads(requests: AsyncIterator[bytes],
                  _context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for raw in channel.stream_stream(ADS_SOTW)(requests):
            resp = discovery_pb2.DiscoveryResponse.FromString(raw)
            for any_ in resp.resources:
                if any_.type_url == EDS_TYPE:
                    cla = endpoint_pb2.ClusterLoadAssignment.FromString(any_.value)
                    change(cla)
                    any_.value = cla.SerializeToString()
            yield resp.SerializeToString()

    try:
        async with grpc_peer("envoy.service.discovery.v3.AggregatedDiscoveryService", {
                "StreamAggregatedResources": grpc.stream_stream_rpc_method_handler(ads)}
                ) as address:
            yield address
    finally:
        await channel.close()
