"""The bounded per-stream queue between the core (which must never block) and one
gRPC stream (which may be slow), as Linkerd's translators have (§3.1)."""

from __future__ import annotations

import asyncio

from meshbridge.host import StreamInfo

# A message as queued: (the version it describes, for /debug/streams; its bytes). The
# tuples are built once per version and shared by every stream that queues them.
Outgoing = tuple[str, bytes]


class UpdateQueue:
    """Encoded messages waiting for one stream's writer, at most `capacity` of them.

    `push` never blocks: when the queue is full the stream is over (the proxy will
    reconnect and get a fresh snapshot), which is cheaper and more honest than
    growing without bound or silently dropping an update. Subclasses add what a
    stream needs to know about itself; slots keep an idle stream small.
    """

    __slots__ = ("_items", "_waiter", "capacity", "ended", "info", "overflowed")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("stream queue capacity must be at least 1")
        self.capacity = capacity
        self._items: list[Outgoing] = []
        self._waiter: asyncio.Future[None] | None = None
        self.ended = False
        self.overflowed = False
        # The stream's entry on /debug/streams, once its writer has registered it.
        self.info: StreamInfo | None = None

    def __len__(self) -> int:
        return len(self._items)

    def push(self, message: Outgoing) -> bool:
        """Queue a message; False if the stream has ended, or ends now because the
        queue is full (then `overflowed` is set and the queue is emptied)."""
        if self.ended:
            return False
        if len(self._items) >= self.capacity:
            self.overflowed = True
            self.end()
            return False
        self._items.append(message)
        self._wake()
        return True

    def end(self) -> None:
        """End the stream: the writer stops after the write in progress, if any."""
        self.ended = True
        self._items = []
        self._wake()

    async def next(self) -> Outgoing | None:
        """The next message to write, or None once the stream has ended."""
        while not self._items:
            if self.ended:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.pop(0)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
