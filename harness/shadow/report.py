"""How `meshbridge shadow` reports: a live table, plain lines, or JSON events, and the
summary at the end.

    LiveReport    a rich table of every target, redrawn a few times a second (a
                  terminal, when `rich` is installed: the `shadow` extra)
    LinesReport   one line per event (not a terminal, or no rich)
    JsonReport    one JSON object per line: start, notes, every event, the summary
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from harness.shadow.model import (
    AGREEING,
    CONVERGING,
    DIFFERS,
    EQUAL,
    ERROR,
    MISSING,
    PENDING,
    SEMANTICS,
    Difference,
    Event,
    Record,
    Tracker,
)

STATUS_ORDER = (DIFFERS, MISSING, ERROR, CONVERGING, PENDING, SEMANTICS, EQUAL)
SHOWN_DIFFERENCES = 4  # per target in the table and lines; JSON carries them all


@dataclass(frozen=True, slots=True)
class Unagreed:
    target: str
    status: str
    differences: tuple[Difference, ...]
    ours: str
    theirs: str
    missing_on: str = ""

    def headline(self) -> str:
        status = f"missing on {self.missing_on}" if self.missing_on else self.status
        return f"{status:<10} {self.target}  (ours: {self.ours}; theirs: {self.theirs})"

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"target": self.target, "status": self.status,
                               "ours": self.ours, "theirs": self.theirs}
        if self.missing_on:
            out["missing_on"] = self.missing_on
        out["differences"] = [d.as_json() for d in self.differences]
        return out


@dataclass(slots=True)
class Summary:
    api: str
    ours: str
    theirs: str
    duration: float
    targets: int
    counts: dict[str, int]
    ignored: tuple[str, ...]  # field patterns left out: --fields, and what a side lacks
    notes: list[str]
    unagreed: list[Unagreed]
    agreements: list[float] = field(default_factory=list)
    strict_semantics: bool = False
    # Per side, every target's current stream's messages summed by kind.
    messages: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        bad = {s for s in self.counts if s not in AGREEING}
        if self.strict_semantics:
            bad.add(SEMANTICS)
        return self.targets > 0 and not any(self.counts.get(s) for s in bad)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def time_to_agree(self) -> dict[str, float] | None:
        if not self.agreements:
            return None
        ms = sorted(t * 1000 for t in self.agreements)
        return {"count": len(ms), "p50_ms": round(statistics.median(ms), 1),
                "p95_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.95))], 1),
                "max_ms": round(ms[-1], 1)}

    def as_json(self) -> dict[str, Any]:
        return {
            "event": "summary", "api": self.api, "ours": self.ours, "theirs": self.theirs,
            "duration_s": round(self.duration, 3), "targets": self.targets,
            "counts": self.counts, "ignored": list(self.ignored),
            "messages": self.messages, "notes": sorted(self.notes),
            "time_to_agree": self.time_to_agree(), "ok": self.ok,
            "exit_status": self.exit_code,
            "unagreed": [u.as_json() for u in self.unagreed],
        }

    def lines(self) -> list[str]:
        counts = ", ".join(f"{self.counts[s]} {s}" for s in STATUS_ORDER if self.counts.get(s))
        out = [f"shadow {self.api}: ours {self.ours} vs theirs {self.theirs}, "
               f"{self.targets} targets over {self.duration:.1f}s: {counts or 'none'}"]
        out.append("compared: every field of every endpoint, of the set, of the profile, "
                   "and redundant messages" + (f"; ignored: {', '.join(self.ignored)}"
                                              if self.ignored else ""))
        for side, kinds in self.messages.items():
            if kinds:
                out.append(f"messages from {side}: " + ", ".join(
                    f"{n} {k}" for k, n in sorted(kinds.items())))
        out.extend(f"note: {n}" for n in self.notes)
        tta = self.time_to_agree()
        if tta:
            out.append(f"time to agree after a change: {tta['count']} times, "
                       f"p50 {tta['p50_ms']} ms, p95 {tta['p95_ms']} ms, "
                       f"max {tta['max_ms']} ms")
        for u in self.unagreed:
            out.append(f"  {u.headline()}")
            if u.status in (DIFFERS, PENDING):
                out.extend(f"               {d.text()}" for d in u.differences)
        out.append("result: " + ("every target agrees" if self.ok else
                                 "targets disagree" if self.targets else "no targets"))
        return out


def summarize(tracker: Tracker, *, api: str, ours: str, theirs: str, duration: float,
              notes: list[str], strict_semantics: bool = False) -> Summary:
    counts: dict[str, int] = {}
    unagreed = []
    agreements: list[float] = []
    messages: dict[str, dict[str, int]] = {"ours": {}, "theirs": {}}
    for rec in sorted(tracker.records.values(), key=lambda r: r.target):
        for side, answer in (("ours", rec.ours), ("theirs", rec.theirs)):
            for kind, n in answer.messages.items():
                messages[side][kind] = messages[side].get(kind, 0) + n
        status = rec.verdict.status
        counts[status] = counts.get(status, 0) + 1
        agreements.extend(rec.agreed_after)
        if not rec.verdict.agrees or (strict_semantics and status == SEMANTICS):
            unagreed.append(Unagreed(rec.target, status, rec.verdict.differences,
                                     rec.ours.describe(), rec.theirs.describe(),
                                     rec.verdict.missing_on))
    return Summary(api, ours, theirs, duration, len(tracker.records), counts,
                   tracker.ignore.patterns, notes, unagreed, agreements, strict_semantics,
                   messages)


def _event_text(ev: Event) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(ev.at))
    text = f"{stamp} {ev.status:<10} {ev.target}"
    if ev.time_to_agree is not None:
        text += f"  agreed after {ev.time_to_agree * 1000:.0f} ms"
    elif ev.status == CONVERGING:
        text += f"  ({ev.changed} changed)"
    if ev.status == MISSING:
        text += f"  missing on {ev.missing_on}"
    if ev.status in (MISSING, ERROR, SEMANTICS):
        text += f"  (ours: {ev.ours}; theirs: {ev.theirs})"
    diffs = list(ev.differences)
    if ev.status not in (MISSING, ERROR, SEMANTICS):
        for d in diffs[:SHOWN_DIFFERENCES]:
            text += f"\n           {d.text()}"
        if len(diffs) > SHOWN_DIFFERENCES:
            text += f"\n           ... {len(diffs) - SHOWN_DIFFERENCES} more"
    return text


class Report(Protocol):
    def start(self, info: dict[str, Any]) -> None: ...

    def note(self, text: str) -> None: ...

    def events(self, events: list[Event]) -> None: ...

    def refresh(self, tracker: Tracker) -> None: ...

    def finish(self, summary: Summary) -> None: ...


class JsonReport:
    def __init__(self, out: TextIO = sys.stdout) -> None:
        self.out = out

    def _write(self, obj: dict[str, Any]) -> None:
        self.out.write(json.dumps(obj, sort_keys=False) + "\n")
        self.out.flush()

    def start(self, info: dict[str, Any]) -> None:
        self._write({"event": "start", "at": round(time.time(), 3), **info})

    def note(self, text: str) -> None:
        self._write({"event": "note", "at": round(time.time(), 3), "note": text})

    def events(self, events: list[Event]) -> None:
        for ev in events:
            self._write(ev.as_json())

    def refresh(self, tracker: Tracker) -> None:
        pass

    def finish(self, summary: Summary) -> None:
        self._write(summary.as_json())


class LinesReport:
    def __init__(self, out: TextIO = sys.stdout) -> None:
        self.out = out

    def _write(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def start(self, info: dict[str, Any]) -> None:
        self._write(f"shadow {info['api']}: ours {info['ours']} vs theirs {info['theirs']}, "
                    f"{info['targets']} targets")

    def note(self, text: str) -> None:
        self._write(f"note: {text}")

    def events(self, events: list[Event]) -> None:
        for ev in events:
            self._write(_event_text(ev))

    def refresh(self, tracker: Tracker) -> None:
        pass

    def finish(self, summary: Summary) -> None:
        for line in summary.lines():
            self._write(line)


_STYLES = {EQUAL: "green", SEMANTICS: "cyan", CONVERGING: "yellow", PENDING: "dim",
           DIFFERS: "bold red", MISSING: "bold red", ERROR: "magenta"}


class LiveReport:
    """The live table. Needs `rich` (the `shadow` extra)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.live import Live

        self.console = Console()
        self.live = Live(console=self.console, auto_refresh=False, transient=False)
        self.header = ""
        self.notes: list[str] = []
        self.last: dict[str, str] = {}  # per target: the latest time-to-agree, as text

    def start(self, info: dict[str, Any]) -> None:
        self.header = (f"shadow {info['api']}: ours {info['ours']} vs theirs "
                       f"{info['theirs']}")
        self.live.start()

    def note(self, text: str) -> None:
        self.notes.append(text)

    def events(self, events: list[Event]) -> None:
        for ev in events:
            if ev.time_to_agree is not None:
                self.last[ev.target] = f"{ev.time_to_agree * 1000:.0f} ms"

    def refresh(self, tracker: Tracker) -> None:
        self.live.update(self._table(tracker), refresh=True)

    def _table(self, tracker: Tracker) -> Any:
        from rich.table import Table

        counts: dict[str, int] = {}
        for rec in tracker.records.values():
            counts[rec.shown] = counts.get(rec.shown, 0) + 1
        caption = "  ".join(f"{counts[s]} {s}" for s in STATUS_ORDER if counts.get(s))
        table = Table(title=self.header, caption="\n".join([caption, *self.notes]),
                      expand=False)
        for col in ("target", "status", "ours", "theirs", "differences", "agreed after"):
            table.add_column(col, overflow="fold")

        def order(rec: Record) -> tuple[int, str]:
            return STATUS_ORDER.index(rec.shown), rec.target

        for rec in sorted(tracker.records.values(), key=order):
            diffs = [d.text() for d in rec.verdict.differences[:SHOWN_DIFFERENCES]]
            more = len(rec.verdict.differences) - SHOWN_DIFFERENCES
            if more > 0:
                diffs.append(f"... {more} more")
            if rec.shown == MISSING:
                diffs = [f"missing on {rec.verdict.missing_on}"]
            elif rec.shown == ERROR:
                diffs = ["no answer from " + " and ".join(
                    side for side, a in (("ours", rec.ours), ("theirs", rec.theirs))
                    if a.signal == ERROR)]
            elif rec.shown in (EQUAL, PENDING, CONVERGING):
                diffs = []
            style = _STYLES.get(rec.shown, "")
            table.add_row(rec.target, f"[{style}]{rec.shown}[/]", rec.ours.describe(),
                          rec.theirs.describe(), "\n".join(diffs),
                          self.last.get(rec.target, ""))
        return table

    def finish(self, summary: Summary) -> None:
        self.live.stop()
        for line in summary.lines():
            self.console.print(line, highlight=False, markup=False)


def make_report(json_output: bool, out: TextIO = sys.stdout) -> tuple[Report, str]:
    """The report for this output, and a note if the live table had to be given up."""
    if json_output:
        return JsonReport(out), ""
    if out.isatty():
        try:
            return LiveReport(), ""
        except ImportError:
            return LinesReport(out), "install meshbridge[shadow] (rich) for the live table"
    return LinesReport(out), ""
