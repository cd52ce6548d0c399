"""A worker's Get whose client goes away while the watcher opens its feed
(linkerd_api.get_feeds.MirroredGet): the feed's count the watcher added is given back
once, whenever the answer comes. The watcher's side is a recording link (a fake: the
real channel is a socketpair between processes, exercised by tests/reliability's
test_faults with MESHBRIDGE_TEST_WORKERS=2, where this race left a View subscriber
behind)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import prometheus_client

from linkerd_api.get_feeds import MirroredGet
from meshbridge.stream_registry import StreamRegistry


class RecordingLink:
    """What the worker sends the watcher, and its handlers for the watcher's answers."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, ...]] = []
        self.handlers: dict[str, Callable[..., None]] = {}

    def on(self, kind: str, handler: Callable[..., None]) -> None:
        self.handlers[kind] = handler

    def on_closed(self, _hook: Callable[[], None]) -> None:
        pass

    def send(self, *message: Any) -> None:
        self.sent.append(message)


class Context:
    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"


def mirrored() -> tuple[MirroredGet, RecordingLink]:
    link = RecordingLink()
    registry = prometheus_client.CollectorRegistry()
    host = SimpleNamespace(link=link, metrics=registry, streams=StreamRegistry(registry))
    return MirroredGet(host, capacity=10), link


async def cancelled_before_resuming(answer: str, *args: Any) -> RecordingLink:
    """A Get cancelled by its client, with the watcher's `answer` dispatched after the
    cancel but before the handler resumes (in one turn of the loop, as when both
    arrive together)."""
    get, link = mirrored()
    handler = asyncio.ensure_future(get.get(b"", Context()))
    await asyncio.sleep(0)  # the handler sent get.open and waits for the answer
    assert [m[0] for m in link.sent] == ["get.open"]
    call_id = link.sent[0][1]
    handler.cancel()
    link.handlers[answer](call_id, *args)
    await asyncio.gather(handler, return_exceptions=True)
    return link


async def test_an_open_answered_after_the_client_cancelled_is_closed_once() -> None:
    link = await cancelled_before_resuming("get.opened", 7, "web.ns.svc.cluster.local:80", ())
    assert link.sent[1:] == [("get.close", 7)]


async def test_a_refusal_answered_after_the_client_cancelled_is_dropped() -> None:
    link = await cancelled_before_resuming("get.refused", 3, "no such service")
    assert [m[0] for m in link.sent] == ["get.open"]
