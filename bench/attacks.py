"""The HTTP/2 attack suite (testkit/attacks/, tests/attacks/) against both gRPC transports,
as a table.

    python -m bench.attacks [--transport native|grpcio|both] [--only a,b] [--json FILE]

For each transport one `meshbridge serve` (restarted only if an attack kills it),
the same flags as the test suite (testkit/attacks/harness.py SERVER_FLAGS), and every
attack of testkit/attacks/budgets.py ATTACKS with its budget: /ready throughout,
the good clients' change latency without and with the attack (p50/p99), RSS
(baseline, peak, after) and what the attacker got, judged against the budget (the
budget is the native server's; grpc.aio's server is not held to it, only shown).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from testkit.attacks.budgets import ATTACKS, verdict
from testkit.attacks.harness import Report, Server, missing_flags, run_attack

TRANSPORTS = ("native", "grpcio")


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1000:.0f}"


def _mib(v: int) -> str:
    return f"{v / 2**20:.0f}"


def got_text(attacker: dict[str, Any]) -> str:
    """What the attacker got, in a few words."""
    if not attacker:
        return "no result"
    parts = []
    goaways = attacker.get("goaway_codes", [])
    if goaways:
        codes = sorted(set(goaways))
        parts.append("GOAWAY " + "/".join(f"{c:#x}" for c in codes)
                     + (f" x{attacker.get('goaways')}" if attacker.get("goaways", 0) > 1 else ""))
    if attacker.get("rst_codes"):
        parts.append("RST " + ", ".join(f"{k}x{v}" for k, v in attacker["rst_codes"].items()))
    n, closed = attacker.get("connections", 0), attacker.get("connections_closed_by_server", 0)
    if closed:
        parts.append(f"closed {closed}/{n} after {attacker.get('closed_after_s')}"
                     f"-{attacker.get('closed_after_max_s')}s")
    else:
        parts.append(f"{n} conn open")
    extra = attacker.get("extra", {})
    if "usable" in extra:
        parts.append("usable" if extra["usable"] else "unusable")
    if "refused" in extra:
        parts.append(f"{extra['refused']} of {extra.get('opened')} refused")
    return "; ".join(parts)


def row(report: Report) -> dict[str, Any]:
    budget = ATTACKS[report.attack]
    problems = verdict(budget, report.attacker)
    return {
        "attack": report.attack, "transport": report.transport,
        "ready_throughout": report.ready_throughout,
        "ready_polls": len(report.ready),
        "missed_changes": len(report.missed),
        "latency_baseline_p50_ms": _ms(report.latency("baseline", .5)),
        "latency_baseline_p99_ms": _ms(report.latency("baseline", .99)),
        "latency_attack_p50_ms": _ms(report.latency("attack", .5)),
        "latency_attack_p99_ms": _ms(report.latency("attack", .99)),
        "rss_baseline_mib": _mib(report.rss_baseline), "rss_peak_mib": _mib(report.rss_peak),
        "rss_after_mib": _mib(report.rss_after),
        "rss_recovered": report.rss_recovered_in is not None,
        "got": got_text(report.attacker),
        "as_budgeted": not problems, "budget_problems": problems,
        "health_problems": report.health_problems(budget.gauges),
        "attacker": report.attacker, "seconds": round(report.seconds, 1),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    header = ["attack", "transport", "ready throughout", "change p50/p99 ms (no attack)",
              "change p50/p99 ms (attack)", "missed", "RSS MiB base/peak/after",
              "attacker got", "as budgeted"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [r["attack"], r["transport"], "yes" if r["ready_throughout"] else "NO",
                 f"{r['latency_baseline_p50_ms']}/{r['latency_baseline_p99_ms']}",
                 f"{r['latency_attack_p50_ms']}/{r['latency_attack_p99_ms']}",
                 str(r["missed_changes"]),
                 f"{r['rss_baseline_mib']}/{r['rss_peak_mib']}/{r['rss_after_mib']}"
                 + ("" if r["rss_recovered"] else " (!)"),
                 r["got"], "yes" if r["as_budgeted"] else "no"]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines)


async def run(transports: list[str], names: list[str], workdir: Path) -> list[dict[str, Any]]:
    rows = []
    for transport in transports:
        server = Server(workdir / transport, transport)
        (workdir / transport).mkdir(parents=True, exist_ok=True)
        server.start()
        try:
            for name in names:
                budget = ATTACKS[name]
                print(f"--- {transport} {name}", file=sys.stderr, flush=True)
                report = await run_attack(server, name, budget.seconds, budget.args,
                                          check_gauges=budget.gauges and transport == "native")
                rows.append(row(report))
        finally:
            server.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.attacks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transport", choices=(*TRANSPORTS, "both"), default="both")
    p.add_argument("--only", default="", help="comma-separated attack names")
    p.add_argument("--json", dest="json_file", default="", help="write the rows to FILE")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    names = [n for n in args.only.split(",") if n] or list(ATTACKS)
    unknown = [n for n in names if n not in ATTACKS]
    if unknown:
        print(f"unknown attack {unknown[0]!r}: expected one of {', '.join(ATTACKS)}",
              file=sys.stderr)
        return 2
    transports = list(TRANSPORTS) if args.transport == "both" else [args.transport]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="meshbridge-attacks-") as tmp:
        rows = asyncio.run(run(transports, names, Path(tmp)))
    print(markdown(rows))
    missing = missing_flags()
    if missing:
        print(f"\nserver flags not (yet) in `meshbridge serve`, left out: {' '.join(missing)}")
    print(f"\n{len(rows)} runs in {time.monotonic() - started:.0f}s")
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
