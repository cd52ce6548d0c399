"""`meshbridge compare SCENARIO [--out DIR] [--envoy N]`: the two addressing models side
by side on the same churn.

meshbridge runs in this process on the `sim` source; measuring clients of each model
(Linkerd `Get` streams, xDS SotW and delta ADS streams) run in a child process, each
decoding what it receives and keeping its own state. The run ends with every
client's state checked against the source's truth. See docs/compare.md.

Exit status: 0 when every check passes, 1 when one fails (a divergence, a byte count
that does not add up), 2 for a scenario or an option that cannot run.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from bridge.sources.sim import ScenarioError
from harness.compare_envoy import EnvoyError, EnvoyFleet
from harness.compare_run import Run, RunError, RunOptions
from harness.compare_scenario import (
    MODELS,
    CompareScenario,
    load_compare_scenario,
)
from meshbridge.log import configure_logging

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
SHORT_TITLES = {"linkerd": "Linkerd Get", "sotw": "xDS SotW", "delta": "xDS delta"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", help="scenario YAML (see bench/scenarios/)")
    parser.add_argument("--out", default=None,
                        help="report folder (default: compare-out/<scenario name>)")
    parser.add_argument("--envoy", type=int, default=0, metavar="N",
                        help="also run N real Envoy processes as xDS clients")
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds of churn, instead of the scenario's")
    parser.add_argument("--settle-timeout", type=float, default=30.0,
                        help="seconds to wait for the clients to go quiet after the churn")
    parser.add_argument("--connect-timeout", type=float, default=60.0,
                        help="seconds to wait for every client's initial snapshot")
    parser.add_argument("--no-charts", action="store_true", help="skip the PNG charts")
    parser.add_argument("--plain", action="store_true",
                        help="no live view: phase lines only (the default when not a TTY)")
    parser.add_argument("--log-level", default="warning")


def run(args: argparse.Namespace) -> int:
    configure_logging("console", args.log_level)
    err = sys.stderr
    try:
        cs = load_compare_scenario(Path(args.scenario), args.duration)
    except ScenarioError as e:
        print(f"meshbridge compare: {e}", file=err)
        return EXIT_USAGE
    if args.envoy < 0:
        print(f"meshbridge compare: --envoy: must be >= 0, got {args.envoy}", file=err)
        return EXIT_USAGE
    for name in ("settle_timeout", "connect_timeout"):
        if getattr(args, name) <= 0:
            print(f"meshbridge compare: --{name.replace('_', '-')}: must be > 0", file=err)
            return EXIT_USAGE
    out = Path(args.out) if args.out else Path("compare-out") / cs.scenario.name
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"meshbridge compare: --out {out}: {e.strerror or e}", file=err)
        return EXIT_USAGE
    envoy = None
    if args.envoy:
        from harness.compare_envoy import EnvoyFleet

        try:
            envoy = EnvoyFleet.check(args.envoy, cs, out)
        except EnvoyError as e:
            print(f"meshbridge compare: --envoy: {e}", file=err)
            return EXIT_USAGE
    live = not args.plain and sys.stderr.isatty()
    options = RunOptions(connect_timeout=args.connect_timeout,
                         settle_timeout=args.settle_timeout)
    return asyncio.run(compare(cs, out, options, live, envoy, not args.no_charts))


async def compare(cs: CompareScenario, out: Path, options: RunOptions, live: bool,
                  envoy: EnvoyFleet | None = None, with_charts: bool = True) -> int:
    from harness import compare_report, compare_run

    view = LiveView(cs) if live else PlainView()
    try:
        with view:
            r = await compare_run.run(cs, out, options, view, envoy)
    except (RunError, EnvoyError) as e:
        print(f"meshbridge compare: {e}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if envoy is not None:
            await envoy.stop()
    fig = compare_report.write(r, out, with_charts)
    print(summary(fig, out))
    return EXIT_OK if fig["ok"] else EXIT_FAILED


def summary(fig: dict[str, Any], out: Path) -> str:
    from harness.compare_report import kube_table, model_table

    lines = [model_table(fig), "", kube_table(fig), ""]
    for c in fig["checks"]:
        if not c["ok"]:
            lines.append(f"FAILED: {c['name']} — {c['detail']}")
    for f in fig["failures"][:20]:
        lines.append(f"DIVERGENCE: {f['client']} {f['target']}: {f['detail']}")
    lines.append(f"{'PASS' if fig['ok'] else 'FAIL'}: report in {out / 'report.md'}")
    return "\n".join(lines)


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

        from harness.compare_report import _fmt_bytes

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
                SHORT_TITLES[m], str(n), str(server.streams) if server else "-",
                f"{server.messages:,} / {_fmt_bytes(server.bytes)}" if server else "-",
                f"{client[0]:,} / {_fmt_bytes(client[1])}" if client else "-")
        versions = r.truth.churn_versions() if r is not None else 0
        table.caption = f"messages / bytes; {versions:,} target versions so far"
        return Group(table, self.progress)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="meshbridge compare")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
