"""The one way tests wait: poll a condition with a deadline, never a bare sleep."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def eventually(check: Callable[[], bool], timeout: float = 10.0,
                     why: Callable[[], str] | str = "condition not met",
                     period: float = 0.02) -> float:
    """Wait until `check()` holds; fail after `timeout` seconds saying `why`. Returns
    how long it took."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            reason = why() if callable(why) else why
            raise AssertionError(f"{reason} after {timeout:g}s")
        await asyncio.sleep(period)  # the polling period, under the deadline above
    return time.monotonic() - start
