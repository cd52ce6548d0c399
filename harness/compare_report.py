"""A run's figures (`report.json`), its tables (`report.md`) and its charts (PNG).

`figures()` turns a raw `Run` into one JSON-able dict holding every figure and the
consistency checks; the markdown and the charts only read that dict, so what the
tables say and what the JSON says cannot differ.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.compare_analysis import ModelFigures, analyse, by_pattern, latency_summary
from harness.compare_kube import KubeSide, kube_side
from harness.compare_run import Run
from harness.compare_scenario import MODEL_TITLES, CompareScenario
from harness.compare_truth import INITIAL
from harness.normalize import digest

CHARTS = ("latency_cdf.png", "bytes_per_change.png", "cumulative_bytes.png")
COLORS = {"linkerd": "#2b8cbe", "sotw": "#e6550d", "delta": "#31a354", "envoy": "#756bb1",
          "endpoints": "#636363", "endpointslices": "#969696"}


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


def divergences(run: Run) -> list[dict[str, Any]]:
    """Every (client, target) whose final state is not the source's truth."""
    out: list[dict[str, Any]] = []
    states = run.results.get("states", {})
    for f in run.results.get("finals", []):
        client = f"{f['model']}-{f['index']}"
        for target, st in sorted(f["targets"].items()):
            truth = run.truth.final.get(target)
            if truth is None:
                continue
            problem = ""
            if st.get("status"):
                problem = f"stream ended: {st['status']}"
            elif st["addr"] != digest(truth):
                have = {(row[0], row[1]) for row in states.get(st["full"], [])}
                want = {(e.address, e.port) for e in truth}
                missing = sorted(want - have)
                extra = sorted(have - want)
                problem = (f"holds {len(have)} endpoints, truth has {len(want)}; missing "
                           f"{_addrs(missing)}; unexpected {_addrs(extra)}")
            if problem:
                out.append({"model": f["model"], "client": client, "target": target,
                            "detail": problem})
    return out


def _addrs(items: Sequence[tuple[str, int]], limit: int = 5) -> str:
    shown = ", ".join(f"{a}:{p}" for a, p in items[:limit])
    more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
    return (shown or "none") + more


def disagreements(run: Run) -> list[str]:
    """Targets whose clients of different models hold different full states: both
    protocols must carry the same View, field for field (as normalised)."""
    by_target: dict[str, dict[str, set[str]]] = {}
    for f in run.results.get("finals", []):
        for target, st in f["targets"].items():
            by_target.setdefault(target, {}).setdefault(f["model"], set()).add(st["full"])
    states = run.results.get("states", {})
    out = []
    for target, per_model in sorted(by_target.items()):
        fulls = {d for ds in per_model.values() for d in ds}
        if len(fulls) > 1:
            rows = {m: sorted(ds) for m, ds in per_model.items()}
            sample = {m: states.get(ds[0], [])[:1] for m, ds in rows.items()}
            out.append(f"{target}: {json.dumps(sample)}")
    return out


def _check(name: str, ok: bool, detail: str = "") -> dict[str, Any]:
    return {"name": name, "ok": bool(ok), "detail": detail}


