"""The one way tests wait: poll a condition with a deadline, never a bare sleep.

`eventually` is for a test on an event loop (its check may be a coroutine function, e.g.
one that asks a child process); `eventually_seen` is `eventually` for a probe that also
says what it saw, so that a missed deadline names the last observation;
`eventually_sync` is for a plain test that waits on something outside it (a real
process, an API server). All fail with an AssertionError that says why, and return
how long the wait took.

A deadline here is a guard against a hang, never a time budget: the suite runs on a
2-core machine with both cores busy, where an event that takes milliseconds when idle
can take seconds. `HANG` is the deadline every wait uses unless it has a reason for a
longer one; how fast something happens is measured in bench/, not asserted here.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any

Why = Callable[[], str] | str

HANG = 60.0  # seconds: only a real hang, not a loaded machine, reaches this deadline


def _failure(why: Why, timeout: float) -> AssertionError:
    reason = why() if callable(why) else why
    return AssertionError(f"{reason} after {timeout:g}s")


async def eventually(check: Callable[[], bool | Awaitable[bool]], timeout: float = HANG,
                     why: Why = "condition not met", period: float = 0.02) -> float:
    """Wait until `check()` holds; fail after `timeout` seconds saying `why`."""
    start = time.monotonic()
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise _failure(why, timeout)
        await asyncio.sleep(period)  # the polling period, under the deadline above


async def eventually_seen(probe: Callable[[], Awaitable[tuple[bool, Any]]], timeout: float,
                          what: str, period: float = 0.02) -> float:
    """Wait until `probe()` returns (True, observed); a missed deadline says `what` and
    the last observation."""
    seen: list[Any] = [None]

    async def check() -> bool:
        ok, seen[0] = await probe()
        return bool(ok)

    return await eventually(check, timeout, lambda: f"{what}; last seen: {seen[0]!r}", period)


def eventually_sync(check: Callable[[], bool], timeout: float = HANG,
                    why: Why = "condition not met", period: float = 0.05) -> float:
    """`eventually` for code with no event loop: blocks the calling thread."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise _failure(why, timeout)
        time.sleep(period)  # the polling period, under the deadline above
    return time.monotonic() - start
