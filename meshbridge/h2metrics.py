"""The native gRPC server's own counters (h2grpc.server.ServerStats), exported on
/metrics. h2grpc imports no metrics library; this collector reads it at scrape time,
so counting costs the server nothing per frame."""

from __future__ import annotations

from collections.abc import Iterator

import prometheus_client
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from h2grpc.server import Server


class H2Collector(Collector):
    def __init__(self, server: Server) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        server = self.server
        yield GaugeMetricFamily("meshbridge_http2_connections",
                                "HTTP/2 connections open on the native gRPC server",
                                value=len(server.connections))
        yield CounterMetricFamily("meshbridge_http2_connections_accepted",
                                  "HTTP/2 connections accepted", value=server.stats.accepted)
        closes = CounterMetricFamily(
            "meshbridge_http2_connection_closes",
            "connections the server ended, by reason: a budget exceeded (GOAWAY "
            "ENHANCE_YOUR_CALM), a timeout, or a protocol error", labels=["reason"])
        for reason, count in sorted(server.stats.closes.items()):
            closes.add_metric([reason], count)
        yield closes
        yield GaugeMetricFamily("meshbridge_http2_open_streams",
                                "HTTP/2 streams open on the native gRPC server",
                                value=server.open_streams)
        yield GaugeMetricFamily("meshbridge_http2_handler_tasks",
                                "gRPC handler tasks running on the native gRPC server",
                                value=server.handler_tasks)
        heap = server.heap
        yield CounterMetricFamily("meshbridge_http2_heap_trims",
                                  "times memory was given back after a burst of closed "
                                  "connections and ended streams",
                                  value=heap.trims if heap else 0)
        yield CounterMetricFamily("meshbridge_http2_heap_trim_seconds",
                                  "CPU seconds spent giving memory back",
                                  value=heap.seconds if heap else 0.0)


def register(server: Server, registry: prometheus_client.CollectorRegistry) -> None:
    registry.register(H2Collector(server))
