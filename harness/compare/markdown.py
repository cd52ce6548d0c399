"""A run's tables: `report.md`, and the tables the command prints, all read from
the figures dict (harness.compare.figures).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from harness.compare.charts import CHARTS
from harness.compare.figures import p99_text


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _ms(x: Any) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}"


def latency_cell(lat: Mapping[str, Any]) -> str:
    """p50 / p95 / p99 / max, the p99 only over enough samples (figures.p99_text)."""
    return (f"{_ms(lat.get('p50'))} / {_ms(lat.get('p95'))} / {p99_text(lat)} / "
            f"{_ms(lat.get('max'))}")


def model_table(fig: Mapping[str, Any]) -> str:
    rows = ["| model | client process | clients | connections | streams | messages (churn) "
            "| bytes (churn) | bytes / change | latency p50 / p95 / p99 / max (ms) "
            "| superseded | server heap / client |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for m in fig["models"].values():
        heap = m["memory"]["heap_per_client"]
        pid = m.get("process", {}).get("pid")
        rows.append(
            f"| {m['title']} | {f'pid {pid}' if pid else '-'} | {m['clients']} | "
            f"{m['connections']} | {m['streams']} | "
            f"{m['messages']['churn']:,} | {fmt_bytes(m['bytes']['churn'])} | "
            f"{fmt_bytes(m['bytes']['per_change'])} | {latency_cell(m['latency_ms'])} | "
            f"{m['versions']['superseded']} | "
            f"{fmt_bytes(heap) if m['memory']['heap_bytes'] >= 0 else '-'} |")
    return "\n".join(rows)


def isolated_table(fig: Mapping[str, Any]) -> str:
    iso = fig.get("isolated", {})
    rows = ["| model | side by side: latency p50 / p95 / p99 / max (ms) | alone: latency "
            "p50 / p95 / p99 / max (ms) | alone: bytes / change | alone: server CPU / "
            "change (+ harness and idle) | alone: client process |",
            "|---|--:|--:|--:|--:|--:|"]
    for model, e in iso.items():
        side = fig["models"].get(model, {}).get("latency_ms", {})
        pid = e.get("process", {}).get("pid")
        serving = e.get("serving_cpu_ms_per_change", e["server_cpu_ms_per_change"])
        rows.append(f"| {e.get('title', model)} | {latency_cell(side)} | "
                    f"{latency_cell(e.get('latency_ms', {}))} | "
                    f"{fmt_bytes(e.get('bytes', {}).get('per_change', 0))} | "
                    f"{serving:.2f} ms (+{e['server_cpu_ms_per_change'] - serving:.2f}) | "
                    f"{f'pid {pid}' if pid else '-'} |")
    return "\n".join(rows)


# Where each figure of a report is taken: the report says it, so that nobody reads a
# harness cost as a protocol's (docs/compare.md, "What is measured").
WHERE_MEASURED = (
    ("latency", "from the change's emission, taken in the server process just before "
     "the sim source applies it to the Cluster, to the moment the model's client "
     "process has decoded the message that gives the client that version's state "
     "(one CLOCK_MONOTONIC for both processes); the truth it is matched against is "
     "recorded inside `Cluster.apply`, by each version's delta"),
    ("bytes and messages", "protobuf payloads counted by the clients as read off "
     "the wire, and by the server per stream; the two must agree (a check)"),
    ("server CPU", "the server runs in the compare process itself: its CPU time "
     "(`time.process_time`, user + system of every thread) from the start of the churn "
     "to the end of the settle: the server's work for the changes and every stream, "
     "plus the harness's own share in the same process (the sim source making each "
     "change, the truth recorder following the Views: each timed on its own) and what "
     "the process spends with nothing changing (its rate measured for a while before "
     "the churn, every client connected); the serving CPU per change leaves those two "
     "out. It is everything the server does per change: the core, each encoding, "
     "every stream's write, the event loop's turns and reading what the clients send "
     "back; `bench.big_service --pattern flap --clients grpcio` measures the same "
     "(its \"server process CPU per change\"), its core + Linkerd figure only the "
     "core and one encoding"),
    ("server heap and resident memory", "this process, while each model's clients "
     "connected, one model at a time (tracemalloc and /proc)"),
    ("client CPU", "each model's client process, its own CPU time"),
    ("Kubernetes watchers", "not measured on a wire: the same seeded churn replayed "
     "after the run and each changed object serialised as the API server's watch "
     "event"),
)


def where_measured() -> list[str]:
    return [f"- **{name}**: {text}" for name, text in WHERE_MEASURED]


def per_change_table(fig: Mapping[str, Any]) -> str:
    """What one change costs each receiver, proxies and Kubernetes watchers alike."""
    k = fig["kubernetes"]
    rows = ["| receiver | receivers | bytes per change, each | bytes per change, all |",
            "|---|--:|--:|--:|"]
    for m in fig["models"].values():
        rows.append(f"| {m['title']} | {m['clients']} | "
                    f"{fmt_bytes(m['bytes']['per_change_per_client'])} | "
                    f"{fmt_bytes(m['bytes']['per_change'])} |")
    for key, title in (("endpoints", "v1 Endpoints watch"),
                       ("endpointslices", "EndpointSlice watch")):
        rows.append(f"| {title} | {k['watchers']} | "
                    f"{fmt_bytes(k[key].get('per_change_per_watcher', 0))} | "
                    f"{fmt_bytes(k[key]['per_change'])} |")
    return "\n".join(rows)


def environment_lines(fig: Mapping[str, Any]) -> list[str]:
    env = fig.get("environment", {})
    if not env:
        return []

    def load(xs: list[float]) -> str:
        return " / ".join(f"{x:.2f}" for x in xs) if xs else "unknown"

    procs = fig.get("processes", {})
    return [
        f"- commit `{env.get('commit', 'unknown')}`",
        f"- Python {env.get('python')} ({env.get('python_implementation')}), grpcio "
        f"{env.get('grpcio')}, protobuf {env.get('protobuf')}, {env.get('platform')}",
        f"- cores: {env.get('cores')} ({env.get('cores_usable')} usable by this process)",
        f"- load average (1 / 5 / 15 min): {load(env.get('load_start', []))} at the start, "
        f"{load(env.get('load_end', []))} at the end",
        f"- xDS endpoint metadata profile: **{env.get('xds_endpoint_metadata')}** "
        "(`--xds-endpoint-metadata`)",
        "- client processes, one per model: " + (", ".join(
            f"{m} pid {p.get('pid')} ({p.get('cpu_seconds', 0):.2f}s CPU)"
            for m, p in procs.items()) or "none"),
    ]


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
            f"{_ms(by[p].get('p50'))} / {p99_text(by[p])}" if p in by else "-"
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
        "- clients: " + ", ".join(f"{n} {m}" for m, n in s["clients"].items()
                                  if m in fig["models"] or m in r["skipped_models"])
        + f"; each follows {s['clients']['targets']} targets ({s['clients']['selection']}); "
        f"{s['clients']['kube_watchers']} Kubernetes watchers",
    ]
    for model, why in r["skipped_models"].items():
        lines.append(f"- **{model} skipped**: {why}")
    lines += ["", "## Environment", "", *environment_lines(fig)]
    lines += ["", "## Proxy protocols, side by side", "", model_table(fig), "",
              "Every model's clients ran in a process of their own, at the same time. "
              "Bytes are protobuf message payloads as counted by the clients (and, "
              "identically, by the server). Latency runs from the source's emission of a "
              "change to the client decoding the message that gives it that version's "
              "state; superseded versions were coalesced into a later one. A p99 is given "
              "over at least 100 samples, else the max of the N there are.", ""]
    leds = fig["models"].get("leds", {}).get("leds")
    if leds is not None:
        lines += [("LEDS: the clients followed "
                   f"{leds['collections']} collections and received {leds['resources']:,} "
                   f"LbEndpoint resources ({leds['removed']:,} removed) besides "
                   f"{leds['cla_updates']:,} CLAs.") if leds["resources"] else
                  "LEDS: the server answered the LEDS clients with plain CLAs (endpoints "
                  "inline, no collection): it does not serve LEDS, and the LEDS row is a "
                  "delta client's.", ""]
    if "isolated" in fig:
        lines += ["## Each model alone (`--isolate`)", "", isolated_table(fig), "",
                  "Each model's clients alone against a fresh server, one model after "
                  "another, on the same seeded churn: nothing shared. The difference from "
                  "the side-by-side figures is what the models cost each other on this "
                  "machine.", ""]
    lines += ["## Bytes per change, every receiver", "", per_change_table(fig), ""]
    pt = pattern_table(fig)
    if pt:
        lines += ["## By churn pattern", "", pt, ""]
    lines += ["## Kubernetes watchers, same churn", "", kube_table(fig), "",
              f"EndpointSlices carry {fig['kubernetes']['slices_to_endpoints']:.1%} of the "
              "bytes v1 Endpoints would for this churn (JSON watch events, without "
              "managedFields).", "",
              "## Server", "",
              f"- CPU of the server process (this compare process, pid "
              f"{srv.get('pid', '-')}): {srv['cpu_seconds']:.2f}s over the churn and settle "
              f"({srv['cpu_user']:.2f}s user, {srv['cpu_system']:.2f}s system), "
              f"{srv['cpu_ms_per_change']:.2f} ms per change, all models together; of "
              f"it the harness's own (sim source, truth recorder) "
              f"{srv.get('harness_cpu_seconds', 0.0):.3f}s and what the server spends "
              f"idle ({srv.get('idle_cpu_ms_per_second', 0.0):.2f} ms a second, "
              f"{srv.get('idle_cpu_seconds', 0.0):.3f}s over that time), so serving the "
              f"changes {srv.get('serving_cpu_ms_per_change', srv['cpu_ms_per_change']):.2f}"
              " ms per change",
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
    lines += ["", "## Where each figure was measured", "", *where_measured()]
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
