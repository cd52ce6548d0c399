"""A destination stream written in the native server's callbacks, with no task.

With h2grpc, a `Get` handler subscribes, queues the snapshot and detaches
(`ServerCall.detach`): from then on each push to the stream's queue is written at
once (`write_nowait`), and a writer task exists only while the client is not taking
what is written (a slow reader waits on `context.write`, and the queue's capacity
still ends a stream that falls too far behind, Linkerd §3.1). The stream's end —
its queue ended (shutdown, overflow, a federated Service gone) or the call ended
from outside (reset, connection gone) — runs `on_over` once (the writer's books,
then the handler's `released`). An idle stream then holds its queue, its View
subscription and the call: no task, no coroutine frames.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import structlog

from linkerd_api.queue import UpdateQueue
from meshbridge.host import StreamInfo

log = structlog.get_logger("meshbridge.linkerd")


class DetachedWriter:
    __slots__ = ("_context", "_on_over", "_task", "info", "over", "queue", "released",
                 "target")

    def __init__(self, queue: UpdateQueue, context: Any, info: StreamInfo, target: str,
                 on_over: Callable[[DetachedWriter], None],
                 released: Callable[[UpdateQueue], None]) -> None:
        self.queue = queue
        self.info = info
        self.target = target
        self._context = context
        self._on_over = on_over  # the writer's books
        self.released = released  # the handler's: what the stream subscribed to
        self._task: asyncio.Task[None] | None = None
        self.over = False

    def start(self) -> None:
        """Detach the call and write what is queued."""
        self.queue.writer = self
        self._context.detach(self)
        self.wake()

    # ------------------------------------------------------------ the queue's side

    def wake(self) -> None:
        """Write what is queued now, while the server takes it; a writer task when
        it does not."""
        if self._task is not None or self.over:
            return  # the writer task looks again before it ends
        queue, info = self.queue, self.info
        while (item := queue.take()) is not None:
            version, message = item
            if not self._context.write_nowait(message):
                self._task = asyncio.get_running_loop().create_task(self._drain(item))
                return
            info.sent(self.target, version, "", len(message))
        if queue.ended:
            self._end()
        else:
            info.converged()  # Linkerd has no ACK: caught up once all is written

    async def _drain(self, item: tuple[str, bytes]) -> None:
        try:
            while True:
                version, message = item
                await self._context.write(message)
                self.info.sent(self.target, version, "", len(message))
                next_item = self.queue.take()
                if next_item is None:
                    break
                item = next_item
        except asyncio.CancelledError:
            return
        except Exception as e:  # the call is broken
            log.debug("destination stream write failed", error=repr(e))
            self._task = None
            self._close()
            with contextlib.suppress(Exception):
                self._context.cancel()
            return
        self._task = None
        self.wake()

    # ------------------------------------------------------------ the call's side

    def __call__(self, _message: Any) -> bool:
        return False  # a unary request: nothing more comes

    def on_done(self) -> None:
        """The call ended from outside: reset, or the connection is gone."""
        self._close()

    def _end(self) -> None:
        """The queue ended: status OK, after what was written."""
        self._close()
        self._context.end()

    def _close(self) -> None:
        if self.over:
            return
        self.over = True
        self.queue.writer = None
        task = self._task
        if task is not None and task is not asyncio.current_task():
            task.cancel()
        self._on_over(self)
