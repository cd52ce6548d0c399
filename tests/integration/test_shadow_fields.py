"""`meshbridge shadow` finds a planted difference in every field class a proxy acts on,
names it by its field path with both values, and agrees once `--fields` ignores it.

Linkerd: two meshbridges on manifest folders that differ in one thing per target (a
pod label, an opaque-ports annotation, a slice label, a slice annotation, a
ServiceProfile), one pair with different HTTP/2 client parameters, and scripted
destination servers for what no real server does on purpose (a redundant message, an
empty add, refusing GetProfile). xDS: two meshbridges whose slices differ in a zone, and
one meshbridge behind relays that each change one field of every CLA."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import shutil
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.config.core.v3 import health_check_pb2
from envoy.config.endpoint.v3 import endpoint_pb2

from bridge.model import MeshConfig
from linkerd_api.proto import destination_pb2
from meshbridge.app import App
from meshbridge.layers import layer
from tests.conftest import AppFactory
from tests.integration.shadow_support import (
    BILLING,
    CANARY,
    CATALOG,
    VOTING,
    WEB,
    ShadowRun,
    fields_of,
    grpc_peer,
    non_equal,
    plant_authority_override,
    plant_opaque_annotation,
    plant_pod_label,
    plant_profile,
    plant_slice_label,
    plant_zone,
    rewriting,
)

pytestmark = pytest.mark.timeout(120)


def addr(app: App) -> str:
    return f"127.0.0.1:{app.grpc_port}"


def targets_file(tmp_path: Path, *targets: str) -> str:
    path = tmp_path / "targets"
    path.write_text("\n".join(targets) + "\n")
    return str(path)


async def settle(*argv: str) -> tuple[dict[str, dict[str, Any]], int, dict[str, Any]]:
    run = ShadowRun(*argv)
    latest = await run.until(run.settled, "every target compared")
    rc, summary = await run.finish()
    return latest, rc, summary


# ---------------------------------------------------------------------- Linkerd


async def test_each_planted_linkerd_field_is_named_and_ignoring_it_agrees(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path) -> None:
    layer("linkerd_api.service")
    theirs_dir = tmp_path / "theirs"
    shutil.copytree(demo_dir, theirs_dir)
    labelled = plant_pod_label(theirs_dir)
    opaque = plant_opaque_annotation(theirs_dir)
    plant_slice_label(theirs_dir)
    vm = plant_authority_override(theirs_dir)
    plant_profile(theirs_dir)
    ours, theirs = await make_app(demo_dir), await make_app(theirs_dir)
    targets = targets_file(tmp_path, VOTING, CATALOG, CANARY, BILLING, WEB)
    argv = ("--api", "linkerd", "--ours", addr(ours), "--theirs", addr(theirs),
            "--targets", targets)

    latest, rc, _ = await settle(*argv)
    found = {t: fields_of(diffs) for t, (_, diffs) in non_equal(latest).items()}
    assert rc == 1
    assert set(found) == {VOTING, CATALOG, CANARY, BILLING, WEB}
    # a pod label -> its endpoint's metric label
    hash_label = f"add[{labelled}].metric_labels.pod_template_hash"
    assert found[VOTING] == {hash_label: ("7f5c6d9b8", "planted")}
    # an opaque-ports annotation -> the protocol hint
    assert found[CATALOG] == {f"add[{opaque}].protocol_hint.h2": ("{}", "(unset)"),
                              f"add[{opaque}].protocol_hint.opaque": ("(unset)", "{}")}
    # a slice label -> the set's labels
    assert found[CANARY] == {"set.metric_labels.target_cluster": ("(unset)", "east")}
    # a slice annotation -> the VM's authority override (and, today, set labels)
    override = f"add[{vm}].authority_override.authority_override"
    assert found[BILLING][override] == ("(unset)", "billing.legacy.svc.east.example:80")
    assert set(found[BILLING]) - {override} <= {"set.metric_labels.target_service",
                                               "set.metric_labels.target_service_namespace"}
    # the ServiceProfile -> the GetProfile answer
    assert found[WEB]["profile.retry_budget.retry_ratio"] == ("0.2", "0.5")
    timeouts = {p: v for p, v in found[WEB].items() if p.startswith("profile.routes[")}
    assert timeouts and all(p.endswith((".timeout.seconds", ".timeout.nanos"))
                            for p in timeouts)
    assert set(found[WEB]) == {"profile.retry_budget.retry_ratio", *timeouts}

    ignored = ",".join(["add.metric_labels.pod_template_hash", "add.protocol_hint",
                        "set.metric_labels.target_*", "add.authority_override",
                        "profile.retry_budget", "profile.routes.timeout"])
    latest, rc, summary = await settle(*argv, "--fields", ignored)
    assert non_equal(latest) == {}
    assert rc == 0
    assert summary["ignored"] == ignored.split(",")


async def test_different_http2_parameters_are_named_on_every_meshed_endpoint(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path) -> None:
    layer("linkerd_api.service")
    ours = await make_app(demo_dir)
    theirs = await make_app(demo_dir, MeshConfig(meshed_http2_params={
        "keep_alive": {"interval": {"seconds": 20}, "timeout": {"seconds": 3},
                       "while_idle": True}}))
    argv = ("--api", "linkerd", "--ours", addr(ours), "--theirs", addr(theirs),
            "--targets", targets_file(tmp_path, WEB))
    latest, rc, _ = await settle(*argv)
    status, diffs = non_equal(latest)[WEB]
    assert (status, rc) == ("differs", 1)
    assert {(d["field"].split("].", 1)[1], d["ours"], d["theirs"]) for d in diffs} == {
        ("http2.keep_alive.interval.seconds", "10", "20")}
    assert len(diffs) == 2  # web's two ready pods

    latest, rc, _ = await settle(*argv, "--fields", "add.http2.keep_alive.interval")
    assert (non_equal(latest), rc) == ({}, 0)


def add(*ips: str, labels: Mapping[str, str] | None = None) -> destination_pb2.Update:
    u = destination_pb2.Update()
    u.add.SetInParent()  # an add, even with nothing in it
    for ip in ips:
        wa = u.add.addrs.add()
        wa.addr.ip.ipv4 = int(ipaddress.IPv4Address(ip))
        wa.addr.port = 8080
        wa.weight = 10000
    u.add.metric_labels.update(labels or {})
    return u


Step = destination_pb2.Update | destination_pb2.DestinationProfile


@contextlib.asynccontextmanager
async def destination(gets: Mapping[str, Sequence[Step]],
                      profiles: Mapping[str, destination_pb2.DestinationProfile] | None = None
                      ) -> AsyncIterator[str]:
    """A scripted destination server (a fake: no real server misbehaves on request).
    Each Get path gets its script; GetProfile is served only if `profiles` is given."""

    async def get(raw: bytes, _context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        for step in gets.get(destination_pb2.GetDestination.FromString(raw).path, ()):
            yield step.SerializeToString()
        await asyncio.Event().wait()

    async def get_profile(raw: bytes,
                          _context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        assert profiles is not None
        path = destination_pb2.GetDestination.FromString(raw).path
        yield profiles.get(path, destination_pb2.DestinationProfile()).SerializeToString()
        await asyncio.Event().wait()

    handlers: dict[str, Any] = {"Get": grpc.unary_stream_rpc_method_handler(get)}
    if profiles is not None:
        handlers["GetProfile"] = grpc.unary_stream_rpc_method_handler(get_profile)
    async with grpc_peer("io.linkerd.proxy.destination.Destination", handlers) as address:
        yield address


async def test_redundant_messages_empty_adds_and_a_refused_getprofile(tmp_path: Path) -> None:
    """A byte-identical repeated add is counted and named; an empty add is shown as
    what it is; theirs refusing GetProfile is said once and the rest is compared."""
    labels = {"namespace": "ns", "service": "svc"}
    ours = {"repeat": [add("10.0.0.1", labels=labels)],
            "empty": [add()],
            "same": [add("10.0.0.1", labels=labels)]}
    theirs = {"repeat": [add("10.0.0.1", labels=labels), add("10.0.0.1", labels=labels)],
              "empty": [],
              "same": [add("10.0.0.1", labels=labels)]}
    fqn = destination_pb2.DestinationProfile(fully_qualified_name="svc.ns.svc.cluster.local")
    # --targets takes names in the one name grammar: each script as a service's name.
    name = {k: f"{k}.shadow.svc.cluster.local:80" for k in ours}
    ours, theirs = ({name[k]: v for k, v in d.items()} for d in (ours, theirs))
    async with destination(ours, {name["same"]: fqn}) as o, destination(theirs) as t:
        run = ShadowRun("--api", "linkerd", "--ours", o, "--theirs", t,
                        "--targets", targets_file(tmp_path, *ours))
        settled = await run.until(run.settled, "every target compared")
        rc, summary = await run.finish()
    latest = {k.split(".", 1)[0]: v for k, v in settled.items()}
    assert latest["repeat"]["status"] == "differs"
    assert latest["repeat"]["differences"] == [
        {"kind": "field", "field": "messages.redundant", "ours": "0", "theirs": "1"}]
    assert latest["repeat"]["messages"]["theirs"] == {"add": 2, "redundant": 1}
    assert (latest["empty"]["ours"], latest["empty"]["theirs"]) == ("add(empty)", "silence")
    assert latest["same"]["status"] == "equal"  # profiles: only ours answers them
    assert rc == 1
    refusals = [e["note"] for e in run.lines()
                if e["event"] == "note" and "refuses GetProfile" in e["note"]]
    assert refusals == ["theirs refuses GetProfile (UNIMPLEMENTED: Method not found!): "
                        "profiles are not compared"]
    assert summary["ignored"] == ["profile", "messages.profile_redundant"]


# ---------------------------------------------------------------------- xDS


async def test_a_planted_xds_zone_is_named_as_the_endpoints_locality(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path) -> None:
    theirs_dir = tmp_path / "theirs"
    shutil.copytree(demo_dir, theirs_dir)
    moved = plant_zone(theirs_dir)
    ours, theirs = await make_app(demo_dir), await make_app(theirs_dir)
    argv = ("--api", "xds", "--ours", addr(ours), "--theirs", addr(theirs),
            "--targets", targets_file(tmp_path, WEB))
    latest, rc, _ = await settle(*argv)
    found = fields_of(non_equal(latest)[WEB][1])
    assert found[f"endpoint[{moved}].locality.zone"] == ("zone-a", "zone-x")
    assert rc == 1
    latest, rc, _ = await settle(*argv, "--fields", "endpoint.locality,endpoint.metadata")
    assert (non_equal(latest), rc) == ({}, 0)


def _first(cla: endpoint_pb2.ClusterLoadAssignment) -> Any:
    return cla.endpoints[0].lb_endpoints[0] if cla.endpoints else None


def _weight(cla: endpoint_pb2.ClusterLoadAssignment) -> None:
    if (lb := _first(cla)) is not None:
        lb.load_balancing_weight.value = 7


def _health(cla: endpoint_pb2.ClusterLoadAssignment) -> None:
    if (lb := _first(cla)) is not None:
        lb.health_status = health_check_pb2.DRAINING


def _metadata(cla: endpoint_pb2.ClusterLoadAssignment) -> None:
    if (lb := _first(cla)) is not None:
        # A key no metadata profile sets (the default istio profile sets `workload`).
        lb.metadata.filter_metadata["istio"].update({"planted": "yes"})


def _priority(cla: endpoint_pb2.ClusterLoadAssignment) -> None:
    for loc in cla.endpoints:
        loc.priority = 1


def _policy(cla: endpoint_pb2.ClusterLoadAssignment) -> None:
    cla.policy.overprovisioning_factor.value = 200


# (change, the path it shows at below endpoint[<first>] or as is, ours, theirs, --fields)
XDS_PLANTS: list[tuple[Callable[[endpoint_pb2.ClusterLoadAssignment], None], str, str, str,
                       str]] = [
    (_weight, "load_balancing_weight.value", "1", "7", "endpoint.load_balancing_weight"),
    (_health, "health_status", "HEALTHY", "DRAINING", "endpoint.health_status"),
    (_metadata, "metadata.filter_metadata.istio.planted", "(unset)", "yes",
     "endpoint.metadata.filter_metadata.istio"),
    (_priority, "priority", "(unset)", "1", "endpoint.priority"),
    (_policy, "cla.policy.overprovisioning_factor.value", "(unset)", "200", "cla.policy"),
]


async def test_each_planted_xds_field_is_named_and_ignoring_it_agrees(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path) -> None:
    """One meshbridge; theirs is the same meshbridge behind a relay that changes one
    field of every CLA, a relay per field class."""
    app = await make_app(demo_dir)
    targets = targets_file(tmp_path, BILLING)
    for change, path, ours_value, theirs_value, pattern in XDS_PLANTS:
        async with rewriting(addr(app), change) as theirs:
            argv = ("--api", "xds", "--ours", addr(app), "--theirs", theirs,
                    "--targets", targets)
            latest, rc, _ = await settle(*argv)
            status, diffs = non_equal(latest)[BILLING]
            named = fields_of(diffs)
            assert (status, rc) == ("differs", 1), path
            assert len(named) == len(diffs), diffs  # fields only, no endpoint set apart
            assert {p.split("].", 1)[-1] for p in named} == {path}
            assert set(named.values()) == {(ours_value, theirs_value)}
            latest, rc, _ = await settle(*argv, "--fields", pattern)
            assert (non_equal(latest), rc) == ({}, 0), path
