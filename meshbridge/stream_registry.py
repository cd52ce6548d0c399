"""Who is connected and what they were told: the source of /debug/streams.

Each protocol layer registers one `StreamInfo` per client stream and keeps it current
(cheap attribute writes on paths that already run); the admin port renders them, like
istiod's /debug/syncz, so an operator can answer "why does this proxy see that?".
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import prometheus_client

from bridge.decoding import Interner
from meshbridge.loopmetrics import LoopHistogram

# Change-to-convergence: from the View version a client must learn to the moment it is
# caught up — written for Linkerd (no ACKs in its protocol), ACKed for xDS.
CONVERGENCE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


def human_time(at: float) -> str | None:
    """A wall-clock time as people read it (UTC, to the second); None for never."""
    if not at:
        return None
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# Sync states, as istioctl proxy-status words them.
SYNCED, STALE, NACKED, NOT_SENT, SENT = "SYNCED", "STALE", "NACKED", "NOT SENT", "SENT"


@dataclass(slots=True)
class TypeState:
    """Per resource type (xDS) or per target (Linkerd) delivery state."""

    subscribed: tuple[str, ...] = ()
    last_sent_version: str = ""
    last_sent_nonce: str = ""
    last_sent_at: float = 0.0
    last_ack_version: str = ""
    last_ack_at: float = 0.0
    last_nack_error: str = ""
    last_nack_at: float = 0.0

    def sync_state(self, acks: bool) -> str:
        """SYNCED when the client ACKed what it was last sent, STALE while an ACK is
        due, NACKED when it refused the last; without ACKs (Linkerd), SENT."""
        if not self.last_sent_version:
            return NOT_SENT
        if not acks:
            return SENT
        if self.last_nack_at > self.last_ack_at:
            return NACKED
        return SYNCED if self.last_ack_version == self.last_sent_version else STALE


# Subscribed-name tuples by value: thousands of streams subscribed to the same few
# names keep one tuple (small ones only).
_SUBSCRIBED = Interner(4096)
_SHARED_SUBSCRIBED = 16


@dataclass(slots=True)
class StreamInfo:
    protocol: str  # linkerd-get | linkerd-profile | xds-sotw | xds-delta
    peer: str
    client: str = ""  # xDS node id, or the Linkerd context token
    started_at: float = field(default_factory=time.time)
    messages_sent: int = 0
    bytes_sent: int = 0
    id: int = 0
    # The publish time (time.monotonic()) of the oldest View change this stream has not
    # yet converged on; 0 when it is caught up.
    pending_since: float = 0.0
    convergence: Any = None  # the histogram child, set by StreamRegistry.add
    # The worker process serving it (`--workers N`), None in a process of its own.
    worker: int | None = None
    # Per type (xDS) or target (Linkerd): almost every stream has one, so the first is
    # kept inline and a dict exists only for a second (`types` shows them all); a dict
    # per stream was ~0.2 KiB of each idle stream.
    _first_name: str = field(default="", repr=False)
    _first: TypeState | None = field(default=None, repr=False)
    _others: dict[str, TypeState] | None = field(default=None, repr=False)

    @property
    def types(self) -> dict[str, TypeState]:
        """Type (or target) -> its delivery state, as a new dict (for the pages)."""
        out = {} if self._first is None else {self._first_name: self._first}
        if self._others is not None:
            out.update(self._others)
        return out

    def state(self, type_name: str) -> TypeState:
        first = self._first
        if first is None:
            self._first_name = type_name
            first = self._first = TypeState()
            return first
        if type_name == self._first_name:
            return first
        others = self._others
        if others is None:
            others = self._others = {}
        st = others.get(type_name)
        if st is None:
            st = others[type_name] = TypeState()
        return st

    def subscribe(self, type_name: str, names: tuple[str, ...]) -> None:
        """What the stream is now subscribed to of this type (or target)."""
        self.state(type_name).subscribed = (
            names if len(names) > _SHARED_SUBSCRIBED else _SUBSCRIBED.share(names))

    def copy(self) -> StreamInfo:
        """A copy without what ties it to this process (its histogram), for another
        process's pages."""
        return dataclasses.replace(self, convergence=None, _others=None if self._others is None
                                   else dict(self._others))

    def changed(self, published_at: float) -> None:
        """A View this stream follows has a new version, published at `published_at`."""
        if not self.pending_since:
            self.pending_since = published_at

    def converged(self) -> None:
        if self.pending_since:
            if self.convergence is not None:
                self.convergence.observe(time.monotonic() - self.pending_since)
            self.pending_since = 0.0

    def sent(self, type_name: str, version: str, nonce: str, size: int) -> None:
        # Per message: the state is there after the first (a call less than state()).
        st = self._first
        if st is None or type_name != self._first_name:
            st = self.state(type_name)
        st.last_sent_version, st.last_sent_nonce, st.last_sent_at = version, nonce, time.time()
        self.messages_sent += 1
        self.bytes_sent += size

    def acked(self, type_name: str, version: str) -> None:
        st = self._first
        if st is None or type_name != self._first_name:
            st = self.state(type_name)
        st.last_ack_version, st.last_ack_at = version, time.time()
        if self.pending_since:
            self.converged()

    def nacked(self, type_name: str, error: str) -> None:
        st = self.state(type_name)
        st.last_nack_error, st.last_nack_at = error, time.time()

    def _worker_column(self) -> dict[str, int]:
        # Only with workers: one process's pages stay as they were.
        return {} if self.worker is None else {"worker": self.worker}

    @property
    def acks(self) -> bool:
        """Whether the protocol has ACKs (xDS) or not (Linkerd's destination API)."""
        return self.protocol.startswith("xds")

    def behind(self, now: float | None = None) -> float:
        """Seconds since the oldest View change this stream has not caught up on."""
        if not self.pending_since:
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - self.pending_since)

    def syncz(self) -> dict[str, Any]:
        """What /debug/syncz says of this stream (istiod's syncz, and per Linkerd
        stream its equivalent): per type or target, version sent, version ACKed, state."""
        return {
            "id": self.id,
            **self._worker_column(),
            "protocol": self.protocol,
            "peer": self.peer,
            "client": self.client,
            "started": human_time(self.started_at),
            "behind_seconds": round(self.behind(), 3),
            "types": {
                name: {"subscribed": list(st.subscribed),
                       "sent": st.last_sent_version, "sent_at": human_time(st.last_sent_at),
                       "acked": st.last_ack_version if self.acks else None,
                       "acked_at": human_time(st.last_ack_at),
                       "nack": st.last_nack_error or None,
                       "state": st.sync_state(self.acks)}
                for name, st in sorted(self.types.items())
            },
        }

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            **self._worker_column(),
            "protocol": self.protocol,
            "peer": self.peer,
            "client": self.client,
            "started_at": human_time(self.started_at),
            "messages_sent": self.messages_sent,
            "bytes_sent": self.bytes_sent,
            "types": {
                name: {
                    "subscribed": list(st.subscribed),
                    "last_sent": {"version": st.last_sent_version, "nonce": st.last_sent_nonce,
                                  "at": human_time(st.last_sent_at)},
                    "last_ack": {"version": st.last_ack_version,
                                 "at": human_time(st.last_ack_at)},
                    "last_nack": ({"error": st.last_nack_error,
                                   "at": human_time(st.last_nack_at)}
                                  if st.last_nack_at else None),
                    "state": st.sync_state(self.acks),
                }
                for name, st in sorted(self.types.items())
            },
        }


