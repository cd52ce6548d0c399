"""The gRPC server meshbridge serves both protocols from: gRPC over HTTP/2, on asyncio.

It takes the same generic handlers and `grpc.aio.ServerInterceptor`s as grpc.aio's
server, and drives handlers the same way, so the protocol layers do not know which
server runs them (`--grpc-transport grpcio` selects grpc.aio's). It exists because a
control plane's cost is its idle subscribers and its fan-out: here an open stream is
one small object and one task (grpc.aio: about 22 KiB of C-core and Python state),
and a change written to every stream of a connection leaves in one socket write
(docs/performance.md has the figures).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections import Counter
from typing import Any, Protocol

import grpc
import structlog

from h2grpc.call import ServerCall
from h2grpc.connection import LINGER, Connection
from h2grpc.heap import HeapTrimmer
from h2grpc.limits import H2Limits

log = structlog.get_logger("meshbridge.grpc")


# A reason's close is logged at most once per this many seconds; the rest are counted
# and said with the next line, so that a flood of bad connections floods no log.
LOG_EVERY = 10.0


class ServerStats:
    """What the server counts, for whoever exports metrics (h2grpc imports no metrics
    library): connections accepted, and connections ended by us, by reason (a budget's
    name, a timeout, a protocol error)."""

    __slots__ = ("_logged_at", "_unlogged", "accepted", "closes")

    def __init__(self) -> None:
        self.accepted = 0
        self.closes: Counter[str] = Counter()
        self._logged_at: dict[str, float] = {}
        self._unlogged: Counter[str] = Counter()

    def closed(self, reason: str, peer: str = "", detail: str = "", now: float = 0.0) -> None:
        self.closes[reason] += 1
        if now - self._logged_at.get(reason, -LOG_EVERY) < LOG_EVERY:
            self._unlogged[reason] += 1
            return
        self._logged_at[reason] = now
        log.info("http2 connection closed", reason=reason, peer=peer, detail=detail,
                 more_since_last_line=self._unlogged.pop(reason, 0))


class AddressCounts(Protocol):
    """Open connections per client address, for `max_connections_per_client`: this
    process's own by default (`LocalCounts`); several processes serving one port
    share theirs (meshbridge.workers.counts)."""

    def add(self, address: str) -> int:
        """Count one more for `address`; how many it has now."""

    def remove(self, address: str) -> None:
        """Count one fewer for `address`."""

    def count(self, address: str) -> int:
        """How many `address` has."""


class LocalCounts:
    """Counts kept in this process."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()

    def add(self, address: str) -> int:
        self._counts[address] += 1
        return self._counts[address]

    def remove(self, address: str) -> None:
        left = self._counts[address] - 1
        if left > 0:
            self._counts[address] = left
        else:
            del self._counts[address]

    def count(self, address: str) -> int:
        return self._counts.get(address, 0)


