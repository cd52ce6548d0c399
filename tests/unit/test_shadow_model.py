"""`meshbridge shadow`'s decisions, with no server: verdicts, the Linkerd semantics
table, grace and time to agree, the summary's exit status, and the input helpers."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.endpoint.v3 import endpoint_pb2
from google.protobuf import any_pb2

from harness.normalize import carries_metadata
from harness.shadow.fields import FieldFilter
from harness.shadow.flat import cla_endpoints
from harness.shadow.model import (
    ABSENT,
    CONVERGING,
    DIFFERS,
    EMPTY,
    ENDPOINTS,
    EQUAL,
    ERROR,
    MISSING,
    NO_ANSWER,
    NO_ENDPOINTS,
    NOT_FOUND,
    PENDING,
    REMOVED,
    REMOVED_ALL,
    SEMANTICS,
    SILENT,
    Answer,
    Difference,
    Tracker,
    compare,
)
from harness.shadow.report import JsonReport, LinesReport, summarize
from harness.shadow.sides import Backoff, eds_names
from harness.shadow.targets import eds_name_template, read_targets

Endpoint = tuple[str, dict[str, str]]  # (key, its flat fields)


def endpoint(key: str, sa: str, zone: str, **more: str) -> Endpoint:
    return key, {"weight": "10000", "metric_labels.zone": zone,
                 "tls_identity.dns_like_identity.name":
                     f"{sa}.ns.serviceaccount.identity.linkerd.cluster.local",
                 "protocol_hint.h2": "{}", "protocol_hint.opaque_transport.inbound_port": "4143",
                 **more}


A = endpoint("10.0.0.1:8080", "a", "zone-a")
B = endpoint("10.0.0.2:8080", "b", "zone-b")


def eps(*items: Endpoint) -> Answer:
    return Answer(ENDPOINTS, dict(items))


# ---------------------------------------------------------------------- compare

VERDICTS = [
    # (ours, theirs, status, missing_on)
    (eps(A, B), eps(A, B), EQUAL, ""),
    (eps(A), eps(A, B), DIFFERS, ""),
    # The two documented semantics (Linkerd §1.7, §2.5) saying the same thing.
    (Answer(ABSENT), Answer(NOT_FOUND, status="NOT_FOUND: x"), SEMANTICS, ""),
    (Answer(NO_ENDPOINTS), Answer(SILENT), SEMANTICS, ""),
    (Answer(SILENT), Answer(NO_ENDPOINTS), SEMANTICS, ""),
    (Answer(NO_ENDPOINTS), Answer(REMOVED_ALL), SEMANTICS, ""),
    (Answer(ABSENT), Answer(REMOVED_ALL), SEMANTICS, ""),
    # 2.20 stays silent when an endpoint-less service is deleted.
    (Answer(ABSENT, existed=True), Answer(SILENT), SEMANTICS, ""),
    # ... but proto saying "never existed" against 2.20 saying "exists" is a real gap.
    (Answer(ABSENT), Answer(SILENT), MISSING, "ours"),
    (Answer(NOT_FOUND, status="NOT_FOUND: x"), Answer(NO_ENDPOINTS), MISSING, "ours"),
    (eps(A), Answer(NOT_FOUND, status="NOT_FOUND: x"), MISSING, "theirs"),
    (eps(A), Answer(ABSENT), MISSING, "theirs"),
    (Answer(ABSENT), Answer(NO_ENDPOINTS), MISSING, "ours"),
    # Same semantics, same meaning.
    (Answer(SILENT), Answer(REMOVED_ALL), EQUAL, ""),
    (Answer(NOT_FOUND, status="NOT_FOUND: a"), Answer(NOT_FOUND, status="NOT_FOUND: b"),
     EQUAL, ""),
    # An empty answer against endpoints is an endpoint difference, whatever the signal.
    (eps(A), Answer(SILENT), DIFFERS, ""),
    (Answer(NO_ENDPOINTS), eps(A), DIFFERS, ""),
    # Errors: a rejection both sides make alike is agreement; no answer is not.
    (Answer(ERROR, status="INVALID_ARGUMENT: a"), Answer(ERROR, status="INVALID_ARGUMENT: b"),
     EQUAL, ""),
    (Answer(ERROR, status="UNAVAILABLE: x"), Answer(ERROR, status="UNAVAILABLE: x"), ERROR, ""),
    (eps(A), Answer(ERROR, status="UNIMPLEMENTED: x"), ERROR, ""),
    (eps(A), Answer(ERROR, status="INVALID_ARGUMENT: x"), ERROR, ""),
    (Answer(PENDING), eps(A), PENDING, ""),
    (Answer(ERROR, status="UNAVAILABLE: x"), Answer(PENDING), ERROR, ""),
    # xDS: an empty CLA says nothing about existence; the CDS does.
    (Answer(EMPTY), Answer(EMPTY), EQUAL, ""),
    (Answer(EMPTY, exists=True), Answer(EMPTY, exists=False), MISSING, "theirs"),
    (Answer(ENDPOINTS, dict([A]), exists=True), Answer(EMPTY, exists=False),
     MISSING, "theirs"),
    (eps(A), Answer(NO_ANSWER), MISSING, "theirs"),
    (Answer(REMOVED), eps(A), MISSING, "ours"),
    (Answer(REMOVED), Answer(EMPTY, exists=False), EQUAL, ""),
]


@pytest.mark.parametrize(("ours", "theirs", "status", "missing_on"), VERDICTS)
def test_verdicts(ours: Answer, theirs: Answer, status: str, missing_on: str) -> None:
    v = compare(ours, theirs)
    assert (v.status, v.missing_on) == (status, missing_on)


def test_an_extra_endpoint_is_listed_as_only_on_one_side() -> None:
    v = compare(eps(A), eps(A, B))
    assert v.differences == (Difference("only-theirs", "10.0.0.2:8080"),)


def test_a_changed_field_is_named_by_its_path_with_both_values() -> None:
    other = endpoint("10.0.0.1:8080", "a", "zone-a", weight="100000")
    v = compare(eps(A), eps(other))
    assert v.differences == (Difference("field", "10.0.0.1:8080", "add[10.0.0.1:8080].weight",
                                        "10000", "100000"),)


def test_a_field_only_one_side_sets_is_unset_on_the_other() -> None:
    labelled = endpoint("10.0.0.1:8080", "a", "zone-a", **{"metric_labels.pod": "p"})
    v = compare(eps(A), eps(labelled))
    assert v.differences == (Difference("field", "10.0.0.1:8080",
                                        "add[10.0.0.1:8080].metric_labels.pod", "(unset)", "p"),)


def test_ignored_fields_are_not_differences() -> None:
    bare = ("10.0.0.1:8080", {"weight": "10000", "metric_labels.zone": "zone-a"})
    assert compare(eps(A), eps(bare)).status == DIFFERS
    ignore = FieldFilter(["add.tls_identity", "add.protocol_hint"])
    assert compare(eps(A), eps(bare), ignore).status == EQUAL
    # An endpoint key narrows a pattern to that endpoint.
    assert compare(eps(A), eps(bare), FieldFilter(["add[10.0.0.9:8080]"])).status == DIFFERS


def test_set_profile_and_redundant_messages_are_compared() -> None:
    ours = Answer(ENDPOINTS, dict([A]), common={"set.metric_labels.service": "web"},
                  profile={"profile.retry_budget.retry_ratio": "0.2"}, messages={"add": 1})
    theirs = Answer(ENDPOINTS, dict([A]), common={"set.metric_labels.service": "web2"},
                    profile={"profile.retry_budget.retry_ratio": "0.5"},
                    messages={"add": 2, "redundant": 1})
    assert [(d.field, d.ours, d.theirs) for d in compare(ours, theirs).differences] == [
        ("set.metric_labels.service", "web", "web2"),
        ("profile.retry_budget.retry_ratio", "0.2", "0.5"),
        ("messages.redundant", "0", "1")]
    # A side whose profile is not compared (it refuses GetProfile): the rest still is.
    refused = Answer(ENDPOINTS, dict([A]), common=ours.common, profile=None)
    assert compare(ours, refused).status == EQUAL
    # A profile still on its way holds the verdict.
    assert compare(ours, Answer(ENDPOINTS, dict([A]), profile_pending=True)).status == PENDING


def test_semantics_never_hides_an_endpoint_difference() -> None:
    assert compare(eps(A), Answer(REMOVED_ALL)).status == DIFFERS


# ---------------------------------------------------------------------- over time


def test_a_fresh_disagreement_converges_then_counts_after_grace() -> None:
    t = Tracker(grace=1.0)
    assert t.set_answer("x", "ours", eps(A), 10.0) == []  # theirs still pending: no change
    [first] = t.set_answer("x", "theirs", eps(A), 10.1)
    assert (first.status, first.previous, first.time_to_agree) == (EQUAL, PENDING, None)
    [conv] = t.set_answer("x", "ours", eps(A, B), 20.0)
    assert (conv.status, conv.changed, conv.differences) == (CONVERGING, "ours", ())
    assert t.tick(20.5) == []
    [late] = t.tick(21.0)
    assert late.status == DIFFERS
    assert late.differences == (Difference("only-ours", "10.0.0.2:8080"),)
    [agreed] = t.set_answer("x", "theirs", eps(A, B), 23.5)
    assert agreed.status == EQUAL
    assert agreed.time_to_agree == pytest.approx(3.5)
    assert t.records["x"].agreed_after == [pytest.approx(3.5)]


def test_a_catch_up_within_grace_reports_only_the_time_to_agree() -> None:
    t = Tracker(grace=1.0)
    t.set_answer("x", "ours", eps(A), 0.0)
    t.set_answer("x", "theirs", eps(A), 0.0)
    statuses = [e.status for e in t.set_answer("x", "theirs", eps(A, B), 5.0)]
    agreed = t.set_answer("x", "ours", eps(A, B), 5.08)
    assert statuses == [CONVERGING]
    assert [(e.status, round(e.time_to_agree or 0, 3)) for e in agreed] == [(EQUAL, 0.08)]
    assert t.tick(10.0) == []


def test_an_unchanged_answer_is_no_event_and_does_not_restart_grace() -> None:
    t = Tracker(grace=1.0)
    t.set_answer("x", "ours", eps(A), 0.0)
    t.set_answer("x", "theirs", eps(B), 0.0)
    assert t.set_answer("x", "theirs", eps(B), 0.9) == []
    assert [e.status for e in t.tick(1.0)] == [DIFFERS]


def test_errors_show_at_once() -> None:
    t = Tracker(grace=10.0)
    t.set_answer("x", "ours", eps(A), 0.0)
    [ev] = t.set_answer("x", "theirs", Answer(ERROR, status="UNAVAILABLE: down"), 0.0)
    assert ev.status == ERROR
    assert "UNAVAILABLE" in ev.theirs


def test_ignoring_more_fields_reevaluates() -> None:
    t = Tracker(grace=0.0, ignore=FieldFilter(["add.protocol_hint"]))
    bare = ("10.0.0.1:8080", {"weight": "10000", "metric_labels.zone": "zone-a"})
    t.set_answer("x", "ours", eps(A), 0.0)
    t.set_answer("x", "theirs", eps(bare), 0.0)
    assert t.records["x"].verdict.status == DIFFERS
    [ev] = t.set_ignored(["add.tls_identity"], 1.0)
    assert ev.status == EQUAL
    assert t.ignore.patterns == ("add.protocol_hint", "add.tls_identity")


# ---------------------------------------------------------------------- report


def _tracker(*pairs: tuple[str, Answer, Answer]) -> Tracker:
    t = Tracker(grace=0.0)
    for target, ours, theirs in pairs:
        t.set_answer(target, "ours", ours, 0.0)
        t.set_answer(target, "theirs", theirs, 0.0)
    return t


@pytest.mark.parametrize(("pairs", "strict", "code"), [
    ([("a", eps(A), eps(A))], False, 0),
    ([("a", eps(A), eps(A)), ("b", Answer(NO_ENDPOINTS), Answer(SILENT))], False, 0),
    ([("b", Answer(NO_ENDPOINTS), Answer(SILENT))], True, 1),
    ([("a", eps(A), eps(A)), ("b", eps(A), eps(B))], False, 1),
    ([("a", eps(A), Answer(PENDING))], False, 1),
    ([], False, 1),
])
def test_exit_status_is_zero_only_if_every_target_agrees(
        pairs: list[tuple[str, Answer, Answer]], strict: bool, code: int) -> None:
    s = summarize(_tracker(*pairs), api="linkerd", ours="o", theirs="t", duration=1.0,
                  notes=[], strict_semantics=strict)
    assert s.exit_code == code


def test_json_report_writes_one_object_per_event_and_a_summary() -> None:
    out = io.StringIO()
    report = JsonReport(out)
    t = Tracker(grace=0.0)
    report.start({"api": "xds", "ours": "o", "theirs": "t", "targets": 1})
    report.events(t.set_answer("x", "ours", eps(A), 0.0))
    report.events(t.set_answer("x", "theirs", eps(A, B), 0.0))
    report.finish(summarize(t, api="xds", ours="o", theirs="t", duration=1.0, notes=["n"]))
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["event"] for line in lines] == ["start", "target", "summary"]
    assert lines[1]["status"] == DIFFERS
    assert lines[1]["differences"] == [{"kind": "only-theirs", "endpoint": "10.0.0.2:8080"}]
    assert lines[2]["exit_status"] == 1
    assert lines[2]["unagreed"][0]["target"] == "x"
    assert lines[2]["notes"] == ["n"]


def test_lines_report_names_the_differences_and_the_result() -> None:
    out = io.StringIO()
    t = _tracker(("x", eps(A), eps(A, B)))
    LinesReport(out).finish(summarize(t, api="xds", ours="o", theirs="t", duration=1.0,
                                      notes=[]))
    text = out.getvalue()
    assert "10.0.0.2:8080 only on theirs" in text
    assert "result: targets disagree" in text


# ---------------------------------------------------------------------- inputs


def test_targets_file_skips_comments_expands_short_names_and_dedupes(tmp_path: Path) -> None:
    f = tmp_path / "targets"
    f.write_text("# pilot\nweb.emojivoto:80\n\nweb.emojivoto.svc.cluster.local:80  # again\n"
                 "db-1.db.data.svc.cluster.local:5432\n")
    assert read_targets(f, "cluster.local") == [
        "web.emojivoto.svc.cluster.local:80", "db-1.db.data.svc.cluster.local:5432"]


def test_eds_name_template_for_istio() -> None:
    name = eds_name_template("outbound|{port}||{host}")
    assert name("web.emojivoto.svc.cluster.local:80") == \
        "outbound|80||web.emojivoto.svc.cluster.local"
    with pytest.raises(KeyError):
        eds_name_template("{nope}")


def test_cds_names_are_the_eds_clusters_service_names() -> None:
    def packed(c: cluster_pb2.Cluster) -> any_pb2.Any:
        a = any_pb2.Any()
        a.Pack(c)
        return a

    eds = cluster_pb2.Cluster(name="outbound|80||web.ns.svc.cluster.local",
                              type=cluster_pb2.Cluster.EDS)
    named = cluster_pb2.Cluster(name="a", type=cluster_pb2.Cluster.EDS)
    named.eds_cluster_config.service_name = "b"
    static = cluster_pb2.Cluster(name="BlackHoleCluster", type=cluster_pb2.Cluster.STATIC)
    assert eds_names([packed(eds), packed(named), packed(static)]) == frozenset(
        {"outbound|80||web.ns.svc.cluster.local", "b"})


def test_a_foreign_cla_is_read_as_envoy_reads_it() -> None:
    cla = endpoint_pb2.ClusterLoadAssignment(cluster_name="x")
    loc = cla.endpoints.add()
    loc.locality.zone = "zone-a"
    lb = loc.lb_endpoints.add()
    lb.endpoint.address.socket_address.address = "10.0.0.1"
    lb.endpoint.address.socket_address.port_value = 8080
    lb.load_balancing_weight.value = 3
    lb2 = loc.lb_endpoints.add()
    lb2.endpoint.address.socket_address.address = "::1"
    lb2.endpoint.address.socket_address.port_value = 8080
    assert carries_metadata(cla) is False
    assert carries_metadata(endpoint_pb2.ClusterLoadAssignment()) is None
    # Unset health is HEALTHY and unset weight 1, as Envoy reads them; the locality's
    # fields are each endpoint's.
    assert cla_endpoints(cla) == {
        "10.0.0.1:8080": {"load_balancing_weight.value": "3", "health_status": "HEALTHY",
                          "locality.zone": "zone-a"},
        "[::1]:8080": {"load_balancing_weight.value": "1", "health_status": "HEALTHY",
                       "locality.zone": "zone-a"}}


def test_backoff_doubles_up_to_its_ceiling_and_resets() -> None:
    b = Backoff(0.2, 1.0)
    assert [b.next() for _ in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    b.reset()
    assert b.next() == 0.2
