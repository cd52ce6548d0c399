"""Processes a test or benchmark starts: a server run until a test is done with it
(`running`, `stop`), client processes that talk JSON lines, and this process's
resident memory.

A parent starts `python -m MODULE --client ARGS...` with `Child.start`, reads its
lines with `Child.line` and sends it commands with `Child.send`; the child reads them
with `commands()` and answers with `out_line(...)`. Closing the child's stdin ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from testkit.polling import HANG, Why, eventually_sync

REPO = Path(__file__).resolve().parent.parent


def rss_kib() -> int:
    """This process's resident memory (Linux /proc), in KiB."""
    found = pid_rss_kib("self")
    return found if found else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def pid_rss_kib(pid: int | str) -> int:
    """A process's resident memory (Linux /proc), in KiB; 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def children(pid: int) -> list[int]:
    """A process's children (Linux /proc); empty if it is gone."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def tree_rss_kib(pid: int) -> int:
    """The resident memory of a process and all its descendants (a `serve --workers N`
    watcher, its fork server and its workers), in KiB; 0 if it is gone."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += pid_rss_kib(p)
        todo += children(p)
    return total


@contextlib.contextmanager
def running(argv: Sequence[str | os.PathLike[str]], started: Callable[[], bool], what: Why,
            timeout: float = 2 * HANG, **popen: Any) -> Iterator[subprocess.Popen[Any]]:
    """`argv` running, once `started()` holds (failing at once, saying `what`, if it
    exits first); killed at the end if still running. A test that wants it to end
    cleanly ends it itself (`stop`). The deadline is a whole process start-up's hang
    guard (one took 23 s at load 20)."""
    proc = subprocess.Popen([os.fspath(a) for a in argv], **popen)
    try:
        eventually_sync(lambda: proc.poll() is not None or started(), timeout, what)
        if proc.poll() is not None:
            why = what() if callable(what) else what
            raise AssertionError(f"{why}: it exited with status {proc.returncode}")
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def stop(proc: subprocess.Popen[Any], timeout: float = HANG) -> str:
    """SIGTERM, then wait for the exit; returns what it wrote to a piped stdout."""
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=timeout)
    return str(out or "")


def out_line(**fields: Any) -> None:
    """A JSON line to the parent (client processes talk on stdout)."""
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


class Child:
    """A client process: `python -m MODULE --client ARGS...`, JSON lines out, closed by
    closing its stdin."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, module: str, *args: str) -> Child:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH"))
                                            if p)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", module, "--client", *args,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env,
            limit=1 << 24)
        return cls(proc)

    async def line(self, timeout: float = 300.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not raw:
            raise RuntimeError(f"the client process exited (status {await self.proc.wait()})")
        parsed: dict[str, Any] = json.loads(raw)
        return parsed

    async def send(self, **fields: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(fields).encode() + b"\n")
        await self.proc.stdin.drain()

    async def close(self, timeout: float = 60.0) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                self.proc.kill()
            await self.proc.wait()


async def commands() -> asyncio.StreamReader:
    """The parent's commands on stdin, as an asyncio reader (client processes)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    return reader
