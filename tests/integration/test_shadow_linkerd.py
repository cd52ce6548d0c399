"""`meshbridge shadow --api linkerd`.

First against scripted destination servers (each authority gets a fixed script of
updates or a status), which pins down how each documented semantics is read; then
between two meshbridge instances fed from folders with planted differences (these
need the Linkerd layer, `linkerd_api.service`)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import AsyncIterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeAlias

import grpc
import pytest

from bridge.model import MeshConfig, ServiceKey
from linkerd_api.endpoint_streams import Semantics
from linkerd_api.proto import destination_pb2
from linkerd_api.service import LinkerdOptions
from meshbridge.layers import layer
from testkit.net import free_port
from tests.conftest import AppFactory
from tests.integration.shadow_support import (
    BILLING,
    CACHE,
    CATALOG,
    DB_PODS,
    IDENTITY,
    MAIL,
    NOSUCH,
    PAYMENTS,
    REPORTS,
    WEB,
    ShadowRun,
    addr,
    copy,
    fields_of,
    grpc_peer,
    non_equal,
    plant_external_name,
    plant_extra_endpoint,
    plant_identity,
    plant_missing_service,
    plant_override_weight,
    restore,
)

pytestmark = pytest.mark.timeout(120)

# ---------------------------------------------------------------------- scripted


def add(*ips: str, identity: str = "") -> destination_pb2.Update:
    u = destination_pb2.Update()
    for ip in ips:
        wa = u.add.addrs.add()
        wa.addr.ip.ipv4 = int(ipaddress.IPv4Address(ip))
        wa.addr.port = 8080
        wa.weight = 10000
        if identity:
            wa.tls_identity.dns_like_identity.name = identity
    return u


def remove(*ips: str) -> destination_pb2.Update:
    u = destination_pb2.Update()
    for ip in ips:
        a = u.remove.addrs.add()
        a.ip.ipv4 = int(ipaddress.IPv4Address(ip))
        a.port = 8080
    return u


def no_endpoints(exists: bool) -> destination_pb2.Update:
    u = destination_pb2.Update()
    u.no_endpoints.exists = exists
    return u


Step: TypeAlias = destination_pb2.Update | grpc.StatusCode


@contextlib.asynccontextmanager
async def destination(scripts: Mapping[str, Sequence[Step]]) -> AsyncIterator[str]:
    """A destination server that answers each path with its script, then holds the
    stream open (or ends it with the script's status)."""

    async def get(raw: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        path = destination_pb2.GetDestination.FromString(raw).path
        for step in scripts.get(path, [grpc.StatusCode.INVALID_ARGUMENT]):
            if isinstance(step, grpc.StatusCode):
                await context.abort(step, f"scripted {step.name} for {path}")
            yield step.SerializeToString()
        await asyncio.Event().wait()

    async with grpc_peer("io.linkerd.proxy.destination.Destination",
                         {"Get": grpc.unary_stream_rpc_method_handler(get)}) as address:
        yield address


async def test_the_two_semantics_are_told_apart_from_endpoint_differences(
        tmp_path: Path) -> None:
    """Proto semantics on ours, 2.20 on theirs (Linkerd §1.7, §2.5): the same truth in
    different words is "semantics"; a real gap is not."""
    ours: dict[str, list[Step]] = {
        "empty": [no_endpoints(True)],
        "gone": [no_endpoints(False)],
        "drained": [add("10.0.0.1"), no_endpoints(True)],
        "same": [add("10.0.0.1", "10.0.0.2")],
        "extra": [add("10.0.0.1", "10.0.0.2")],
        "found-only-here": [no_endpoints(True)],
        "rejected": [grpc.StatusCode.INVALID_ARGUMENT],
        "theirs-rejects": [add("10.0.0.1")],
    }
    theirs: dict[str, list[Step]] = {
        "empty": [],  # silence
        "gone": [grpc.StatusCode.NOT_FOUND],
        "drained": [add("10.0.0.1"), remove("10.0.0.1")],
        "same": [add("10.0.0.1"), add("10.0.0.2")],
        "extra": [add("10.0.0.1")],
        "found-only-here": [grpc.StatusCode.NOT_FOUND],
        "rejected": [grpc.StatusCode.INVALID_ARGUMENT],
        "theirs-rejects": [grpc.StatusCode.INVALID_ARGUMENT],
    }
    # --targets takes names in the one name grammar: each script as a service's name.
    name = {k: f"{k}.shadow.svc.cluster.local:80" for k in ours}
    ours, theirs = ({name[k]: v for k, v in d.items()} for d in (ours, theirs))
    targets = tmp_path / "targets"
    targets.write_text("\n".join(ours) + "\n")
    async with destination(ours) as o, destination(theirs) as t:
        run = ShadowRun("--api", "linkerd", "--ours", o, "--theirs", t,
                        "--targets", str(targets))
        settled = await run.until(run.settled, "every target compared")
        rc, summary = await run.finish()
    latest = {k.split(".", 1)[0]: v for k, v in settled.items()}
    assert {k: e["status"] for k, e in latest.items()} == {
        "empty": "semantics", "gone": "semantics", "drained": "semantics", "same": "equal",
        "extra": "differs", "found-only-here": "missing", "rejected": "equal",
        "theirs-rejects": "error"}
    assert latest["empty"]["differences"] == [
        {"kind": "semantics", "ours": "no_endpoints{exists:true}", "theirs": "silence"}]
    assert latest["gone"]["differences"][0]["theirs"].startswith("NOT_FOUND")
    assert latest["found-only-here"]["missing_on"] == "theirs"
    assert latest["extra"]["differences"] == [{"kind": "only-ours", "endpoint": "10.0.0.2:8080"}]
    assert latest["theirs-rejects"]["theirs"].startswith("INVALID_ARGUMENT: scripted")
    assert rc == 1
    assert summary["counts"] == {"semantics": 3, "equal": 2, "differs": 1, "missing": 1,
                                 "error": 1}
    assert summary["notes"] == [
        "ours answers in proto semantics (it sent no_endpoints)",
        "ours refuses GetProfile (UNIMPLEMENTED: Method not found!): profiles are not compared",
        "theirs answers in linkerd-2.20 semantics (Get ended NOT_FOUND)",
        "theirs refuses GetProfile (UNIMPLEMENTED: Method not found!): profiles are not "
        "compared"]


async def test_a_not_found_target_is_resubscribed_until_it_exists(tmp_path: Path) -> None:
    name = "t.shadow.svc.cluster.local:80"  # a name in the one name grammar
    scripts: dict[str, Sequence[Step]] = {name: [grpc.StatusCode.NOT_FOUND]}
    targets = tmp_path / "targets"
    targets.write_text(f"{name}\n")
    async with destination({name: [add("10.0.0.1")]}) as o, destination(scripts) as t:
        run = ShadowRun("--api", "linkerd", "--ours", o, "--theirs", t,
                        "--targets", str(targets))
        await run.until(lambda: (s := run.settled()) and s[name]["status"] == "missing",
                        "missing on theirs")
        scripts[name] = [add("10.0.0.1")]  # the service appears on theirs
        agreed = await run.until(lambda: [e for e in run.events(name)
                                          if e["status"] == "equal"],
                                 "agreed once it exists")
        rc, _ = await run.finish()
    assert agreed[0]["time_to_agree_ms"] > 0
    assert rc == 0


# ---------------------------------------------------------------------- meshbridge


def linkerd_layer() -> Any:
    return layer("linkerd_api.service")


@pytest.mark.parametrize("semantics", ["proto", "linkerd-2.20"])
async def test_reports_exactly_the_planted_differences_and_their_removal(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path, semantics: Semantics) -> None:
    linkerd_layer()
    theirs_dir = copy(demo_dir, tmp_path / "theirs")
    planted_ep = plant_identity(theirs_dir)
    extra_ep = plant_extra_endpoint(theirs_dir)
    plant_missing_service(theirs_dir)
    ours = await make_app(demo_dir, layer_options=(LinkerdOptions(semantics=semantics),))
    theirs = await make_app(theirs_dir, layer_options=(LinkerdOptions(semantics=semantics),))
    run = ShadowRun("--api", "linkerd", "--ours", addr(ours), "--theirs", addr(theirs),
                    "--all")
    latest = await run.until(run.settled, "every target compared")
    found = non_equal(latest)
    assert found.pop(CACHE)[0] == "missing"
    assert latest[CACHE]["missing_on"] == "theirs"
    web = f"add[{planted_ep}]"
    assert found == {
        WEB: ("differs", [
            {"kind": "field", "endpoint": planted_ep, "field": f"{web}.{path}",
             "ours": ours_value, "theirs": theirs_value}
            for path, ours_value, theirs_value in (
                ("metric_labels.serviceaccount", "web", "web-v2"),
                ("tls_identity.dns_like_identity.name", IDENTITY.format(sa="web"),
                 IDENTITY.format(sa="web-v2")),
                ("tls_identity.server_name.name", IDENTITY.format(sa="web"),
                 IDENTITY.format(sa="web-v2")))]),
        BILLING: ("differs", [{"kind": "only-theirs", "endpoint": extra_ep}]),
    }
    others = {e["status"] for e in run.events() if e["target"] not in (WEB, BILLING, CACHE)}
    assert others == {"equal"}
    # --all follows the StatefulSet's pod authorities too (and each target's profile).
    assert set(DB_PODS) <= set(latest)

    restore(theirs_dir, demo_dir, "10-emojivoto.yaml")
    restore(theirs_dir, demo_dir, "20-shop.yaml")
    for target in (WEB, CACHE):
        agreed = await run.until(partial(run.agreed, target), f"{target} agrees again")
        assert agreed[-1]["time_to_agree_ms"] > 0
    rc, summary = await run.finish()
    assert rc == 1
    assert [u["target"] for u in summary["unagreed"]] == [BILLING]


async def test_routes_are_compared_field_by_field(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path) -> None:
    """--routes: each target's OutboundPolicies answer too, every field. Planted: theirs'
    web profile sends 20% to the canary; the profile routes web (Routes §7), so every
    route of the policy carries the split (HTTP/1 and HTTP/2, the opaque route too),
    and the profile says it once."""
    linkerd_layer()
    theirs_dir = copy(demo_dir, tmp_path / "theirs")
    plant_override_weight(theirs_dir)
    ours, theirs = await make_app(demo_dir), await make_app(theirs_dir)
    run = ShadowRun("--api", "linkerd", "--ours", addr(ours), "--theirs", addr(theirs),
                    "--all", "--routes", "--workload", '{"ns":"emojivoto","pod":"shadow"}')
    latest = await run.until(run.settled, "every target compared")
    found = non_equal(latest)
    status, web = found.pop(WEB)
    assert (status, found) == ("differs", {})
    split = "backends.random_available.backends[1].weight"
    detect = "policy.protocol.detect"
    assert fields_of(web) == {
        "profile.dst_overrides[1].weight": ("1000", "2000"),
        f"{detect}.opaque.routes[0].rules[0].{split}": ("1000", "2000"),
        **{f"{detect}.{proto}.routes[0].rules[{i}].{split}": ("1000", "2000")
           for proto in ("http1", "http2") for i in range(3)}}
    assert latest[WEB]["differences"] == [d for d in web if d["kind"] == "field"]

    restore(theirs_dir, demo_dir, "10-emojivoto.yaml")
    agreed = await run.until(partial(run.agreed, WEB), "web agrees again")
    assert agreed[-1]["time_to_agree_ms"] > 0
    rc, summary = await run.finish()
    assert (rc, summary["ok"]) == (0, True)


async def test_a_changed_weight_is_reported_on_exactly_the_weighted_endpoints(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path) -> None:
    """Weights depend on the client's node (zone weights, like Linkerd's
    --ext-endpoint-zone-weights): theirs weighs same-zone endpoints x10, ours does not.
    A client on node-a sees catalog's two zone-a endpoints (topology hints)."""
    linkerd_layer()
    ours = await make_app(demo_dir)
    theirs = await make_app(demo_dir, MeshConfig(zone_weights=True))
    targets = tmp_path / "targets"
    targets.write_text(f"{CATALOG}\n")
    run = ShadowRun("--api", "linkerd", "--ours", addr(ours), "--theirs", addr(theirs),
                    "--targets", str(targets), "--token", '{"ns":"shop","nodeName":"node-a"}')
    latest = await run.until(run.settled, "compared")
    await run.finish()
    status, diffs = non_equal(latest)[CATALOG]
    assert status == "differs"
    assert {(d["kind"], d["field"].split("].", 1)[1], d["ours"], d["theirs"])
            for d in diffs} == {("field", "weight", "10000", "100000")}
    assert {d["field"] for d in diffs} == {f"add[{d['endpoint']}].weight" for d in diffs}
    assert len(diffs) == 2  # the two zone-a pods, and nothing else


async def test_two_semantics_modes_differ_only_in_semantics(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path) -> None:
    linkerd_layer()
    ours = await make_app(demo_dir, layer_options=(LinkerdOptions(semantics="proto"),))
    theirs = await make_app(demo_dir, layer_options=(LinkerdOptions(semantics="linkerd-2.20"),))
    names = [ours.authority(*_split(svc)) for svc in ours.service_port_summary()]
    targets = tmp_path / "targets"
    targets.write_text("\n".join([*names, NOSUCH, MAIL]) + "\n")
    run = ShadowRun("--api", "linkerd", "--ours", addr(ours), "--theirs", addr(theirs),
                    "--targets", str(targets))
    latest = await run.until(run.settled, "every target compared")
    rc, summary = await run.finish()
    statuses = {t: e["status"] for t, e in latest.items()}
    assert set(statuses.values()) == {"equal", "semantics"}
    semantic = {t for t, s in statuses.items() if s == "semantics"}
    assert {PAYMENTS, REPORTS, NOSUCH} <= semantic
    assert statuses[MAIL] == "equal"  # both reject the ExternalName alike
    assert rc == 0
    assert summary["ok"] is True


def _split(row: tuple[str, int, int, int]) -> tuple[ServiceKey, int]:
    ns, name = row[0].split("/", 1)
    return ServiceKey(ns, name), row[1]


async def test_bad_peers_are_reported_per_target_while_the_rest_compares(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path) -> None:
    linkerd_layer()
    theirs_dir = copy(demo_dir, tmp_path / "theirs")
    plant_external_name(theirs_dir)
    ours = await make_app(demo_dir)
    theirs = await make_app(theirs_dir)
    xds_only = await make_app(demo_dir, layers=[layer("xds_api.service")])
    targets = tmp_path / "targets"
    targets.write_text(f"{WEB}\n{BILLING}\n")

    # An authority theirs rejects (billing is ExternalName there): INVALID_ARGUMENT.
    run = ShadowRun("--api", "linkerd", "--ours", addr(ours), "--theirs", addr(theirs),
                    "--targets", str(targets))
    latest = await run.until(run.settled, "compared")
    assert latest[BILLING]["status"] == "error"
    assert latest[BILLING]["theirs"].startswith("INVALID_ARGUMENT")
    assert latest[WEB]["status"] == "equal"
    plant_identity(demo_dir)  # and the rest keeps comparing
    await run.until(lambda: [e for e in run.events(WEB) if e["status"] == "differs"],
                    "web differs")
    await run.finish()

    # A server that speaks only xDS, and one that is not there at all.
    closed = f"127.0.0.1:{free_port()}"
    for peer, code in ((addr(xds_only), "UNIMPLEMENTED"), (closed, "UNAVAILABLE")):
        run = ShadowRun("--api", "linkerd", "--ours", addr(ours), "--theirs", peer,
                        "--targets", str(targets))
        latest = await run.until(run.settled, f"compared against {code}")
        rc, _ = await run.finish()
        assert {e["status"] for e in latest.values()} == {"error"}
        assert all(e["theirs"].startswith(code) for e in latest.values())
        assert rc == 1
        notes = [e["note"] for e in run.lines() if e["event"] == "note"]
        other_api = [n for n in notes if "does not serve the Linkerd destination API" in n]
        # Said once for the side, however many targets hit it.
        assert len(other_api) == (1 if code == "UNIMPLEMENTED" else 0)