class Server:
    def __init__(self, interceptors: list[Any] | None = None, *,
                 limits: H2Limits | None = None,
                 address_counts: AddressCounts | None = None,
                 reuse_port: bool = False) -> None:
        self.interceptors = tuple(interceptors or ())
        self.handlers: tuple[grpc.GenericRpcHandler, ...] = ()
        self.limits = limits or H2Limits()
        self.stats = ServerStats()
        self.connections: set[Connection] = set()
        self._per_address: AddressCounts = address_counts or LocalCounts()
        # SO_REUSEPORT: several processes listen on one port, the kernel spreads the
        # connections over them.
        self.reuse_port = reuse_port
        self.bind_error = ""  # why the last add_*_port returned 0
        self.stopping = False
        self._sockets: list[tuple[socket.socket, ssl.SSLContext | None]] = []
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        # Calls whose handlers go on in callbacks, without a task (ServerCall.detach):
        # counted (their connections reach them), not kept.
        self._detached = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._no_connections = asyncio.Event()
        self._no_connections.set()
        self.heap: HeapTrimmer | None = None  # from start(): it needs the loop

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.handlers = (*self.handlers, *handlers)

    def add_insecure_port(self, address: str) -> int:
        return self._bind(address, None)

    def add_secure_port(self, address: str, context: ssl.SSLContext) -> int:
        return self._bind(address, context)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.heap = HeapTrimmer(loop)
        for sock, context in self._sockets:
            self._servers.append(await loop.create_server(
                lambda: Connection(self), sock=sock, ssl=context,
                backlog=socket.SOMAXCONN))

    async def stop(self, grace: float | None) -> None:
        """GOAWAY to every connection; streams still open after `grace` are cancelled."""
        self.stopping = True
        for server in self._servers:
            server.close()
        for conn in list(self.connections):
            conn.go_away()
        if (self._tasks or self._detached) and grace:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._idle.wait(), grace)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=1.0)
        for conn in list(self.connections):
            conn.abandon()  # streams whose end a client never read
        # Closing connections linger until their clients have read the GOAWAY
        # (h2grpc.connection._close); they are bounded, and waited for here.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._no_connections.wait(), LINGER + 1.0)
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        if self.heap is not None:
            self.heap.close()

    # ------------------------------------------------------------ for connections

    def call_started(self, call: ServerCall) -> None:
        assert call.task is not None
        self._tasks.add(call.task)
        self._idle.clear()

    def call_done(self, call: ServerCall) -> None:
        if call.task is not None:
            self._tasks.discard(call.task)
        if not self._tasks and not self._detached:
            self._idle.set()
        if self.heap is not None and not call.detached:
            self.heap.streams_ended()

    def call_detached(self, _call: ServerCall) -> None:
        self._detached += 1
        self._idle.clear()

    def detached_done(self, _call: ServerCall) -> None:
        self._detached -= 1
        if not self._tasks and not self._detached:
            self._idle.set()
        if self.heap is not None:
            self.heap.streams_ended()

    def connection_made(self, conn: Connection) -> bool:
        """Count the connection; False when its address already has as many as it may."""
        self.stats.accepted += 1
        self.connections.add(conn)
        self._no_connections.clear()
        count = self._per_address.add(conn.address)
        limit = self.limits.max_connections_per_client
        return not limit or count <= limit

    def connection_gone(self, conn: Connection) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            self._per_address.remove(conn.address)
            if not self.connections:
                self._no_connections.set()
            if self.heap is not None:
                self.heap.connection_closed(conn.streams_at_end)

    @property
    def open_streams(self) -> int:
        return sum(len(c.core.streams) for c in self.connections)

    @property
    def handler_tasks(self) -> int:
        """Handlers running: a task each, or callbacks (a detached call)."""
        return len(self._tasks) + self._detached

    # ------------------------------------------------------------ internals

    def _bind(self, address: str, context: ssl.SSLContext | None) -> int:
        try:
            sock = bind_socket(address, reuse_port=self.reuse_port)
        except (OSError, ValueError) as e:
            self.bind_error = str(e)
            log.error("cannot listen", address=address, error=str(e))
            return 0
        self._sockets.append((sock, context))
        bound: int = sock.getsockname()[1]
        return bound


def bind_socket(address: str, *, reuse_port: bool = False, listen: bool = True
                ) -> socket.socket:
    """A TCP socket bound to `address` (`host:port`; `:port` or `*:port` is every
    address, both families), listening unless `listen` is False (a bound socket that
    does not listen holds its port: processes sharing it by SO_REUSEPORT get its
    number from it). OSError or ValueError says why not."""
    host, _, port_text = address.rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"{address!r}: the port is not a number") from None
    if host in ("", "*"):
        host = "::"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if host not in ("::", "0.0.0.0") and ":" not in host:
        host = str(socket.getaddrinfo(host, port, socket.AF_UNSPEC,
                                      socket.SOCK_STREAM)[0][4][0])
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6 and host == "::":
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # dual stack
        sock.bind((host, port))
        if listen:
            sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def tls_context(cert: str, key: str, client_ca: str | None) -> ssl.SSLContext:
    """TLS for the gRPC port: HTTP/2 by ALPN; with `client_ca`, client certs required."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    context.set_alpn_protocols(["h2"])
    if client_ca:
        context.load_verify_locations(client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context
