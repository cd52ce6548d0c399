"""What `meshbridge compare` shows while it runs: phase lines, or a live table of each
model's counts under the churn's progress bar."""

from __future__ import annotations

import sys
import time
from typing import Any

from harness.compare.markdown import fmt_bytes
from harness.compare.run import Run
from harness.compare.scenario import MODELS, CompareScenario

SHORT_TITLES = {"linkerd": "Linkerd Get", "sotw": "xDS SotW", "delta": "xDS delta",
                "leds": "xDS LEDS"}


class PlainView:
    """Phase lines on stderr, for logs and pipes."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self._last_tick = 0.0

    def __enter__(self) -> PlainView:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def phase(self, text: str) -> None:
        self._last_tick = time.monotonic()
        print(f"[{self._last_tick - self.started:6.1f}s] {text}", file=sys.stderr, flush=True)

    def tick(self, run: Run) -> None:
        now = time.monotonic()
        if run.phase == "churn" and now - self._last_tick >= 5:
            self._last_tick = now
            self.phase(f"churn: {run.source_emitted()} changes emitted")


class LiveView:
    """A rich live view: the churn's progress bar and each model's counts."""

    def __init__(self, cs: CompareScenario) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self.cs = cs
        self.console = Console(stderr=True)
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 TextColumn("{task.completed:.0f}/{task.total:.0f} changes"),
                                 TimeRemainingColumn(), console=self.console)
        expected = max(1, int(cs.scenario.churn.rate * cs.duration + 0.999))
        self.task = self.progress.add_task("churn", total=expected)
        self.phase_text = "starting"
        self.run: Run | None = None
        self.live: Any = None

    def __enter__(self) -> LiveView:
        from rich.live import Live

        self.live = Live(self._render(), console=self.console, refresh_per_second=2,
                         transient=False)
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.update(self._render())
            self.live.__exit__(None, None, None)

    def phase(self, text: str) -> None:
        self.phase_text = text
        if self.live is not None:
            self.live.update(self._render())

    def tick(self, run: Run) -> None:
        self.run = run
        self.progress.update(self.task, completed=run.source_emitted())
        if self.live is not None:
            self.live.update(self._render())

    def _render(self) -> Any:
        from rich.console import Group
        from rich.table import Table

        table = Table(title=f"meshbridge compare — {self.cs.scenario.name}: {self.phase_text}",
                      title_justify="left")
        for col in ("model", "clients", "streams", "sent (server)", "received (clients)"):
            table.add_column(col, justify="left" if col == "model" else "right",
                             no_wrap=True)
        r = self.run
        for m in MODELS:
            n = self.cs.clients.count(m)
            if not n:
                continue
            server = r.live_server.get(m) if r is not None else None
            client = r.client_counts.get(m) if r is not None else None
            table.add_row(
                SHORT_TITLES.get(m, m), str(n), str(server.streams) if server else "-",
                f"{server.messages:,} / {fmt_bytes(server.bytes)}" if server else "-",
                f"{client[0]:,} / {fmt_bytes(client[1])}" if client else "-")
        versions = r.truth.churn_versions() if r is not None else 0
        table.caption = f"messages / bytes; {versions:,} target versions so far"
        return Group(table, self.progress)
