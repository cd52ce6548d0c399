"""Subscribers that keep what they are told, for tests to read back."""

from __future__ import annotations

from bridge.views import View, ViewChange


class ViewRecorder:
    """A View subscriber that keeps every change it is told of, in order."""

    def __init__(self) -> None:
        self.changes: list[ViewChange] = []

    def on_view_change(self, view: View, change: ViewChange) -> None:
        self.changes.append(change)
