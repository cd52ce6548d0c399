"""Get over workers: the watcher opens each Get (its checks, its View) and sends every
worker each version of the Views its Get streams follow once, as the `Update`
messages already encoded; the worker queues those very bytes for each of its
streams (docs/workers.md, "What crosses the channel").

Watcher side, `GetFeeds`: `get.open(call, request, peer)` is answered with
`get.opened(call, feed, label, snapshot)` — the feed of the View the request keys
(one per worker and View, the View's subscriber for all that worker's streams of
it) and the messages a new stream is sent first — or `get.refused(call, code,
details)`, counted and logged as in one process. Then each version of the View is
`get.diff(feed, published_at, messages)`; `get.close(feed)` says one stream of it
ended; `get.end(feed)` ends every stream of it (a federated Service that goes,
Linkerd §2.4). The channel is ordered, so a snapshot at version v is followed by the
diffs from v+1 on.

Worker side, `MirroredGet`: the Get handler itself, writing from those messages
(`DestinationWriter`, as in one process).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import TYPE_CHECKING, Any

import grpc
import structlog

from bridge.model import ViewKey
from bridge.views import View, ViewChange
from linkerd_api.errors import DestinationError
from linkerd_api.queue import Outgoing, UpdateQueue
from linkerd_api.writer import DestinationWriter, decode_request, endpoint_overflow_counter

if TYPE_CHECKING:
    from linkerd_api.service import DestinationService
    from meshbridge.host import Link, WorkerHost

log = structlog.get_logger("meshbridge.linkerd")

SERVICE_NAME = "io.linkerd.proxy.destination.Destination"


# ---------------------------------------------------------------------- watcher side


class GetFeed:
    """One worker's Get streams of one View: the View's subscriber for all of them."""

    __slots__ = ("ends_with_service", "feeds", "id", "key", "link", "weight")

    def __init__(self, feeds: GetFeeds, link: Link, feed_id: int, key: ViewKey) -> None:
        self.feeds = feeds
        self.link = link
        self.id = feed_id
        self.key = key
        self.weight = 0  # the worker's streams on it (the View's subscriber count)
        self.ends_with_service = False

    def on_view_change(self, view: View, change: ViewChange) -> None:
        if self.ends_with_service and not view.exists:
            self.link.send("get.end", self.id)
            return
        messages = self.feeds.service.encoder.diff(view, change)
        if messages:
            self.link.send("get.diff", self.id, view.published_at, messages)


class GetFeeds:
    def __init__(self, service: DestinationService) -> None:
        self.service = service
        self._feeds: dict[tuple[int, ViewKey], GetFeed] = {}
        self._by_id: dict[tuple[int, int], GetFeed] = {}
        self._ids = itertools.count(1)

    def attach(self, link: Link) -> None:
        key = id(link)
        link.on("get.open", lambda *a: self._open(link, *a))
        link.on("get.close", lambda feed_id: self._close(key, feed_id))
        link.on_closed(lambda: self._gone(key))

    def _open(self, link: Link, call_id: int, raw: bytes, peer: str) -> None:
        service = self.service
        path = ""
        try:
            request = decode_request(raw)
            path = request.path
            key, label = service.open_get(request, peer)
            feed = self._feeds.get((id(link), key))
            found = service.host.views.view(key) if feed is not None else None
            if feed is None or found is None:
                feed = GetFeed(self, link, next(self._ids), key)
                view = service.subscribe_get(key, feed, path)
                feed.ends_with_service = service.ends_with_service(view)
                self._feeds[(id(link), key)] = feed
                self._by_id[(id(link), feed.id)] = feed
            else:
                view = found
        except DestinationError as e:
            code, details = service.refused("Get", peer, path, e)
            link.send("get.refused", call_id, code.value[0], details)
            return
        feed.weight += 1
        view.reweighed()
        link.send("get.opened", call_id, feed.id, label, service.encoder.snapshot(view))

    def _close(self, link: int, feed_id: int) -> None:
        feed = self._by_id.get((link, feed_id))
        if feed is None:
            return
        feed.weight -= 1
        view = self.service.host.views.view(feed.key)
        if feed.weight > 0:
            if view is not None:
                view.reweighed()
            return
        self._drop(link, feed)

    def _drop(self, link: int, feed: GetFeed) -> None:
        del self._by_id[(link, feed.id)]
        del self._feeds[(link, feed.key)]
        self.service.host.views.unsubscribe(feed.key, feed)

    def _gone(self, link: int) -> None:
        for feed in [f for (w, _), f in self._by_id.items() if w == link]:
            self._drop(link, feed)


# ---------------------------------------------------------------------- worker side


class MirroredStream(UpdateQueue):
    """One Get stream of a worker: queues the messages its feed brings."""

    __slots__ = ("feed", "label", "peer")

    def __init__(self, capacity: int, peer: str) -> None:
        super().__init__(capacity)
        self.peer = peer
        self.label = ""
        self.feed = 0


class MirroredGet:
    """A worker's Get handler (see the module)."""

    def __init__(self, host: WorkerHost, capacity: int) -> None:
        self.link = host.link
        self.capacity = capacity
        self.writer = DestinationWriter(host.metrics, host.streams)
        self._release = self._released  # bound once: every detached Get refers to it
        self.overflows = endpoint_overflow_counter(host.metrics)
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[MirroredStream, asyncio.Future[Any]]] = {}
        self._feeds: dict[int, set[MirroredStream]] = {}
        self.link.on("get.opened", self._opened)
        self.link.on("get.refused", self._refused)
        self.link.on("get.diff", self._diff)
        self.link.on("get.end", self._end)
        self.link.on_closed(self._watcher_gone)

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(SERVICE_NAME, {
            "Get": grpc.unary_stream_rpc_method_handler(self.get)})

    def stop(self) -> None:
        self.writer.stop()

    async def get(self, raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        call_id = next(self._ids)
        stream = MirroredStream(self.capacity, context.peer())
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = (stream, answer)
        self.link.send("get.open", call_id, raw, stream.peer)
        try:
            refusal = await answer
        finally:
            self._pending.pop(call_id, None)
        if refusal is not None:
            await context.abort(*refusal)
            return
        detached = False
        try:
            request = decode_request(raw)
            if self.writer.detach(stream, stream.label, request, context, self._release):
                detached = True  # written in the server's callbacks from here on
                return
            await self.writer.pump("Get", stream, stream.label, request, context)
        finally:
            if not detached:
                self._leave(stream)

    def _released(self, stream: UpdateQueue) -> None:
        assert isinstance(stream, MirroredStream)
        self._leave(stream)

    def _leave(self, stream: MirroredStream) -> None:
        streams = self._feeds.get(stream.feed)
        if streams is None or stream not in streams:
            return
        streams.discard(stream)
        if not streams:
            del self._feeds[stream.feed]
        self.link.send("get.close", stream.feed)

    # ------------------------------------------------------------ from the watcher

    def _opened(self, call_id: int, feed_id: int, label: str,
                snapshot: tuple[Outgoing, ...]) -> None:
        pending = self._pending.pop(call_id, None)
        if pending is None or pending[1].done():
            # The client went away meanwhile: its handler is gone, or cancelled and not
            # yet resumed (the answer is cancelled with it, and the handler will not
            # leave a feed it never saw), so the watcher's count is given back here.
            self.link.send("get.close", feed_id)
            return
        stream, answer = pending
        stream.feed = feed_id
        stream.label = label
        self._feeds.setdefault(feed_id, set()).add(stream)
        for message in snapshot:
            stream.push(message)
        answer.set_result(None)

    def _refused(self, call_id: int, code: int, details: str) -> None:
        pending = self._pending.pop(call_id, None)
        if pending is not None and not pending[1].done():  # done: cancelled, see _opened
            pending[1].set_result((_CODES.get(code, grpc.StatusCode.UNKNOWN), details))

    def _diff(self, feed_id: int, published_at: float, messages: tuple[Outgoing, ...]) -> None:
        for stream in list(self._feeds.get(feed_id, ())):
            if stream.ended:
                continue
            if stream.info is not None:
                stream.info.changed(published_at)
            for message in messages:
                if not stream.push(message):
                    if stream.overflowed:
                        self._overflow(stream)
                    break

    def _end(self, feed_id: int) -> None:
        for stream in list(self._feeds.get(feed_id, ())):
            stream.end()

    def _watcher_gone(self) -> None:
        for _, answer in self._pending.values():
            if not answer.done():
                answer.set_result((grpc.StatusCode.UNAVAILABLE, "the control plane is stopping"))
        self.stop()

    def _overflow(self, stream: MirroredStream) -> None:
        self.overflows.labels(stream.label).inc()
        log.warning("endpoint update queue full; ending stream", peer=stream.peer,
                    authority=stream.label, capacity=self.capacity)
        self._leave(stream)


_CODES = {code.value[0]: code for code in grpc.StatusCode}
