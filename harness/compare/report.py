"""A run's report folder: its figures (`report.json`), its tables (`report.md`), the
raw truth (`truth.json`) and its charts (PNG).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from harness.compare.charts import charts
from harness.compare.figures import figures
from harness.compare.kube import kube_side
from harness.compare.markdown import markdown
from harness.compare.run import Run


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
