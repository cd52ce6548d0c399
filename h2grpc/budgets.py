"""Per-connection budgets: how much of each cheap-to-send, costly-to-serve thing one
connection may ask for before it is told to calm down (GOAWAY ENHANCE_YOUR_CALM,
RFC 9113 §5.4.1) and closed.

Every attack class on an HTTP/2 server is one of these floods — PINGs, SETTINGS,
WINDOW_UPDATEs, resets, PRIORITY, empty frames, CONTINUATIONs, requests that fail
(the CVE-2019-9511…9518 family, CVE-2023-44487 "rapid reset", the 2024
CONTINUATION flood) — so each has a counter here with a limit a well-behaved gRPC
client never comes near. Counting is over fixed windows (h2grpc.limits: `window`
seconds): cheap, and all a flood detector needs.
"""

from __future__ import annotations


class RateBudget:
    """At most `limit` events per `window` seconds. `earn` gives credit back for work
    that legitimately causes the event (a DATA frame we send earns the client one
    WINDOW_UPDATE)."""

    __slots__ = ("count", "limit", "name", "since", "window")

    def __init__(self, name: str, limit: int, window: float) -> None:
        self.name = name
        self.limit = limit
        self.window = window
        self.count = 0
        self.since = 0.0

    def spend(self, now: float, n: int = 1) -> bool:
        """Count `n` events; False once the budget is exceeded. A limit of 0 means no
        limit."""
        if now - self.since >= self.window:
            self.count, self.since = 0, now
        self.count += n
        return self.limit <= 0 or self.count <= self.limit

    def earn(self, n: int = 1) -> None:
        self.count = max(0, self.count - n)

    def describe(self) -> str:
        return f"more than {self.limit} {self.name} in {self.window:g} s"


class PingStrikes:
    """gRPC's keepalive enforcement, as its servers do it: a PING that comes sooner
    than `min_interval` after the previous one, with no HEADERS or DATA sent by us in
    between, is a strike; more than `max_strikes` and the connection is closed with
    ENHANCE_YOUR_CALM "too_many_pings". Sending data forgives: a client's BDP pings
    follow the data it receives, and keepalive pings on a busy connection are not
    abuse."""

    __slots__ = ("last", "max_strikes", "min_interval", "strikes")

    def __init__(self, min_interval: float, max_strikes: int) -> None:
        self.min_interval = min_interval
        self.max_strikes = max_strikes
        self.strikes = 0
        self.last: float | None = None

    def ping(self, now: float) -> bool:
        """A PING arrived: False once it is one strike too many."""
        last, self.last = self.last, now
        if last is not None and now - last < self.min_interval:
            self.strikes += 1
            return self.strikes <= self.max_strikes
        return True

    def forgive(self) -> None:
        """We sent HEADERS or DATA."""
        self.strikes = 0
        self.last = None
