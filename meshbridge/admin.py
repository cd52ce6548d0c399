"""The admin HTTP port: /metrics, /ready, /live, and whatever debug pages are mounted.

A deliberately small HTTP/1.1 server on asyncio streams (GET and HEAD only, one
request per connection): the admin port serves probes and scrapes, and a framework
would be the largest dependency of the process for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

import structlog

log = structlog.get_logger("meshbridge.admin")

MAX_REQUEST_BYTES = 8192


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    # Header names lower-cased; of a repeated header, the last.
    headers: dict[str, str] = field(default_factory=dict)
    # The client's IP address ("" when unknown).
    peer: str = ""

    def wants_json(self) -> bool:
        """`?format=json`, or an Accept header that names JSON (what scripts send)."""
        if self.query.get("format", [""])[-1] == "json":
            return True
        return "application/json" in self.headers.get("accept", "")


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = field(default=())

    @staticmethod
    def text(status: int, text: str) -> Response:
        return Response(status, (text.rstrip("\n") + "\n").encode())


Handler = Callable[[Request], Awaitable[Response] | Response]

_REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed",
            413: "Payload Too Large", 431: "Request Header Fields Too Large",
            500: "Internal Server Error", 503: "Service Unavailable"}


class AdminServer:
    def __init__(self) -> None:
        self.routes: dict[str, Handler] = {}
        self._server: asyncio.Server | None = None

    def route(self, path: str, handler: Handler) -> None:
        self.routes[path] = handler

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, host, port)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        peer = str(peername[0]) if isinstance(peername, tuple) else ""
        try:
            response = await self._handle(reader, peer)
        except Exception:  # never a stack trace on the wire
            log.exception("admin handler failed")
            response = Response.text(500, "internal error")
        reason = _REASONS.get(response.status, "")
        head = [f"HTTP/1.1 {response.status} {reason}", f"Content-Type: {response.content_type}",
                f"Content-Length: {len(response.body)}", "Connection: close"]
        head += [f"{k}: {v}" for k, v in response.headers]
        with contextlib.suppress(ConnectionError):
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + response.body)
            await writer.drain()
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, peer: str) -> Response:
        try:
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
        except asyncio.LimitOverrunError:
            return Response.text(431, "request headers too large")
        except (asyncio.IncompleteReadError, TimeoutError):
            return Response.text(400, "incomplete request")
        if len(raw) > MAX_REQUEST_BYTES:
            return Response.text(431, "request headers too large")
        line = raw.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split(" ")
        if len(parts) != 3:
            return Response.text(400, "malformed request line")
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            return Response.text(405, f"method {method} not allowed")
        url = urlsplit(target)
        handler = self.routes.get(url.path)
        if handler is None:
            return Response.text(404, f"no such page: {url.path}")
        headers = {}
        for header in raw.split(b"\r\n")[1:]:
            name, sep, value = header.decode("latin-1").partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        result = handler(Request(method, url.path, parse_qs(url.query, keep_blank_values=True),
                                 headers, peer))
        if isinstance(result, Response):
            return result
        return await result
