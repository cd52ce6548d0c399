"""Clients of every model that reconnect when their stream ends (as proxies do),
spread over a few shared connections (`Fleet`), and the server's truth to compare
what each holds with. The fault, soak and worker tests share them. Every wait polls
with a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
from collections.abc import Callable
from typing import Any

import grpc

from bridge.authority import parse_authority
from harness.clients import LinkerdClient, XdsClient
from meshbridge.app import App
from testkit.polling import eventually

MODELS = ("linkerd", "sotw", "delta")


def truth(app: App, authority: str) -> frozenset[str]:
    """The ready addresses every client of `authority` must end with."""
    key = parse_authority(authority, app.config.cluster_domain, default_port=None)
    view = app.views.view(key)
    if view is None:
        _, merged = app.views.merge_endpoints(key.service, key.port)
        snapshot: Any = app.views.filter_endpoints(key, merged)
    else:
        snapshot = view.snapshot
    return frozenset(str(ipaddress.ip_address(r.endpoint.ip))
                     for r in snapshot.values() if r.endpoint.ready)


class Follower:
    """One proxy following one target with one model; it reconnects (a new stream on
    its channel) whenever its stream ends, until stopped."""

    def __init__(self, channel: grpc.aio.Channel, model: str, authority: str,
                 index: int) -> None:
        self.channel = channel
        self.model = model
        self.target = authority
        self.index = index
        self.client: LinkerdClient | XdsClient | None = None
        self.streams = 0  # streams opened so far
        self.statuses: list[str] = []
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def state(self) -> frozenset[str] | None:
        c = self.client
        if c is None:
            return None
        st = c.state.get(self.target)
        if st is None:
            return None
        if isinstance(c, XdsClient) and self.target not in c.received:
            return None
        if isinstance(c, LinkerdClient) and not c.first_message[self.target].is_set():
            return None
        return frozenset(a for a, _ in st.endpoints)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"follower-{self.index}")

    async def _run(self) -> None:
        while not self._stopping:
            if self.model == "linkerd":
                client: LinkerdClient | XdsClient = LinkerdClient(
                    self.channel, [self.target], self.index)
            else:
                client = XdsClient(self.channel, [self.target], self.index,
                                   delta=self.model == "delta",
                                   node_id=f"rel-{self.model}-{self.index}")
            self.client = client
            self.streams += 1
            await client.run()
            status = (client.state[self.target].status if isinstance(client, LinkerdClient)
                      else client.status)
            self.statuses.append(status)
            if not self._stopping:
                await asyncio.sleep(0.05)  # a reconnect backoff, as proxies have

    async def stop(self) -> None:
        self._stopping = True
        if isinstance(self.client, XdsClient):
            await self.client.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


class Fleet:
    """Followers of every model spread over a few shared connections."""

    def __init__(self, server: str, count: int, targets: Callable[[int], str],
                 channels: int = 20) -> None:
        options = [("grpc.use_local_subchannel_pool", 1),
                   ("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 500)]
        self.channels = [grpc.aio.insecure_channel(server, options=options)
                         for _ in range(channels)]
        self.followers = [Follower(self.channels[i % channels], MODELS[i % 3], targets(i), i)
                          for i in range(count)]

    def start(self) -> None:
        for f in self.followers:
            f.start()

    def wrong(self, app: App) -> list[str]:
        """Followers whose state is not the truth (or who have none yet)."""
        truths: dict[str, frozenset[str]] = {}
        out = []
        for f in self.followers:
            t = truths.get(f.target)
            if t is None:
                t = truths[f.target] = truth(app, f.target)
            if f.state() != t:
                out.append(f"{f.model}-{f.index} {f.target}")
        return out

    async def converged(self, app: App, timeout: float) -> None:
        await eventually(lambda: not self.wrong(app), timeout,
                         lambda: f"{len(self.wrong(app))} clients differ from the truth, "
                                 f"e.g. {self.wrong(app)[:3]}", period=0.05)

    async def stop(self) -> None:
        await asyncio.gather(*(f.stop() for f in self.followers))
        for ch in self.channels:
            await ch.close(grace=None)
