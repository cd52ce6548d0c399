"""Send-side flow control (RFC 9113 §5.2, §6.9) at a cost that does not grow with
the number of blocked streams.

Data waits for two windows, the stream's and the connection's. A stream whose own
window is open waits only for the connection: those streams are kept in arrival
order (`_connection_waiters`), and a connection WINDOW_UPDATE walks them only while
the connection window lasts. A stream whose own window is shut waits in a heap
ordered by how much window it would have (`_stream_waiters`): a stream
WINDOW_UPDATE touches that stream alone, and raising SETTINGS_INITIAL_WINDOW_SIZE
pops only the streams that can now send. So a flood of WINDOW_UPDATE(+1) or of
window-size toggles costs O(streams that can send) per frame, never O(streams
blocked), which is what lets one connection not stall the event loop (the flood
itself is a budget's business, h2grpc.budgets).

A stream's window is `initial + stream.window_delta` (h2grpc.streams), so an
initial-window change is one assignment, not a loop over streams.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from h2grpc import frames as f
from h2grpc.streams import NOT_WAITING, WAITING_CONNECTION, WAITING_STREAM, H2Stream

# frames.frame_header's packing, for the one DATA frame per stream per change.
_DATA_HEADER = f.HEADER.pack


class SendWindows:
    __slots__ = ("_connection_waiters", "_on_drained", "_out", "_seq", "_stream_blocked",
                 "_stream_waiters", "connection", "frames_sent", "initial", "max_frame")

    def __init__(self, out: list[bytes], on_drained: Callable[[H2Stream], None]) -> None:
        self.connection = f.DEFAULT_WINDOW  # the connection window the peer granted
        self.initial = f.DEFAULT_WINDOW  # the peer's SETTINGS_INITIAL_WINDOW_SIZE
        self.max_frame = f.DEFAULT_MAX_FRAME  # the peer's SETTINGS_MAX_FRAME_SIZE
        self.frames_sent = 0  # DATA frames, for the budgets that DATA earns
        self._out = out
        self._on_drained = on_drained  # a stream's data moved out: its writer may go on
        self._connection_waiters: dict[H2Stream, None] = {}  # insertion-ordered
        self._stream_waiters: list[tuple[int, int, int, H2Stream]] = []
        self._seq = 0  # heap tie-break: streams blocked earlier go first
        self._stream_blocked = 0  # live entries in the heap (the rest are stale)

    def window(self, stream: H2Stream) -> int:
        return self.initial + stream.window_delta

    def try_send(self, stream: H2Stream, data: bytes) -> bool:
        """The fast path: frame `data` at once if nothing is queued and both windows
        and the frame size allow it; False leaves it to `queue`."""
        n = len(data)
        if (stream.pending is None and n <= self.initial + stream.window_delta
                and n <= self.connection and n <= self.max_frame):
            out = self._out
            out.append(_DATA_HEADER(n >> 16, n & 0xFFFF, f.DATA, 0, stream.id))
            out.append(data)
            stream.window_delta -= n
            self.connection -= n
            self.frames_sent += 1
            return True
        return False

    def queue(self, stream: H2Stream, data: bytes) -> None:
        if stream.pending is None:
            stream.pending = [data]
        else:
            stream.pending.append(data)
        stream.pending_bytes += len(data)
        if stream.waiting == NOT_WAITING:
            self.drain(stream)

    def drain(self, stream: H2Stream) -> None:
        """Send what the windows allow of the stream's queue, then file it where it
        must wait (or nowhere, once empty)."""
        pending = stream.pending
        out = self._out
        while pending:
            allowed = min(self.initial + stream.window_delta, self.connection, self.max_frame)
            if allowed <= 0:
                break
            chunk = pending[0]
            if len(chunk) <= allowed:
                pending.pop(0)
            else:
                pending[0] = chunk[allowed:]
                chunk = chunk[:allowed]
            n = len(chunk)
            out.append(f.frame_header(f.DATA, 0, stream.id, n))
            out.append(chunk)
            stream.window_delta -= n
            self.connection -= n
            stream.pending_bytes -= n
            self.frames_sent += 1
        if pending:
            self._file(stream)
        else:
            stream.pending = None
            self._unfile(stream)
        self._on_drained(stream)

    def detach(self) -> None:
        """The connection is gone: no more callbacks (the one we hold refers back to it),
        no stream kept."""
        self._on_drained = _ignore
        self._connection_waiters.clear()
        self._stream_waiters.clear()
        self._stream_blocked = 0

    def forget(self, stream: H2Stream) -> None:
        """The stream is closed: it waits for nothing any more (and the heap keeps no
        closed streams for long: a connection whose streams all ended holds none)."""
        stream.pending = None
        stream.pending_bytes = 0
        self._unfile(stream)
        if len(self._stream_waiters) > 2 * self._stream_blocked + 64:
            self._compact()

    # ------------------------------------------------------------ window changes

    def connection_opened(self, increment: int) -> None:
        """A connection WINDOW_UPDATE: streams waiting on it go, in order, while it lasts;
        then streams whose own window reopened in the meantime."""
        self.connection += increment
        waiters = self._connection_waiters
        while self.connection > 0 and waiters:
            stream = next(iter(waiters))
            del waiters[stream]
            stream.waiting = NOT_WAITING
            self.drain(stream)
        self._release_stream_waiters()

    def stream_opened(self, stream: H2Stream, increment: int) -> None:
        stream.window_delta += increment
        if stream.waiting == WAITING_STREAM and self.window(stream) > 0:
            self._unfile(stream)  # its heap entry is stale now
            self.drain(stream)

    def initial_changed(self, value: int) -> None:
        """SETTINGS_INITIAL_WINDOW_SIZE (§6.9.2): every stream's window moves by the
        difference at once, by construction."""
        grew = value > self.initial
        self.initial = value
        if grew:
            self._release_stream_waiters()

    def _release_stream_waiters(self) -> None:
        heap = self._stream_waiters
        while heap and self.connection > 0:
            neg_delta, _, token, stream = heap[0]
            if token != stream.heap_token or stream.waiting != WAITING_STREAM:
                heapq.heappop(heap)  # stale: the stream moved since it was filed
                continue
            if self.initial - neg_delta <= 0:
                break  # the stream with the most window still has none: nor the rest
            heapq.heappop(heap)
            self._unfile(stream)
            self.drain(stream)

    # ------------------------------------------------------------ filing

    def _file(self, stream: H2Stream) -> None:
        if self.initial + stream.window_delta <= 0:
            if stream.waiting == WAITING_CONNECTION:
                del self._connection_waiters[stream]
            if stream.waiting != WAITING_STREAM:
                stream.waiting = WAITING_STREAM
                stream.heap_token += 1
                self._stream_blocked += 1
                self._seq += 1
                heap = self._stream_waiters
                heapq.heappush(heap, (-stream.window_delta, self._seq, stream.heap_token, stream))
                if len(heap) > 2 * self._stream_blocked + 64:
                    self._compact()
        elif stream.waiting != WAITING_CONNECTION:
            self._unfile(stream)
            stream.waiting = WAITING_CONNECTION
            self._connection_waiters[stream] = None

    def _unfile(self, stream: H2Stream) -> None:
        if stream.waiting == WAITING_CONNECTION:
            del self._connection_waiters[stream]
        elif stream.waiting == WAITING_STREAM:
            stream.heap_token += 1
            self._stream_blocked -= 1
        stream.waiting = NOT_WAITING

    def _compact(self) -> None:
        """Drop stale heap entries, so that streams filed and released over and over
        (a WINDOW_UPDATE(+1) flood on one stream) leave nothing behind."""
        heap = [e for e in self._stream_waiters
                if e[2] == e[3].heap_token and e[3].waiting == WAITING_STREAM]
        heapq.heapify(heap)
        self._stream_waiters = heap

    @property
    def blocked(self) -> int:
        """Streams with data the windows hold back."""
        return len(self._connection_waiters) + self._stream_blocked


def _ignore(_stream: H2Stream) -> None:
    pass
