"""A run's figures: one JSON-able dict (`report.json`) holding every figure of a raw
`Run` and the consistency checks (harness.compare.verdicts). The markdown and the charts
only read that dict, so what the tables say and what the JSON says cannot differ.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from harness.compare.analysis import ModelFigures, analyse, by_pattern, latency_summary
from harness.compare.kube import KubeSide, kube_side
from harness.compare.run import Run
from harness.compare.scenario import MODEL_TITLES, MODELS, CompareScenario
from harness.compare.verdicts import checks, divergences
from harness.normalize import digest


def scenario_json(cs: CompareScenario) -> dict[str, Any]:
    s = cs.scenario
    c = cs.clients
    linked: dict[str, Any] = {}
    if cs.linked is not None:
        ls = cs.linked.scenario
        linked = {"linked": {"name": cs.linked.name, "mode": cs.linked.mode, "seed": ls.seed,
                             "services": ls.cluster.services,
                             "endpoints_per_service": ls.cluster.endpoints_per_service,
                             "churn": {"rate": ls.churn.rate}}}
    return {**linked,
        "name": s.name, "file": cs.source, "seed": s.seed,
        "cluster": {"namespaces": s.cluster.namespaces, "services": s.cluster.services,
                    "endpoints_per_service": s.cluster.endpoints_per_service,
                    "zones": s.cluster.zones, "slice_size": s.cluster.slice_size,
                    "port": s.cluster.port, "meshed": s.cluster.meshed},
        "churn": {"rate": s.churn.rate, "patterns": dict(s.churn.patterns)},
        "duration": s.duration,
        "clients": {**{m: c.count(m) for m in MODELS},
                    "targets": "all" if c.targets is None else c.targets,
                    "selection": c.selection, "kube_watchers": c.kube_watchers},
    }


def p99_text(summary: Mapping[str, Any]) -> str:
    """The p99 as the tables give it: a number only over at least MIN_P99_SAMPLES
    samples (analysis.latency_summary's `p99_enough`), else "max of N"."""
    n = int(summary.get("count", 0))
    if not n:
        return "-"
    if summary.get("p99_enough"):
        return f"{summary['p99']:.2f}"
    return f"max of {n}"


def leds_json(finals: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """What the LEDS clients followed: collections and LbEndpoint resources. All zero
    against a server that answers them with plain CLAs (endpoints inline)."""
    out = {"clients": 0, "collections": 0, "resources": 0, "removed": 0, "cla_updates": 0}
    for f in finals:
        leds = f.get("leds")
        if leds is None:
            continue
        out["clients"] += 1
        for k in ("collections", "resources", "removed", "cla_updates"):
            out[k] += int(leds.get(k, 0))
    return out


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
            "process": dict(run.processes.get(model, {})),
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
        if model == "leds":
            models[model]["leds"] = leds_json([x for x in finals if x["model"] == "leds"])
    kube_json = {
        "watchers": kube.watchers,
        "endpoints": {"initial_bytes_per_watcher": kube.initial_endpoints,
                      "churn_bytes_per_watcher": kube.endpoints_bytes,
                      "churn_bytes": kube.endpoints_bytes * kube.watchers,
                      "events_per_watcher": kube.endpoints_events,
                      "per_change": _per(kube.endpoints_bytes * kube.watchers, changes),
                      "per_change_per_watcher": _per(kube.endpoints_bytes, changes),
                      "by_pattern": _kube_by_pattern(kube.endpoints_by_change, kube.patterns,
                                                     kube.watchers)},
        "endpointslices": {"initial_bytes_per_watcher": kube.initial_slices,
                           "churn_bytes_per_watcher": kube.slices_bytes,
                           "churn_bytes": kube.slices_bytes * kube.watchers,
                           "events_per_watcher": kube.slices_events,
                           "per_change": _per(kube.slices_bytes * kube.watchers, changes),
                           "per_change_per_watcher": _per(kube.slices_bytes, changes),
                           "by_pattern": _kube_by_pattern(kube.slices_by_change, kube.patterns,
                                                          kube.watchers)},
        "slices_to_endpoints": _per(kube.slices_bytes, kube.endpoints_bytes),
    }
    churn_s = (run.churn_end_ns - run.churn_start_ns) / 1e9
    # What the server would have spent over the churn and settle had nothing changed.
    idle_seconds = run.idle_cpu_rate * (run.settled_ns - run.churn_start_ns) / 1e9
    out: dict[str, Any] = {
        "scenario": scenario_json(cs),
        "environment": dict(run.environment),
        "processes": {m: dict(p) for m, p in run.processes.items()},
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
            # The server runs in the compare process, where the figures are computed.
            "pid": os.getpid(),
            "cpu_seconds": run.cpu_seconds, "cpu_user": run.cpu_user,
            "cpu_system": run.cpu_system,
            "cpu_ms_per_change": _per(run.cpu_seconds * 1000, changes),
            "harness_cpu_seconds": run.harness_cpu_seconds,
            "idle_cpu_ms_per_second": run.idle_cpu_rate * 1000,
            "idle_cpu_seconds": idle_seconds,
            "serving_cpu_ms_per_change": _per(
                max(0.0, run.cpu_seconds - run.harness_cpu_seconds - idle_seconds) * 1000,
                changes),
            "rss_start_bytes": run.rss_start, "rss_end_bytes": run.rss_end,
            "client_process_cpu_seconds": res.get("cpu_seconds", 0.0),
        },
        "kubernetes": kube_json,
        "failures": failures,
    }
    out.update(run.extra_figures)
    out["checks"] = checks(out, run)
    if run.isolated:
        out["isolated"] = isolated_json(run, kube)
        out["checks"] += isolated_checks(out["isolated"], run)
    out["ok"] = all(c["ok"] for c in out["checks"])
    return out


ISOLATED_KEYS = ("title", "process", "clients", "subscriptions", "messages", "bytes",
                 "latency_ms", "latency_ms_by_pattern", "versions", "bytes_by_pattern")


def isolated_json(run: Run, kube: KubeSide) -> dict[str, Any]:
    """Each model's figures from its run alone (`--isolate`), beside the server's CPU
    of that run and whether every one of its checks passed."""
    out: dict[str, Any] = {}
    for model, r in run.isolated.items():
        fig = figures(r, kube if r.changes == run.changes else None)
        m = fig["models"].get(model, {})
        entry = {k: m[k] for k in ISOLATED_KEYS if k in m}
        entry["server_cpu_seconds"] = fig["server"]["cpu_seconds"]
        entry["server_cpu_ms_per_change"] = fig["server"]["cpu_ms_per_change"]
        entry["serving_cpu_ms_per_change"] = fig["server"]["serving_cpu_ms_per_change"]
        entry["changes"] = fig["run"]["changes"]
        entry["environment"] = fig["environment"]
        entry["failed_checks"] = [c for c in fig["checks"] if not c["ok"]]
        entry["ok"] = fig["ok"]
        entry["churn"] = churn_fingerprint(r)
        out[model] = entry
    return out


def churn_fingerprint(run: Run) -> str:
    """The sequence of changes (their patterns) and every followed target's final truth:
    equal for two runs of one scenario however their timing differed."""
    parts = [",".join(e.pattern for e in run.truth.emissions[:run.changes])]
    parts += [f"{t}={digest(s)}" for t, s in sorted(run.truth.final.items())]
    return digest_text("|".join(parts))


def digest_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def isolated_checks(iso: Mapping[str, Any], run: Run) -> list[dict[str, Any]]:
    mine = churn_fingerprint(run)
    out = []
    for model, e in iso.items():
        failed = e["failed_checks"]
        out.append({"name": f"isolated {model}: every check of its run alone passed",
                    "ok": not failed,
                    "detail": "; ".join(f"{c['name']}: {c['detail']}" for c in failed[:3])})
        # The churn's patterns are seeded; the final truth of a target it shares with
        # the side-by-side run must agree (the isolated run may follow fewer targets).
        same = _same_churn(run, run.isolated[model])
        out.append({"name": f"isolated {model}: the same churn as the side-by-side run",
                    "ok": same, "detail": "" if same else
                    f"fingerprints {e['churn']} vs {mine}"})
    return out


def _same_churn(a: Run, b: Run) -> bool:
    pa = [e.pattern for e in a.truth.emissions[:a.changes]]
    pb = [e.pattern for e in b.truth.emissions[:b.changes]]
    if pa != pb:
        return False
    return all(digest(a.truth.final[t]) == digest(s) for t, s in b.truth.final.items()
               if t in a.truth.final)


def _kube_by_pattern(values: Sequence[int], patterns: Sequence[str],
                     watchers: int) -> dict[str, float]:
    sums: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for v, p in zip(values, patterns, strict=True):
        sums[p] += v * watchers
        counts[p] += 1
    return {p: sums[p] / counts[p] for p in sorted(counts)}
