"""Calls a worker hands to the watcher whole: every method a layer serves without a
worker side of its own (GetProfile, the policy API, Certify, FetchEndpoints, ...).

The worker's catch-all handler (`RelayHandler`) forwards a call's requests, as the
bytes the client sent, and writes back what comes: messages, then a status. The
watcher (`RelayServer`) runs the layer's own handler for it, exactly as its gRPC
server would (the same generic handlers, the request decoded and each response
encoded by the handler's own (de)serializers), with a context (`RelayContext`)
whose peer is the client's. So these methods behave, count and log as with one
process: the layer's streams, queues and metrics are the watcher's, each client
stream one of them; the worker counts the call on the port (`grpc_server_*`, the
per-client stream limit) as it does every call.

Messages, worker -> watcher: `rpc.open(id, method, metadata, peer)`, `rpc.req(id,
bytes)`, `rpc.close(id)` (no more requests), `rpc.cancel(id)`; watcher -> worker:
`rpc.msg(id, bytes)`, `rpc.end(id, code, details)`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import grpc
import structlog

from h2grpc.call import RequestIterator
from meshbridge.workers.link import Link

log = structlog.get_logger("meshbridge.workers")

# (request streaming, response streaming) of each relayed method, by its full path.
MethodTable = dict[str, tuple[bool, bool]]
_EOF = grpc.aio.EOF
# Messages of one relayed call waiting for a client that does not read before the
# call is ended (a Linkerd stream's queue is 100; these streams change rarely).
MAX_WAITING = 1000


def method_table(handlers: Iterable[grpc.GenericRpcHandler]) -> MethodTable:
    """What each generic handler serves, by method path. grpc's own generic handlers
    (`grpc.method_handlers_generic_handler`, what every layer uses) keep their
    methods in `_method_handlers`: read here once, at start."""
    table: MethodTable = {}
    for generic in handlers:
        methods: dict[str, grpc.RpcMethodHandler] = getattr(generic, "_method_handlers", {})
        for path, handler in methods.items():
            table[path] = (handler.request_streaming, handler.response_streaming)
    return table


class _Details:
    __slots__ = ("invocation_metadata", "method")

    def __init__(self, method: str, metadata: tuple[tuple[str, str | bytes], ...]) -> None:
        self.method = method
        self.invocation_metadata = metadata


# ---------------------------------------------------------------------- watcher side


class RelayContext:
    """The ServicerContext of a call run for a worker: what the layers call on one."""

    __slots__ = (
        "_code",
        "_deserializer",
        "_details",
        "_ended",
        "_id",
        "_inbox",
        "_link",
        "_metadata",
        "_peer",
        "_reader",
        "_remote_closed",
        "_serializer",
    )

    def __init__(self, link: Link, call_id: int, peer: str,
                 metadata: tuple[tuple[str, str | bytes], ...],
                 handler: grpc.RpcMethodHandler) -> None:
        self._link = link
        self._id = call_id
        self._peer = peer
        self._metadata = metadata
        self._serializer: Callable[[Any], bytes] | None = handler.response_serializer
        self._deserializer: Callable[[bytes], Any] | None = handler.request_deserializer
        self._inbox: list[bytes] = []
        self._reader: asyncio.Future[None] | None = None
        self._remote_closed = False
        self._ended = False
        self._code: grpc.StatusCode | None = None
        self._details = ""

    # ServicerContext
    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._metadata

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str:
        return self._details

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def done(self) -> bool:
        return self._ended

    def cancelled(self) -> bool:
        return False

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    def set_trailing_metadata(self, _metadata: Any) -> None:
        return None

    async def send_initial_metadata(self, _metadata: Any) -> None:
        return None

    async def read(self) -> Any:
        while not self._inbox:
            if self._remote_closed or self._ended:
                return _EOF
            self._reader = asyncio.get_running_loop().create_future()
            try:
                await self._reader
            finally:
                self._reader = None
        raw = self._inbox.pop(0)
        return raw if self._deserializer is None else self._deserializer(raw)

    async def write(self, message: Any) -> None:
        self.write_nowait(message)

    def write_nowait(self, message: Any) -> bool:
        if self._ended:
            raise grpc.aio.UsageError("write on an RPC that has ended")
        data = message if self._serializer is None else self._serializer(message)
        self._link.send("rpc.msg", self._id, data)
        return True

    async def abort(self, code: grpc.StatusCode, details: str = "",
                    trailing_metadata: Any = ()) -> None:
        if self._ended:
            raise grpc.aio.UsageError("abort on an RPC that has ended")
        self.end(code, details)
        raise grpc.aio.AbortError(f"aborted with {code.name}")

    # from the relay
    def end(self, code: grpc.StatusCode, details: str) -> None:
        if self._ended:
            return
        self._ended = True
        self._code = code
        self._details = details
        self._link.send("rpc.end", self._id, code.value[0], details)

    def received(self, raw: bytes) -> None:
        self._inbox.append(raw)
        self._wake()

    def remote_end(self) -> None:
        self._remote_closed = True
        self._wake()

    def _wake(self) -> None:
        if self._reader is not None and not self._reader.done():
            self._reader.set_result(None)


class RelayServer:
    """The watcher's side: runs relayed calls on the layers' own handlers."""

    def __init__(self, handlers: tuple[grpc.GenericRpcHandler, ...]) -> None:
        self.handlers = handlers
        self.table = method_table(handlers)
        # (link, call id) -> (context, task)
        self._calls: dict[tuple[int, int], tuple[RelayContext, asyncio.Task[None]]] = {}

    def attach(self, link: Link) -> None:
        """Serve the relayed calls of the worker at the other end of `link`."""
        key = id(link)
        link.on("rpc.open", lambda *a: self._open(link, *a))
        link.on("rpc.req", lambda call_id, raw: self._req(key, call_id, raw))
        link.on("rpc.close", lambda call_id: self._close(key, call_id))
        link.on("rpc.cancel", lambda call_id: self._cancel(key, call_id))
        link.on_closed(lambda: self._link_gone(key))

    @property
    def open_calls(self) -> int:
        return len(self._calls)

    def _handler(self, method: str, metadata: tuple[tuple[str, str | bytes], ...]
                 ) -> grpc.RpcMethodHandler | None:
        details = _Details(method, metadata)
        for generic in self.handlers:
            found = generic.service(details)
            if found is not None:
                return found
        return None

    def _open(self, link: Link, call_id: int, method: str,
              metadata: tuple[tuple[str, str | bytes], ...], peer: str) -> None:
        handler = self._handler(method, metadata)
        if handler is None:
            link.send("rpc.end", call_id, grpc.StatusCode.UNIMPLEMENTED.value[0],
                      "Method not found!")
            return
        context = RelayContext(link, call_id, peer, metadata, handler)
        key = (id(link), call_id)
        task = asyncio.get_running_loop().create_task(self._run(context, handler))
        self._calls[key] = (context, task)
        task.add_done_callback(lambda _t: self._calls.pop(key, None))

    async def _run(self, context: RelayContext, handler: grpc.RpcMethodHandler) -> None:
        """Drive the handler as the native server does (h2grpc.call.ServerCall._drive)."""
        try:
            if handler.request_streaming:
                request: Any = RequestIterator(context)
            else:
                request = await context.read()
                if request is _EOF:
                    context.end(grpc.StatusCode.INTERNAL, "Missing request message")
                    return
            if not handler.response_streaming:
                fn = handler.unary_unary or handler.stream_unary
                response = await fn(request, context)
                if not context.done() and response is not None:
                    await context.write(response)
            else:
                fn = handler.unary_stream or handler.stream_stream
                result = fn(request, context)
                if inspect.isasyncgen(result):
                    async for item in result:
                        await context.write(item)
                else:
                    await result
            context.end(context.code() or grpc.StatusCode.OK, context.details())
        except grpc.aio.AbortError:
            pass  # the status went with the abort
        except asyncio.CancelledError:
            context.end(grpc.StatusCode.CANCELLED, "Cancelled")
            raise
        except Exception as e:
            log.exception("relayed grpc handler failed", peer=context.peer())
            context.end(grpc.StatusCode.UNKNOWN, f"Unexpected {type(e)}: {e}")

    def _req(self, link: int, call_id: int, raw: bytes) -> None:
        found = self._calls.get((link, call_id))
        if found is not None:
            found[0].received(raw)

    def _close(self, link: int, call_id: int) -> None:
        found = self._calls.get((link, call_id))
        if found is not None:
            found[0].remote_end()

    def _cancel(self, link: int, call_id: int) -> None:
        found = self._calls.get((link, call_id))
        if found is not None:
            found[1].cancel()

    def _link_gone(self, link: int) -> None:
        for key, (_, task) in list(self._calls.items()):
            if key[0] == link:
                task.cancel()


# ---------------------------------------------------------------------- worker side


class _Relayed:
    """One call relayed by a worker: what came back for it, for its handler to write."""

    __slots__ = ("code", "details", "messages", "waiter")

    def __init__(self) -> None:
        self.messages: list[bytes] = []
        self.code: int | None = None
        self.details = ""
        self.waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def wait(self) -> None:
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await self.waiter
        finally:
            self.waiter = None


class RelayHandler(grpc.GenericRpcHandler):  # type: ignore[misc]
    """The worker's catch-all: every method the watcher serves and no local layer
    does goes to the watcher whole (see the module)."""

    def __init__(self, link: Link, table: MethodTable) -> None:
        self.link = link
        self.table = table
        self._ids = itertools.count(1)
        self._calls: dict[int, _Relayed] = {}
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        link.on("rpc.msg", self._msg)
        link.on("rpc.end", self._end)
        link.on_closed(self._link_gone)

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        method: str = details.method
        handler = self._handlers.get(method)
        if handler is not None:
            return handler
        kind = self.table.get(method)
        if kind is None:
            return None  # the watcher serves it no more than we do: UNIMPLEMENTED
        handler = self._handlers[method] = self._make(method, *kind)
        return handler

    def end_all(self, code: grpc.StatusCode = grpc.StatusCode.OK, details: str = "") -> None:
        """End every relayed call (the worker stops, or its watcher is gone)."""
        for call in self._calls.values():
            if call.code is None:
                call.code, call.details = code.value[0], details
                call.wake()

    # ------------------------------------------------------------ the handlers

    def _make(self, method: str, request_streaming: bool,
              response_streaming: bool) -> grpc.RpcMethodHandler:
        relay = self

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            async with relay._opened(method, request, request_streaming, context) as call:
                while call.code is None:
                    await call.wait()
                await _finish(call, context)
                return call.messages[0] if call.messages else None

        async def streaming(request: Any, context: grpc.aio.ServicerContext) -> None:
            async with relay._opened(method, request, request_streaming, context) as call:
                while True:
                    while call.messages:
                        await context.write(call.messages.pop(0))
                    if call.code is not None:
                        break
                    await call.wait()
                await _finish(call, context)

        if request_streaming and response_streaming:
            return grpc.stream_stream_rpc_method_handler(streaming)
        if request_streaming:
            return grpc.stream_unary_rpc_method_handler(unary)
        if response_streaming:
            return grpc.unary_stream_rpc_method_handler(streaming)
        return grpc.unary_unary_rpc_method_handler(unary)

    @contextlib.asynccontextmanager
    async def _opened(self, method: str, request: Any, streaming: bool,
                      context: grpc.aio.ServicerContext) -> Any:
        call_id = next(self._ids)
        call = self._calls[call_id] = _Relayed()
        self.link.send("rpc.open", call_id, method,
                       tuple(context.invocation_metadata() or ()), context.peer())
        pump: asyncio.Task[None] | None = None
        if streaming:
            pump = asyncio.get_running_loop().create_task(self._pump(call_id, request))
        else:
            self.link.send("rpc.req", call_id, request)
            self.link.send("rpc.close", call_id)
        if self.link.closed:
            call.code, call.details = grpc.StatusCode.UNAVAILABLE.value[0], \
                "the control plane's watcher is gone"
        try:
            yield call
        finally:
            if pump is not None:
                pump.cancel()
            if call.code is None:
                self.link.send("rpc.cancel", call_id)  # the client went away first
            self._calls.pop(call_id, None)

    async def _pump(self, call_id: int, requests: Any) -> None:
        async for raw in requests:
            self.link.send("rpc.req", call_id, raw)
        self.link.send("rpc.close", call_id)

    # ------------------------------------------------------------ from the watcher

    def _msg(self, call_id: int, raw: bytes) -> None:
        call = self._calls.get(call_id)
        if call is None:
            return
        if len(call.messages) >= MAX_WAITING:
            # The client does not read: end its call rather than hold more for it.
            self.link.send("rpc.cancel", call_id)
            call.code = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
            call.details = "the client is not reading its responses"
            call.messages.clear()
        else:
            call.messages.append(raw)
        call.wake()

    def _end(self, call_id: int, code: int, details: str) -> None:
        call = self._calls.get(call_id)
        if call is not None and call.code is None:
            call.code, call.details = code, details
            call.wake()

    def _link_gone(self) -> None:
        self.end_all(grpc.StatusCode.UNAVAILABLE, "the control plane's watcher is gone")


_CODES = {code.value[0]: code for code in grpc.StatusCode}


async def _finish(call: _Relayed, context: grpc.aio.ServicerContext) -> None:
    code = _CODES.get(call.code if call.code is not None else 2, grpc.StatusCode.UNKNOWN)
    if code is not grpc.StatusCode.OK:
        await context.abort(code, call.details)
