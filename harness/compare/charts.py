"""A run's charts (PNG, matplotlib imported only when drawn): the latency CDF, bytes
per change by churn pattern, and cumulative bytes over the churn.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from harness.compare.analysis import ModelFigures
from harness.compare.kube import KubeSide
from harness.compare.run import Run
from harness.compare.scenario import MODEL_TITLES

CHARTS = ("latency_cdf.png", "bytes_per_change.png", "cumulative_bytes.png")
COLORS = {"linkerd": "#2b8cbe", "sotw": "#e6550d", "delta": "#31a354", "envoy": "#756bb1",
          "endpoints": "#636363", "endpointslices": "#969696"}


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
