"""One text format for a route table, whoever encoded it: `meshbridge policy` prints a
Linkerd OutboundPolicy with it and `meshbridge xds --type rds` a RouteConfiguration,
so that the two answers for one Service port read line for line alike."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RouteRow:
    """One match of one rule: what it matches, where it sends, and the rest."""

    match: str  # e.g. "prefix / header x-canary=1"
    to: str  # e.g. "web:80 90, web-canary:80 10", "redirect 302 ...", "respond 500"
    notes: tuple[str, ...] = ()  # timeout, retry, header changes, ...
    source: str = ""  # the route it comes from, where the answer says


def weighted(pairs: Iterable[tuple[str, int]]) -> str:
    """`a 90, b 10`; one backend alone is just its name."""
    items = list(pairs)
    if len(items) == 1:
        return items[0][0]
    return ", ".join(f"{name} {weight}" for name, weight in items)


def format_rows(title: str, rows: Sequence[RouteRow]) -> list[str]:
    lines = [title]
    if not rows:
        lines.append("  (no routes: every request is refused)")
    for i, row in enumerate(rows, 1):
        line = f"  {i}. {row.match or '(any)'} -> {row.to}"
        if row.notes:
            line += f"  [{'; '.join(row.notes)}]"
        if row.source:
            line += f"  ({row.source})"
        lines.append(line)
    return lines
