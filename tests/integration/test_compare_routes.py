"""`meshbridge compare` on a route-edit scenario, end to end: a real server, each
model's real gRPC clients (OutboundPolicies.Watch, RDS over SotW and delta ADS) in a
child process of its own, a dozen route edits; every client must end on every edit's
weights, and the figures must add up."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "bench" / "scenarios" / "route-edit-smoke.yaml"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str],
                                                           dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("compare-routes")
    proc = subprocess.run(
        [sys.executable, "-m", "meshbridge.cli", "compare", str(SMOKE), "--out", str(out)],
        capture_output=True, text=True, timeout=240, cwd=ROOT)
    path = out / "route-edit.json"
    return proc, json.loads(path.read_text()) if path.exists() else {}, out


def test_every_client_of_every_model_follows_the_same_edits(run: Any) -> None:
    proc, fig, out = run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert fig["ok"] and fig["failures"] == [] and fig["edits"] == 12
    assert set(fig["models"]) == {"linkerd", "sotw", "delta"}
    for model in fig["models"].values():
        assert model["client_errors"] == []
        # An edit a later one superseded before it arrived is not counted as reaching
        # everyone; the last edit of every target always arrives (`ok` above).
        assert model["edits_reaching_every_client"] >= 1
    md = (out / "route-edit.md").read_text()
    assert md.rstrip().endswith("PASS") and "xDS delta (ADS), RDS" in md


def test_the_streams_are_each_models_own(run: Any) -> None:
    _, fig, _ = run
    models = fig["models"]
    # route-edit-smoke: 3 clients per model following 2 services each.
    assert (models["linkerd"]["clients"], models["linkerd"]["streams"]) == (3, 6)
    assert (models["sotw"]["clients"], models["sotw"]["streams"]) == (3, 3)
    assert (models["delta"]["clients"], models["delta"]["streams"]) == (3, 3)


def test_an_edit_costs_each_follower_at_most_one_message(run: Any) -> None:
    _, fig, _ = run
    # Each of the 6 services is followed by one client per model (spread, 3 x 2), so
    # an edit is one message per model, or none when a later edit superseded it.
    for model in fig["models"].values():
        assert 0 < model["messages_per_edit"] <= 1.0, model
        assert model["bytes_per_edit"] > 0
        assert model["client_cpu_s"] > 0
