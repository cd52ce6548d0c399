"""Which asyncio event loop runs the process: the standard library's or uvloop (libuv).

uvloop is the field's usual loop for asyncio socket servers, so both are measured
(docs/performance.md, "The event loop"): on meshbridge's own server, whose hot paths
are Python callbacks rather than the loop's, uvloop did not save CPU here, so the
standard loop is the default and uvloop a flag (`--event-loop uvloop`, the
`[uvloop]` extra).
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

EVENT_LOOPS = ("uvloop", "asyncio")


def default_loop() -> str:
    """The loop `serve` runs on unless told otherwise."""
    return "asyncio"


def available(loop: str) -> bool:
    return loop == "asyncio" or importlib.util.find_spec(loop) is not None


def run(main: Coroutine[Any, Any, T], loop: str | None = None) -> T:
    """Run `main` to completion on a new event loop of the kind named."""
    if (loop or default_loop()) == "uvloop":  # an optional dependency
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    return asyncio.run(main)
