"""A stream's read-ahead queue, bounded by message count *and* by bytes.

A WebSocket frame may be up to 16 MiB, so a queue of 64 messages alone let one stream hold about 1 GiB (a
client sending large frames faster than the model runs). Here a message is taken in only while fewer than
``max_messages`` are queued and they hold fewer than ``max_bytes``; one message is always taken in, so a single
frame larger than ``max_bytes`` still passes. The reader then waits, and TCP throttles the client.

One producer (the stream's reader task) and one consumer (its processing loop), on one event loop.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


def message_bytes(item: object) -> int:
    """What an ASGI WebSocket message holds in memory (0 for anything else, e.g. an error)."""
    if isinstance(item, dict):
        return len(item.get("bytes") or b"") + len(item.get("text") or "")
    return 0


class Inbox(Generic[T]):
    def __init__(self, max_messages: int, max_bytes: int) -> None:
        self.max_messages, self.max_bytes = max_messages, max_bytes
        self._items: deque[tuple[T, int]] = deque()
        self._bytes = 0
        self._filled = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def empty(self) -> bool:
        return not self._items

    def _has_room(self) -> bool:
        return not self._items or (len(self._items) < self.max_messages and self._bytes < self.max_bytes)

    async def put(self, item: T) -> None:
        while not self._has_room():
            self._room.clear()
            await self._room.wait()
        self.push(item)

    def push(self, item: T) -> None:
        """Queue ``item`` now, past the bounds (for a marker that must not wait behind a reader waiting for room)."""
        size = message_bytes(item)
        self._items.append((item, size))
        self._bytes += size
        self._filled.set()

    async def get(self) -> T:
        while not self._items:
            self._filled.clear()
            await self._filled.wait()
        return self.get_nowait()

    def get_nowait(self) -> T:
        """The oldest message; IndexError when empty (check :meth:`empty` first)."""
        item, size = self._items.popleft()
        self._bytes -= size
        if self._has_room():
            self._room.set()
        return item
