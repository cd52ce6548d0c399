"""The webhook's own HTTPS listener: HTTP/1.1 POSTs of AdmissionReviews, kept alive
as the API server keeps its connections, each bounded in size and time.

Small on purpose, like the admin port's server: one request at a time per
connection, `Content-Length` bodies only (the API server sends nothing else), a
request line and headers of at most 16 KiB, a body of at most `max_body` bytes
(a larger one is answered 413 without being read), and every read bounded by a
timeout, so that a client that stalls holds one connection and nothing else. A
handler's failure is answered 500, never a traceback on the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable
from dataclasses import dataclass

import structlog

log = structlog.get_logger("meshbridge.admission")

MAX_HEAD = 16 * 1024
# An AdmissionReview holds the object and, on UPDATE, its old version; Kubernetes
# objects are at most about 1.5 MiB in etcd.
DEFAULT_MAX_BODY = 4 * 1024 * 1024
READ_TIMEOUT = 10.0
IDLE_TIMEOUT = 60.0  # a kept-alive connection with no request in this long is closed

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 411: "Length Required", 413: "Payload Too Large",
            431: "Request Header Fields Too Large", 500: "Internal Server Error"}


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"

    @staticmethod
    def text(status: int, text: str) -> Reply:
        return Reply(status, (text.rstrip("\n") + "\n").encode())


Handler = Callable[[bytes], Reply]


class HttpsListener:
    """Serves `handler` for POSTs to `path` on a TLS port."""

    def __init__(self, handler: Handler, context: ssl.SSLContext, path: str = "/validate",
                 max_body: int = DEFAULT_MAX_BODY) -> None:
        self.handler = handler
        self.context = context
        self.path = path
        self.max_body = max_body
        self.port = 0
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._connection, host, port,
                                                  ssl=self.context, limit=MAX_HEAD,
                                                  ssl_handshake_timeout=READ_TIMEOUT)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._connections):
            writer.close()  # its reader sees the end and returns
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2.0)
        self._server = None

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        try:
            while True:
                reply, keep = await self._one(reader)
                if reply is None:
                    return
                head = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, '')}",
                        f"Content-Type: {reply.content_type}",
                        f"Content-Length: {len(reply.body)}",
                        "Connection: keep-alive" if keep else "Connection: close"]
                writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + reply.body)
                await asyncio.wait_for(writer.drain(), READ_TIMEOUT)
                if not keep:
                    return
        except (ConnectionError, TimeoutError, ssl.SSLError, asyncio.IncompleteReadError):
            return
        finally:
            self._connections.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _one(self, reader: asyncio.StreamReader) -> tuple[Reply | None, bool]:
        """One request's answer and whether the connection stays open; (None, False)
        when the client closed or went quiet between requests."""
        try:
            raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IDLE_TIMEOUT)
        except (asyncio.IncompleteReadError, TimeoutError):
            return None, False
        except asyncio.LimitOverrunError:
            return Reply.text(431, "request line and headers exceed 16 KiB"), False
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return Reply.text(400, "malformed request line"), False
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return Reply.text(411, "send the body with a Content-Length"), False
        length_text = headers.get("content-length", "0")
        if not length_text.isdigit():
            return Reply.text(400, f"Content-Length {length_text!r} is not a number"), False
        length = int(length_text)
        if length > self.max_body:
            # Not read: the connection is closed after the answer.
            return Reply.text(413, f"the body has {length} bytes; the limit is "
                                   f"{self.max_body}"), False
        try:
            body = await asyncio.wait_for(reader.readexactly(length), READ_TIMEOUT)
        except TimeoutError:
            return Reply.text(408, f"the body did not arrive within {READ_TIMEOUT:g}s"), False
        if method != "POST":
            return Reply.text(405, f"method {method} not allowed: POST an AdmissionReview"), keep
        if target.split("?", 1)[0] != self.path:
            return Reply.text(404, f"no such path {target!r}: POST to {self.path}"), keep
        try:
            return self.handler(body), keep
        except Exception:  # never a traceback on the wire
            log.exception("admission handler failed")
            return Reply.text(500, "internal error"), keep
