"""The per-stream bounded queue: never blocks the core, ends a stream that falls
behind instead of growing (Linkerd §3.1)."""

from __future__ import annotations

import asyncio

import pytest

from linkerd_api.queue import UpdateQueue
from testkit.polling import HANG


def msg(i: int) -> tuple[str, bytes]:
    return (str(i), bytes([i]))


async def test_messages_come_out_in_order() -> None:
    q = UpdateQueue(3)
    assert all(q.push(msg(i)) for i in range(3))
    assert [await q.next() for _ in range(3)] == [msg(0), msg(1), msg(2)]


async def test_a_full_queue_ends_the_stream_and_forgets_what_it_held() -> None:
    q = UpdateQueue(2)
    assert q.push(msg(1)) and q.push(msg(2))
    assert q.push(msg(3)) is False
    assert q.overflowed and q.ended and len(q) == 0
    assert await q.next() is None
    assert q.push(msg(4)) is False


async def test_a_waiting_writer_is_woken_by_a_push_and_by_the_end() -> None:
    q = UpdateQueue(1)
    reader = asyncio.create_task(q.next())
    await asyncio.sleep(0)  # let it start waiting (scheduling, not synchronisation)
    assert not reader.done()
    q.push(msg(5))
    assert await asyncio.wait_for(reader, HANG) == msg(5)
    reader = asyncio.create_task(q.next())
    await asyncio.sleep(0)
    q.end()
    assert await asyncio.wait_for(reader, HANG) is None
    assert not q.overflowed


def test_a_queue_holds_at_least_one_message() -> None:
    with pytest.raises(ValueError):
        UpdateQueue(0)
