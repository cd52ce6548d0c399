"""What answers at an address: for the tools' one-line error when given the wrong one
(the admin address where the gRPC one was expected, or the other way round).

One short exchange on a fresh connection, bounded by a timeout: an HTTP/1.1 request
line (an HTTP/1.1 server answers `HTTP/1.x ...`; meshbridge's gRPC port, which speaks
only HTTP/2, answers with a GOAWAY frame or closes), and failing that the HTTP/2
preface (an HTTP/2 server answers with a SETTINGS frame).
"""

from __future__ import annotations

import socket

from meshbridge.host import split_listen_address

_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_SETTINGS = 0x4
_GOAWAY = 0x7


def _exchange(host: str, port: int, data: bytes, timeout: float) -> bytes:
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(data)
        try:
            return sock.recv(64)
        except (TimeoutError, ConnectionError):
            return b""


def what_answers(address: str, timeout: float = 2.0) -> str:
    """A few words saying what answers at `address` ("an HTTP/1.1 server", "an
    HTTP/2 server (gRPC)", "nothing: connection refused", ...)."""
    try:
        host, port = split_listen_address(address)
    except ValueError:
        return "nothing: not a host:port address"
    try:
        first = _exchange(host, port, b"GET / HTTP/1.1\r\nHost: probe\r\n\r\n", timeout)
        if first.startswith(b"HTTP/1."):
            return "an HTTP/1.1 server"
        if first.startswith(b"\x15\x03"):
            return "a TLS server"
        if _frame_type(first) in (_SETTINGS, _GOAWAY):
            return "an HTTP/2 server (gRPC)"
        second = _exchange(host, port, _HTTP2_PREFACE, timeout)
        if _frame_type(second) in (_SETTINGS, _GOAWAY):
            return "an HTTP/2 server (gRPC)"
        return "a server that speaks neither HTTP/1.1 nor HTTP/2" if first or second \
            else "a server that closed the connection without a word"
    except ConnectionRefusedError:
        return "nothing: connection refused"
    except TimeoutError:
        return f"nothing within {timeout:g}s"
    except OSError as e:
        return f"nothing: {e.strerror or e}"


def _frame_type(data: bytes) -> int | None:
    """The type of the HTTP/2 frame `data` starts with, if it starts with one."""
    return data[3] if len(data) >= 9 else None
