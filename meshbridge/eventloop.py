"""Which asyncio event loop runs the process: uvloop (libuv) or the standard library's.

uvloop is the field's usual loop for asyncio socket servers: the same fan-out costs
the server less CPU on it (docs/performance.md, "The event loop"), because reading,
writing and scheduling callbacks are done in C. The standard loop stays one flag
away (`--event-loop asyncio`), and is what runs when uvloop is not installed.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

EVENT_LOOPS = ("uvloop", "asyncio")


def default_loop() -> str:
    """uvloop when it is installed (it is a dependency of `serve`), else asyncio."""
    return "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"


def run(main: Coroutine[Any, Any, T], loop: str | None = None) -> T:
    """Run `main` to completion on a new event loop of the kind named."""
    if (loop or default_loop()) == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(main)
    return asyncio.run(main)
