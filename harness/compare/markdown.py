"""A run's tables: `report.md`, and the tables the command prints, all read from
the figures dict (harness.compare.figures).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from harness.compare.charts import CHARTS


def fmt_bytes(n: float) -> str:
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
            f"{m['messages']['churn']:,} | {fmt_bytes(m['bytes']['churn'])} | "
            f"{fmt_bytes(m['bytes']['per_change'])} | "
            f"{_ms(lat.get('p50'))} / {_ms(lat.get('p95'))} / {_ms(lat.get('p99'))} / "
            f"{_ms(lat.get('max'))} | {m['versions']['superseded']} | "
            f"{fmt_bytes(heap) if m['memory']['heap_bytes'] >= 0 else '-'} |")
    return "\n".join(rows)


def kube_table(fig: Mapping[str, Any]) -> str:
    k = fig["kubernetes"]
    rows = [f"| API ({k['watchers']} watchers) | initial list / watcher | events / watcher "
            "| churn bytes / watcher | churn bytes, all watchers | bytes / change |",
            "|---|--:|--:|--:|--:|--:|"]
    for key, title in (("endpoints", "v1 Endpoints"), ("endpointslices", "EndpointSlices")):
        e = k[key]
        rows.append(f"| {title} | {fmt_bytes(e['initial_bytes_per_watcher'])} | "
                    f"{e['events_per_watcher']:,} | {fmt_bytes(e['churn_bytes_per_watcher'])}"
                    f" | {fmt_bytes(e['churn_bytes'])} | {fmt_bytes(e['per_change'])} |")
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
            fmt_bytes(m["bytes_by_pattern"].get(p, 0)) for p in patterns) + " |")
    k = fig["kubernetes"]
    for key, title in (("endpoints", "v1 Endpoints"), ("endpointslices", "EndpointSlices")):
        rows.append(f"| {title} x {k['watchers']} watchers | " + " | ".join(
            fmt_bytes(k[key]["by_pattern"].get(p, 0)) for p in patterns) + " |")
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
              f"- resident memory: {fmt_bytes(srv['rss_start_bytes'])} before the clients, "
              f"{fmt_bytes(srv['rss_end_bytes'])} at the end",
              f"- the client process used {srv['client_process_cpu_seconds']:.2f}s of CPU",
              ""]
    for name, m in fig["models"].items():
        mem = m["memory"]
        if mem["heap_bytes"] >= 0:
            lines.append(f"- {name}: Python heap grew {fmt_bytes(mem['heap_bytes'])} when its "
                         f"clients connected ({fmt_bytes(mem['heap_per_subscription'])} per "
                         f"subscribed target), resident memory {fmt_bytes(mem['rss_bytes'])}")
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
             f"{fmt_bytes(srv['bytes'])}, over {srv['streams']} streams; each follows all "
             f"{env['targets']} services (wildcard CDS, then EDS for every cluster). Update "
             "counts are Envoy's own stats over the churn and settle."]
    return "\n".join(rows)
