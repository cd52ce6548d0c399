"""Encode cost per change: what one endpoint change costs before any byte is written.

    python -m bench.encode [--endpoints 10,100,1000] [--changes 200] [--runs 5] [--json]

No network and no subscriber streams: a cluster cache, the View registry and both
protocol layers' encoders, in this process. Each change scales one service up or
down by one pod (a pod event plus its EndpointSlice, as the slice controller writes
them), and three costs are timed separately, per change:

    core      Cluster.apply -> merge, enrich and diff the View (one subscriber)
    Get       the Linkerd `Update` messages of that diff (linkerd_api's encoder)
    CLA       the xDS ClusterLoadAssignment of the new version (xds_api's cache)

Each is what the server pays once per change whatever the number of subscribers
(the fan-out benchmark measures what each subscriber adds). A run is `--changes`
changes; the figure is the median per-change cost of a run, then the median of runs.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

from bench.common import finish, parser, row


class _Recorder:
    def on_view_change(self, view: Any, change: Any) -> None:
        self.change = change


def measure(endpoints: int, changes: int) -> dict[str, float]:
    from bridge.cluster import Cluster, Event, EventType
    from bridge.model import MeshConfig, ServiceKey, ViewKey
    from bridge.sources.sim import Churn, ClusterShape, Scenario, SimCluster
    from bridge.views import ViewRegistry
    from linkerd_api.endpoint_streams import UpdateEncoder
    from linkerd_api.translate import Translator
    from xds_api.cache import ResourceCache

    sim = SimCluster(Scenario(seed=3, cluster=ClusterShape(
        namespaces=1, services=1, endpoints_per_service=endpoints, zones=3,
        slice_size=100), churn=Churn(rate=0)))
    cluster = Cluster()
    config = MeshConfig()
    registry = ViewRegistry(cluster, config)
    cluster.apply(Event(EventType.ADDED, o) for o in sim.initial_objects())
    key = ViewKey(ServiceKey("ns-0", "svc-0"), 8080)
    rec = _Recorder()
    view = registry.subscribe(key, rec, "bench")
    encoder = UpdateEncoder(Translator(config), "proto")
    cache = ResourceCache(cluster, registry, config.cluster_domain)
    cache.cla_of(view)  # the first version, as a subscriber would have it
    core, get, cla = [], [], []
    svc = sim.services[0]
    for i in range(changes):
        events = sim._step_scale(svc, up=i % 2 == 0)
        t0 = time.perf_counter_ns()
        cluster.apply(events)
        t1 = time.perf_counter_ns()
        encoder.diff(view, rec.change)
        t2 = time.perf_counter_ns()
        cache.cla_of(view)
        t3 = time.perf_counter_ns()
        core.append(t1 - t0)
        get.append(t2 - t1)
        cla.append(t3 - t2)
    cache.close()
    return {"core": statistics.median(core) / 1000, "get": statistics.median(get) / 1000,
            "cla": statistics.median(cla) / 1000}


def run(sizes: list[int], changes: int, runs: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for n in sizes:
        per_run = [measure(n, changes) for _ in range(runs)]
        results[str(n)] = {k: [r[k] for r in per_run] for k in ("core", "get", "cla")}
    return {"changes_per_run": changes, "runs": runs, "us_per_change": results}


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for n, figs in result["us_per_change"].items():
        for part, label in (("core", "core: merge, enrich, diff"), ("get", "Linkerd Update"),
                            ("cla", "xDS CLA")):
            out.append(row(f"encode cost per change, {int(n):,}-endpoint View", label,
                           figs[part], "µs"))
    return out


def report(result: dict[str, Any]) -> str:
    lines = [f"encode cost per one-endpoint change (median µs per change; "
             f"{result['runs']} runs of {result['changes_per_run']} changes)",
             f"  {'endpoints':>9}  {'core':>9}  {'Get':>9}  {'CLA':>9}"]
    for n, figs in result["us_per_change"].items():
        lines.append(f"  {int(n):>9,}  " + "  ".join(
            f"{statistics.median(figs[k]):>9.0f}" for k in ("core", "get", "cla")))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = parser("encode", __doc__)
    p.add_argument("--endpoints", default="10,100,1000",
                   help="View sizes, comma-separated")
    p.add_argument("--changes", type=int, default=200)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.endpoints.split(",") if x.strip()]
    return finish("encode", run(sizes, args.changes, args.runs), args.json, rows, report)


if __name__ == "__main__":
    sys.exit(main())
