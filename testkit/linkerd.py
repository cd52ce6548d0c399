"""The model Linkerd client: a destination API stream read as a proxy reads it (every
read has a deadline; nothing waits on a bare sleep), what an Update says, and manifest
edits that the files source picks up on its next poll. `linkerd_policy` reads the
policy API's streams with the same `ServerStream`."""

from __future__ import annotations

import asyncio
import copy
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import yaml
from google.protobuf.message import Message

from linkerd_api.proto import destination_pb2 as dst
from linkerd_api.translate import address_text
from meshbridge.app import App
from testkit.polling import HANG

SERVICE = "/io.linkerd.proxy.destination.Destination"
DEADLINE = HANG  # every read waits for its message, never times it


class ServerStream:
    """One server-streaming call, read with a deadline per message."""

    def __init__(self, channel: grpc.aio.Channel, path: str, request: bytes,
                 response: type[Message]) -> None:
        self.call = channel.unary_stream(path, request_serializer=None,
                                         response_deserializer=response.FromString)(request)

    async def next(self, timeout: float = DEADLINE) -> Any:
        message = await asyncio.wait_for(self.call.read(), timeout)
        assert message is not grpc.aio.EOF, f"stream ended: {await self.call.code()}"
        return message

    async def error(self, timeout: float = DEADLINE) -> tuple[grpc.StatusCode, str]:
        """The status a refused stream ends with (before any message)."""
        try:
            message = await asyncio.wait_for(self.call.read(), timeout)
        except grpc.aio.AioRpcError as e:
            return e.code(), e.details() or ""
        raise AssertionError(f"expected an error status, got {message}")

    async def rest(self, timeout: float = DEADLINE) -> tuple[list[Any], grpc.StatusCode]:
        """Every message until the server ends the stream, and its status."""
        out: list[Any] = []
        while True:
            message = await asyncio.wait_for(self.call.read(), timeout)
            if message is grpc.aio.EOF:
                return out, await self.call.code()
            out.append(message)

    def cancel(self) -> None:
        self.call.cancel()


class Stream(ServerStream):
    """One Get or GetProfile stream."""

    def __init__(self, channel: grpc.aio.Channel, method: str, path: str, token: str = "",
                 raw: bytes | None = None) -> None:
        response = dst.Update if method == "Get" else dst.DestinationProfile
        request = raw if raw is not None else dst.GetDestination(
            scheme="k8s", path=path, context_token=token).SerializeToString()
        super().__init__(channel, f"{SERVICE}/{method}", request, response)


@asynccontextmanager
async def channel_to(app: App, options: list[tuple[str, Any]] | None = None,
                     ) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.grpc_port}",
                                         options=options or []) as ch:
        yield ch


def kind(update: dst.Update) -> str:
    return update.WhichOneof("update") or ""


def addrs(update: dst.Update) -> list[str]:
    """The sorted addresses of an add or remove."""
    if kind(update) == "add":
        return sorted(address_text(a.addr) for a in update.add.addrs)
    if kind(update) == "remove":
        return sorted(address_text(a) for a in update.remove.addrs)
    return []


def by_addr(update: dst.Update) -> dict[str, dst.WeightedAddr]:
    return {address_text(a.addr): a for a in update.add.addrs}


def describe(update: dst.Update) -> tuple[str, Any]:
    """(kind, addresses) or ("no_endpoints", exists): short enough to compare whole."""
    if kind(update) == "no_endpoints":
        return ("no_endpoints", update.no_endpoints.exists)
    return (kind(update), addrs(update))


# ------------------------------------------------------------------ manifests


def read_docs(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def write_docs(path: Path, docs: list[Any]) -> None:
    """Replace a manifest file atomically, so a poll never reads half of it."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    os.replace(tmp, path)


def edit(folder: Path, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> int:
    """Apply `change` to every object under `folder` (None deletes it); rewrite the
    files that changed. Returns how many objects changed."""
    changed = 0
    for path in sorted(folder.glob("*.yaml")):
        docs = read_docs(path)
        out = []
        dirty = False
        for doc in docs:
            new = change(copy.deepcopy(doc))
            if new != doc:
                dirty = True
                changed += 1
            if new is not None:
                out.append(new)
        if dirty:
            write_docs(path, out)
    return changed


def drop_an_endpoint(folder: Path, ns: str, service: str) -> None:
    """A scale-down: the first endpoint of the service's first EndpointSlice goes."""
    done: list[bool] = []

    def change(doc: dict[str, Any]) -> dict[str, Any]:
        md = doc.get("metadata") or {}
        if not done and doc.get("kind") == "EndpointSlice" and md.get("namespace") == ns \
                and (md.get("labels") or {}).get("kubernetes.io/service-name") == service:
            doc["endpoints"] = doc["endpoints"][1:]
            done.append(True)
        return doc

    edit(folder, change)
    assert done, f"no EndpointSlice of {ns}/{service}"


def named(kind_: str, ns: str, name: str) -> Callable[[dict[str, Any]], bool]:
    def match(doc: dict[str, Any]) -> bool:
        md = doc.get("metadata") or {}
        return bool(doc.get("kind") == kind_ and md.get("namespace") == ns
                    and md.get("name") == name)
    return match


def remove_objects(folder: Path, match: Callable[[dict[str, Any]], bool]) -> list[Any]:
    """Delete matching objects; returns them so a test can put them back."""
    removed: list[Any] = []

    def drop(doc: dict[str, Any]) -> dict[str, Any] | None:
        if match(doc):
            removed.append(doc)
            return None
        return doc

    edit(folder, drop)
    assert removed, "nothing matched"
    return removed


async def metric(app: App, name: str, labels: dict[str, str] | None = None) -> float:
    """A sample of the app's metrics, summed over its workers if it has any."""
    value = await app.sample_value(name, labels)
    return 0.0 if value is None else value
