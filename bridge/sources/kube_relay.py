"""The Pods' first watch, read by a process of its own: the relay.

On a big cluster the Pods' state is most of what the API server sends at start (174
MiB at 10,000 meshed pods, most of it managedFields), and the API server sends it
only as fast as it is read: a full socket stalls it. Read by a thread of the server's
own process, each TLS record (16 KiB at most, 11,000 of them) is a return into the
interpreter, which waits for the GIL while the process imports its protocol layers
and decodes what came before, and the API server waits with it. The relay is a
process forked as soon as the credentials are loaded (`RelayedWatch.start`, before the
kube source's modules are imported) that opens that watch and writes what it reads to
a pipe, as it comes; the Pod watcher reads the pipe a MiB at a time when it has
fallen behind (one wait for the GIL), the pipe (1 MiB) and the relay's socket buffer
holding what it has not taken yet. The watcher decodes that stream as it would the
response (`RelayedWatch.response`), and once the state is in, ends the relay and goes
on watching in-process from the state's resourceVersion (`kube.KindWatcher`): the
relay lives for the start-up only.

One thread, no buffer of its own: a relay that held up to 64 MiB in its memory, a
second thread writing it out, used 0.40-0.50 s of CPU for the 174 MiB (the two
threads handing each other the GIL) and made the start-up slower whenever the
machine was not busy; this one uses 0.28-0.31 s.

The pipe carries messages: a tag byte, a 4-byte big-endian length, the payload.
    H  the answer's head, JSON: {"status", "reason", "content_type"}
    D  bytes of the body, as the server sent them (an error's body too)
    X  the read failed (the reason, text); nothing follows
    Z  the body ended as the server ended it; nothing follows
The relay also ends when its stdin closes (the server process is gone).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import asdict
from typing import IO, Any, NoReturn

from bridge.sources.kube_api import (
    WATCH_TIMEOUT_RANGE,
    ApiClient,
    Credentials,
    refusal,
    watch_params,
)
from bridge.sources.kube_kinds import KindSpec, accept

_HEAD = struct.Struct(">cI")
PIECE = 1 << 20  # the most one message carries
_PIPE_SIZE = 1 << 20  # asked of the kernel for the relay's stdout (fcntl F_SETPIPE_SZ)


class RelayError(ConnectionError):
    """The relayed watch ended other than as the server ended it."""


class _Forked:
    """A relay forked from this process: what of `subprocess.Popen` is used here."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)


