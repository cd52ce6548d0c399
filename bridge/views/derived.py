"""What a protocol layer derives from a View's versions, kept by the View itself.

A layer that derives something from every version of a View (Linkerd's encoded
`Update`s and set labels, xDS's ClusterLoadAssignment assembly and LEDS members)
names it with a `Derivation`. The View makes the value the first time the layer asks
for it (`View.derived`) and, from then on, advances it with every version it
publishes, before any subscriber hears of that version. So the value is current
whenever a subscriber reads it: each derived value has one place, one owner that
moves it forward, and no check of its own of whether it is up to date.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from bridge.views.view import View, ViewChange


class Derived(Protocol):
    def advance(self, change: ViewChange) -> None:
        """The View published `change`: bring the value to `change.version`. Called
        on the event loop, before the View's subscribers; must not block."""


D = TypeVar("D", bound=Derived)


class Derivation(Generic[D]):
    """One kind of value a layer derives per View: the key the View keeps it under
    and how to make it from the View as it is. One per deriving object (an encoder,
    a type cache), so two of them never share a value."""

    __slots__ = ("make", "name")

    def __init__(self, name: str, make: Callable[[View], D]) -> None:
        self.name = name
        self.make = make

    def __repr__(self) -> str:
        return f"Derivation({self.name!r})"
