"""`meshbridge status --server ADDR`: every client of a running meshbridge and how far
it is in sync, as a table (what `istioctl proxy-status` and `linkerd diagnostics`
users look for), read from the admin port's /debug/syncz."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any, TextIO

DEFAULT_ADMIN = "127.0.0.1:9996"
COLUMNS = ("ID", "PROTOCOL", "CLIENT", "PEER", "TYPE/TARGET", "SENT", "ACKED", "STATE",
           "BEHIND")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", default=DEFAULT_ADMIN,
                        help="meshbridge's admin address (its --admin)")
    parser.add_argument("--json", action="store_true", help="print /debug/syncz as JSON")
    parser.add_argument("--timeout", type=float, default=5.0,
                        help="seconds to wait for the admin port")


def rows(syncz: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for s in syncz:
        types = s.get("types") or {"-": {}}
        for name, t in sorted(types.items()):
            out.append(tuple(str(v) for v in (
                s["id"], s["protocol"], s["client"][:40] or "-", s["peer"], name,
                t.get("sent") or "-", t.get("acked") or "-", t.get("state", "-"),
                f"{s['behind_seconds']:g}s")))
    return out


def table(syncz: list[dict[str, Any]], out: TextIO) -> None:
    body = rows(syncz)
    widths = [max(len(c), *(len(r[i]) for r in body)) if body else len(c)
              for i, c in enumerate(COLUMNS)]
    for line in (COLUMNS, *body):
        out.write("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip()
                  + "\n")


def run(args: argparse.Namespace) -> int:
    url = f"http://{args.server}/debug/syncz"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as r:
            syncz = json.loads(r.read())
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        print(f"meshbridge status: {url}: {reason}", file=sys.stderr)
        return 1
    if args.json:
        json.dump(syncz, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    elif not syncz:
        print("no clients connected")
    else:
        table(syncz, sys.stdout)
    return 0
