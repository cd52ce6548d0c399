"""`python -m bench [NAME...]`: run each benchmark module in its own process.

A benchmark is a module `bench/<name>.py` runnable as `python -m bench.<name>`; each
prints its own table. Separate processes keep one benchmark's memory and threads from
skewing the next one's figures.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
NOT_BENCHMARKS = {"__init__", "__main__", "compare", "common"}


def discover() -> list[str]:
    return sorted(
        p.stem for p in HERE.glob("*.py")
        if p.stem not in NOT_BENCHMARKS and not p.stem.startswith("_")
        and "def main(" in p.read_text(encoding="utf-8")
    )


def main(argv: list[str]) -> int:
    names = argv or discover()
    failed = []
    for name in names:
        print(f"=== bench.{name}", flush=True)
        rc = subprocess.call([sys.executable, "-m", f"bench.{name}"])
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