def checks(fig: Mapping[str, Any], run: Run) -> list[dict[str, Any]]:
    out = []
    models = fig["models"]
    fails = fig["failures"]
    out.append(_check("every client's final state equals the source's truth", not fails,
                      f"{len(fails)} divergent (client, target) pairs" if fails else
                      f"{sum(m['subscriptions'] for m in models.values())} (client, target) "
                      "pairs checked"))
    dis = disagreements(run)
    out.append(_check("clients of every model hold the same endpoints, field for field",
                      not dis, "; ".join(dis[:3])))
    out.append(_check("the clients went quiet before the settle deadline",
                      fig["run"]["settled"]))
    broken = fig["run"].get("broken_layers", {})
    out.append(_check("every protocol layer started", not broken,
                      "; ".join(f"{k}: {v}" for k, v in broken.items())))
    env = fig.get("envoy")
    if env is not None:
        bad = [p["name"] for p in env["proxies"] if not p["matches"]]
        rejected = sum(p["update_rejected"] + p["cds_update_rejected"] for p in env["proxies"])
        out.append(_check("every Envoy ends on the source's truth for every service", not bad,
                          f"{', '.join(bad)} differ" if bad else
                          f"{len(env['proxies'])} Envoys x {env['targets']} services"))
        out.append(_check("no Envoy rejected an update", rejected == 0,
                          f"{rejected} rejected"))
    for name, m in models.items():
        if name == "envoy":
            continue
        c, s = m["bytes"]["total"], m["server"]["bytes"]
        out.append(_check(f"{name}: bytes counted by the clients equal bytes sent by the "
                          "server", c == s, f"clients {c}, server {s}"))
        cm, sm = m["messages"]["total"], m["server"]["messages"]
        out.append(_check(f"{name}: messages received equal messages sent", cm == sm,
                          f"clients {cm}, server {sm}"))
        want_streams = m["subscriptions"] if name == "linkerd" else m["clients"]
        out.append(_check(f"{name}: streams held as the model says", m["streams"] ==
                          want_streams, f"{m['streams']} streams, expected {want_streams}"))
        out.append(_check(f"{name}: one connection per client",
                          m["connections"] == m["clients"],
                          f"{m['connections']} connections for {m['clients']} clients"))
        v = m["versions"]
        accounted = v["delivered"] + v["superseded"] + v["unchanged"] + v["missing"]
        out.append(_check(f"{name}: every version of every followed target reached each "
                          "client or was superseded",
                          v["missing"] == 0 and accounted == v["due"],
                          f"due {v['due']}: delivered {v['delivered']}, superseded "
                          f"{v['superseded']}, unchanged {v['unchanged']}, missing "
                          f"{v['missing']}"))
        churn_updates = m["messages"]["target_updates"] - m["subscriptions"]
        if name in ("sotw", "delta"):
            out.append(_check(f"{name}: one resource update per delivered version "
                              "(none redundant, none unexplained)",
                              churn_updates == v["delivered"]
                              and v["intermediate_messages"] == 0,
                              f"{churn_updates} updates during the churn, "
                              f"{v['delivered']} versions delivered, "
                              f"{v['repeated_updates']} repeated, "
                              f"{v['intermediate_messages']} matching no version"))
        else:
            lo, hi = v["delivered"], 2 * (v["delivered"] + v["superseded"]) + v["unchanged"]
            out.append(_check(f"{name}: messages match the churn (one or two Updates, add "
                              "and remove, per delivered version)",
                              lo <= m["messages"]["churn"] <= hi,
                              f"{m['messages']['churn']} messages for {v['delivered']} "
                              f"versions delivered"))
    return out


