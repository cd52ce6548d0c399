"""The watcher's workers: started, watched, restarted, stopped (docs/workers.md).

The watcher holds the gRPC port (a socket bound with SO_REUSEPORT that does not
listen: it gets no connection, it only keeps the port, across worker restarts too)
and starts N worker processes that each listen on it. Processes are forked by
multiprocessing's fork server with the worker's modules already imported, so a
worker (re)starts in milliseconds, not in the seconds an interpreter takes to import
gRPC and the protocol modules. A start waits for every worker's `listening`; the
first `failed` (or exit) ends them all and fails the start with one line.

A worker that dies is logged (its number and exit status), counted
(`meshbridge_worker_restarts_total`), its shared counts and feeds dropped, and
started again after a backoff (0.5 s, doubling to 30 s; back to 0.5 s once a worker
has lived a minute). Its clients' connections died with it; they reconnect, and the
kernel spreads them over the workers listening.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.machinery
import multiprocessing
import socket
import sys
import time
from collections.abc import Callable, Iterator
from multiprocessing.context import ForkServerContext
from typing import Any

import prometheus_client
import structlog

from h2grpc.server import bind_socket
from meshbridge.workers import process
from meshbridge.workers.counts import SharedCounts
from meshbridge.workers.link import Link

log = structlog.get_logger("meshbridge.workers")

START_TIMEOUT = 120.0  # seconds for every worker to listen (the first start imports)
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0
STABLE = 60.0  # seconds a worker lives before its backoff starts over
STOP_MARGIN = 5.0  # seconds beyond the grace before a worker is killed

_context: ForkServerContext | None = None


def _fork_server() -> ForkServerContext:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(["meshbridge.workers.process"])
    return _context


@contextlib.contextmanager
def _main_not_rerun() -> Iterator[None]:
    """multiprocessing prepares a child by running the parent's main module again
    (`__mp_main__`), unless that module is a package's `__main__`: a script, a test
    runner or a benchmark would run in every worker. The worker needs nothing of it
    (its target is `process.run`), so while a worker starts, the main module says it
    is such a `__main__`."""
    main = sys.modules["__main__"]
    saved = getattr(main, "__spec__", None)
    main.__spec__ = importlib.machinery.ModuleSpec("__main__", None)
    try:
        yield
    finally:
        main.__spec__ = saved


class WorkerFailed(OSError):
    """A worker could not start; the message is one line naming it."""


class _Worker:
    __slots__ = ("backoff", "index", "link", "listening", "process", "started_at")

    def __init__(self, index: int) -> None:
        self.index = index
        self.process: Any = None
        self.link: Link | None = None
        self.listening: asyncio.Future[None] | None = None
        self.started_at = 0.0
        self.backoff = BACKOFF_FIRST


class WorkerPool:
    def __init__(self, count: int, listen: str, spec: Callable[[int, str], process.WorkerSpec],
                 registry: prometheus_client.CollectorRegistry) -> None:
        self.count = count
        self.listen = listen
        self._spec = spec
        self._attach: list[Callable[[Link], None]] = []
        self._workers = [_Worker(i) for i in range(count)]
        self.counts = SharedCounts(count)
        self._port_socket: socket.socket | None = None
        self.port = 0
        self.stopping = False
        self._started = False  # every worker listened once: from now on, restart them
        self._restarts: set[asyncio.Task[None]] = set()
        self.restarts = prometheus_client.Counter(
            "meshbridge_worker_restarts", "Worker processes restarted after they died",
            registry=registry)
        self.up = prometheus_client.Gauge(
            "meshbridge_worker_up", "1 while a worker process listens on the gRPC port",
            ["worker"], registry=registry)

    # ------------------------------------------------------------ FeedHub

    def on_link(self, attach: Callable[[Link], None]) -> None:
        self._attach.append(attach)
        for worker in self._workers:
            if worker.link is not None and not worker.link.closed:
                attach(worker.link)

    def links(self) -> list[Link]:
        return [w.link for w in self._workers if w.link is not None and not w.link.closed]

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> int:
        """Hold the port, start every worker, wait until each listens; the port."""
        try:
            sock = bind_socket(self.listen, reuse_port=True, listen=False)
        except (OSError, ValueError) as e:
            raise WorkerFailed(f"cannot listen on {self.listen}: {e}") from None
        self._port_socket = sock
        self.port = sock.getsockname()[1]
        for worker in self._workers:
            await self._spawn(worker)
        waits = [w.listening for w in self._workers if w.listening is not None]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), START_TIMEOUT)
        except (WorkerFailed, TimeoutError) as e:
            await self.stop(0)
            if isinstance(e, TimeoutError):
                raise WorkerFailed(f"the workers did not listen within {START_TIMEOUT:g} s"
                                   ) from None
            raise
        self._started = True
        return self.port

    async def stop(self, grace: float) -> None:
        """Each worker ends its streams (GOAWAY, status OK) within `grace`; those
        still there after it and a margin are killed."""
        self.stopping = True
        for task in self._restarts:
            task.cancel()
        live = [w for w in self._workers if w.process is not None]
        for worker in live:
            if worker.link is not None:
                worker.link.send("stop", grace)
                worker.link.flush()
        deadline = time.monotonic() + grace + STOP_MARGIN
        for worker in live:
            await self._reaped(worker, deadline)
        loop = asyncio.get_running_loop()
        for worker in live:
            loop.remove_reader(worker.process.sentinel)
            if worker.link is not None:
                worker.link.close()
        if self._port_socket is not None:
            self._port_socket.close()
            self._port_socket = None

    async def _reaped(self, worker: _Worker, deadline: float) -> None:
        proc = worker.process
        while proc.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # a polling period, not synchronisation
        if proc.is_alive():
            log.warning("worker did not stop in time; killed", worker=worker.index)
            proc.kill()
        proc.join(1.0)

    # ------------------------------------------------------------ one worker

    async def _spawn(self, worker: _Worker) -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair()
        spec = self._spec(worker.index, f"{_host(self.listen)}:{self.port}")
        proc = _fork_server().Process(target=process.run, args=(spec, theirs),
                                      name=f"meshbridge-worker-{worker.index}", daemon=True)
        with _main_not_rerun():
            proc.start()
        theirs.close()
        socket.send_fds(ours, [b"c"], [self.counts.fd])
        ours.setblocking(False)
        link = await Link.over(ours, f"worker-{worker.index}")
        worker.process = proc
        worker.link = link
        worker.started_at = time.monotonic()
        listening: asyncio.Future[None] = loop.create_future()
        worker.listening = listening

        def said_listening(pid: int) -> None:
            if not listening.done():
                listening.set_result(None)
            self.up.labels(str(worker.index)).set(1)

        def said_failed(reason: str) -> None:
            if not listening.done():
                listening.set_exception(WorkerFailed(f"worker {worker.index}: {reason}"))

        link.on("listening", said_listening)
        link.on("failed", said_failed)
        for attach in self._attach:
            attach(link)
        loop.add_reader(proc.sentinel, self._exited, worker, proc)

    def _exited(self, worker: _Worker, proc: Any) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(proc.sentinel)
        proc.join(0)
        if worker.process is not proc:
            return
        self.up.labels(str(worker.index)).set(0)
        if self.stopping:
            return
        if worker.link is not None:
            worker.link.close()
        self.counts.clear(worker.index)
        listening = worker.listening
        starting = listening is not None and not listening.done() and not self._started
        if listening is not None and not listening.done():
            listening.set_exception(WorkerFailed(
                f"worker {worker.index} exited before it listened (status {proc.exitcode})"))
        if self.stopping or starting:
            return
        lived = time.monotonic() - worker.started_at
        if lived >= STABLE:
            worker.backoff = BACKOFF_FIRST
        delay = worker.backoff
        worker.backoff = min(BACKOFF_MAX, worker.backoff * 2)
        log.error("worker died; restarting it", worker=worker.index, status=proc.exitcode,
                  lived_seconds=round(lived, 1), restart_in=delay)
        self.restarts.inc()
        task = loop.create_task(self._restart(worker, delay))
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _restart(self, worker: _Worker, delay: float) -> None:
        await asyncio.sleep(delay)
        if self.stopping:
            return
        await self._spawn(worker)
        assert worker.listening is not None
        try:
            await worker.listening
        except WorkerFailed as e:
            log.error("worker restart failed", worker=worker.index, reason=str(e))
            # It exits; its exit schedules the next attempt (with a longer backoff).

    # ------------------------------------------------------------ asking every worker

    async def ask(self, kind: str, *arguments: Any, timeout: float = 1.0) -> list[Any]:
        """Every live worker's answer to `kind` (a worker that does not answer in
        `timeout` is left out)."""
        async def one(link: Link) -> Any:
            with contextlib.suppress(Exception):
                return await asyncio.wait_for(link.call(kind, *arguments), timeout)
            return None

        answers = await asyncio.gather(*(one(link) for link in self.links()))
        return [a for a in answers if a is not None]

    def pids(self) -> list[int]:
        return [w.process.pid for w in self._workers
                if w.process is not None and w.process.is_alive()]


def _host(listen: str) -> str:
    host = listen.rpartition(":")[0]
    return host
