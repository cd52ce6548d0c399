"""Counters and histograms for the per-message path, cheaper than prometheus_client's.

prometheus_client takes a lock on every `inc` and `observe` (its metrics may be
touched from any thread); a fan-out to thousands of streams pays that several times
per stream. These are plain attribute updates: use them only for metrics changed on
the event loop's thread (the gRPC handlers and the Views are; the kube source's
threads are not). They are exposed exactly as prometheus_client's would be, through
the same registry.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

import prometheus_client
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector


class CountChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class HistogramChild:
    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.sum += value
        # Prometheus buckets are "less than or equal": the first bound >= value.
        self.counts[bisect.bisect_left(self._bounds, value)] += 1


Child = TypeVar("Child", CountChild, HistogramChild)


class _Family(Collector, Generic[Child]):
    """A metric family: its children by label values, and how it is exposed."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (),
                 registry: prometheus_client.CollectorRegistry | None = None) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], Child] = {}
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> Child:
        child = self._children.get(values)
        if child is None:
            if len(values) != len(self.labelnames):
                raise ValueError(f"{self.name}: expected labels {self.labelnames}")
            child = self._children[values] = self._new_child()
        return child

    def describe(self) -> list[Metric]:
        return [self._family()]

    def _new_child(self) -> Child:
        raise NotImplementedError

    def _family(self) -> Metric:
        raise NotImplementedError

    def collect(self) -> Iterator[Metric]:
        raise NotImplementedError


class LoopCounter(_Family[CountChild]):
    def _new_child(self) -> CountChild:
        return CountChild()

    def _family(self) -> CounterMetricFamily:
        return CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, child in self._children.items():
            family.add_metric(list(values), child.value)
        yield family


class LoopHistogram(_Family[HistogramChild]):
    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (),
                 registry: prometheus_client.CollectorRegistry | None = None,
                 buckets: Sequence[float] = prometheus_client.Histogram.DEFAULT_BUCKETS,
                 ) -> None:
        self.bounds = tuple(sorted(b for b in buckets if not math.isinf(b)))
        super().__init__(name, documentation, labelnames, registry)

    def _new_child(self) -> HistogramChild:
        return HistogramChild(self.bounds)

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, child in self._children.items():
            cumulative, buckets = 0, []
            for bound, count in zip((*self.bounds, math.inf), child.counts, strict=True):
                cumulative += count
                buckets.append((_bound_text(bound), cumulative))
            family.add_metric(list(values), buckets, child.sum)
        yield family


def _bound_text(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))
