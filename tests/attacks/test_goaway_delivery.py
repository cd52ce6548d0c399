"""The server's last frames reach a client that keeps writing (RFC 9113 §6.8).

A connection error ends in GOAWAY and a close. A client that is still sending when
that happens leaves unread input in the server's socket, and closing a socket with
unread input resets the connection: what the server had not yet delivered (the end of
a large response, the GOAWAY behind it) is dropped, and the client reads a reset
instead (h2spec saw `connection reset by peer`). Here a raw client, plaintext and
TLS, asks h2grpc's server on 127.0.0.1 for a 6 MiB response, breaks a rule once the
response is flowing, and writes frames without pause and without reading for a
while, so the server meets the error with its output backed up and the client's input
unread. The client must then read the whole response, the GOAWAY with the rule's error
code and, once it stops writing, a clean end of stream. A client that never stops
writing is cut off, but only after it had the GOAWAY.
"""

from __future__ import annotations

import asyncio
import select
import socket
import ssl
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from h2grpc.server import Server, tls_context
from testkit.attacks.attackers import (
    PREFACE,
    SETTINGS_ACK,
    data,
    frame,
    grpc_message,
    headers,
    ping,
    request_fields,
    settings,
    stateless_block,
    window_update,
)
from testkit.certs import self_signed
from testkit.polling import eventually

GOAWAY, PROTOCOL_ERROR, INITIAL_WINDOW_SIZE = 0x7, 0x1, 0x4
MAX_WINDOW = 2**31 - 1
RESPONSE = 6 << 20  # bytes: more than the socket buffers and the server's high-water mark
BIG = stateless_block(request_fields(b"/meshbridge.test.Big/Get"))
DATA_ON_STREAM_0 = frame(0x0, 0, 0, b"x")  # a connection error PROTOCOL_ERROR (§6.1)
FILLER = ping() * (65_536 // 17)  # what the client goes on sending, 64 KiB at a time
BURST = 0.5  # seconds of writing, after the error, before the client reads again
DEADLINE = 30.0  # for the whole exchange; about a second when all is well


@dataclass
class Outcome:
    goaway_codes: list[int]
    end: str  # "eof", "reset", or "none" (still open at the deadline)
    bytes_written_after_error: int
    response_bytes: int  # DATA payload received on the request's stream


def _frames(stream: bytes) -> list[tuple[int, int, bytes]]:
    """(type, stream id, payload) of each whole frame the server sent."""
    out, at = [], 0
    while len(stream) - at >= 9:
        length = int.from_bytes(stream[at:at + 3], "big")
        if len(stream) - at - 9 < length:
            break
        sid = int.from_bytes(stream[at + 5:at + 9], "big") & MAX_WINDOW
        out.append((stream[at + 3], sid, stream[at + 9:at + 9 + length]))
        at += 9 + length
    return out


def _goaways(stream: bytes) -> list[int]:
    return [int.from_bytes(p[4:8], "big") for kind, _, p in _frames(stream) if kind == GOAWAY]


def _data_bytes(stream: bytes) -> int:
    return sum(len(p) for kind, sid, p in _frames(stream) if kind == 0x0 and sid == 1)


def run_client(port: int, tls: bool, then_read: bool) -> Outcome:
    """Ask for the big response and read its start; break a rule; write without pause
    and without reading for BURST seconds; then read only (`then_read`), or go on
    writing while reading, until the server ends the connection."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=5.0)
    sock: socket.socket = raw
    if tls:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        context.set_alpn_protocols(["h2"])
        sock = context.wrap_socket(raw, server_hostname="localhost")
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(PREFACE + settings({INITIAL_WINDOW_SIZE: MAX_WINDOW}) + SETTINGS_ACK
                 + window_update(0, MAX_WINDOW - 65_535)
                 + headers(1, BIG, end_stream=False) + data(1, grpc_message(b""), True))
    received = bytearray()
    while len(received) < 65_536:  # the response is flowing
        chunk = sock.recv(65_536)
        if not chunk:
            break
        received += chunk
    sock.sendall(DATA_ON_STREAM_0)
    sock.setblocking(False)
    end, written = "none", 0
    pending = memoryview(FILLER)
    start = time.monotonic()
    writing, reading = True, False
    try:
        while time.monotonic() - start < DEADLINE:
            if not reading and time.monotonic() - start >= BURST:
                reading, writing = True, not then_read
            if writing:
                try:
                    n = sock.send(pending)
                    written += n
                    pending = pending[n:] or memoryview(FILLER)
                except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
                    pass
                except OSError:
                    writing = False  # the server is gone: what it sent is still read
            if not reading:
                select.select([], [sock], [], 0.01)
                continue
            try:
                got: bytes | None = sock.recv(1 << 20)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                got = None
            except (ConnectionResetError, ssl.SSLError, BrokenPipeError):
                end = "reset"
                break
            if got == b"":
                end = "eof"
                break
            if got:
                received += got
                continue
            select.select([sock], [sock] if writing else [], [], 0.05)
    finally:
        sock.close()
    return Outcome(_goaways(bytes(received)), end, written, _data_bytes(bytes(received)))


@pytest.fixture
async def servers(tmp_path: Path) -> AsyncIterator[dict[str, tuple[Server, int]]]:
    """h2grpc's server with no services, plaintext and TLS."""
    async def big(_request: bytes, _context: Any) -> bytes:
        return b"x" * RESPONSE

    plain, secure = Server(), Server()
    for server in (plain, secure):
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            "meshbridge.test.Big", {"Get": grpc.unary_unary_rpc_method_handler(big)})])
    ports = {"plaintext": (plain, plain.add_insecure_port("127.0.0.1:0")),
             "tls": (secure, secure.add_secure_port(
                 "127.0.0.1:0", tls_context(*self_signed(tmp_path), None)))}
    for server, _ in ports.values():
        await server.start()
    yield ports
    for server, _ in ports.values():
        await server.stop(0)


@pytest.mark.parametrize("transport", ["plaintext", "tls"])
async def test_a_client_that_was_writing_reads_the_goaway_and_a_clean_end(
        servers: dict[str, tuple[Server, int]], transport: str) -> None:
    server, port = servers[transport]
    outcome = await asyncio.to_thread(run_client, port, transport == "tls", True)
    assert outcome.response_bytes == RESPONSE + 5, outcome  # the message and its prefix
    assert outcome.goaway_codes == [PROTOCOL_ERROR], outcome
    assert outcome.bytes_written_after_error > 0, outcome
    assert outcome.end == "eof", outcome
    await eventually(lambda: not server.connections, 10.0, "the server kept the connection")


@pytest.mark.parametrize("transport", ["plaintext", "tls"])
async def test_a_client_that_never_stops_writing_still_reads_the_goaway_then_is_cut_off(
        servers: dict[str, tuple[Server, int]], transport: str) -> None:
    server, port = servers[transport]
    outcome = await asyncio.to_thread(run_client, port, transport == "tls", False)
    assert outcome.goaway_codes == [PROTOCOL_ERROR], outcome
    assert outcome.end in ("eof", "reset"), outcome  # ended by the server, not the deadline
    await eventually(lambda: not server.connections, 10.0, "the server kept the connection")
