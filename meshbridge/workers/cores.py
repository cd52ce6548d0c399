"""`--workers N|auto`: how many processes serve the gRPC port (docs/workers.md)."""

from __future__ import annotations

import argparse
import os


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, as a container's cpuset
    or `taskset` leaves it), not the machine's."""
    return len(os.sched_getaffinity(0))


def parse_workers(text: str, cores: int | None = None) -> int:
    """`auto` is every usable core; a number must be 1 to the usable cores (more would
    only add switches). ValueError names the limit."""
    limit = usable_cores() if cores is None else cores
    if text.strip().lower() == "auto":
        return limit
    hint = f"this process may use {limit} core{'s' if limit != 1 else ''} " \
           f"(os.sched_getaffinity); use 1..{limit} or auto"
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"--workers {text}: not a number; {hint}") from None
    if not 1 <= value <= limit:
        raise ValueError(f"--workers {text}: {hint}")
    return value


def workers_argument(text: str) -> int:
    """`parse_workers` as an argparse type."""
    try:
        return parse_workers(text)
    except ValueError as e:
        # argparse says "argument --workers: " before it; the value follows.
        raise argparse.ArgumentTypeError(
            f"{text!r}: " + str(e).removeprefix(f"--workers {text}: ")) from None