class RelayedWatch:
    """The server process's side: the relay started, and its answer read as a
    streaming response (`headers`, `stream`, `release_conn`, `shutdown`)."""

    def __init__(self, proc: subprocess.Popen[bytes] | _Forked, out: IO[bytes],
                 lifeline: IO[bytes]) -> None:
        self.proc = proc
        self.headers: dict[str, str] = {}
        self._out = out
        self._lifeline = lifeline  # the relay's stdin: it ends when this closes

    @classmethod
    def initial(cls, creds: Credentials, spec: KindSpec) -> RelayedWatch:
        """A kind's first watch, as its `kube.KindWatcher` would open it: the state
        sent first, then the changes."""
        timeout = random.randint(*WATCH_TIMEOUT_RANGE)
        return cls.start(creds, spec.path, watch_params(timeout, None, spec.params),
                         timeout + 30, accept(spec.kind))

    @classmethod
    def start(cls, creds: Credentials, path: str, params: dict[str, str],
              read_timeout: float, accept: str | None) -> RelayedWatch:
        """Start the relay on one GET; returns at once (the answer is `response`'s).
        A process with one thread (`serve` when it starts) forks it: no interpreter
        to start and nothing to import again, and the request goes out 0.1 s sooner;
        any other (a test's) starts a fresh interpreter, since a fork copies whatever
        lock another thread holds at that moment."""
        request = {"creds": asdict(creds), "path": path, "params": params,
                   "read_timeout": read_timeout, "accept": accept}
        if threading.active_count() == 1 and hasattr(os, "fork"):
            out_r, out_w = os.pipe()
            in_r, in_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the relay
                try:
                    os.close(out_r)
                    os.close(in_w)
                    _relay(request, out_w, in_r)
                finally:
                    os._exit(1)
            os.close(out_w)
            os.close(in_r)
            return cls(_Forked(pid), open(out_r, "rb", buffering=PIECE),
                       open(in_w, "wb", buffering=0))
        proc = subprocess.Popen([sys.executable, "-m", "bridge.sources.kube_relay"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                bufsize=PIECE)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(request).encode() + b"\n")  # kept open: see main
        proc.stdin.flush()
        return cls(proc, proc.stdout, proc.stdin)

    def response(self) -> RelayedWatch:
        """Wait for the answer's head; ApiError (Gone for 410) as `ApiClient.open`
        raises, when the server answered >= 300."""
        tag, payload = self._message()
        if tag != b"H":
            self.release_conn()
            raise RelayError(payload.decode(errors="replace") if tag == b"X"
                             else f"the relay sent {tag!r} before the answer's head")
        head = json.loads(payload)
        self.headers = {"Content-Type": head["content_type"] or ""}
        if head["status"] >= 300:
            body = b"".join(self.stream())
            self.release_conn()
            raise refusal(head["status"], head["reason"], body[:65536],
                          head["content_type"])
        return self

    def stream(self, amt: int = PIECE) -> Iterator[bytes]:
        """The body in the pieces the relay sent (`amt` is not needed: a piece is at
        most `PIECE`); RelayError if the relay ends otherwise than the server did."""
        while True:
            tag, payload = self._message()
            if tag == b"D":
                yield payload
            elif tag == b"Z":
                return
            else:
                raise RelayError(payload.decode(errors="replace"))

    def _message(self) -> tuple[bytes, bytes]:
        head = self._read(_HEAD.size)
        if len(head) < _HEAD.size:
            return b"X", b"the relay process ended"
        tag, n = _HEAD.unpack(head)
        payload = self._read(n)
        if len(payload) < n:
            return b"X", b"the relay process ended mid-message"
        return tag, payload

    def _read(self, n: int) -> bytes:
        # Buffered (a MiB): a message's head fetches whatever the pipe holds, up to a
        # MiB, in one read, which is one wait for the GIL; the rest comes from there.
        return self._out.read(n) or b""

    def shutdown(self) -> None:
        """End the relay (from any thread): a read waiting on it returns."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()

    def release_conn(self) -> None:
        self.shutdown()
        self.proc.wait()
        for f in (self._lifeline, self._out):
            with contextlib.suppress(OSError):
                f.close()


def _send(fd: int, tag: bytes, payload: bytes) -> None:
    view = memoryview(_HEAD.pack(tag, len(payload)) + payload)
    while view:
        view = view[os.write(fd, view):]


def _orphaned(lifeline: int) -> None:
    """The server process keeps the relay's stdin open for as long as it lives."""
    while os.read(lifeline, 4096):
        pass
    os._exit(0)


def _relay(request: dict[str, Any], out: int, lifeline: int) -> NoReturn:
    threading.Thread(target=_orphaned, args=(lifeline,), daemon=True).start()
    with contextlib.suppress(OSError, AttributeError):  # a bigger pipe: fewer wake-ups
        import fcntl

        fcntl.fcntl(out, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
    try:
        try:
            client = ApiClient(Credentials(**request["creds"]))
            resp = client.request(request["path"], request["params"],
                                  request["read_timeout"], request["accept"])
            head = {"status": resp.status, "reason": resp.reason or "",
                    "content_type": resp.headers.get("Content-Type")}
            _send(out, b"H", json.dumps(head).encode())
            for chunk in resp.stream(PIECE):
                if chunk:
                    _send(out, b"D", chunk)
            _send(out, b"Z", b"")
        except OSError as e:
            if e.errno == errno.EPIPE:  # the server process closed its end
                os._exit(0)
            raise
    except Exception as e:  # network errors, timeouts, a truncated body
        with contextlib.suppress(OSError):
            _send(out, b"X", f"{type(e).__name__}: {e}".encode())
    os._exit(0)


def main() -> None:
    """The relay as a fresh interpreter (`python -m bridge.sources.kube_relay`): the
    request is stdin's first line, the answer goes to stdout."""
    line = b""
    while b"\n" not in line:  # nothing follows it: the rest of stdin is the lifeline
        more = os.read(0, 65536)
        if not more:
            os._exit(0)
        line += more
    _relay(json.loads(line), sys.stdout.fileno(), 0)


if __name__ == "__main__":
    main()
