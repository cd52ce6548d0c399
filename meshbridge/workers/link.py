"""The channel between the watcher and one worker: framed messages on a socketpair.

A message is one tuple, `(kind, *arguments)`, pickled behind a 4-byte length. Both
ends are this program, started by the watcher over a private socketpair, so what
pickle may construct is only what the other end (the same code) sent. What the hot
path sends is bytes the protocols already encoded (resources, `Update` messages),
which pickle copies once. Messages sent in one loop turn leave in one socket write.

A kind is handled by one callback (`on`); `call` sends a request whose handler's
return value (or the value of the awaitable it returns) comes back as its answer.
A peer that stops reading cannot grow this end without bound: past `MAX_BUFFERED`
bytes unsent, the link is closed (the watcher then restarts that worker).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import itertools
import pickle
import socket
import struct
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger("meshbridge.workers")

_LENGTH = struct.Struct(">I")
# Bytes one end may have queued for a peer that does not read before the link is
# given up (a stuck worker is restarted; the watcher never grows for it).
MAX_BUFFERED = 256 * 1024 * 1024
_CALL = "link.call"
_ANSWER = "link.answer"


class LinkClosed(ConnectionError):
    """The other end is gone; an unanswered call will never be answered."""


class RemoteError(RuntimeError):
    """The other end's handler of a call raised; the message is its error."""


Handler = Callable[..., Any]


class Link(asyncio.Protocol):
    """One end of a worker channel (see the module)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.transport: asyncio.Transport | None = None
        self._handlers: dict[str, Handler] = {}
        self._call_handlers: dict[str, Handler] = {}
        self._closed_callbacks: list[Callable[[], None]] = []
        self._out: list[bytes] = []
        self._buffer = bytearray()
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Future[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False
        self.sent_bytes = 0

    @classmethod
    async def over(cls, sock: socket.socket, name: str) -> Link:
        """A link on a connected stream socket (one end of a socketpair)."""
        loop = asyncio.get_running_loop()
        link = cls(name)
        link._loop = loop
        await loop.connect_accepted_socket(lambda: link, sock)
        return link

    # ------------------------------------------------------------ handlers

    def on(self, kind: str, handler: Handler) -> None:
        """Call `handler(*arguments)` for every message of `kind`."""
        self._handlers[kind] = handler

    def on_call(self, kind: str, handler: Handler) -> None:
        """Answer every call of `kind` with what `handler(*arguments)` returns (or the
        awaitable it returns resolves to)."""
        self._call_handlers[kind] = handler

    def on_closed(self, callback: Callable[[], None]) -> None:
        self._closed_callbacks.append(callback)

    # ------------------------------------------------------------ sending

    def send(self, kind: str, *arguments: Any) -> None:
        """Queue one message; what a loop turn queues leaves in one write. Nothing is
        sent once the link is closed."""
        if self.closed or self.transport is None:
            return
        data = pickle.dumps((kind, *arguments), protocol=pickle.HIGHEST_PROTOCOL)
        out = self._out
        if not out:
            assert self._loop is not None
            self._loop.call_soon(self._flush)
        out.append(_LENGTH.pack(len(data)))
        out.append(data)

    def flush(self) -> None:
        """Write what is queued now (before the process exits, say)."""
        self._flush()

    async def call(self, kind: str, *arguments: Any) -> Any:
        """Ask the other end; its handler's answer, RemoteError if it raised, LinkClosed
        if the link closes first."""
        if self.closed:
            raise LinkClosed(f"{self.name}: link closed")
        assert self._loop is not None
        call_id = next(self._ids)
        answer: asyncio.Future[Any] = self._loop.create_future()
        self._calls[call_id] = answer
        self.send(_CALL, call_id, kind, arguments)
        try:
            return await answer
        finally:
            self._calls.pop(call_id, None)

    def close(self) -> None:
        if self.transport is not None:
            self._flush()
            self.transport.close()

    def _flush(self) -> None:
        out = self._out
        if not out or self.transport is None or self.closed:
            out.clear()
            return
        data = b"".join(out)
        out.clear()
        self.sent_bytes += len(data)
        self.transport.write(data)
        if self.transport.get_write_buffer_size() > MAX_BUFFERED:
            log.error("worker channel not read: closing it", link=self.name,
                      buffered=self.transport.get_write_buffer_size())
            self.transport.abort()

    # ------------------------------------------------------------ asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if self._loop is None:
            self._loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        buf = self._buffer
        buf += data
        at = 0
        end = len(buf)
        messages = []
        while end - at >= 4:
            (size,) = _LENGTH.unpack_from(buf, at)
            if end - at - 4 < size:
                break
            messages.append(pickle.loads(memoryview(buf)[at + 4:at + 4 + size]))
            at += 4 + size
        del buf[:at]
        for message in messages:
            self._dispatch(message)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._out.clear()
        for answer in self._calls.values():
            if not answer.done():
                answer.set_exception(LinkClosed(f"{self.name}: link closed"))
        self._calls.clear()
        for task in list(self._tasks):
            task.cancel()
        for callback in self._closed_callbacks:
            callback()

    # ------------------------------------------------------------ receiving

    def _dispatch(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        try:
            if kind == _CALL:
                self._answer(*message[1:])
            elif kind == _ANSWER:
                self._answered(*message[1:])
            else:
                handler = self._handlers.get(kind)
                if handler is None:
                    log.warning("worker channel: unknown message", link=self.name, kind=kind)
                    return
                handler(*message[1:])
        except Exception:  # one bad message must not end the link
            log.exception("worker channel: handler failed", link=self.name, kind=kind)

    def _answer(self, call_id: int, kind: str, arguments: tuple[Any, ...]) -> None:
        handler = self._call_handlers.get(kind)
        if handler is None:
            self.send(_ANSWER, call_id, False, f"no handler for {kind!r}")
            return
        try:
            result = handler(*arguments)
        except Exception as e:
            self.send(_ANSWER, call_id, False, f"{type(e).__name__}: {e}")
            return
        if not inspect.isawaitable(result):
            self.send(_ANSWER, call_id, True, result)
            return
        task = asyncio.ensure_future(result)
        self._tasks.add(task)
        task.add_done_callback(functools.partial(self._answer_later, call_id))

    def _answer_later(self, call_id: int, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self.send(_ANSWER, call_id, False, f"{type(error).__name__}: {error}")
        else:
            self.send(_ANSWER, call_id, True, task.result())

    def _answered(self, call_id: int, ok: bool, value: Any) -> None:
        answer = self._calls.get(call_id)
        if answer is None or answer.done():
            return
        if ok:
            answer.set_result(value)
        else:
            answer.set_exception(RemoteError(str(value)))
