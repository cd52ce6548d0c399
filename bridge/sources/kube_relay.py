"""The Pods' first watch, read by a process of its own: the relay.

On a big cluster the Pods' state is most of what the API server sends at start (174
MiB at 10,000 meshed pods, most of it managedFields), and the API server sends it
only as fast as it is read: a full socket stalls it. Read by a thread of the server's
own process, each TLS record (16 KiB at most) is a return into the interpreter, which
waits for the GIL while the process imports its protocol layers and decodes what came
before, and the API server waits with it. The relay is a small process that opens
that watch as soon as the credentials are loaded (`RelayedWatch.start`, before the
kube source's modules are imported), reads it as fast as the API server sends, keeps
what the server process has not taken yet in its own memory (up to `BUFFER_LIMIT`,
then it stops reading), and hands it over through a pipe in pieces of up to a MiB.
The Pod watcher reads that stream as it would the response (`RelayedWatch.response`),
decodes it as it always does, and once the state is in, ends it and goes on watching
in-process from the state's resourceVersion (`kube.KindWatcher`): the relay lives for
the start-up only.

The pipe carries messages: a tag byte, a 4-byte big-endian length, the payload.
    H  the answer's head, JSON: {"status", "reason", "content_type"}
    D  bytes of the body, as the server sent them (an error's body too)
    X  the read failed (the reason, text); nothing follows
    Z  the body ended as the server ended it; nothing follows
The relay also ends when its stdin closes (the server process is gone).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import struct
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict
from typing import IO, Any

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
BUFFER_LIMIT = 64 << 20  # the most the relay holds that the server has not taken
_PIPE_SIZE = 1 << 20  # asked of the kernel for the relay's stdout (fcntl F_SETPIPE_SZ)


class RelayError(ConnectionError):
    """The relayed watch ended other than as the server ended it."""


class RelayedWatch:
    """The server process's side: the relay started, and its answer read as a
    streaming response (`headers`, `stream`, `release_conn`, `shutdown`)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.headers: dict[str, str] = {}
        assert proc.stdout is not None
        self._out: IO[bytes] = proc.stdout

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
        """Start the relay on one GET; returns at once (the answer is `response`'s)."""
        proc = subprocess.Popen([sys.executable, "-m", "bridge.sources.kube_relay"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        request = {"creds": asdict(creds), "path": path, "params": params,
                   "read_timeout": read_timeout, "accept": accept}
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(request).encode() + b"\n")  # kept open: see main
        return cls(proc)

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
        first = self._out.read(n)  # one read is one wait for the GIL: mostly all of it
        if first is None or len(first) == n or not first:
            return first or b""
        parts = [first]
        got = len(first)
        while got < n:
            more = self._out.read(n - got)
            if not more:
                break
            parts.append(more)
            got += len(more)
        return b"".join(parts)

    def shutdown(self) -> None:
        """End the relay (from any thread): a read waiting on it returns."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()

    def release_conn(self) -> None:
        self.shutdown()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()


class _Pending:
    """What the relay has read and not yet written: pieces, bounded by BUFFER_LIMIT.
    The writer is woken once a batch (`BATCH`) is in, or finds the few bytes of a
    quiet stream (a bookmark, one change) after `LINGER` at most: woken at every
    piece, the two threads handed the GIL to each other 10,000 times a start and the
    relay used twice the CPU of its reading."""

    BATCH = 256 << 10
    LINGER = 0.002  # seconds

    def __init__(self) -> None:
        self.pieces: deque[tuple[bytes, bytes]] = deque()
        self.size = 0
        self.cond = threading.Condition()

    def put(self, tag: bytes, payload: bytes) -> None:
        with self.cond:
            while self.size >= BUFFER_LIMIT:
                self.cond.wait()
            self.pieces.append((tag, payload))
            self.size += len(payload)
            if tag != b"D" or self.size >= self.BATCH or len(self.pieces) == 1:
                self.cond.notify_all()

    def take(self) -> tuple[bytes, bytes]:
        """The next message: consecutive body pieces joined, up to PIECE."""
        with self.cond:
            while not self.pieces:
                self.cond.wait()
            if self.pieces[-1][0] == b"D" and self.size < self.BATCH:
                self.cond.wait(self.LINGER)  # more may be on its way
            tag, payload = self.pieces.popleft()
            if tag == b"D":
                parts, size = [payload], len(payload)
                while self.pieces and self.pieces[0][0] == b"D" \
                        and size + len(self.pieces[0][1]) <= PIECE:
                    parts.append(self.pieces.popleft()[1])
                    size += len(parts[-1])
                payload = b"".join(parts) if len(parts) > 1 else payload
            self.size -= len(payload)
            self.cond.notify_all()
            return tag, payload


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _writer(pending: _Pending, fd: int) -> None:
    try:
        while True:
            tag, payload = pending.take()
            _write_all(fd, _HEAD.pack(tag, len(payload)) + payload)
            if tag in (b"X", b"Z"):
                break
    except OSError:  # the server process closed its end: nothing to relay to
        pass
    os._exit(0)


def _orphaned() -> None:
    """The server process keeps the relay's stdin open for as long as it lives."""
    sys.stdin.buffer.read()
    os._exit(0)


def main() -> None:
    request = json.loads(sys.stdin.buffer.readline())
    threading.Thread(target=_orphaned, daemon=True).start()
    fd = sys.stdout.fileno()
    with contextlib.suppress(OSError, AttributeError):  # a bigger pipe: fewer wake-ups
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
    pending = _Pending()
    threading.Thread(target=_writer, args=(pending, fd), daemon=True).start()
    try:
        client = ApiClient(Credentials(**request["creds"]))
        resp = client.request(request["path"], request["params"], request["read_timeout"],
                              request["accept"])
        head: dict[str, Any] = {"status": resp.status, "reason": resp.reason or "",
                                "content_type": resp.headers.get("Content-Type")}
        pending.put(b"H", json.dumps(head).encode())
        for chunk in resp.stream(PIECE):
            if chunk:
                pending.put(b"D", chunk)
        pending.put(b"Z", b"")
    except Exception as e:  # network errors, timeouts, a truncated body
        pending.put(b"X", f"{type(e).__name__}: {e}".encode())
    threading.Event().wait()  # the writer ends the process


if __name__ == "__main__":
    main()
