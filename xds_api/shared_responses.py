"""Nonces from one clock, and responses encoded once for every stream that sends the
same bytes.

A change fans out to thousands of streams whose responses differ, byte for byte, only
in their nonce when each stream counts its own. Nonces need only be unique on their
stream (docs/protocol/xds.md §1.3: a client quotes the last one it was sent for a
type; nothing compares them across streams), so a process's streams draw them from
one clock: the service ticks it once per write batch (one loop turn's fan-out), and a
stream's next nonce is the clock's reading, or one more than its own last nonce when
the clock has not moved past it (a second response in the same batch, a stream
written outside any batch). So a stream's nonces still only ever grow, and every
stream written in one batch with the same resources and version sends the very same
response: it is encoded once (`encoded`) and shared.

Streams that never see a tick (a lone stream, a unit test) count 1, 2, 3... as
before.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

# Distinct responses kept per tick: a batch whose streams hold many different sets
# (CDS wildcard clients with differing names, say) encodes the rest per stream.
MAX_SHARED = 4096


class SharedResponses:
    __slots__ = ("_memo", "_memo_tick", "_now_text", "now")

    def __init__(self) -> None:
        self.now = 0  # the clock: ticks once per write batch
        self._now_text = "0"
        self._memo: dict[Hashable, tuple[object, bytes]] = {}
        self._memo_tick = 0

    def tick(self) -> None:
        """A new write batch: responses of the last one are not shared with it."""
        self.now += 1
        self._now_text = str(self.now)

    def end_batch(self) -> None:
        """The batch is written: its responses are the connections' now, not kept
        here (a big one would otherwise live until the next change)."""
        self._memo.clear()

    def nonce_after(self, last: int) -> int:
        """A stream's next nonce, given its last one (§1.3: unique on the stream)."""
        now = self.now
        return now if now > last else last + 1

    def text(self, nonce: int) -> str:
        """The nonce as sent; the clock's reading is one string for every stream that
        keeps it (as its last nonce of a type)."""
        return self._now_text if nonce == self.now else str(nonce)

    def encoded(self, nonce: int, key: Hashable, pin: object,
                encode: Callable[[], bytes]) -> bytes:
        """The response `key` describes (its nonce included), encoded once per tick.
        `pin` holds what the key names by identity (resources), so that no id in a
        kept key is reused while the entry lives."""
        if nonce != self.now:
            return encode()  # this stream's own nonce: no other stream sends it
        memo = self._memo
        if self._memo_tick != nonce:
            memo.clear()
            self._memo_tick = nonce
        found = memo.get(key)
        if found is not None:
            return found[1]
        data = encode()
        if len(memo) < MAX_SHARED:
            memo[key] = (pin, data)
        return data


# What streams share when nothing ticks: every nonce is a stream's own, nothing shared.
UNSHARED = SharedResponses()
