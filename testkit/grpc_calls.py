"""grpc.aio client calls that outlive their test. A call cancelled (by the test, or by
its channel's close) still has a task of grpc's own waiting for the core to say it is
over. If the test's event loop closes first, that word comes later, to a loop that is
closed, and grpc's poller reports "Event loop is closed" from whatever loop runs next:
the next test's, where the traceback lands in its captured log. The tiers whose tests
are gRPC clients wait for those tasks at each test's end (`grpc_calls_settled`, autouse
in their conftest.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

# How long a test's teardown waits for its calls to be over: a cancelled call is over
# in milliseconds (thousands of them took 0.2 s on a loaded machine); a call left open
# is not waited for past this.
SETTLE_BOUND = 2.0


def _is_call_task(task: asyncio.Task[object]) -> bool:
    """A task grpc.aio runs for a client call (its status, its request stream)."""
    coro = task.get_coro()
    code = getattr(coro, "cr_code", None)
    return "grpc" in str(getattr(code, "co_filename", "")) and \
        "_AioCall." in str(getattr(coro, "__qualname__", ""))


async def settle_grpc_calls(bound: float = SETTLE_BOUND) -> int:
    """Wait (at most `bound` seconds) until no client call's task of grpc's is pending
    on this loop; how many were."""
    pending = [t for t in asyncio.all_tasks() if not t.done() and _is_call_task(t)]
    if pending:
        await asyncio.wait(pending, timeout=bound)
    return len(pending)


@pytest.fixture(autouse=True)
async def grpc_calls_settled() -> AsyncIterator[None]:
    """Autouse: set up before, so torn down after, the test's other fixtures (its
    channels closed and servers stopped), before its event loop closes."""
    yield
    await settle_grpc_calls()
