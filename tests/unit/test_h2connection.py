"""h2grpc.connection's clocks, with a fake loop and transport: how a closing connection
lingers (RFC 9113 §6.8), and what counts as an answer to a keepalive PING.

The real socket side of the close is tests/attacks/test_goaway_delivery.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from h2grpc import frames as f
from h2grpc.connection import LINGER, QUIET, Connection
from h2grpc.limits import H2Limits
from h2grpc.server import Server
from tests.unit.fake_loop import FakeLoop

HANDSHAKE = f.PREFACE + f.frame(f.SETTINGS, 0, 0) + f.frame(f.SETTINGS, f.ACK, 0)
BAD_FRAME = f.frame(f.DATA, 0, 0, b"x")  # DATA on stream 0: a connection error
ACTIVITY = f.window_update(0, 1)


class FakeTransport(asyncio.Transport):
    def __init__(self, tls: bool) -> None:
        super().__init__()
        self.tls = tls
        self.written = bytearray()
        self.eof_written = self.closed = self.aborted = False
        self.unsent = 0  # what get_write_buffer_size says

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 5555) if name == "peername" else default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def can_write_eof(self) -> bool:
        return not self.tls  # asyncio's TLS transport cannot half-close

    def write_eof(self) -> None:
        self.eof_written = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return self.unsent

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True


def connect(monkeypatch: pytest.MonkeyPatch, tls: bool = False,
            **limits: Any) -> tuple[Connection, FakeTransport, FakeLoop]:
    loop = FakeLoop()
    monkeypatch.setattr("h2grpc.connection.asyncio.get_running_loop", lambda: loop)
    conn = Connection(Server(limits=H2Limits(**limits)))
    transport = FakeTransport(tls)
    conn.connection_made(transport)
    conn.data_received(HANDSHAKE)
    loop.advance(0)
    assert conn.core.handshake_complete
    return conn, transport, loop


def goaway_codes(data: bytes) -> list[int]:
    return [int.from_bytes(p[4:8], "big") for kind, _, _, p, _ in
            f.frames_in(bytearray(data), 1 << 24) if kind == f.GOAWAY]


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_a_closing_connection_reads_on_until_the_client_is_quiet(
        monkeypatch: pytest.MonkeyPatch, tls: bool) -> None:
    conn, t, loop = connect(monkeypatch, tls)
    conn.data_received(BAD_FRAME)
    loop.advance(0)
    assert goaway_codes(bytes(t.written)) == [f.PROTOCOL_ERROR]
    assert t.eof_written is not tls  # our side shut at once, where the transport can
    for _ in range(5):  # the client goes on sending: the socket stays open
        loop.advance(QUIET / 2)
        conn.data_received(ACTIVITY)
    assert not t.closed and not t.aborted
    loop.advance(QUIET * 1.5)
    assert t.closed and not t.aborted


def test_a_client_that_never_stops_sending_is_cut_off_after_the_linger(
        monkeypatch: pytest.MonkeyPatch) -> None:
    conn, t, loop = connect(monkeypatch)
    conn.data_received(BAD_FRAME)
    for _ in range(int(LINGER / (QUIET / 2)) + 2):
        loop.advance(QUIET / 2)
        conn.data_received(ACTIVITY)
    assert t.aborted and not t.closed


def test_a_closing_connection_whose_client_does_not_read_is_cut_off_after_the_linger(
        monkeypatch: pytest.MonkeyPatch) -> None:
    conn, t, loop = connect(monkeypatch)
    t.unsent = 1 << 20  # our last frames are still waiting for the client to read
    conn.data_received(BAD_FRAME)
    loop.advance(LINGER / 2)
    assert not t.closed and not t.aborted
    loop.advance(LINGER)
    assert t.aborted


def test_any_input_after_a_keepalive_ping_answers_it_and_silence_does_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    conn, t, loop = connect(monkeypatch, keepalive_time=1.0, keepalive_timeout=1.0,
                            idle_timeout=0)
    loop.advance(1.5)
    assert conn._ping is not None  # silent for keepalive_time: pinged
    conn.data_received(ACTIVITY)  # not the ACK, but the client is there
    loop.advance(0.9)
    assert conn._ping is None and not t.eof_written
    loop.advance(1.0 + 1.0 + 0.5)  # silent again: pinged, unanswered
    assert t.eof_written and goaway_codes(bytes(t.written)) == [f.NO_ERROR]


def test_keepalive_does_not_fire_while_the_server_is_behind_on_the_clients_input(
        monkeypatch: pytest.MonkeyPatch) -> None:
    conn, t, loop = connect(monkeypatch, keepalive_time=1.0, keepalive_timeout=1.0,
                            idle_timeout=1.0, read_slice=64)
    monkeypatch.setattr(loop, "call_soon", lambda *_: None)  # the slices wait: we are slow
    conn.data_received(ACTIVITY * 100)  # far more than one slice
    loop.advance(10.0)
    assert not t.eof_written and goaway_codes(bytes(t.written)) == []
