"""testkit.grpc_calls against a real `meshbridge serve`: a test's cancelled grpc.aio
calls are over before its event loop closes, so grpc's poller has nothing left to
deliver to that closed loop from the next test's (where it reported "Event loop is
closed" into that test's captured log)."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import grpc

from linkerd_api.proto import destination_pb2 as dst
from testkit.grpc_calls import settle_grpc_calls
from testkit.net import free_port, ready
from testkit.processes import running

GET = "/io.linkerd.proxy.destination.Destination/Get"
WEB = "web.emojivoto.svc.cluster.local:80"
CALLS = 300  # what one test of the burst kind leaves behind, and more


def get(channel: grpc.aio.Channel) -> Any:
    return channel.unary_stream(GET, request_serializer=dst.GetDestination.SerializeToString,
                                response_deserializer=dst.Update.FromString)(
        dst.GetDestination(scheme="k8s", path=WEB))


def test_cancelled_calls_settled_at_a_loops_end_leave_nothing_for_the_next_loop() -> None:
    grpc_port, admin_port = free_port(), free_port()
    with running([sys.executable, "-m", "meshbridge.cli", "serve", "--source", "demo",
                  "--listen", f"127.0.0.1:{grpc_port}", "--admin", f"127.0.0.1:{admin_port}"],
                 lambda: ready(admin_port), "/ready never answered 200"):
        target = f"127.0.0.1:{grpc_port}"
        left_open: list[grpc.aio.Channel] = []

        async def a_test_that_cancels_its_calls() -> int:
            channel = grpc.aio.insecure_channel(target)
            calls = [get(channel) for _ in range(CALLS)]
            for call in calls:
                await call.read()
            for call in calls:
                call.cancel()
            left_open.append(channel)  # not closed, as a test that forgets to (or whose
            # channel is a fixture of a wider scope) leaves it
            return await settle_grpc_calls()  # what the autouse fixture does

        async def the_next_test() -> list[str]:
            errors: list[str] = []
            asyncio.get_running_loop().set_exception_handler(
                lambda _loop, context: errors.append(f"{context.get('message')}: "
                                                     f"{context.get('exception')!r}"))
            async with grpc.aio.insecure_channel(target) as channel:
                for _ in range(20):
                    call = get(channel)
                    await call.read()
                    call.cancel()
            await settle_grpc_calls()
            return errors

        # Each test's own event loop, as pytest-asyncio gives them.
        with asyncio.Runner() as runner:
            pending = runner.run(a_test_that_cancels_its_calls())
        with asyncio.Runner() as runner:
            errors = runner.run(the_next_test())
    assert pending > 0  # the cancelled calls' tasks outlived their channel's close
    assert errors == []
