"""h2grpc against two independent peers: grpcio's own client, and the `h2`
package as a raw HTTP/2 client for what a gRPC client never does on its own
(padding, CONTINUATION, tiny windows, resets, bad prefaces)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import struct
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import pytest

from h2grpc.call import INBOX_SLACK
from h2grpc.limits import H2Limits
from h2grpc.server import Server
from testkit.polling import HANG, eventually

SERVICE = "meshbridge.test.Echo"
STREAM_WINDOW = H2Limits().stream_window
RESET_BUDGET = H2Limits().max_resets


def _frame(message: bytes, compressed: bool = False) -> bytes:
    return struct.pack(">BI", int(compressed), len(message)) + message


class Handlers:
    """Echo handlers of every kind, recording what happened to them."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.release = asyncio.Event()
        self.unary_context: Any = None  # the last Unary call's context

    async def unary(self, request: bytes, context: Any) -> bytes:
        self.unary_context = context
        if request == b"boom":
            raise RuntimeError("handler broke")
        if request == b"abort":
            await context.abort(grpc.StatusCode.NOT_FOUND, "no such thing: caf\u00e9 100%")
        if request.startswith(b"big:"):
            return b"x" * int(request[4:])
        return b"echo:" + request

    async def hold(self, request: bytes, context: Any) -> None:
        await context.write(b"first")
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        await context.write(b"last")

    async def bidi(self, _requests: Any, context: Any) -> None:
        while (message := await context.read()) is not grpc.aio.EOF:
            await context.write(b"ack:" + message)

    async def stall(self, _requests: Any, context: Any) -> None:
        await self.release.wait()  # reads nothing until released, then everything
        count = 0
        while await context.read() is not grpc.aio.EOF:
            count += 1
        await context.write(str(count).encode())

    async def generator(self, request: bytes, _context: Any) -> AsyncIterator[bytes]:
        for i in range(int(request)):
            yield str(i).encode()

    def generic(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(SERVICE, {
            "Unary": grpc.unary_unary_rpc_method_handler(self.unary),
            "Hold": grpc.unary_stream_rpc_method_handler(self.hold),
            "Bidi": grpc.stream_stream_rpc_method_handler(self.bidi),
            "Count": grpc.unary_stream_rpc_method_handler(self.generator),
            "Stall": grpc.stream_stream_rpc_method_handler(self.stall),
        })


@pytest.fixture
async def served() -> AsyncIterator[tuple[Server, Handlers, str]]:
    handlers = Handlers()
    server = Server(limits=H2Limits(max_concurrent_streams=50, max_message_bytes=1 << 20))
    server.add_generic_rpc_handlers((handlers.generic(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield server, handlers, f"127.0.0.1:{port}"
    await server.stop(0.5)


# ------------------------------------------------------------------ with grpcio's client


async def test_every_rpc_kind_works_with_grpcs_own_client(
        served: tuple[Server, Handlers, str]) -> None:
    _, _handlers, address = served
    async with grpc.aio.insecure_channel(address) as ch:
        assert await ch.unary_unary(f"/{SERVICE}/Unary")(b"hi") == b"echo:hi"
        assert [m async for m in ch.unary_stream(f"/{SERVICE}/Count")(b"3")] == [
            b"0", b"1", b"2"]
        call = ch.stream_stream(f"/{SERVICE}/Bidi")()
        for word in (b"a", b"b"):
            await call.write(word)
            assert await call.read() == b"ack:" + word
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK
        # A response far larger than any window arrives whole.
        big = await ch.unary_unary(f"/{SERVICE}/Unary")(b"big:3000000")
        assert big == b"x" * 3_000_000


async def test_statuses_reach_the_client_precisely(served: tuple[Server, Handlers, str]) -> None:
    _, _, address = served
    async with grpc.aio.insecure_channel(address) as ch:
        unary = ch.unary_unary(f"/{SERVICE}/Unary")
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await unary(b"abort")
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert e.value.details() == "no such thing: caf\u00e9 100%"  # percent-encoded on the wire
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await unary(b"boom")
        assert e.value.code() == grpc.StatusCode.UNKNOWN
        assert "handler broke" in (e.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await ch.unary_unary("/no.Such/Method")(b"x")
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        bidi = ch.stream_stream("/no.Such/Stream")()
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await bidi.write(b"x")
            await bidi.read()
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await unary(b"y" * (2 << 20))
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max" in (e.value.details() or "")
        # The connection is still good for the next call.
        assert await unary(b"again") == b"echo:again"


async def test_a_deadline_ends_the_call_with_deadline_exceeded(
        served: tuple[Server, Handlers, str]) -> None:
    _, handlers, address = served
    async with grpc.aio.insecure_channel(address) as ch:
        call = ch.unary_stream(f"/{SERVICE}/Hold")(b"", timeout=0.3)
        assert await call.read() == b"first"
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await call.read()
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.wait_for(handlers.cancelled.wait(), HANG)


async def test_a_client_cancelling_cancels_the_handler(
        served: tuple[Server, Handlers, str]) -> None:
    server, handlers, address = served
    async with grpc.aio.insecure_channel(address) as ch:
        call = ch.unary_stream(f"/{SERVICE}/Hold")(b"")
        assert await call.read() == b"first"
        call.cancel()
        await asyncio.wait_for(handlers.cancelled.wait(), HANG)
        await eventually(lambda: not server._tasks, HANG, lambda: "the call's task is left")


async def test_stop_ends_open_streams_with_their_status_then_closes(
        served: tuple[Server, Handlers, str]) -> None:
    server, handlers, address = served
    async with grpc.aio.insecure_channel(address) as ch:
        call = ch.unary_stream(f"/{SERVICE}/Hold")(b"")
        assert await call.read() == b"first"
        stopping = asyncio.ensure_future(server.stop(5))
        await asyncio.sleep(0)
        handlers.release.set()  # the handler finishes within the grace
        assert await call.read() == b"last"
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK
        await stopping
        # New calls are refused: the port is closed.
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await ch.unary_unary(f"/{SERVICE}/Unary")(b"late", timeout=2)
        assert e.value.code() in (grpc.StatusCode.UNAVAILABLE,
                                  grpc.StatusCode.DEADLINE_EXCEEDED)


async def test_interceptors_wrap_handlers_in_order() -> None:
    seen: list[str] = []

    class Note(grpc.aio.ServerInterceptor):  # type: ignore[misc]
        def __init__(self, name: str) -> None:
            self.name = name

        async def intercept_service(self, continuation: Callable[..., Any],
                                    details: grpc.HandlerCallDetails) -> Any:
            seen.append(f"{self.name}:{details.method}")
            return await continuation(details)

    handlers = Handlers()
    server = Server(interceptors=[Note("outer"), Note("inner")])
    server.add_generic_rpc_handlers((handlers.generic(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            assert await ch.unary_unary(f"/{SERVICE}/Unary")(b"x") == b"echo:x"
    finally:
        await server.stop(0)
    assert seen == [f"outer:/{SERVICE}/Unary", f"inner:/{SERVICE}/Unary"]


# ------------------------------------------------------------------ with a raw HTTP/2 peer


def _text(headers: Any) -> dict[str, str]:
    return {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes)
            else v) for k, v in headers}


class RawClient:
    """An HTTP/2 client from the `h2` package, driven frame by frame."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 settings: dict[int, int] | None = None) -> None:
        self.reader, self.writer = reader, writer
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self.conn = h2.connection.H2Connection(config)
        self.conn.initiate_connection()
        if settings:
            self.conn.update_settings(settings)
        self.events: list[h2.events.Event] = []
        self.closed = False
        self.send()

    @classmethod
    async def connect(cls, address: str, settings: dict[int, int] | None = None,
                      ) -> RawClient:
        """Connected; with `settings`, once the server has acknowledged them."""
        host, port = address.rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        client = cls(reader, writer, settings)
        if settings:
            await client.until(lambda e: isinstance(e, h2.events.SettingsAcknowledged))
        return client

    def send(self) -> None:
        self.writer.write(self.conn.data_to_send())

    def request(self, method: str, *, end: bool = False, extra: tuple[tuple[str, str], ...] = (),
                ) -> int:
        sid = self.conn.get_next_available_stream_id()
        self.conn.send_headers(sid, [
            (":method", "POST"), (":scheme", "http"), (":path", f"/{SERVICE}/{method}"),
            (":authority", "test"), ("content-type", "application/grpc"), ("te", "trailers"),
            *extra], end_stream=end)
        self.send()
        return sid

    def call(self, method: str, data: bytes, extra: tuple[tuple[str, str], ...] = ()) -> int:
        """A stream with one request (`data`, framed) and its end."""
        sid = self.request(method, extra=extra)
        self.conn.send_data(sid, data, end_stream=True)
        self.send()
        return sid

    async def barrier(self) -> None:
        """Until the server has handled every frame sent so far (a PING answered: what
        it sent in reply to earlier frames has arrived before the answer)."""
        self.conn.ping(b"barrier!")
        self.send()
        await self.until(lambda e: isinstance(e, h2.events.PingAckReceived))

    async def until(self, want: Callable[[h2.events.Event], bool],
                    ack_data: bool = True) -> Any:
        while True:
            for e in self.events:
                if want(e):
                    self.events.remove(e)
                    return e
            data = await asyncio.wait_for(self.reader.read(1 << 16), HANG)
            if not data:
                self.closed = True
                raise ConnectionError("server closed the connection")
            for e in self.conn.receive_data(data):
                if ack_data and isinstance(e, h2.events.DataReceived):
                    self.conn.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                self.events.append(e)
            self.send()

    async def response(self, sid: int) -> tuple[bytes, dict[str, str]]:
        body = b""
        while True:
            e = await self.until(lambda e: getattr(e, "stream_id", None) == sid)
            if isinstance(e, h2.events.DataReceived):
                body += e.data
            elif isinstance(e, h2.events.TrailersReceived):
                return body, _text(e.headers)
            elif isinstance(e, h2.events.ResponseReceived):
                headers = _text(e.headers)
                if "grpc-status" in headers:  # trailers-only
                    return body, headers

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


async def test_ping_and_settings_are_answered(served: tuple[Server, Handlers, str]) -> None:
    _, _, address = served
    c = await RawClient.connect(address)
    changed = await c.until(lambda e: isinstance(e, h2.events.RemoteSettingsChanged))
    assert changed.changed_settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] \
        .new_value == 50
    await c.until(lambda e: isinstance(e, h2.events.SettingsAcknowledged))
    c.conn.ping(b"12345678")
    c.send()
    ack = await c.until(lambda e: isinstance(e, h2.events.PingAckReceived))
    assert ack.ping_data == b"12345678"
    await c.close()


async def test_padding_continuation_and_split_messages_are_read(
        served: tuple[Server, Handlers, str]) -> None:
    _, _, address = served
    c = await RawClient.connect(address)
    c.conn.max_outbound_frame_size = 16384
    # A header block big enough to need CONTINUATION frames.
    sid = c.request("Unary", extra=tuple((f"x-pad-{i}", "v" * 1000) for i in range(40)))
    message = _frame(b"split across frames")
    for piece, end in ((message[:3], False), (message[3:10], False), (message[10:], True)):
        c.conn.send_data(sid, piece, end_stream=end, pad_length=7)
    c.send()
    body, trailers = await c.response(sid)
    assert trailers["grpc-status"] == "0"
    assert body == _frame(b"echo:split across frames")
    # Two messages in one DATA frame, on a bidirectional stream.
    sid = c.call("Bidi", _frame(b"one") + _frame(b"two"))
    body, trailers = await c.response(sid)
    assert trailers["grpc-status"] == "0"
    assert body == _frame(b"ack:one") + _frame(b"ack:two")
    await c.close()


async def test_a_compressed_request_is_decompressed(served: tuple[Server, Handlers, str]) -> None:
    _, _, address = served
    c = await RawClient.connect(address)
    sid = c.call("Unary", _frame(gzip.compress(b"zipped"), compressed=True),
                 extra=(("grpc-encoding", "gzip"),))
    body, trailers = await c.response(sid)
    assert (body, trailers["grpc-status"]) == (_frame(b"echo:zipped"), "0")
    await c.close()


async def test_the_servers_sends_respect_a_tiny_window(
        served: tuple[Server, Handlers, str]) -> None:
    _, _, address = served
    c = await RawClient.connect(
        address, settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1000})
    sid = c.call("Unary", _frame(b"big:50000"))
    body, trailers = await c.response(sid)  # h2 raises if a frame overruns the window
    assert trailers["grpc-status"] == "0"
    assert body == _frame(b"x" * 50000)
    await c.close()


async def test_a_reader_that_never_grants_window_holds_back_only_its_stream(
        served: tuple[Server, Handlers, str]) -> None:
    _, _, address = served
    stalled = await RawClient.connect(
        address, settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 10})
    stalled.call("Unary", _frame(b"big:100000"))
    first = await stalled.until(lambda e: isinstance(e, h2.events.DataReceived), ack_data=False)
    assert len(first.data) == 10  # exactly the window, then nothing
    async with grpc.aio.insecure_channel(address) as ch:
        assert await ch.unary_unary(f"/{SERVICE}/Unary")(b"ok", timeout=HANG) == b"echo:ok"
    await stalled.close()


async def test_a_reset_stream_cancels_its_handler_and_leaves_the_connection_usable(
        served: tuple[Server, Handlers, str]) -> None:
    _server, handlers, address = served
    c = await RawClient.connect(address)
    sid = c.call("Hold", _frame(b""))
    await c.until(lambda e: isinstance(e, h2.events.DataReceived))
    c.conn.reset_stream(sid)
    c.send()
    await asyncio.wait_for(handlers.cancelled.wait(), HANG)
    sid = c.call("Unary", _frame(b"still here"))
    body, _ = await c.response(sid)
    assert body == _frame(b"echo:still here")
    await c.close()


async def test_streams_beyond_the_limit_are_refused(served: tuple[Server, Handlers, str]) -> None:
    _, _handlers, address = served
    c = await RawClient.connect(address)
    await c.until(lambda e: isinstance(e, h2.events.RemoteSettingsChanged))
    # Ignore the advertised limit on purpose: raise what h2 thinks the server allows.
    c.conn.remote_settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = 1000
    c.conn.remote_settings.acknowledge()
    sids = []
    for _ in range(51):
        sid = c.request("Hold")
        c.conn.send_data(sid, _frame(b""), end_stream=True)
        sids.append(sid)
    c.send()
    reset = await c.until(lambda e: isinstance(e, h2.events.StreamReset))
    assert reset.stream_id == sids[-1]
    assert reset.error_code == h2.errors.ErrorCodes.REFUSED_STREAM
    await c.close()


async def test_a_client_that_is_not_http2_is_told_and_closed(
        served: tuple[Server, Handlers, str]) -> None:
    _, _, address = served
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    data = await asyncio.wait_for(reader.read(), HANG)  # until the server closes
    frames = []
    while data:
        length = int.from_bytes(data[:3], "big")
        frames.append((data[3], data[9:9 + length]))
        data = data[9 + length:]
    goaway = [payload for kind, payload in frames if kind == 0x7]
    assert goaway and int.from_bytes(goaway[0][4:8], "big") == 0x1  # PROTOCOL_ERROR
    writer.close()


async def test_a_client_resetting_streams_in_a_flood_is_cut_off_alone(
        served: tuple[Server, Handlers, str]) -> None:
    _, _, address = served
    flood = await RawClient.connect(address)
    await flood.until(lambda e: isinstance(e, h2.events.RemoteSettingsChanged))
    for _ in range(RESET_BUDGET + 100):  # open a stream, throw it away at once
        sid = flood.request("Hold")
        flood.conn.send_data(sid, _frame(b""), end_stream=True)
        flood.conn.reset_stream(sid)
    flood.send()
    goaway = await flood.until(lambda e: isinstance(e, h2.events.ConnectionTerminated))
    assert goaway.error_code == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    assert b"resets in 10 s" in (goaway.additional_data or b"")
    async with grpc.aio.insecure_channel(address) as ch:  # everyone else is served
        assert await ch.unary_unary(f"/{SERVICE}/Unary")(b"calm", timeout=HANG) == b"echo:calm"
    await flood.close()


def _server_call(server: Server, stream_id: int) -> Any:
    (conn,) = server.connections
    return conn.calls[stream_id]


async def test_a_handler_that_does_not_read_holds_back_its_client_not_the_servers_memory(
        served: tuple[Server, Handlers, str]) -> None:
    server, handlers, address = served
    c = await RawClient.connect(address)
    await c.until(lambda e: isinstance(e, h2.events.RemoteSettingsChanged))
    sid = c.request("Stall")
    message = _frame(b"m" * 10_000)
    sent = 0
    for _ in range(20):  # send all the window allows, until it stops coming back
        while c.conn.local_flow_control_window(sid) >= len(message):
            c.conn.send_data(sid, message)
            sent += 1
        await c.barrier()  # a window given back for those messages has arrived
        if c.conn.local_flow_control_window(sid) < len(message):
            break
    assert c.conn.local_flow_control_window(sid) < len(message)  # the client must wait
    held = _server_call(server, sid).unread()
    assert held == sent
    assert held * len(message) <= STREAM_WINDOW + (INBOX_SLACK + 1) * len(message)
    handlers.release.set()  # the handler reads: the window comes back
    while c.conn.local_flow_control_window(sid) < len(message):
        await c.until(lambda e: isinstance(e, h2.events.WindowUpdated))
    c.conn.send_data(sid, message, end_stream=True)
    c.send()
    body, trailers = await c.response(sid)
    assert (body, trailers["grpc-status"]) == (_frame(str(sent + 1).encode()), "0")
    await c.close()


async def test_messages_after_a_unary_request_are_dropped_not_held(
        served: tuple[Server, Handlers, str]) -> None:
    server, handlers, address = served
    c = await RawClient.connect(address)
    await c.until(lambda e: isinstance(e, h2.events.RemoteSettingsChanged))
    sid = c.request("Hold")
    c.conn.send_data(sid, _frame(b""))
    c.send()
    await c.until(lambda e: isinstance(e, h2.events.DataReceived))  # b"first"
    junk = _frame(b"j" * 10_000)
    for _ in range(2 * STREAM_WINDOW // len(junk)):  # twice the window: it must come back
        while c.conn.local_flow_control_window(sid) < len(junk):
            await c.until(lambda e: isinstance(e, h2.events.WindowUpdated))
        c.conn.send_data(sid, junk)
        c.send()
    await c.barrier()
    assert _server_call(server, sid).unread() == 0
    handlers.release.set()
    c.conn.end_stream(sid)
    c.send()
    body, trailers = await c.response(sid)
    assert (body, trailers["grpc-status"]) == (_frame(b"last"), "0")
    await c.close()


async def test_stop_does_not_wait_forever_for_a_client_that_never_reads(
        served: tuple[Server, Handlers, str]) -> None:
    server, _, address = served
    stalled = await RawClient.connect(
        address, settings={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 10})
    # Small enough for the handler's write to complete: the handler is done, and its
    # response and status wait behind a window that never opens.
    stalled.call("Unary", _frame(b"big:50000"))
    await stalled.until(lambda e: isinstance(e, h2.events.DataReceived), ack_data=False)
    await eventually(lambda: not server._tasks, HANG, lambda: "the handler did not finish")
    await asyncio.wait_for(server.stop(0.2), HANG)
    assert not server.connections or all(c.closed for c in server.connections)
    # The server ends the connection: what it still sends (GOAWAY, the stream's reset)
    # is followed by the end of the byte stream.
    while await asyncio.wait_for(stalled.reader.read(1 << 16), HANG):
        pass
    await stalled.close()


async def test_the_context_says_cancelled_only_for_a_reset_call(
        served: tuple[Server, Handlers, str]) -> None:
    server, handlers, address = served
    async with grpc.aio.insecure_channel(address) as ch:
        assert await ch.unary_unary(f"/{SERVICE}/Unary")(b"x") == b"echo:x"
        finished = handlers.unary_context
        assert finished.done() and not finished.cancelled()  # ended with its status
        call = ch.unary_stream(f"/{SERVICE}/Hold")(b"")
        assert await call.read() == b"first"
        (conn,) = server.connections
        (held,) = conn.calls.values()
        assert not held.cancelled()
        call.cancel()
        await asyncio.wait_for(handlers.cancelled.wait(), HANG)
        assert held.cancelled() and held.done()
