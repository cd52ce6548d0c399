"""A stand-in for an asyncio loop's clock and timers, for code that only schedules
callbacks: time passes when the test says, and the callbacks due run in order."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class FakeHandle:
    def __init__(self, loop: FakeLoop, when: float, callback: Callable[..., Any],
                 args: tuple[Any, ...]) -> None:
        self.loop, self.when, self.callback, self.args = loop, when, callback, args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[FakeHandle] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> FakeHandle:
        handle = FakeHandle(self, self.now + delay, callback, args)
        self.timers.append(handle)
        return handle

    def call_soon(self, callback: Callable[..., Any], *args: Any) -> FakeHandle:
        return self.call_later(0.0, callback, *args)

    def advance(self, seconds: float) -> None:
        """Let `seconds` pass, running the callbacks that fall due, in order."""
        end = self.now + seconds
        while True:
            due = [h for h in self.timers if h.when <= end and not h.cancelled]
            if not due:
                break
            handle = min(due, key=lambda h: h.when)
            self.timers.remove(handle)
            self.now = max(self.now, handle.when)
            handle.callback(*handle.args)
        self.timers = [h for h in self.timers if not h.cancelled]
        self.now = end
