"""The stream's read-ahead queue (server.inbox): bounded by messages and by bytes, one large message passes."""

from __future__ import annotations

import asyncio

import pytest

from server.drain import ShuttingDown, StreamDrain
from server.inbox import Inbox, message_bytes


def _frame(n: int) -> dict[str, object]:
    return {"type": "websocket.receive", "bytes": b"\x00" * n}


def test_message_bytes() -> None:
    assert message_bytes(_frame(10)) == 10
    assert message_bytes({"type": "websocket.receive", "text": "abc"}) == 3
    assert message_bytes({"type": "websocket.disconnect"}) == 0
    assert message_bytes(ValueError("an error")) == 0


def test_the_reader_waits_once_the_bytes_are_queued() -> None:
    async def scenario() -> None:
        inbox: Inbox[object] = Inbox(max_messages=64, max_bytes=100)
        await inbox.put(_frame(60))
        await inbox.put(_frame(60))  # 60 < 100 when it was put: taken in
        blocked = asyncio.ensure_future(inbox.put(_frame(1)))
        await asyncio.sleep(0.05)
        assert not blocked.done() and len(inbox) == 2 and inbox.queued_bytes == 120
        assert message_bytes(inbox.get_nowait()) == 60  # 60 left: room again
        await asyncio.wait_for(blocked, 1)
        assert len(inbox) == 2 and inbox.queued_bytes == 61
        assert message_bytes(await inbox.get()) == 60
        assert message_bytes(await inbox.get()) == 1
        assert inbox.empty() and inbox.queued_bytes == 0

    asyncio.run(scenario())


def test_one_message_larger_than_the_budget_still_passes() -> None:
    async def scenario() -> None:
        inbox: Inbox[object] = Inbox(max_messages=64, max_bytes=100)
        await asyncio.wait_for(inbox.put(_frame(1000)), 1)
        blocked = asyncio.ensure_future(inbox.put(_frame(1)))
        await asyncio.sleep(0.05)
        assert not blocked.done()
        getter = asyncio.ensure_future(inbox.get())
        assert message_bytes(await asyncio.wait_for(getter, 1)) == 1000
        await asyncio.wait_for(blocked, 1)

    asyncio.run(scenario())


def test_the_count_bounds_small_messages_and_get_waits_for_one() -> None:
    async def scenario() -> None:
        inbox: Inbox[object] = Inbox(max_messages=3, max_bytes=1 << 20)
        for _ in range(3):
            await inbox.put(_frame(1))
        blocked = asyncio.ensure_future(inbox.put(_frame(1)))
        await asyncio.sleep(0.05)
        assert not blocked.done() and len(inbox) == 3
        for _ in range(3):
            inbox.get_nowait()
        await asyncio.wait_for(blocked, 1)
        inbox.get_nowait()
        waiting = asyncio.ensure_future(inbox.get())
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await inbox.put(_frame(5))
        assert message_bytes(await asyncio.wait_for(waiting, 1)) == 5

    asyncio.run(scenario())


def test_the_shutdown_marker_goes_behind_a_full_inbox_and_no_stream_opens_after_it() -> None:
    """The drain (server.drain) queues its marker past the bounds, behind the audio a stream received, while the
    reader waits for room; a stream that starts once the drain began is refused; the drain waits for the
    streams only as long as it is given."""

    async def scenario() -> None:
        marker = "stop"
        drain = StreamDrain(lambda: marker)
        inbox: Inbox[object] = Inbox(max_messages=2, max_bytes=100)
        drain.add(inbox)
        await inbox.put(_frame(1))
        await inbox.put(_frame(2))
        blocked = asyncio.ensure_future(inbox.put(_frame(3)))  # the reader, waiting for room
        assert not await drain.drain(0.05)  # nothing took the messages: the drain gave up
        assert [message_bytes(inbox.get_nowait()), message_bytes(inbox.get_nowait())] == [1, 2]
        assert inbox.get_nowait() == marker
        await asyncio.wait_for(blocked, 1)  # room again: the frame sent after the marker comes after it
        assert message_bytes(inbox.get_nowait()) == 3
        with pytest.raises(ShuttingDown):
            drain.add(Inbox(2, 100))
        ended = asyncio.ensure_future(drain.drain(5))
        await asyncio.sleep(0.05)
        assert not ended.done() and len(drain) == 1
        drain.discard(inbox)  # the stream ended
        assert await asyncio.wait_for(ended, 1)

    asyncio.run(scenario())
