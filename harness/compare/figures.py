"""A run's figures: one JSON-able dict (`report.json`) holding every figure of a raw
`Run` and the consistency checks (harness.compare.verdicts). The markdown and the charts
only read that dict, so what the tables say and what the JSON says cannot differ.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from harness.compare.analysis import ModelFigures, analyse, by_pattern, latency_summary
from harness.compare.kube import KubeSide, kube_side
from harness.compare.run import Run
from harness.compare.scenario import MODEL_TITLES, CompareScenario
from harness.compare.verdicts import checks, divergences


def scenario_json(cs: CompareScenario) -> dict[str, Any]:
    s = cs.scenario
    c = cs.clients
    return {
        "name": s.name, "file": cs.source, "seed": s.seed,
        "cluster": {"namespaces": s.cluster.namespaces, "services": s.cluster.services,
                    "endpoints_per_service": s.cluster.endpoints_per_service,
                    "zones": s.cluster.zones, "slice_size": s.cluster.slice_size,
                    "port": s.cluster.port, "meshed": s.cluster.meshed},
        "churn": {"rate": s.churn.rate, "patterns": dict(s.churn.patterns)},
        "duration": s.duration,
        "clients": {"linkerd": c.linkerd, "sotw": c.sotw, "delta": c.delta,
                    "targets": "all" if c.targets is None else c.targets,
                    "selection": c.selection, "kube_watchers": c.kube_watchers},
    }


def _per(n: float, d: float) -> float:
    return n / d if d else 0.0


def figures(run: Run, kube: KubeSide | None = None) -> dict[str, Any]:
    cs = run.cs
    res = run.results
    records = res.get("records", [])
    finals = res.get("finals", [])
    subs = {(f["model"], int(f["index"])): list(f["targets"]) for f in finals}
    analysed = analyse(records, run.truth.versions, run.truth.emissions, run.churn_start_ns,
                       subs)
    run.analysed = analysed
    changes = run.changes
    emissions = run.truth.emissions[:changes]
    pattern_counts = Counter(e.pattern for e in emissions)
    if kube is None:
        kube = kube_side(cs.scenario, changes, cs.clients.kube_watchers)
    failures = divergences(run)
    models: dict[str, Any] = {}
    for model in run.models + tuple(m for m in analysed if m not in run.models):
        f = analysed.get(model) or ModelFigures(model)
        server = run.server.get(model)
        mem = run.memory.get(model, {})
        models[model] = {
            "title": MODEL_TITLES.get(model, model),
            "clients": f.clients,
            "subscriptions": f.subscriptions,
            "connections": server.connections if server else 0,
            "streams": server.streams if server else 0,
            "messages": {"total": f.messages, "snapshot": f.snapshot_messages,
                         "churn": f.churn_messages,
                         "per_change": _per(f.churn_messages, changes),
                         "target_updates": f.target_updates},
            "bytes": {"total": f.bytes, "snapshot": f.snapshot_bytes, "churn": f.churn_bytes,
                      "per_change": _per(f.churn_bytes, changes),
                      "per_change_per_client": _per(f.churn_bytes, changes * f.clients)},
            "server": {"messages": server.messages if server else 0,
                       "bytes": server.bytes if server else 0},
            "latency_ms": latency_summary(f.latencies_ns),
            "latency_ms_by_pattern": {p: latency_summary(ns) for p, ns in
                                      sorted(f.latencies_by_pattern.items())},
            "versions": {"due": f.versions_due, "delivered": f.delivered,
                         "superseded": f.superseded, "unchanged": f.unchanged,
                         "missing": f.missing, "intermediate_messages": f.intermediate,
                         "repeated_updates": f.repeats},
            "memory": {"rss_bytes": mem.get("rss", 0), "heap_bytes": mem.get("heap", -1),
                       "heap_per_client": _per(mem.get("heap", 0), f.clients),
                       "heap_per_subscription": _per(mem.get("heap", 0), f.subscriptions)},
            "bytes_by_pattern": by_pattern(f.bytes_by_change, emissions),
            "messages_by_pattern": by_pattern(f.messages_by_change, emissions),
            "divergences": sum(1 for x in failures if x["model"] == model),
        }
    kube_json = {
        "watchers": kube.watchers,
        "endpoints": {"initial_bytes_per_watcher": kube.initial_endpoints,
                      "churn_bytes_per_watcher": kube.endpoints_bytes,
                      "churn_bytes": kube.endpoints_bytes * kube.watchers,
                      "events_per_watcher": kube.endpoints_events,
                      "per_change": _per(kube.endpoints_bytes * kube.watchers, changes),
                      "by_pattern": _kube_by_pattern(kube.endpoints_by_change, kube.patterns,
                                                     kube.watchers)},
        "endpointslices": {"initial_bytes_per_watcher": kube.initial_slices,
                           "churn_bytes_per_watcher": kube.slices_bytes,
                           "churn_bytes": kube.slices_bytes * kube.watchers,
                           "events_per_watcher": kube.slices_events,
                           "per_change": _per(kube.slices_bytes * kube.watchers, changes),
                           "by_pattern": _kube_by_pattern(kube.slices_by_change, kube.patterns,
                                                          kube.watchers)},
        "slices_to_endpoints": _per(kube.slices_bytes, kube.endpoints_bytes),
    }
    churn_s = (run.churn_end_ns - run.churn_start_ns) / 1e9
    out: dict[str, Any] = {
        "scenario": scenario_json(cs),
        "run": {
            "changes": changes,
            "changes_by_pattern": dict(sorted(pattern_counts.items())),
            "truth_versions": run.truth.churn_versions(),
            "targets_followed": len(run.truth.versions),
            "churn_seconds": churn_s,
            "settle_seconds": (run.settled_ns - run.churn_end_ns) / 1e9,
            "settled": run.settled,
            "skipped_models": dict(run.skipped),
            "broken_layers": dict(run.broken),
        },
        "models": models,
        "server": {
            "cpu_seconds": run.cpu_seconds, "cpu_user": run.cpu_user,
            "cpu_system": run.cpu_system,
            "cpu_ms_per_change": _per(run.cpu_seconds * 1000, changes),
            "rss_start_bytes": run.rss_start, "rss_end_bytes": run.rss_end,
            "client_process_cpu_seconds": res.get("cpu_seconds", 0.0),
        },
        "kubernetes": kube_json,
        "failures": failures,
    }
    out.update(run.extra_figures)
    out["checks"] = checks(out, run)
    out["ok"] = all(c["ok"] for c in out["checks"])
    return out


def _kube_by_pattern(values: Sequence[int], patterns: Sequence[str],
                     watchers: int) -> dict[str, float]:
    sums: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for v, p in zip(values, patterns, strict=True):
        sums[p] += v * watchers
        counts[p] += 1
    return {p: sums[p] / counts[p] for p in sorted(counts)}
