"""/metrics in Prometheus' text format, with Linkerd's and Istio's counter names as
they expose them.

The Go Prometheus client (Linkerd's destination controller) and istiod's exporter
write a counter under the name it was given: `endpoint_updates_queue_overflow`,
`pilot_xds_pushes`. The Python client always writes a counter as `<name>_total` (and
adds `<name>_created`), so Linkerd's and Istio's dashboards and alerts would find
nothing. The counters named in `UPSTREAM_COUNTERS` are written here under their
upstream names; every other family is written by prometheus_client unchanged (our
own counters, `meshbridge_*`, and the gRPC ones, whose upstream names do end in
`_total`). The registry itself is untouched: in-process readers
(`registry.get_sample_value`) see the library's names.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric

# Counters with the same meaning as Linkerd's or istiod's, under their names there
# (docs/metrics.md says where each is defined upstream).
LINKERD_COUNTERS = frozenset({
    "endpoint_updates_queue_overflow",
    "profile_updates_queue_overflow",
    "endpoint_profile_updates_queue_overflow",
    "endpoints_updates",
})
ISTIO_COUNTERS = frozenset({
    "pilot_xds_pushes",
    "pilot_total_xds_rejects",
    "pilot_xds_expired_nonce",
    "pilot_xds_write_timeout",
})
UPSTREAM_COUNTERS = LINKERD_COUNTERS | ISTIO_COUNTERS


class _One:
    """A registry of one family, for generate_latest."""

    def __init__(self, family: Metric) -> None:
        self.family = family

    def collect(self) -> Iterator[Metric]:
        yield self.family


def _value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _plain_counter(family: Metric) -> str:
    doc = family.documentation.replace("\\", r"\\").replace("\n", r"\n")
    lines = [f"# HELP {family.name} {doc}", f"# TYPE {family.name} counter"]
    for sample in family.samples:
        if sample.name != family.name + "_total":
            continue  # `_created`: the Go client has no such series
        labels = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sample.labels.items())
        lines.append(f"{family.name}{{{labels}}} {_value(sample.value)}"
                     if labels else f"{family.name} {_value(sample.value)}")
    return "\n".join(lines) + "\n"


class Collected(Protocol):
    def collect(self) -> Iterable[Metric]: ...


def generate(registry: CollectorRegistry | Collected) -> bytes:
    """The text exposition of `registry`, upstream counters under upstream names."""
    parts: list[bytes] = []
    for family in registry.collect():
        if family.type == "counter" and family.name in UPSTREAM_COUNTERS:
            parts.append(_plain_counter(family).encode())
        else:
            parts.append(generate_latest(_One(family)))
    return b"".join(parts)