class StreamRegistry:
    def __init__(self, metrics: prometheus_client.CollectorRegistry | None = None,
                 first_id: int = 1, worker: int | None = None) -> None:
        self._streams: dict[int, StreamInfo] = {}
        self.worker = worker
        # A worker numbers its streams from a first id of its own, so that the ids
        # the watcher's pages list are unique across the processes.
        self._ids = itertools.count(first_id)
        self.convergence: LoopHistogram | None = None
        if metrics is not None:
            # Observed once per stream per change, on the loop thread: lock-free.
            self.convergence = LoopHistogram(
                "meshbridge_convergence_seconds",
                "From a View change to a stream being caught up: written (Linkerd), "
                "ACKed (xDS)", ["protocol"], buckets=CONVERGENCE_BUCKETS, registry=metrics)

    def add(self, info: StreamInfo) -> StreamInfo:
        info.id = next(self._ids)
        info.worker = self.worker
        if self.convergence is not None:
            info.convergence = self.convergence.labels(info.protocol)
        self._streams[info.id] = info
        return info

    def remove(self, info: StreamInfo) -> None:
        self._streams.pop(info.id, None)

    def __len__(self) -> int:
        return len(self._streams)

    def all(self) -> list[StreamInfo]:
        return list(self._streams.values())

    def detached(self) -> list[StreamInfo]:
        """Copies of every stream's entry without what ties it to this process (its
        histogram), for another process's pages."""
        return [s.copy() for s in self._streams.values()]

    def synced(self) -> dict[str, tuple[int, int]]:
        """Per protocol: (streams open, streams whose every type sent is ACKed). A
        summary another process can ask for often (a benchmark's "idle?") without
        copying every entry as `detached` does."""
        out: dict[str, tuple[int, int]] = {}
        for s in self._streams.values():
            done = bool(s.types) and all(
                st.last_sent_version and st.sync_state(s.acks) in (SYNCED, SENT)
                for st in s.types.values())
            n, k = out.get(s.protocol, (0, 0))
            out[s.protocol] = (n + 1, k + done)
        return out

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self._streams.values():
            out[s.protocol] = out.get(s.protocol, 0) + 1
        return out
