"""Handoff: a bounded FIFO from one task to one other of the same event loop.

The listener hands each connection's frames from its reading task to its processing task,
and their answers on to its writing task, through two of these (socket_server.py).
asyncio.Queue did that job at ~8 Python calls a put and a get (`full`, `qsize`, `empty`,
`_wakeup_next`, the unfinished-task count and its Event, ...), for any number of waiting
producers and consumers; a connection has one of each, which needs one waiting future
a side. Its semantics are asyncio.Queue's for that case: `put` waits while `max_items`
items are held, `get` while none is, and a waiter cancelled while waiting takes nothing
and loses nothing. Not thread-safe: one event loop's.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")


class Handoff(Generic[T]):
    """Items from one producer task to one consumer task, at most `max_items` held."""

    __slots__ = ("_items", "_max_items", "_getter", "_putter")

    def __init__(self, max_items: int) -> None:
        assert max_items > 0, max_items
        self._items: deque[T] = deque()
        self._max_items = max_items
        self._getter: asyncio.Future[None] | None = None  # the consumer, waiting for an item
        self._putter: asyncio.Future[None] | None = None  # the producer, waiting for room

    def empty(self) -> bool:
        return not self._items

    def put_nowait(self, item: T) -> None:
        """Adds `item` (asyncio.QueueFull if `max_items` are held) and wakes the consumer."""
        if len(self._items) >= self._max_items:
            raise asyncio.QueueFull
        self._items.append(item)
        getter = self._getter
        if getter is not None and not getter.done():
            getter.set_result(None)

    def __len__(self) -> int:
        return len(self._items)

    async def put(self, item: T) -> None:
        """Adds `item` once fewer than `max_items` are held."""
        await self.wait_until_fewer(self._max_items)
        self.put_nowait(item)

    async def wait_until_fewer(self, count: int) -> None:
        """Returns once fewer than `count` items are held (the producer's wait for room)."""
        while len(self._items) >= count:
            assert self._putter is None, "a Handoff has one producer"
            self._putter = asyncio.get_running_loop().create_future()
            try:
                await self._putter
            finally:
                self._putter = None

    def get_nowait(self) -> T:
        """The oldest item (asyncio.QueueEmpty if none); wakes the producer."""
        if not self._items:
            raise asyncio.QueueEmpty
        item = self._items.popleft()
        putter = self._putter
        if putter is not None and not putter.done():
            putter.set_result(None)
        return item

    async def get(self) -> T:
        """The oldest item, once there is one."""
        while not self._items:
            assert self._getter is None, "a Handoff has one consumer"
            self._getter = asyncio.get_running_loop().create_future()
            try:
                await self._getter
            finally:
                self._getter = None
        return self.get_nowait()
