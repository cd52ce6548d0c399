"""`meshbridge shadow --api xds` between two meshbridge instances on loopback, fed from
manifest folders that differ in planted ways; and against bad peers."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from envoy.config.endpoint.v3 import endpoint_pb2

from harness.shadow.sides import LINKERD_METADATA
from meshbridge.layers import layer
from testkit.net import free_port
from tests.conftest import AppFactory
from tests.integration.shadow_support import (
    BILLING,
    CACHE,
    DB_PODS,
    EXTRA_ADDRESS,
    IDENTITY,
    WEB,
    ShadowRun,
    addr,
    copy,
    fields_of,
    non_equal,
    plant_external_name,
    plant_extra_endpoint,
    plant_identity,
    plant_missing_service,
    restore,
    rewriting,
)
from xds_api.service import XdsOptions

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def make_app(make_app: AppFactory) -> AppFactory:
    # The compared fields (identity, hint, ...) travel in the linkerd metadata profile.
    return partial(make_app, layer_options=(XdsOptions(endpoint_metadata="linkerd"),))


@pytest.mark.parametrize("variant", ["sotw", "delta"])
async def test_reports_exactly_the_planted_differences_and_their_removal(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path, variant: str) -> None:
    theirs_dir = copy(demo_dir, tmp_path / "theirs")
    planted_ep = plant_identity(theirs_dir)
    extra_ep = plant_extra_endpoint(theirs_dir)
    plant_missing_service(theirs_dir)
    ours, theirs = await make_app(demo_dir), await make_app(theirs_dir)
    run = ShadowRun("--api", "xds", "--ours", addr(ours), "--theirs", addr(theirs), "--all",
                    *(["--delta"] if variant == "delta" else []))

    latest = await run.until(run.settled, "every target compared")
    # Every service port of the demo but the ExternalName one, and db's three pods.
    assert run.targets() == 20
    assert set(DB_PODS) <= set(latest)
    found = non_equal(latest)
    meta = f'endpoint[{planted_ep}].metadata.filter_metadata."io.linkerd.destination"'
    status, web = found.pop(WEB)
    assert status == "differs"
    assert fields_of(web) == {
        f"{meta}.identity": (IDENTITY.format(sa="web"), IDENTITY.format(sa="web-v2")),
        f"{meta}.server_name": (IDENTITY.format(sa="web"), IDENTITY.format(sa="web-v2")),
        f"{meta}.labels.serviceaccount": ("web", "web-v2"),
    }
    assert found == {
        # The VM's locality (no zone) now holds two endpoints: its weight is theirs' sum.
        BILLING: ("differs", [
            {"kind": "field", "endpoint": "10.0.5.20:8080",
             "field": "endpoint[10.0.5.20:8080].locality_load_balancing_weight.value",
             "ours": "1", "theirs": "2"},
            {"kind": "only-theirs", "endpoint": extra_ep}]),
        CACHE: ("missing", [{"kind": "missing", "ours": "1 endpoint",
                             # delta tells a deleted service apart (xDS §2.1)
                             "theirs": "removed" if variant == "delta"
                             else "empty (no cluster)"}]),
    }
    assert latest[CACHE]["missing_on"] == "theirs"
    # Nothing else was ever reported as anything but agreeing.
    others = {e["status"] for e in run.events() if e["target"] not in (WEB, BILLING, CACHE)}
    assert others == {"equal"}

    # Take two plants out again: those targets agree, with the time it took.
    restore(theirs_dir, demo_dir, "10-emojivoto.yaml")
    restore(theirs_dir, demo_dir, "20-shop.yaml")
    for target in (WEB, CACHE):
        agreed = await run.until(partial(run.agreed, target), f"{target} agrees again")
        assert agreed[-1]["time_to_agree_ms"] > 0
        # (xDS: CDS and EDS are two streams; one may land a moment before the other.)
        assert agreed[-1]["previous"] in ("differs", "missing", "converging")

    rc, summary = await run.finish()
    assert rc == 1
    assert [u["target"] for u in summary["unagreed"]] == [BILLING]
    assert summary["counts"] == {"equal": 19, "differs": 1}
    assert summary["time_to_agree"]["count"] == 2
    assert summary["ignored"] == []


async def test_a_live_change_on_one_side_converges_then_agrees(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path) -> None:
    theirs_dir = copy(demo_dir, tmp_path / "theirs")
    ours, theirs = await make_app(demo_dir), await make_app(theirs_dir)
    targets = tmp_path / "targets"
    targets.write_text(f"{BILLING}\n{WEB}\n")
    run = ShadowRun("--api", "xds", "--ours", addr(ours), "--theirs", addr(theirs),
                    "--targets", str(targets), "--grace", "30")
    await run.until(lambda: (s := run.settled()) and not non_equal(s), "both equal")

    plant_extra_endpoint(demo_dir)
    await run.until(lambda: any(e["status"] == "converging" and e.get("changed") == "ours"
                                for e in run.events(BILLING)), "ours changed first")
    plant_extra_endpoint(theirs_dir)
    agreed = await run.until(
        lambda: [e for e in run.events(BILLING) if e.get("time_to_agree_ms")],
        "theirs caught up")
    # The grace never ran out: the disagreement was never reported as one. (It is long
    # so that a loaded machine's slow second edit cannot outlast it; waiting for the
    # agreement ends the wait as soon as it comes.)
    assert [e["status"] for e in run.events(BILLING)] == ["equal", "converging", "equal"]
    assert 0 < agreed[0]["time_to_agree_ms"] < 30_000
    rc, summary = await run.finish()
    assert rc == 0
    assert summary["ok"] is True


async def test_an_unreachable_theirs_is_an_error_per_target(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path) -> None:
    ours = await make_app(demo_dir)
    targets = tmp_path / "targets"
    targets.write_text(f"{WEB}\n{BILLING}\n")
    run = ShadowRun("--api", "xds", "--ours", addr(ours), "--theirs",
                    f"127.0.0.1:{free_port()}", "--targets", str(targets))
    def answered() -> dict[str, dict[str, object]] | None:
        # theirs fails at once; ours may answer later on a loaded machine
        latest = run.settled()
        ours_in = latest and all(str(e["ours"]).endswith("endpoints") for e in latest.values())
        return latest if ours_in else None

    latest = await run.until(answered, "both targets compared, with ours' answers")
    assert {t: e["status"] for t, e in latest.items()} == {WEB: "error", BILLING: "error"}
    assert all(e["theirs"].startswith("UNAVAILABLE") for e in latest.values())
    assert all(e["ours"].endswith("endpoints") for e in latest.values())
    rc, _ = await run.finish()
    assert rc == 1


async def test_a_server_without_xds_is_reported_unimplemented(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path) -> None:
    ours = await make_app(demo_dir)
    # Linkerd's layer alone: no xDS options to give it.
    theirs = await make_app(demo_dir, layers=[layer("linkerd_api.service")], layer_options=())
    targets = tmp_path / "targets"
    targets.write_text(f"{WEB}\n")
    run = ShadowRun("--api", "xds", "--ours", addr(ours), "--theirs", addr(theirs),
                    "--targets", str(targets))
    latest = await run.until(run.settled, "compared")
    assert latest[WEB]["status"] == "error"
    assert latest[WEB]["theirs"].startswith("UNIMPLEMENTED")
    await run.finish()
    # Said once for the side: it looks like a server of the other API.
    assert [e["note"] for e in run.lines() if e["event"] == "note"
            and "does not serve xDS ADS" in e["note"]] == [
        f"theirs does not serve xDS ADS ({latest[WEB]['theirs']}): is it a Linkerd "
        f"destination server (--api linkerd)?"]


async def test_a_target_theirs_does_not_serve_is_missing_while_the_rest_compares(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path) -> None:
    theirs_dir = copy(demo_dir, tmp_path / "theirs")
    plant_external_name(theirs_dir)
    ours, theirs = await make_app(demo_dir), await make_app(theirs_dir)
    run = ShadowRun("--api", "xds", "--ours", addr(ours), "--theirs", addr(theirs), "--all")
    latest = await run.until(run.settled, "every target compared")
    assert non_equal(latest) == {
        BILLING: ("missing", [{"kind": "missing", "ours": "3 endpoints",
                               "theirs": "empty (no cluster)"}])}
    # Still comparing the others: a change on ours shows up.
    planted = plant_identity(demo_dir)
    changed = await run.until(
        lambda: [e for e in run.events(WEB) if e["status"] == "differs"], "web differs")
    assert changed[-1]["differences"][0]["endpoint"] == planted
    await run.finish()


def without_metadata(cla: endpoint_pb2.ClusterLoadAssignment) -> None:
    """What an xDS server that is not meshbridge sends: no endpoint metadata."""
    for loc in cla.endpoints:
        for lb in loc.lb_endpoints:
            lb.ClearField("metadata")


async def test_a_foreign_server_is_compared_on_what_both_carry(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path) -> None:
    """A server without meshbridge's endpoint metadata (istiod, any other xDS server):
    identity and the other Linkerd fields are not compared, and the output says so."""
    theirs_dir = copy(demo_dir, tmp_path / "theirs")
    plant_identity(theirs_dir)  # invisible without the metadata, by design
    plant_extra_endpoint(theirs_dir)  # visible
    ours, theirs = await make_app(demo_dir), await make_app(theirs_dir)
    targets = tmp_path / "targets"
    targets.write_text(f"{WEB}\n{CACHE}\n{BILLING}\n")
    async with rewriting(addr(theirs), without_metadata) as theirs_addr:
        run = ShadowRun("--api", "xds", "--ours", addr(ours), "--theirs", theirs_addr,
                        "--targets", str(targets))
        latest = await run.until(run.settled, "compared")
        assert non_equal(latest) == {
            BILLING: ("differs", [
                {"kind": "field", "endpoint": "10.0.5.20:8080",
                 "field": "endpoint[10.0.5.20:8080].locality_load_balancing_weight.value",
                 "ours": "1", "theirs": "2"},
                {"kind": "only-theirs", "endpoint": f"{EXTRA_ADDRESS}:8080"}])}
        rc, summary = await run.finish()
    assert rc == 1
    assert summary["ignored"] == [LINKERD_METADATA]
    assert [n for n in summary["notes"] if "theirs sends no io.linkerd.destination" in n]
    assert [e for e in run.lines() if e["event"] == "note"]


async def _cli(*argv: str) -> tuple[int, list[dict[str, Any]]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "meshbridge.cli", "shadow", *argv,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None, err
    return proc.returncode, [json.loads(line) for line in out.decode().splitlines()]


async def test_the_command_exits_zero_only_if_every_target_agrees(
        make_app: AppFactory, demo_dir: Path, tmp_path: Path) -> None:
    theirs_dir = copy(demo_dir, tmp_path / "theirs")
    ours, theirs = await make_app(demo_dir), await make_app(theirs_dir)
    common = ["--api", "xds", "--ours", addr(ours), "--all", "--json", "--duration", "1.5",
              "--grace", "0.3", "--settle", "0.5"]
    rc, lines = await _cli(*common, "--theirs", addr(theirs))
    assert (rc, lines[-1]["event"], lines[-1]["ok"]) == (0, "summary", True)
    assert lines[-1]["counts"] == {"equal": 20}

    plant_extra_endpoint(theirs_dir)
    rc, lines = await _cli(*common, "--theirs", addr(theirs))
    assert rc == 1
    assert [u["target"] for u in lines[-1]["unagreed"]] == [BILLING]

    rc, _ = await _cli(*common, "--theirs", addr(theirs), "--ours",
                       f"127.0.0.1:{free_port()}", "--connect-timeout", "1")
    assert rc == 2  # --all needs ours' CDS
