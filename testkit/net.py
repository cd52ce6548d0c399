"""Loopback ports and plain HTTP for tests and benchmarks: a free port to hand a child
process, and a GET that says the status rather than raising on an error status."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

from testkit.polling import HANG


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 now, all different: every socket is held until all are
    chosen. Another process may take one before ours binds it; the tests that hand a
    port to a child process accept that small window."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """One port free on 127.0.0.1 now (nothing listens on it)."""
    return free_ports(1)[0]


def http_get(url: str, timeout: float = HANG) -> tuple[int, str]:
    """(status, body) of a GET, error statuses included; OSError when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status), r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode(errors="replace")


def http_text(url: str, timeout: float = HANG) -> str:
    """The body of a GET; an error status raises urllib's HTTPError (an OSError)."""
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body: bytes = r.read()
        return body.decode(errors="replace")


def ready(admin_port: int, timeout: float = 2.0) -> bool:
    """Whether meshbridge's admin port on 127.0.0.1 answers /ready with 200 now."""
    try:
        return http_get(f"http://127.0.0.1:{admin_port}/ready", timeout)[0] == 200
    except OSError:
        return False
