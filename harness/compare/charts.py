"""A run's charts (PNG, matplotlib imported only when drawn): the latency CDF, bytes
per change by churn pattern, and cumulative bytes over the churn.

Every model is one more entry of `style` (a colour, a dash pattern and a marker of
its own), so lines that lie on each other (xDS SotW and delta cost the same for EDS)
both stay visible; latency axes are in plain milliseconds.
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
COLORS = {"linkerd": "#2b8cbe", "sotw": "#e6550d", "delta": "#31a354", "leds": "#d62728",
          "envoy": "#756bb1", "endpoints": "#636363", "endpointslices": "#969696"}
DASHES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)))
MARKERS = ("o", "s", "^", "D", "v", "P")
FALLBACK_COLORS = ("#8c564b", "#e377c2", "#17becf", "#bcbd22")


def style(key: str, order: list[str]) -> dict[str, Any]:
    """Line style of one series: its own colour, dash pattern and marker (by its place
    in `order`), half transparent, so overlapping lines all show."""
    i = order.index(key) if key in order else len(order)
    return {"color": COLORS.get(key, FALLBACK_COLORS[i % len(FALLBACK_COLORS)]),
            "linestyle": DASHES[i % len(DASHES)], "marker": MARKERS[i % len(MARKERS)],
            "alpha": 0.8, "linewidth": 1.6 + 0.4 * (i % 3), "markersize": 4}


def plain_ms_axis(axis: Any) -> None:
    """Log scale, ticks written as plain milliseconds (0.5, 2, 10, 100), not 10^x."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda _v, _pos: ""))


def charts(fig: Mapping[str, Any], run: Run, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    analysed: dict[str, ModelFigures] = run.analysed or {}
    title = fig["scenario"]["name"]

    order = list(fig["models"])
    # Latency CDF per model; with --isolate, each model alone too (thin, its colour).
    figure, ax = plt.subplots(figsize=(7.5, 4.6))
    curves = [(model, f.latencies_ns, "") for model, f in analysed.items()]
    for model, r in run.isolated.items():
        alone: dict[str, ModelFigures] = r.analysed or {}
        if model in alone:
            curves.append((model, alone[model].latencies_ns, " alone"))
    for model, latencies, suffix in curves:
        ms = sorted(x / 1e6 for x in latencies)
        if not ms:
            continue
        ys = [(i + 1) / len(ms) for i in range(len(ms))]
        st = style(model, order)
        if suffix:
            st.update(linewidth=1.0, alpha=0.6, marker=None, linestyle=":")
        ax.step(ms, ys, where="post", markevery=max(1, len(ms) // 12),
                label=f"{MODEL_TITLES.get(model, model)}{suffix} (n={len(ms)})", **st)
    ax.set_xscale("log")
    plain_ms_axis(ax.xaxis)
    ax.set_xlabel("change-to-client latency (milliseconds)")
    ax.set_ylabel("fraction of (client, target, version)")
    ax.set_title(f"Latency CDF — {title}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2,
              frameon=False)
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
        ax.bar(xs, [max(v, 0.1) for v in values], width, label=label,
               color=style(key, [*order, "endpoints", "endpointslices"])["color"],
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
    every = [*order, "endpoints", "endpointslices"]
    for model, f in analysed.items():
        xs, ys = _cumulative(((at - t0) / 1e9, size) for at, size in f.timeline)
        ax.plot(xs, ys, label=MODEL_TITLES.get(model, model),
                markevery=max(1, len(xs) // 10), **style(model, every))
    kube_times = [(e.at_ns - t0) / 1e9 for e in run.truth.emissions[:run.changes]]
    for key, label, per_change in _kube_series(run):
        xs, ys = _cumulative(zip(kube_times, per_change, strict=False))
        ax.plot(xs, ys, label=label, markevery=max(1, len(xs) // 10), **style(key, every))
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
