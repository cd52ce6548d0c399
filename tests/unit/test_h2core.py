"""The sans-IO HTTP/2 core (h2grpc.core), fed bytes and read back, with no socket.

Frames a well-behaved client sends come from the `h2` package's client (an
independent implementation); the ones no client should send are built by hand.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import replace

import h2.config
import h2.connection
import h2.events
import hpack
import pytest

from h2grpc import frames as f
from h2grpc.core import H2Connection
from h2grpc.flow import SendWindows
from h2grpc.headers import Request
from h2grpc.limits import H2Limits
from h2grpc.streams import H2Stream, Input, State, StreamStateError

GRPC_HEADERS = [(":method", "POST"), (":scheme", "http"), (":path", "/svc/Method"),
                (":authority", "test"), ("content-type", "application/grpc"),
                ("te", "trailers")]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """The layer above the core: records what it is told."""

    def __init__(self) -> None:
        self.requests: list[tuple[H2Stream, Request, bool]] = []
        self.data: list[tuple[int, bytes]] = []
        self.ended: list[int] = []
        self.resets: list[tuple[int, int]] = []
        self.drained: list[int] = []
        self.handshakes = 0
        self.pings: list[bytes] = []
        self.terminations: list[tuple[int, str]] = []

    def request_received(self, stream: H2Stream, request: Request, end_stream: bool) -> None:
        self.requests.append((stream, request, end_stream))

    def stream_data(self, stream: H2Stream, data: bytes) -> None:
        self.data.append((stream.id, data))

    def stream_ended(self, stream: H2Stream) -> None:
        self.ended.append(stream.id)

    def stream_reset(self, stream: H2Stream, code: int) -> None:
        self.resets.append((stream.id, code))

    def stream_drained(self, stream: H2Stream) -> None:
        self.drained.append(stream.id)

    def handshake_done(self) -> None:
        self.handshakes += 1

    def ping_acked(self, payload: bytes) -> None:
        self.pings.append(payload)

    def terminated(self, code: int, reason: str) -> None:
        self.terminations.append((code, reason))


class Peer:
    """A core and an `h2` client talking to it, one exchange at a time."""

    def __init__(self, limits: H2Limits | None = None, settings: dict[int, int] | None = None,
                 ) -> None:
        self.clock = Clock()
        self.events = Recorder()
        self.core = H2Connection(self.events, limits or H2Limits(), self.clock)
        self.core.initiate()
        self.client = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.client.initiate_connection()
        if settings:
            self.client.update_settings(settings)
        self.received: list[h2.events.Event] = []
        self.exchange()
        self.exchange()  # the client's ACK of our SETTINGS

    def exchange(self, extra: bytes = b"") -> list[h2.events.Event]:
        """Client bytes (and `extra` raw bytes) into the core, its answer back."""
        self.core.feed(self.client.data_to_send() + extra)
        while self.core.process(1 << 20):
            pass
        events = self.client.receive_data(self.core.data_to_send())
        self.received += events
        return list(events)

    def raw(self, *frames: bytes) -> bytes:
        """Raw frames in; what the core answered, as bytes."""
        self.core.feed(b"".join(frames))
        while self.core.process(1 << 20):
            pass
        return self.core.data_to_send()

    def request(self, end: bool = False, headers: list[tuple[str, str]] | None = None) -> int:
        sid: int = self.client.get_next_available_stream_id()
        self.client.send_headers(sid, headers or GRPC_HEADERS, end_stream=end)
        self.exchange()
        return sid

    def stream(self, sid: int) -> H2Stream:
        return self.core.streams[sid]

    @property
    def goaway(self) -> int | None:
        return self.core.terminated.code if self.core.terminated else None


def frames_of(data: bytes) -> list[tuple[int, int, int, bytes]]:
    return [(k, fl, sid, p) for k, fl, sid, p, _ in f.frames_in(bytearray(data), 1 << 24)]


def rst_codes(data: bytes) -> list[tuple[int, int]]:
    return [(sid, struct.unpack(">I", p)[0]) for k, _, sid, p in frames_of(data)
            if k == f.RST_STREAM]


def header_block(fields: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(f.literal(k, v) for k, v in fields)


REQUEST = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/svc/Method"),
           (b":authority", b"t"), (b"content-type", b"application/grpc")]


# ------------------------------------------------------------------ the handshake


def test_a_handshake_completes_once_both_settings_are_exchanged() -> None:
    p = Peer()
    assert p.core.handshake_complete and p.events.handshakes == 1
    assert any(isinstance(e, h2.events.RemoteSettingsChanged) for e in p.received)


@pytest.mark.parametrize(("what", "data"), [
    ("an HTTP/1.1 request", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("a preface then PING instead of SETTINGS", f.PREFACE + f.frame(f.PING, 0, 0, b"x" * 8)),
])
def test_a_client_that_does_not_open_properly_gets_protocol_error(what: str, data: bytes) -> None:
    events = Recorder()
    core = H2Connection(events, H2Limits(), Clock())
    core.feed(data)
    core.process(1 << 16)
    assert events.terminations and events.terminations[0][0] == f.PROTOCOL_ERROR, what


# ------------------------------------------------------------------ connection errors


def _settings(*pairs: tuple[int, int]) -> bytes:
    return f.frame(f.SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))


CONNECTION_ERRORS: list[tuple[str, Callable[[Peer], bytes], int]] = [
    ("DATA on stream 0", lambda p: f.frame(f.DATA, 0, 0, b"x"), f.PROTOCOL_ERROR),
    ("DATA on an idle stream", lambda p: f.frame(f.DATA, 0, 99, b"x"), f.PROTOCOL_ERROR),
    ("HEADERS on an even stream",
     lambda p: f.frame(f.HEADERS, f.END_HEADERS, 2, header_block(REQUEST)), f.PROTOCOL_ERROR),
    ("HEADERS on stream 0",
     lambda p: f.frame(f.HEADERS, f.END_HEADERS, 0, header_block(REQUEST)), f.PROTOCOL_ERROR),
    ("SETTINGS ACK with a payload", lambda p: f.frame(f.SETTINGS, f.ACK, 0, b"\0" * 6),
     f.FRAME_SIZE_ERROR),
    ("SETTINGS of 5 bytes", lambda p: f.frame(f.SETTINGS, 0, 0, b"\0" * 5), f.FRAME_SIZE_ERROR),
    ("SETTINGS on a stream", lambda p: f.frame(f.SETTINGS, 0, 1, b""), f.PROTOCOL_ERROR),
    ("ENABLE_PUSH=2", lambda p: _settings((f.ENABLE_PUSH, 2)), f.PROTOCOL_ERROR),
    ("INITIAL_WINDOW_SIZE above 2^31-1", lambda p: _settings((f.INITIAL_WINDOW_SIZE, 2**31)),
     f.FLOW_CONTROL_ERROR),
    ("MAX_FRAME_SIZE below 16384", lambda p: _settings((f.MAX_FRAME_SIZE, 100)),
     f.PROTOCOL_ERROR),
    ("PING of 7 bytes", lambda p: f.frame(f.PING, 0, 0, b"x" * 7), f.FRAME_SIZE_ERROR),
    ("PING on a stream", lambda p: f.frame(f.PING, 0, 1, b"x" * 8), f.PROTOCOL_ERROR),
    ("RST_STREAM on an idle stream", lambda p: f.rst_stream(5, f.CANCEL), f.PROTOCOL_ERROR),
    ("RST_STREAM on stream 0", lambda p: f.rst_stream(0, f.CANCEL), f.PROTOCOL_ERROR),
    ("RST_STREAM of 3 bytes", lambda p: f.frame(f.RST_STREAM, 0, 1, b"\0\0\0"),
     f.FRAME_SIZE_ERROR),
    ("WINDOW_UPDATE of 0 on the connection", lambda p: f.window_update(0, 0), f.PROTOCOL_ERROR),
    ("WINDOW_UPDATE of 3 bytes", lambda p: f.frame(f.WINDOW_UPDATE, 0, 0, b"\0\0\1"),
     f.FRAME_SIZE_ERROR),
    ("WINDOW_UPDATE on an idle stream", lambda p: f.window_update(7, 1), f.PROTOCOL_ERROR),
    ("a connection window above 2^31-1", lambda p: f.window_update(0, 2**31 - 1),
     f.FLOW_CONTROL_ERROR),
    ("PUSH_PROMISE", lambda p: f.frame(f.PUSH_PROMISE, f.END_HEADERS, 1, b"\0\0\0\2"),
     f.PROTOCOL_ERROR),
    ("GOAWAY on a stream", lambda p: f.frame(f.GOAWAY, 0, 1, b"\0" * 8), f.PROTOCOL_ERROR),
    ("a header block interrupted by PING",
     lambda p: f.frame(f.HEADERS, 0, 1, header_block(REQUEST)) + f.frame(f.PING, 0, 0, b"x" * 8),
     f.PROTOCOL_ERROR),
    ("CONTINUATION with nothing to continue", lambda p: f.frame(f.CONTINUATION, 4, 1, b""),
     f.PROTOCOL_ERROR),
    ("a header block HPACK cannot decode", lambda p: f.frame(f.HEADERS, 4, 1, b"\xff\xff\xff"),
     f.COMPRESSION_ERROR),
    ("a header list above the limit", lambda p: f.frame(
        f.HEADERS, 4, 1, header_block([*REQUEST, (b"x-big", b"v" * 10000)])), f.COMPRESSION_ERROR),
    ("a new stream id below the last one", lambda p: f.frame(
        f.HEADERS, 4, 5, header_block(REQUEST)) + f.frame(f.HEADERS, 4, 3, header_block(REQUEST)),
     f.PROTOCOL_ERROR),
    ("a frame above 16 KiB", lambda p: f.frame(f.DATA, 0, 1, b"x" * 16385), f.FRAME_SIZE_ERROR),
    ("DATA beyond the connection window", lambda p: b"".join(
        f.frame(f.DATA, 0, 1, b"x" * 16384) for _ in range(1100)), f.FLOW_CONTROL_ERROR),
]


@pytest.mark.parametrize(("what", "frames", "code"), CONNECTION_ERRORS,
                         ids=[c[0] for c in CONNECTION_ERRORS])
def test_a_connection_error_is_goaway_with_the_rfc_code(
        what: str, frames: Callable[[Peer], bytes], code: int) -> None:
    limits = H2Limits(max_header_list=8192, stream_window=2**30,
                      connection_window=16 << 20)
    p = Peer(limits)
    if "window" in what:
        p.request()  # stream 1 is open
    p.core.feed(frames(p))
    p.core.process(1 << 30)  # one slice: the connection window is not given back between
    out = p.core.data_to_send()
    goaways = [fr for fr in frames_of(out) if fr[0] == f.GOAWAY]
    assert goaways, f"{what}: no GOAWAY"
    assert struct.unpack(">II", goaways[-1][3][:8])[1] == code
    assert p.events.terminations[0][0] == code
    assert p.raw(f.frame(f.PING, 0, 0, b"x" * 8)) == b""  # nothing more is answered


# ------------------------------------------------------------------ stream errors


STREAM_ERRORS: list[tuple[str, list[tuple[bytes, bytes]]]] = [
    ("an uppercase name", [*REQUEST, (b"X-Upper", b"v")]),
    ("an empty name", [*REQUEST, (b"", b"v")]),
    ("a connection-specific header", [*REQUEST, (b"connection", b"keep-alive")]),
    ("transfer-encoding", [*REQUEST, (b"transfer-encoding", b"chunked")]),
    ("te other than trailers", [*REQUEST, (b"te", b"gzip")]),
    ("a pseudo-header after a regular one", [*REQUEST[1:], REQUEST[0]]),
    ("an unknown pseudo-header", [*REQUEST[:4], (b":status", b"200"), *REQUEST[4:]]),
    ("no :path", [fl for fl in REQUEST if fl[0] != b":path"]),
    ("an empty :path", [(k, b"" if k == b":path" else v) for k, v in REQUEST]),
    ("no :method", REQUEST[1:]),
    ("a duplicated :method", [REQUEST[0], *REQUEST]),
    ("a value with a newline", [*REQUEST, (b"x-a", b"one\ntwo")]),
    ("a value with leading space", [*REQUEST, (b"x-a", b" v")]),
]


@pytest.mark.parametrize(("what", "fields"), STREAM_ERRORS, ids=[c[0] for c in STREAM_ERRORS])
def test_a_malformed_request_is_reset_with_protocol_error_and_the_connection_goes_on(
        what: str, fields: list[tuple[bytes, bytes]]) -> None:
    p = Peer()
    out = p.raw(f.frame(f.HEADERS, f.END_HEADERS, 1, header_block(fields)))
    assert rst_codes(out) == [(1, f.PROTOCOL_ERROR)], what
    assert not p.events.requests and p.core.terminated is None
    p.raw(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 3, header_block(REQUEST)))
    assert [s.id for s, _, _ in p.events.requests] == [3]  # the next stream is served


def test_trailers_without_end_stream_or_with_pseudo_headers_reset_the_stream() -> None:
    p = Peer()
    sid = p.request()
    out = p.raw(f.frame(f.HEADERS, f.END_HEADERS, sid, header_block([(b"x-t", b"1")])))
    assert rst_codes(out) == [(sid, f.PROTOCOL_ERROR)]
    assert p.events.resets == [(sid, f.PROTOCOL_ERROR)]
    sid = p.request()
    out = p.raw(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, sid,
                        header_block([(b":path", b"/x")])))
    assert rst_codes(out) == [(sid, f.PROTOCOL_ERROR)]


def test_content_length_must_match_the_data() -> None:
    p = Peer()
    sid = p.request(headers=[*GRPC_HEADERS, ("content-length", "10")])
    out = p.raw(f.frame(f.DATA, f.END_STREAM, sid, b"12345"))
    assert rst_codes(out) == [(sid, f.PROTOCOL_ERROR)]
    sid = p.request(headers=[*GRPC_HEADERS, ("content-length", "5")])
    assert rst_codes(p.raw(f.frame(f.DATA, f.END_STREAM, sid, b"12345"))) == []
    assert p.events.ended == [sid]


@pytest.mark.parametrize(("what", "frame", "code"), [
    ("a zero WINDOW_UPDATE on a stream", f.window_update(1, 0), f.PROTOCOL_ERROR),
    ("a stream window above 2^31-1", f.window_update(1, 2**31 - 1), f.FLOW_CONTROL_ERROR),
    ("PRIORITY depending on itself", f.frame(f.PRIORITY, 0, 1, struct.pack(">IB", 1, 0)),
     f.PROTOCOL_ERROR),
    ("PRIORITY of 4 bytes", f.frame(f.PRIORITY, 0, 1, b"\0" * 4), f.FRAME_SIZE_ERROR),
    ("DATA beyond the stream window", f.frame(f.DATA, 0, 1, b"x" * 16384), f.FLOW_CONTROL_ERROR),
])
def test_a_stream_error_resets_that_stream_only(what: str, frame: bytes, code: int) -> None:
    p = Peer(H2Limits(stream_window=1000))
    p.request()
    out = p.raw(frame)
    assert rst_codes(out) == [(1, code)], what
    assert p.core.terminated is None and 1 not in p.core.streams


def test_data_after_the_clients_end_is_stream_closed() -> None:
    p = Peer()
    sid = p.request(end=True)
    assert rst_codes(p.raw(f.frame(f.DATA, 0, sid, b"x"))) == [(sid, f.STREAM_CLOSED)]


def test_late_frames_are_judged_by_how_the_stream_closed() -> None:
    p = Peer()
    ours = p.request()
    p.core.reset_stream(p.stream(ours))
    p.core.data_to_send()
    # In flight before the client saw our RST_STREAM: ignored.
    assert rst_codes(p.raw(f.frame(f.DATA, 0, ours, b"x"))) == []
    theirs = p.request()
    p.raw(f.rst_stream(theirs, f.CANCEL))
    assert p.events.resets == [(theirs, f.CANCEL)]
    # The client reset it itself and sends more: STREAM_CLOSED (RFC 9113 §5.1).
    assert rst_codes(p.raw(f.frame(f.DATA, 0, theirs, b"x"))) == [(theirs, f.STREAM_CLOSED)]
    assert p.core.terminated is None


# ------------------------------------------------------------------ HPACK stays in step


def test_a_refused_streams_headers_still_update_the_hpack_table() -> None:
    p = Peer(H2Limits(max_concurrent_streams=1))
    encoder = hpack.Encoder()  # indexes what it sends, as clients' encoders do
    remembered = [*REQUEST, (b"x-remembered", b"by the table")]
    p.raw(f.frame(f.HEADERS, f.END_HEADERS, 1, encoder.encode(REQUEST)))
    out = p.raw(f.frame(f.HEADERS, f.END_HEADERS, 3, encoder.encode(remembered)))
    assert rst_codes(out) == [(3, f.REFUSED_STREAM)]  # one stream at a time
    p.core.reset_stream(p.stream(1))
    # The same fields again: this block only points into the dynamic table.
    again = encoder.encode(remembered)
    assert len(again) < 10
    p.raw(f.frame(f.HEADERS, f.END_HEADERS, 5, again))
    (_, request, _) = p.events.requests[-1]
    assert (b"x-remembered", b"by the table") in request.fields


def test_a_header_block_too_large_to_decode_ends_the_connection_not_the_table() -> None:
    encoder = hpack.Encoder()
    p = Peer(H2Limits(max_header_list=4096))
    block = encoder.encode([*REQUEST, (b"x-big", b"v" * 5000)])
    out = p.raw(f.frame(f.HEADERS, f.END_HEADERS, 1, block))
    assert p.goaway == f.COMPRESSION_ERROR
    assert any(fr[0] == f.GOAWAY for fr in frames_of(out))


# ------------------------------------------------------------------ budgets


def _goaway_reason(p: Peer) -> tuple[int | None, str]:
    return (p.goaway, p.events.terminations[0][1] if p.events.terminations else "")


def _flood(p: Peer, frame: Callable[[int], bytes], n: int) -> None:
    for i in range(n):
        p.raw(frame(i))
        p.core.peer_reading()
        if p.core.terminated:
            return


BUDGETS: list[tuple[str, H2Limits, Callable[[int], bytes], str]] = [
    ("SETTINGS", H2Limits(max_settings=50), lambda i: _settings(), "settings"),
    ("WINDOW_UPDATE", H2Limits(max_window_updates=50), lambda i: f.window_update(0, 1),
     "window_updates"),
    ("PRIORITY", H2Limits(max_priority=50),
     lambda i: f.frame(f.PRIORITY, 0, 3, struct.pack(">IB", 1, 0)), "priority_frames"),
    ("empty DATA", H2Limits(max_empty_frames=50), lambda i: f.frame(f.DATA, 0, 1, b""),
     "empty_frames"),
    ("rapid reset", H2Limits(max_resets=50), lambda i: f.frame(
        f.HEADERS, f.END_HEADERS, 3 + 2 * i, header_block(REQUEST)) + f.rst_stream(
        3 + 2 * i, f.CANCEL), "resets"),
    ("malformed requests", H2Limits(max_malformed_requests=50), lambda i: f.frame(
        f.HEADERS, f.END_HEADERS, 3 + 2 * i, header_block([*REQUEST, (b"Bad", b"x")])),
     "malformed_requests"),
    ("streams beyond the concurrency limit", H2Limits(max_refused_streams=50,
                                                      max_concurrent_streams=1),
     lambda i: f.frame(f.HEADERS, f.END_HEADERS, 3 + 2 * i, header_block(REQUEST)),
     "refused_streams"),
    ("PINGs with no data between", H2Limits(max_ping_strikes=2),
     lambda i: f.frame(f.PING, 0, 0, b"p" * 8), "pings"),
]


@pytest.mark.parametrize(("what", "limits", "frame", "reason"), BUDGETS,
                         ids=[b[0] for b in BUDGETS])
def test_a_flood_beyond_its_budget_gets_enhance_your_calm(
        what: str, limits: H2Limits, frame: Callable[[int], bytes], reason: str) -> None:
    p = Peer(limits)
    p.request()  # stream 1, for the frames that need one
    _flood(p, frame, 60)
    assert _goaway_reason(p) == (f.ENHANCE_YOUR_CALM, reason), what


def test_the_concurrency_limit_answers_before_the_failed_request_budget() -> None:
    # h2spec's §5.1.2 case: the limit's worth of requests that all fail (the layer above
    # counts each as it arrives), held open, then one more stream.
    limit = 50
    p = Peer(H2Limits(max_concurrent_streams=limit, max_failed_requests=10))
    for i in range(limit):
        out = p.raw(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1 + 2 * i,
                            header_block(REQUEST)))
        assert rst_codes(out) == []
        p.core.failed_request()
    beyond = 1 + 2 * limit
    out = p.raw(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, beyond, header_block(REQUEST)))
    assert rst_codes(out) == [(beyond, f.REFUSED_STREAM)]
    assert p.core.terminated is None
    # The budget is still the full max_failed_requests beyond the concurrency.
    for _ in range(10):
        p.core.failed_request()
    assert p.core.terminated is None
    p.core.failed_request()
    assert _goaway_reason(p) == (f.ENHANCE_YOUR_CALM, "failed_requests")


def test_one_slice_handles_at_most_slice_requests_header_blocks() -> None:
    p = Peer(H2Limits(slice_requests=100))
    p.core.feed(b"".join(f.frame(f.HEADERS, f.END_HEADERS | f.END_STREAM, 1 + 2 * i,
                                 header_block(REQUEST)) for i in range(250)))
    assert p.core.process(1 << 20)  # more left for the next loop turn
    assert len(p.events.requests) == 100
    while p.core.process(1 << 20):
        pass
    assert len(p.events.requests) == 250


def test_streams_refused_after_our_goaway_spend_no_budget() -> None:
    p = Peer(H2Limits(max_refused_streams=5, max_failed_requests=5, max_concurrent_streams=5))
    p.request()
    p.core.go_away()
    for i in range(30):  # sent before the client read the GOAWAY
        out = p.raw(f.frame(f.HEADERS, f.END_HEADERS, 3 + 2 * i, header_block(REQUEST)))
        assert rst_codes(out) == [(3 + 2 * i, f.REFUSED_STREAM)]
    assert p.core.terminated is None


def test_a_budget_counts_per_window_so_a_steady_client_never_reaches_it() -> None:
    p = Peer(H2Limits(max_settings=10, window=10.0))
    for _ in range(100):  # 5 a window, forever
        for _ in range(5):
            p.raw(_settings())
        p.clock.now += 10.0
    assert p.core.terminated is None


def test_pings_are_forgiven_while_the_server_sends_data() -> None:
    p = Peer(H2Limits(max_ping_strikes=2))
    sid = p.request()
    for _ in range(20):  # a BDP ping after every message, as grpc clients send them
        p.core.send_data(p.stream(sid), b"message")
        p.raw(f.frame(f.PING, 0, 0, b"bdp-ping"))
    assert p.core.terminated is None


def test_window_updates_are_earned_by_the_data_frames_sent() -> None:
    p = Peer(H2Limits(max_window_updates=10))
    sid = p.request()
    for _ in range(200):  # one WINDOW_UPDATE per DATA frame received: fine
        p.core.send_data(p.stream(sid), b"m")
        p.raw(f.window_update(sid, 1))
    assert p.core.terminated is None


def test_continuation_frames_and_header_fields_per_block_are_bounded() -> None:
    p = Peer(H2Limits(max_continuations=4))
    out = p.raw(f.frame(f.HEADERS, 0, 1, header_block(REQUEST)),
                *[f.frame(f.CONTINUATION, 0, 1, f.literal(b"x-a", b"1")) for _ in range(5)])
    assert any(fr[0] == f.GOAWAY for fr in frames_of(out))
    assert _goaway_reason(p) == (f.ENHANCE_YOUR_CALM, "continuations")
    p = Peer(H2Limits(max_header_fields=20))
    p.raw(f.frame(f.HEADERS, f.END_HEADERS, 1,
                  header_block([*REQUEST, *[(b"x-a", b"1")] * 20])))
    assert _goaway_reason(p) == (f.ENHANCE_YOUR_CALM, "header_fields")


def test_empty_continuation_frames_are_counted_as_empty_frames() -> None:
    p = Peer(H2Limits(max_empty_frames=10, max_continuations=1000))
    p.raw(f.frame(f.HEADERS, 0, 1, header_block(REQUEST)),
          *[f.frame(f.CONTINUATION, 0, 1, b"") for _ in range(20)])
    assert _goaway_reason(p) == (f.ENHANCE_YOUR_CALM, "empty_frames")


def test_control_replies_owed_to_a_peer_that_does_not_read_are_bounded() -> None:
    p = Peer(H2Limits(max_control_replies=100, ping_min_interval=0.0))
    for _ in range(150):  # nobody calls peer_reading(): the socket is not draining
        p.raw(f.frame(f.PING, 0, 0, b"12345678"))
    assert _goaway_reason(p) == (f.ENHANCE_YOUR_CALM, "control_replies")


# ------------------------------------------------------------------ flow control


def _blocked_streams(n: int) -> Peer:
    """n streams with data waiting behind a stream window of 0."""
    p = Peer(H2Limits(max_concurrent_streams=n + 1, max_window_updates=0, max_settings=0),
             settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
    for _ in range(n):
        sid = p.request()
        p.core.send_data(p.stream(sid), b"x" * 100)
    p.core.data_to_send()
    assert p.core.windows.blocked == n
    return p


def _count_drains(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    original = SendWindows.drain

    def counting(self: SendWindows, stream: H2Stream) -> None:
        calls.append(stream.id)
        original(self, stream)

    monkeypatch.setattr(SendWindows, "drain", counting)
    return calls


def test_a_connection_window_update_touches_no_stream_whose_own_window_is_shut(
        monkeypatch: pytest.MonkeyPatch) -> None:
    p = _blocked_streams(2000)
    drains = _count_drains(monkeypatch)
    for _ in range(1000):
        p.raw(f.window_update(0, 1))
    assert drains == []


def test_a_stream_window_update_drains_that_stream_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    p = _blocked_streams(500)
    drains = _count_drains(monkeypatch)
    p.raw(f.window_update(21, 1000))
    assert drains == [21]
    assert p.core.windows.blocked == 499


def test_raising_the_initial_window_costs_only_the_streams_that_can_now_send(
        monkeypatch: pytest.MonkeyPatch) -> None:
    p = _blocked_streams(500)
    drains = _count_drains(monkeypatch)
    p.raw(_settings((f.INITIAL_WINDOW_SIZE, 0)))  # no change: nothing
    assert drains == []
    # The connection window spent, a larger initial window still lets nobody send.
    p.core.windows.connection = 0
    p.raw(_settings((f.INITIAL_WINDOW_SIZE, 50)))
    assert drains == []
    out = p.raw(f.window_update(0, 120))  # enough for two streams' 50 bytes and a bit
    assert len(drains) == 3
    sent = [fr for fr in frames_of(out) if fr[0] == f.DATA]
    assert [len(fr[3]) for fr in sent] == [50, 50, 20]


def test_one_settings_frame_with_many_window_values_applies_the_last_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    p = _blocked_streams(100)
    drains = _count_drains(monkeypatch)
    toggles = [(f.INITIAL_WINDOW_SIZE, v) for v in (1, 0) * 1000]
    p.raw(_settings(*toggles))
    assert drains == []


def test_data_goes_out_as_the_windows_open_and_in_order() -> None:
    p = Peer(settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 3})
    sid = p.request()
    p.core.send_headers(p.stream(sid))
    p.core.send_data(p.stream(sid), b"abcdefgh")
    p.core.send_trailers(p.stream(sid), f.trailers_block(0, "", True))
    got = b""
    for _ in range(10):
        for e in p.exchange():
            if isinstance(e, h2.events.DataReceived):
                got += e.data
                p.client.acknowledge_received_data(e.flow_controlled_length, sid)
    assert got == b"abcdefgh"
    assert any(isinstance(e, h2.events.StreamEnded) for e in p.received)


def test_compaction_keeps_the_heap_of_blocked_streams_bounded() -> None:
    p = _blocked_streams(1)
    stream = p.stream(1)
    p.core.send_data(stream, b"y" * 100_000)
    for _ in range(5000):  # +1 at a time: filed and released again each time
        p.raw(f.window_update(1, 1))
    assert len(p.core.windows._stream_waiters) < 200


# ------------------------------------------------------------------ slices


def test_input_is_handled_in_bounded_slices() -> None:
    p = Peer(H2Limits(ping_min_interval=0.0, max_control_replies=0))
    p.core.feed(f.frame(f.PING, 0, 0, b"12345678") * 20_000)  # 340 KB
    slices = 0
    while p.core.process(16 * 1024):
        slices += 1
        assert p.core.buffered < 340_000
    assert slices >= 20
    acks = [fr for fr in frames_of(p.core.data_to_send()) if fr[0] == f.PING]
    assert len(acks) == 20_000


# ------------------------------------------------------------------ the state machine


def test_stream_states_follow_rfc_9113_section_5_1() -> None:
    s = H2Stream(1, 100)
    assert s.move(Input.RECV_HEADERS) is State.OPEN
    assert s.move(Input.RECV_END_STREAM) is State.HALF_CLOSED_REMOTE
    assert s.move(Input.SEND_END_STREAM) is State.CLOSED
    with pytest.raises(StreamStateError):
        s.move(Input.RECV_HEADERS)
    t = H2Stream(3, 100)
    t.move(Input.RECV_HEADERS)
    assert t.move(Input.SEND_END_STREAM) is State.HALF_CLOSED_LOCAL
    assert t.move(Input.RESET) is State.CLOSED


def test_limits_default_for_every_flag() -> None:
    limits = H2Limits()
    assert replace(limits, max_resets=1).max_resets == 1
    assert all(isinstance(getattr(limits, name), int | float) for name in limits.__slots__)
