"""bridge/loopmetrics exposes exactly what prometheus_client's own metrics would."""

from __future__ import annotations

import prometheus_client
from prometheus_client.parser import text_string_to_metric_families

from meshbridge.loopmetrics import LoopCounter, LoopHistogram

BUCKETS = (0.001, 0.01, 0.1, 1.0)
VALUES = (0.0005, 0.001, 0.002, 0.05, 0.1, 0.5, 3.0, 7.5)


def _samples(registry: prometheus_client.CollectorRegistry) -> set[tuple[str, tuple[
        tuple[str, str], ...], float]]:
    text = prometheus_client.generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items())), s.value)
            for family in text_string_to_metric_families(text) for s in family.samples
            if not s.name.endswith("_created")}


def test_counters_and_histograms_match_prometheus_clients() -> None:
    ours, theirs = prometheus_client.CollectorRegistry(), prometheus_client.CollectorRegistry()
    c1 = LoopCounter("pushes", "responses", ["type"], registry=ours)
    c2 = prometheus_client.Counter("pushes", "responses", ["type"], registry=theirs)
    h1 = LoopHistogram("lag_seconds", "lag", ["protocol"], registry=ours, buckets=BUCKETS)
    h2 = prometheus_client.Histogram("lag_seconds", "lag", ["protocol"], registry=theirs,
                                     buckets=BUCKETS)
    for i, v in enumerate(VALUES):
        label = "eds" if i % 3 else "cds"
        c1.labels(label).inc(i + 1)
        c2.labels(label).inc(i + 1)
        h1.labels(label).observe(v)
        h2.labels(label).observe(v)
    assert _samples(ours) == _samples(theirs)
    assert ours.get_sample_value("lag_seconds_bucket", {"protocol": "eds", "le": "0.01"}) == 2


def test_a_label_count_mismatch_is_refused() -> None:
    counter = LoopCounter("c", "c", ["a", "b"])
    try:
        counter.labels("only-one")
    except ValueError as e:
        assert "expected labels" in str(e)
    else:
        raise AssertionError("accepted the wrong number of labels")
