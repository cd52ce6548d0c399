"""Linkerd's destination metrics for the shared views (Linkerd §4.9), one series per View.

The names and labels are Linkerd's, so existing dashboards carry over. One difference,
by design: a View is shared by both protocols, so `endpoints_subscribers` counts every
subscriber of it, Linkerd streams and xDS streams alike (`/debug/views` splits them).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import prometheus_client

if TYPE_CHECKING:
    from bridge.views.view import View

_LABELS = ("cluster", "namespace", "service", "port", "hostname", "nodename")


class ViewMetrics:
    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self.subscribers = prometheus_client.Gauge(
            "endpoints_subscribers", "Subscribers of a service port's filter group", _LABELS,
            registry=registry)
        self.updates = prometheus_client.Counter(
            "endpoints_updates", "Versions published for a filter group", _LABELS,
            registry=registry)
        self.pods = prometheus_client.Gauge(
            "endpoints_pods", "Ready endpoints in a filter group's snapshot", _LABELS,
            registry=registry)
        self.exists = prometheus_client.Gauge(
            "endpoints_exists", "1 if the service exists", _LABELS, registry=registry)

    @staticmethod
    def _labels(view: View) -> tuple[str, ...]:
        k = view.key
        return (view.cluster.name, k.service.namespace, k.service.name, str(k.port),
                k.filter.hostname, k.filter.node_name)

    def published(self, view: View) -> None:
        labels = self._labels(view)
        self.updates.labels(*labels).inc()
        self.pods.labels(*labels).set(view.snapshot.ready_count)
        self.exists.labels(*labels).set(1 if view.exists else 0)

    def subscribed(self, view: View) -> None:
        self.subscribers.labels(*self._labels(view)).set(view.subscriber_total())

    def dropped(self, view: View) -> None:
        labels = self._labels(view)
        for metric in (self.subscribers, self.updates, self.pods, self.exists):
            with contextlib.suppress(KeyError):
                metric.remove(*labels)
