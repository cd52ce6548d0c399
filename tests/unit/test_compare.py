"""`meshbridge compare`: scenario checks, target selection, truth matching, the
Kubernetes side and the report's checks. Nothing running."""

from __future__ import annotations

from pathlib import Path

import pytest

from bridge.cluster import Event, EventType
from bridge.objects import EndpointSlice
from bridge.sources.sim import ScenarioError, SimCluster, parse_scenario
from harness.compare.analysis import analyse, latency_summary, match_stream, percentile
from harness.compare.kube import _Replay, endpoints_object, kube_side, slice_object
from harness.compare.scenario import parse_compare_scenario
from harness.compare.truth import INITIAL, Emission, TruthVersion
from meshbridge.cli import main as cli_main

SMOKE = Path(__file__).resolve().parents[2] / "bench" / "scenarios" / "smoke.yaml"
SCENARIOS = sorted(SMOKE.parent.glob("*.yaml"))

BASE = """
seed: 3
cluster: {services: 6, endpoints_per_service: 3}
churn: {rate: 5}
duration: 2
"""


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(("text", "message"), [
    (BASE + "clients: {linkerd: 1, bogus: 2}\n", "clients: unknown key 'bogus'"),
    (BASE + "clients: {linkerd: -1}\n", "clients.linkerd: must be an integer"),
    (BASE + "clients: {linkerd: 0, sotw: 0, delta: 0}\n", "at least one of linkerd"),
    (BASE + "clients: {targets: 7}\n", "clients.targets: 7 is more than"),
    (BASE + "clients: {targets: 0}\n", "clients.targets: must be an integer"),
    (BASE + "clients: {selection: nearest}\n", "clients.selection: must be one of"),
    (BASE + "clients: {kube_watchers: 0}\n", "clients.kube_watchers"),
    (BASE + "clients: [1, 2]\n", "clients: must be a mapping"),
    ("seed: 1\ncluster: {services: 2}\nchurn: {rate: 1}\n", "duration: compare needs"),
    ("seed: 1\ncluster: {services: 0}\nduration: 1\n", "cluster.services"),
    ("seed: 1\nchurn: {rate: -2}\nduration: 1\n", "churn.rate"),
    ("seed: 1\ncluster: {servicez: 2}\nduration: 1\n", "cluster: unknown key 'servicez'"),
    ("seed: 1\nduration: 1\nextra: true\n", "scenario: unknown key 'extra'"),
])
def test_bad_scenarios_name_the_key(text: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[")):
        parse_compare_scenario(text)


@pytest.mark.parametrize(("text", "message"), [
    (BASE + "clients: {linkerd: 1, bogus: 2}\n", "unknown key 'bogus'"),
    ("seed: 1\nchurn: {rate: -2}\nduration: 1\n", "churn.rate"),
    ("seed: 1\ncluster: {services: 0}\nduration: 1\n", "cluster.services"),
    ("seed: [1\n", "not valid YAML"),
])
def test_the_command_exits_2_with_one_clear_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert cli_main(["compare", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_missing_file_exits_2_naming_the_path(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.yaml"
    assert cli_main(["compare", str(missing)]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "cannot read" in err


def test_a_directory_is_not_a_scenario(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["compare", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_bad_options_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["compare", str(SMOKE), "--envoy", "-1"]) == 2
    assert "--envoy" in capsys.readouterr().err
    assert cli_main(["compare", str(SMOKE), "--duration", "0"]) == 2
    assert "--duration" in capsys.readouterr().err
    # The server's own --xds-* flags are the xDS layer's, checked by it.
    assert cli_main(["compare", str(SMOKE), "--xds-write-timeout", "-1"]) == 2
    assert capsys.readouterr().err.startswith("meshbridge compare: ")


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_every_bundled_scenario_is_valid_and_documented(path: Path) -> None:
    from harness.compare.scenario import load_compare_scenario

    cs = load_compare_scenario(path)
    assert cs.scenario.name == path.stem
    assert path.read_text().startswith("#"), "a bundled scenario starts with what it shows"


# ------------------------------------------------------------------ targets


def test_client_i_of_every_model_follows_the_same_targets() -> None:
    cs = parse_compare_scenario(BASE + "clients: {linkerd: 2, sotw: 2, delta: 2, targets: 2}\n")
    specs = cs.client_specs()
    by_index: dict[int, set[tuple[str, ...]]] = {}
    for s in specs:
        by_index.setdefault(s.index, set()).add(s.targets)
    assert all(len(v) == 1 for v in by_index.values())
    assert cs.targets_of(0) == ("svc-0.ns-0.svc.cluster.local:8080",
                                "svc-1.ns-0.svc.cluster.local:8080")
    assert cs.targets_of(1)[0] == "svc-2.ns-0.svc.cluster.local:8080"


@pytest.mark.parametrize(("selection", "expected_first"), [("same", "svc-0"), ("spread", "svc-4")])
def test_selection(selection: str, expected_first: str) -> None:
    cs = parse_compare_scenario(BASE + f"clients: {{targets: 2, selection: {selection}}}\n")
    assert cs.targets_of(2)[0].startswith(expected_first + ".")


def test_random_selection_is_seeded_and_all_means_every_service() -> None:
    cs = parse_compare_scenario(BASE + "clients: {targets: 3, selection: random}\n")
    assert cs.targets_of(5) == cs.targets_of(5) and len(set(cs.targets_of(5))) == 3
    every = parse_compare_scenario(BASE + "clients: {targets: all}\n")
    assert len(every.targets_of(0)) == 6 and every.followed_targets() == every.all_targets()


# ------------------------------------------------------------------ truth matching


def v(version: int, change: int, at: int, digest: str) -> TruthVersion:
    return TruthVersion(version, change, at, digest, 1)


VERSIONS = [v(1, INITIAL, 0, "A"), v(2, 0, 100, "B"), v(3, 1, 200, "C"), v(4, 2, 300, "A")]


def test_every_version_reached_in_order_gives_one_latency_each() -> None:
    m = match_stream(VERSIONS, [(10, "A"), (150, "B"), (260, "C"), (301, "A")])
    assert (m.delivered, m.superseded, m.missing) == (3, 0, 0)
    assert m.latencies_ns == [50, 60, 1]


def test_a_version_coalesced_into_a_later_one_is_superseded_not_late() -> None:
    m = match_stream(VERSIONS, [(10, "A"), (320, "A")])
    assert (m.delivered, m.superseded, m.missing) == (1, 2, 0)
    assert m.latencies_ns == [20]


def test_a_state_seen_before_is_not_mistaken_for_an_old_version() -> None:
    # A -> B -> C -> A: the last A is version 4, not version 1 again.
    m = match_stream(VERSIONS, [(10, "A"), (110, "B"), (210, "C"), (305, "A")])
    assert m.reached == [0, 1, 2, 3]


def test_a_lagging_client_on_a_flapping_pod_is_matched_version_for_version() -> None:
    flap = [v(1, INITIAL, 0, "A"), v(2, 0, 100, "B"), v(3, 1, 200, "A"), v(4, 2, 300, "B"),
            v(5, 3, 400, "A")]
    m = match_stream(flap, [(10, "A"), (450, "B"), (460, "A"), (470, "B"), (480, "A")])
    assert m.reached == [0, 1, 2, 3, 4] and m.intermediate == 0
    assert m.latencies_ns == [350, 260, 170, 80]


def test_a_repeated_state_is_a_repeat_not_a_new_version() -> None:
    m = match_stream(VERSIONS, [(10, "A"), (150, "B"), (160, "B")])
    assert m.reached == [0, 1, 1] and m.repeats == 1 and m.delivered == 1


def test_a_half_applied_diff_is_intermediate_and_charged_to_its_version() -> None:
    m = match_stream(VERSIONS, [(10, "A"), (120, "A+B"), (130, "B")])
    assert m.intermediate == 1 and m.reached == [0, None, 1]
    assert (m.delivered, m.missing) == (1, 2)


def test_a_version_equal_to_the_held_state_needs_no_message() -> None:
    versions = [v(1, INITIAL, 0, "A"), v(2, 0, 100, "A")]
    m = match_stream(versions, [(10, "A")])
    assert (m.unchanged, m.missing) == (1, 0)


def test_percentiles_are_nearest_rank() -> None:
    values = [float(x) for x in range(1, 101)]
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99
    assert percentile(values, 100) == 100 and percentile([3.0], 95) == 3
    s = latency_summary([1_000_000, 3_000_000])
    assert s["p50"] == 1.0 and s["max"] == 3.0 and s["count"] == 2


def test_bytes_are_charged_to_the_change_that_caused_them() -> None:
    truth = {"t1": VERSIONS, "t2": [v(1, INITIAL, 0, "X"), v(2, 1, 200, "Y")]}
    emissions = [Emission(0, "scale", 100), Emission(1, "flap", 200), Emission(2, "scale", 300)]
    records = [
        ["delta", 0, 10, 50, "response", [["t1", "A"], ["t2", "X"]]],  # snapshot
        ["delta", 0, 150, 10, "response", [["t1", "B"]]],
        ["delta", 0, 250, 30, "response", [["t1", "C"], ["t2", "Y"]]],  # change 1, both
        ["delta", 0, 330, 20, "response", [["t1", "A"]]],
    ]
    figs = analyse(records, truth, emissions, 100, {("delta", 0): ["t1", "t2"]})
    f = figs["delta"]
    assert (f.snapshot_bytes, f.churn_bytes, f.churn_messages) == (50, 60, 3)
    assert f.bytes_by_change == {0: 10, 1: 30, 2: 20}
    assert f.versions_due == 4 and f.delivered == 4 and f.target_updates == 6


# ------------------------------------------------------------------ Kubernetes side


def test_endpoints_hold_every_address_and_slices_only_their_own() -> None:
    scenario = parse_scenario({"seed": 1, "cluster": {"services": 1, "endpoints_per_service": 5,
                                                      "slice_size": 2}})
    sim = SimCluster(scenario)
    objs = sim.initial_objects()
    slices = [o for o in objs if isinstance(o, EndpointSlice)]
    assert len(slices) == 3
    ep = endpoints_object("ns-0", "svc-0", slices, {}, "9")
    assert len(ep["subsets"][0]["addresses"]) == 5
    assert all("resourceVersion" in a["targetRef"] for a in ep["subsets"][0]["addresses"])
    body = slice_object(slices[0], "9")
    assert len(body["endpoints"]) == 2 and body["metadata"]["labels"][
        "kubernetes.io/service-name"] == "svc-0"


def test_a_slice_sent_again_unchanged_costs_nothing() -> None:
    scenario = parse_scenario({"seed": 1, "cluster": {"services": 1, "endpoints_per_service": 3}})
    sim = SimCluster(scenario)
    replay = _Replay()
    objs = sim.initial_objects()
    eb, sb, en, sn = replay.apply(Event(EventType.ADDED, o) for o in objs)
    assert (en, sn) == (1, 1) and eb > 0 and sb > 0
    svc = sim.services[0]
    same = [Event(EventType.MODIFIED, sim._slice(svc, k, eps)) for k, eps in svc.slices.items()]
    assert replay.apply(same) == (0, 0, 0, 0)


def test_one_endpoint_changing_in_a_big_service_costs_a_slice_not_everything() -> None:
    scenario = parse_scenario({"seed": 2, "cluster": {"services": 1, "endpoints_per_service": 500,
                                                      "slice_size": 100},
                               "churn": {"patterns": {"flap": 1}}})
    k = kube_side(scenario, 4, watchers=3)
    assert len(k.slices_by_change) == 4 and k.slices_events == 4 and k.endpoints_events == 4
    # 100 of 500 endpoints per event, each a little longer in a slice than in Endpoints.
    assert k.slices_bytes * 3 < k.endpoints_bytes


def test_the_replay_is_the_same_churn_as_the_run() -> None:
    scenario = parse_scenario({"seed": 5, "cluster": {"services": 4}})
    a = kube_side(scenario, 20, 1)
    b = kube_side(scenario, 20, 1)
    assert a.patterns == b.patterns and a.slices_by_change == b.slices_by_change


# ------------------------------------------------------------------ live view, wire counts


def test_the_live_view_shows_each_model_and_the_churn() -> None:
    import io

    from rich.console import Console

    from harness.compare.run import Run, ServerCounts
    from harness.compare.views import LiveView

    cs = parse_compare_scenario(BASE + "clients: {linkerd: 2, sotw: 1, delta: 0}\n")
    view = LiveView(cs)
    run = Run(cs)
    run.truth.emissions.extend(Emission(i, "scale", i) for i in range(4))
    run.live_server = {"linkerd": ServerCounts(2, 2, 7, 700)}
    run.client_counts = {"linkerd": [7, 700]}
    view.phase("churn")
    view.tick(run)
    text = io.StringIO()
    Console(file=text, width=120, force_terminal=False).print(view._render())
    out = text.getvalue()
    assert "Linkerd Get" in out and "xDS SotW" in out and "delta" not in out
    assert "7 / 700 B" in out and "4/10 changes" in out


async def test_the_wire_counter_counts_what_a_handler_writes() -> None:
    from harness.compare.wire import WireCounter, _wrap_unary_stream

    class Context:
        def __init__(self) -> None:
            self.written: list[bytes] = []

        def peer(self) -> str:
            return "ipv4:127.0.0.1:5000"

        async def write(self, message: bytes) -> None:
            self.written.append(message)

    async def handler(_request: object, context: Context) -> None:
        await context.write(b"abc")
        await context.write(b"de")

    counter = WireCounter(frozenset({"/m"}))
    ctx = Context()
    await _wrap_unary_stream(handler, "/m", counter)(None, ctx)
    (stream,) = counter.streams
    assert (stream.messages, stream.bytes, stream.open) == (2, 5, False)
    assert ctx.written == [b"abc", b"de"]


# ------------------------------------------------------------------ the report's figures


def test_a_p99_is_given_only_over_a_hundred_samples() -> None:
    from harness.compare.analysis import MIN_P99_SAMPLES
    from harness.compare.figures import p99_text

    few = latency_summary(range(1_000_000, 100_000_000, 1_000_000))  # 99 samples
    assert few["count"] == MIN_P99_SAMPLES - 1 and not few["p99_enough"]
    assert p99_text(few) == "max of 99"
    enough = latency_summary(range(1_000_000, 101_000_000, 1_000_000))  # 1..100 ms
    assert enough["p99_enough"] and p99_text(enough) == "99.00"
    assert p99_text(latency_summary([])) == "-"


def test_the_markdown_says_max_of_n_where_samples_are_few() -> None:
    from harness.compare.markdown import latency_cell

    cell = latency_cell(latency_summary([2_000_000, 4_000_000, 9_000_000]))
    assert cell == "4.00 / 9.00 / max of 3 / 9.00"


def test_the_metadata_profile_is_read_from_the_xds_options() -> None:
    from dataclasses import dataclass

    from harness.compare.environment import metadata_profile, profile_of

    @dataclass(frozen=True)
    class WithProfile:
        endpoint_metadata: str = "istio"

    @dataclass(frozen=True)
    class Without:
        draining: bool = False

    assert profile_of(WithProfile()) == "istio"
    assert profile_of(WithProfile("none")) == "none"
    assert profile_of(Without()) == profile_of(None) == "linkerd"
    # Whatever this build's xDS layer says by default, it is one of the profiles.
    assert metadata_profile(()) in ("none", "istio", "linkerd")


def test_models_agree_field_for_field_as_far_as_the_profile_carries_fields() -> None:
    from harness.compare.verdicts import field_groups

    models = ["linkerd", "sotw", "delta", "leds"]
    assert field_groups(models, "linkerd") == [set(models)]
    assert field_groups(models, "istio") == [{"linkerd"}, {"sotw", "delta", "leds"}]
    assert field_groups(["sotw"], "none") == [{"sotw"}]


def test_leds_is_one_more_model_and_isolating_keeps_one() -> None:
    cs = parse_compare_scenario(BASE + "clients: {linkerd: 2, sotw: 1, delta: 0, leds: 3}\n")
    assert [cs.clients.count(m) for m in ("linkerd", "sotw", "delta", "leds")] == [2, 1, 0, 3]
    alone = cs.only("leds")
    assert [alone.clients.count(m) for m in ("linkerd", "sotw", "delta", "leds")] == \
        [0, 0, 0, 3]
    assert alone.scenario == cs.scenario  # the same seeded churn
    assert [s.targets for s in alone.client_specs()] == \
        [s.targets for s in cs.client_specs() if s.model == "leds"]
    # A scenario that predates LEDS has no LEDS clients.
    assert parse_compare_scenario(BASE).clients.count("leds") == 0


def test_chart_styles_differ_for_every_model() -> None:
    from harness.compare.charts import style

    order = ["linkerd", "sotw", "delta", "leds", "newcomer"]
    styles = [style(m, order) for m in order]
    assert len({(s["color"], s["linestyle"], s["marker"]) for s in styles}) == len(order)
    assert all(s["alpha"] < 1 for s in styles)
