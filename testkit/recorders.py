"""Stand-ins that keep what they are told, for tests to read back."""

from __future__ import annotations

from typing import Any

from bridge.views import View, ViewChange


class ViewRecorder:
    """A View subscriber that keeps every change it is told of, in order."""

    def __init__(self) -> None:
        self.changes: list[ViewChange] = []

    def on_view_change(self, view: View, change: ViewChange) -> None:
        self.changes.append(change)


class HandlerRecorder:
    """A gRPC server stand-in (no port) that keeps the handlers a layer registers."""

    def __init__(self) -> None:
        self.handlers: list[Any] = []

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.handlers.extend(handlers)
