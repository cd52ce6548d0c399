"""`meshbridge compare`'s route-edit run: its scenario checks, the routes it writes and
how its figures are read from what the clients received. Nothing running."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.sources.sim import ScenarioError
from harness.compare.route_edit import (
    BASE_WEIGHT,
    Edit,
    RoutePlan,
    canary_of,
    check_route_scenario,
    http_route,
    route_figures,
    route_table,
)
from harness.compare.scenario import CompareScenario, parse_compare_scenario
from meshbridge.cli import main as cli_main

ROUTES = """
seed: 3
cluster: {namespaces: 2, services: 6, endpoints_per_service: 2}
clients: {linkerd: 2, sotw: 1, delta: 0, targets: 2}
"""
SMOKE = Path(__file__).resolve().parents[2] / "bench" / "scenarios" / "route-edit-smoke.yaml"


def scenario(routes: str = "routes: {edits: 4, interval: 0}\n",
             base: str = ROUTES) -> CompareScenario:
    return parse_compare_scenario(base + routes)


@pytest.mark.parametrize(("routes", "message"), [
    ("routes: {edits: 0}\n", "routes.edits: must be an integer in 1..100000"),
    ("routes: {edits: 2, interval: -1}\n", "routes.interval: must be a number"),
    ("routes: {services: 7}\n", "routes.services: must be an integer in 1..6"),
    ("routes: {edit: 3}\n", "routes: unknown key 'edit'"),
])
def test_bad_route_plans_name_the_key(routes: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        check_route_scenario(scenario(routes))


def test_a_route_edit_run_needs_no_duration_and_refuses_what_it_cannot_measure() -> None:
    assert check_route_scenario(scenario()) == RoutePlan(4, 0.0, None)
    with pytest.raises(ScenarioError, match=r"clients\.leds: a route-edit run has no LEDS"):
        check_route_scenario(scenario(base=ROUTES.replace("delta: 0", "delta: 0, leds: 1")))
    with pytest.raises(ScenarioError, match="two services in every namespace"):
        check_route_scenario(scenario(base=ROUTES.replace("services: 6", "services: 3")))


def test_the_command_refuses_churn_options_for_a_route_edit_scenario(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for option in (["--isolate"], ["--envoy", "1"], ["--duration", "3"]):
        assert cli_main(["compare", str(SMOKE), "--out", str(tmp_path), *option]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "not for a route-edit scenario" in err[0], err


def test_each_route_splits_its_service_with_the_next_of_its_own_namespace() -> None:
    cs = scenario()
    # The sim deals svc-0..5 over ns-0, ns-1 in turn: ns-0 holds svc-0, 2, 4.
    assert [canary_of(cs, i) for i in range(6)] == [
        ("ns-0", "svc-2"), ("ns-1", "svc-3"), ("ns-0", "svc-4"), ("ns-1", "svc-5"),
        ("ns-0", "svc-0"), ("ns-1", "svc-1")]
    route = http_route(cs, 4, 7)
    assert (route.meta.namespace, route.meta.name) == ("ns-0", "svc-4-split")
    assert route.all_problems() == []
    assert [(b.namespace, b.name, b.weight) for b in route.rules[0].backends] == [
        ("ns-0", "svc-4", BASE_WEIGHT), ("ns-0", "svc-0", 7)]


def _figures(records: dict[str, list[list[object]]]) -> dict[str, object]:
    cs = scenario()
    a, b = cs.authority("ns-0", "svc-0"), cs.authority("ns-1", "svc-1")
    specs: dict[str, list[tuple[int, tuple[str, ...]]]] = {
        "linkerd": [(0, (a, b)), (1, (b,))], "sotw": [(0, (a,))]}
    edits = [Edit(0, a, 2, 1_000_000_000), Edit(1, b, 3, 1_100_000_000)]
    results = {m: {"records": r, "cpu_seconds": 0.5, "errors": []} for m, r in records.items()}
    return route_figures(cs, RoutePlan(2, 0.1, None), ("linkerd", "sotw"), specs, edits,
                         results, 0.004, 0.2)


def test_an_edit_reaches_a_model_when_its_last_follower_has_it() -> None:
    a, b = scenario().authority("ns-0", "svc-0"), scenario().authority("ns-1", "svc-1")
    t0, t1 = 1_000_000_000, 1_100_000_000
    fig = _figures({
        "linkerd": [
            ["compare-linkerd-0", a, [1000, 1], 500, 90],
            ["compare-linkerd-0", b, [1000, 1], 500, 90],
            ["compare-linkerd-1", b, [1000, 1], 500, 90],
            ["compare-linkerd-0", a, [1000, 2], t0 + 4_000_000, 100],
            ["compare-linkerd-0", b, [1000, 3], t1 + 2_000_000, 100],
            ["compare-linkerd-1", b, [1000, 3], t1 + 9_000_000, 100]],
        "sotw": [
            ["compare-sotw-0", a, [1000, 1], 500, 120],
            ["compare-sotw-0", a, [1000, 2], t0 + 6_000_000, 130]]})
    assert fig["ok"] and fig["failures"] == []
    linkerd = fig["models"]["linkerd"]  # type: ignore[index]
    assert linkerd["to_every_client_ms"]["max"] == 9.0  # edit 1's second follower
    assert linkerd["edits_reaching_every_client"] == 2 and linkerd["arrivals_missed"] == 0
    assert linkerd["messages_per_edit"] == 1.5 and linkerd["bytes_per_edit"] == 150.0
    sotw = fig["models"]["sotw"]  # type: ignore[index]
    # No sotw client follows b: edit 1 reaches no one and is no divergence.
    assert sotw["to_every_client_ms"]["p50"] == 6.0 and sotw["bytes_per_edit"] == 65.0
    assert "PASS" in route_table(fig)


def test_a_client_that_ends_on_an_older_weight_is_a_divergence() -> None:
    a, b = scenario().authority("ns-0", "svc-0"), scenario().authority("ns-1", "svc-1")
    fig = _figures({
        "linkerd": [["compare-linkerd-0", a, [1000, 2], 1_001_000_000, 100],
                    ["compare-linkerd-0", b, [1000, 3], 1_101_000_000, 100],
                    ["compare-linkerd-1", b, [1000, 1], 500, 100]],
        "sotw": [["compare-sotw-0", a, [1000, 2], 1_002_000_000, 100]]})
    assert not fig["ok"]
    assert fig["failures"] == [{"client": "compare-linkerd-1", "target": b, "want": 3,
                                "got": [1000, 1]}]
    assert fig["models"]["linkerd"]["arrivals_missed"] == 1  # type: ignore[index]
    assert "DIVERGENCE: compare-linkerd-1" in route_table(fig)