# ------------------------------------------------------------------ markdown


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _ms(x: Any) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def model_table(fig: Mapping[str, Any]) -> str:
    rows = ["| model | clients | connections | streams | messages (churn) | bytes (churn) "
            "| bytes / change | latency p50 / p95 / p99 / max (ms) | superseded | "
            "server heap / client |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for m in fig["models"].values():
        lat = m["latency_ms"]
        heap = m["memory"]["heap_per_client"]
        rows.append(
            f"| {m['title']} | {m['clients']} | {m['connections']} | {m['streams']} | "
            f"{m['messages']['churn']:,} | {_fmt_bytes(m['bytes']['churn'])} | "
            f"{_fmt_bytes(m['bytes']['per_change'])} | "
            f"{_ms(lat.get('p50'))} / {_ms(lat.get('p95'))} / {_ms(lat.get('p99'))} / "
            f"{_ms(lat.get('max'))} | {m['versions']['superseded']} | "
            f"{_fmt_bytes(heap) if m['memory']['heap_bytes'] >= 0 else '-'} |")
    return "\n".join(rows)


def kube_table(fig: Mapping[str, Any]) -> str:
    k = fig["kubernetes"]
    rows = [f"| API ({k['watchers']} watchers) | initial list / watcher | events / watcher "
            "| churn bytes / watcher | churn bytes, all watchers | bytes / change |",
            "|---|--:|--:|--:|--:|--:|"]
    for key, title in (("endpoints", "v1 Endpoints"), ("endpointslices", "EndpointSlices")):
        e = k[key]
        rows.append(f"| {title} | {_fmt_bytes(e['initial_bytes_per_watcher'])} | "
                    f"{e['events_per_watcher']:,} | {_fmt_bytes(e['churn_bytes_per_watcher'])}"
                    f" | {_fmt_bytes(e['churn_bytes'])} | {_fmt_bytes(e['per_change'])} |")
    return "\n".join(rows)


def pattern_table(fig: Mapping[str, Any]) -> str:
    patterns = sorted(fig["run"]["changes_by_pattern"])
    if not patterns:
        return ""
    head = "| mean bytes per change | " + " | ".join(
        f"{p} ({fig['run']['changes_by_pattern'][p]})" for p in patterns) + " |"
    rows = [head, "|---|" + "--:|" * len(patterns)]
    for m in fig["models"].values():
        rows.append(f"| {m['title']} | " + " | ".join(
            _fmt_bytes(m["bytes_by_pattern"].get(p, 0)) for p in patterns) + " |")
    k = fig["kubernetes"]
    for key, title in (("endpoints", "v1 Endpoints"), ("endpointslices", "EndpointSlices")):
        rows.append(f"| {title} x {k['watchers']} watchers | " + " | ".join(
            _fmt_bytes(k[key]["by_pattern"].get(p, 0)) for p in patterns) + " |")
    rows += ["", "| latency p50 / p99 (ms) | " + " | ".join(patterns) + " |",
             "|---|" + "--:|" * len(patterns)]
    for m in fig["models"].values():
        by = m["latency_ms_by_pattern"]
        rows.append(f"| {m['title']} | " + " | ".join(
            f"{_ms(by[p].get('p50'))} / {_ms(by[p].get('p99'))}" if p in by else "-"
            for p in patterns) + " |")
    return "\n".join(rows)


def markdown(fig: Mapping[str, Any]) -> str:
    s = fig["scenario"]
    r = fig["run"]
    srv = fig["server"]
    cl = s["cluster"]
    lines = [
        f"# meshbridge compare: {s['name']}",
        "",
        f"**{'PASS' if fig['ok'] else 'FAIL'}** — {r['changes']} changes in "
        f"{r['churn_seconds']:.1f}s ({', '.join(f'{p} {n}' for p, n in r['changes_by_pattern'].items()) or 'none'}); "  # noqa: E501
        f"{r['truth_versions']} target versions over {r['targets_followed']} followed "
        f"targets; settled in {r['settle_seconds']:.2f}s.",
        "",
        "## Scenario",
        "",
        f"- file: `{s['file'] or '(inline)'}`, seed {s['seed']}",
        f"- cluster: {cl['services']} services in {cl['namespaces']} namespaces, "
        f"{cl['endpoints_per_service']} endpoints each, {cl['zones']} zones, slices of "
        f"{cl['slice_size']}, port {cl['port']}, {'meshed' if cl['meshed'] else 'unmeshed'}",
        f"- churn: {s['churn']['rate']:g} changes/s for {s['duration']:g}s, patterns "
        + ", ".join(f"{p} {w:g}" for p, w in s["churn"]["patterns"].items()),
        f"- clients: {s['clients']['linkerd']} Linkerd, {s['clients']['sotw']} xDS SotW, "
        f"{s['clients']['delta']} xDS delta; each follows {s['clients']['targets']} "
        f"targets ({s['clients']['selection']}); {s['clients']['kube_watchers']} "
        "Kubernetes watchers",
    ]
    for model, why in r["skipped_models"].items():
        lines.append(f"- **{model} skipped**: {why}")
    lines += ["", "## Proxy protocols", "", model_table(fig), "",
              "Bytes are protobuf message payloads as counted by the clients (and, "
              "identically, by the server). Latency runs from the source's emission of a "
              "change to the client decoding the message that gives it that version's "
              "state; superseded versions were coalesced into a later one.", ""]
    pt = pattern_table(fig)
    if pt:
        lines += ["## By churn pattern", "", pt, ""]
    lines += ["## Kubernetes watchers, same churn", "", kube_table(fig), "",
              f"EndpointSlices carry {fig['kubernetes']['slices_to_endpoints']:.1%} of the "
              "bytes v1 Endpoints would for this churn (JSON watch events, without "
              "managedFields).", "",
              "## Server", "",
              f"- CPU: {srv['cpu_seconds']:.2f}s over the churn and settle "
              f"({srv['cpu_user']:.2f}s user, {srv['cpu_system']:.2f}s system), "
              f"{srv['cpu_ms_per_change']:.2f} ms per change, all models together",
              f"- resident memory: {_fmt_bytes(srv['rss_start_bytes'])} before the clients, "
              f"{_fmt_bytes(srv['rss_end_bytes'])} at the end",
              f"- the client process used {srv['client_process_cpu_seconds']:.2f}s of CPU",
              ""]
    for name, m in fig["models"].items():
        mem = m["memory"]
        if mem["heap_bytes"] >= 0:
            lines.append(f"- {name}: Python heap grew {_fmt_bytes(mem['heap_bytes'])} when its "
                         f"clients connected ({_fmt_bytes(mem['heap_per_subscription'])} per "
                         f"subscribed target), resident memory {_fmt_bytes(mem['rss_bytes'])}")
    if "envoy" in fig:
        lines += ["", "## Envoy", "", envoy_table(fig["envoy"])]
    lines += ["", "## Checks", ""]
    for c in fig["checks"]:
        lines.append(f"- {'✅' if c['ok'] else '❌'} {c['name']}"
                     + (f" — {c['detail']}" if c["detail"] else ""))
    if fig["failures"]:
        lines += ["", "## Divergences", "", "| client | target | problem |", "|---|---|---|"]
        for f in fig["failures"][:200]:
            lines.append(f"| {f['client']} | {f['target']} | {f['detail']} |")
    lines += ["", "## Charts", ""]
    lines += [f"![{c}]({c})" for c in CHARTS]
    return "\n".join(lines) + "\n"


def envoy_table(env: Mapping[str, Any]) -> str:
    rows = ["| Envoy | ADS | EDS update_attempt | update_success | update_rejected | "
            "CDS update_success / rejected | endpoints at the end | the truth |",
            "|---|---|--:|--:|--:|--:|--:|---|"]
    for e in env.get("proxies", []):
        rows.append(f"| {e['name']} | {e['api_type']} | {e['update_attempt']} | "
                    f"{e['update_success']} | {e['update_rejected']} | "
                    f"{e['cds_update_success']} / {e['cds_update_rejected']} | "
                    f"{e['endpoints']} | {'yes' if e['matches'] else 'no: ' + ', '.join(e['wrong_targets'][:3])} |")  # noqa: E501
    srv = env["server"]
    rows += ["", f"The server sent the Envoys {srv['messages']:,} messages, "
             f"{_fmt_bytes(srv['bytes'])}, over {srv['streams']} streams; each follows all "
             f"{env['targets']} services (wildcard CDS, then EDS for every cluster). Update "
             "counts are Envoy's own stats over the churn and settle."]
    return "\n".join(rows)


# ------------------------------------------------------------------ charts


def charts(fig: Mapping[str, Any], run: Run, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    analysed: dict[str, ModelFigures] = run.analysed or {}
    title = fig["scenario"]["name"]

    # Latency CDF per model.
    figure, ax = plt.subplots(figsize=(7, 4.2))
    for model, f in analysed.items():
        ms = sorted(x / 1e6 for x in f.latencies_ns)
        if not ms:
            continue
        ys = [(i + 1) / len(ms) for i in range(len(ms))]
        ax.step(ms, ys, where="post", label=f"{MODEL_TITLES.get(model, model)} (n={len(ms)})",
                color=COLORS.get(model))
    ax.set_xscale("log")
    ax.set_xlabel("change-to-client latency (ms, log)")
    ax.set_ylabel("fraction of (client, target, version)")
    ax.set_title(f"Latency CDF — {title}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    paths.append(_save(figure, out / CHARTS[0]))

    # Bytes per change, per pattern, per model (and the Kubernetes watchers).
    patterns = sorted(fig["run"]["changes_by_pattern"])
    series: list[tuple[str, str, list[float]]] = []
    for model, m in fig["models"].items():
        series.append((MODEL_TITLES.get(model, model), model,
                       [m["bytes_by_pattern"].get(p, 0.0) for p in patterns]))
    k = fig["kubernetes"]
    for key, label in (("endpoints", "v1 Endpoints"), ("endpointslices", "EndpointSlices")):
        series.append((f"{label} x {k['watchers']} watchers", key,
                       [k[key]["by_pattern"].get(p, 0.0) for p in patterns]))
    figure, ax = plt.subplots(figsize=(8, 4.8))
    width = 0.8 / max(1, len(series))
    for i, (label, key, values) in enumerate(series):
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(patterns))]
        ax.bar(xs, [max(v, 0.1) for v in values], width, label=label, color=COLORS.get(key),
               hatch="//" if key in ("endpoints", "endpointslices") else None)
    ax.set_xticks(range(len(patterns)))
    ax.set_xticklabels([f"{p}\n({fig['run']['changes_by_pattern'][p]} changes)"
                        for p in patterns])
    ax.set_yscale("log")
    ax.set_ylabel("mean bytes per change, all clients (log)")
    ax.set_title(f"Bytes per change — {title}")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3,
              frameon=False)
    paths.append(_save(figure, out / CHARTS[1]))

    # Cumulative bytes over time since the churn started.
    figure, ax = plt.subplots(figsize=(7, 4.2))
    t0 = run.churn_start_ns
    for model, f in analysed.items():
        xs, ys = _cumulative(((at - t0) / 1e9, size) for at, size in f.timeline)
        ax.plot(xs, ys, label=MODEL_TITLES.get(model, model), color=COLORS.get(model))
    kube_times = [(e.at_ns - t0) / 1e9 for e in run.truth.emissions[:run.changes]]
    for key, label, per_change in _kube_series(run):
        xs, ys = _cumulative(zip(kube_times, per_change, strict=False))
        ax.plot(xs, ys, label=label, color=COLORS.get(key), linestyle="--")
    ax.set_xlabel("seconds since the churn started")
    ax.set_ylabel("cumulative bytes received (log)")
    ax.set_yscale("symlog", linthresh=1024)
    ax.set_title(f"Cumulative bytes — {title}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    paths.append(_save(figure, out / CHARTS[2]))
    return paths


def _cumulative(points: Iterable[tuple[float, float]]) -> tuple[list[float], list[float]]:
    xs, ys, total = [0.0], [0.0], 0.0
    for x, y in points:
        total += y
        xs.append(x)
        ys.append(total)
    return xs, ys


def _kube_series(run: Run) -> list[tuple[str, str, list[int]]]:
    kube: KubeSide | None = run.kube
    if kube is None:
        return []
    w = kube.watchers
    return [("endpoints", f"v1 Endpoints x {w} watchers",
             [v * w for v in kube.endpoints_by_change]),
            ("endpointslices", f"EndpointSlices x {w} watchers",
             [v * w for v in kube.slices_by_change])]


def _save(figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(figure)
    return path


def write(run: Run, out: Path, with_charts: bool = True) -> dict[str, Any]:
    kube = kube_side(run.cs.scenario, run.changes, run.cs.clients.kube_watchers)
    run.kube = kube
    fig = figures(run, kube)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(fig, indent=1, default=_json_default) + "\n",
                                     encoding="utf-8")
    (out / "report.md").write_text(markdown(fig), encoding="utf-8")
    # The raw truth beside the clients' raw records (client-results.json), so any
    # figure can be recomputed.
    (out / "truth.json").write_text(json.dumps({
        "churn_start_ns": run.churn_start_ns,
        "emissions": [[e.index, e.pattern, e.at_ns] for e in run.truth.emissions],
        "versions": {t: [[v.version, v.change, v.at_ns, v.digest, v.endpoints] for v in vs]
                     for t, vs in run.truth.versions.items()},
    }, separators=(",", ":")), encoding="utf-8")
    if with_charts:
        charts(fig, run, out)
    return fig


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and math.isnan(o):
        return None
    raise TypeError(f"not JSON: {type(o).__name__}")


__all__ = ["CHARTS", "INITIAL", "figures", "markdown", "write"]
