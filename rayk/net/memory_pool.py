"""MemoryPool: the listener's budget of request bytes (Kafka's `queued.max.request.bytes`).

A connection reserves a frame's size, as its size prefix declares it, before it reads the
frame's body, and gives the bytes back once the request is answered. When the pool is
spent, connections wait to read their next frame, and TCP pushes back on their clients:
the listener's memory for requests it holds is bounded by the pool, whatever clients
declare. Only authenticated connections reserve here: before authentication (a SASL
listener's connection until SaslAuthenticate succeeds) frames are read outside the pool,
one at a time and at most `sasl.server.max.receive.size` each (rayk/net/socket_server.py),
so unauthenticated clients cannot spend it. Reservations are served in arrival order, so
a large frame is not starved by a stream of small ones. Every frame fits: the pool is at
least `socket.request.max.bytes` (checked in rayk/config.py).
"""

from __future__ import annotations

import asyncio
from collections import deque

UNBOUNDED = -1  # Kafka's value for no limit


class MemoryPool:
    """A listener's budget of request bytes: owns the bytes available and the reservations
    waiting, in arrival order; UNBOUNDED leaves it unlimited. Made with its SocketServer;
    not thread-safe (the listener's event loop)."""

    def __init__(self, capacity_bytes: int) -> None:
        assert capacity_bytes == UNBOUNDED or capacity_bytes > 0, capacity_bytes
        self.capacity_bytes = capacity_bytes
        self.available_bytes = capacity_bytes
        self._waiters: deque[tuple[int, asyncio.Future]] = deque()

    async def reserve(self, size_bytes: int) -> None:
        """Waits until `size_bytes` are free, in arrival order, and takes them."""
        if self.capacity_bytes == UNBOUNDED:
            return
        assert 0 <= size_bytes <= self.capacity_bytes, (size_bytes, self.capacity_bytes)
        if not self._waiters and self.available_bytes >= size_bytes:
            self.available_bytes -= size_bytes
            return
        granted = asyncio.get_running_loop().create_future()
        waiter = (size_bytes, granted)
        self._waiters.append(waiter)
        try:
            await granted
        except asyncio.CancelledError:
            if not granted.cancelled():
                self.release(size_bytes)  # granted as the wait was cancelled: give it back
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
                self._grant()  # a large frame ahead may have held smaller ones back
            raise

    def try_reserve(self, size_bytes: int) -> bool:
        """Takes `size_bytes` now if they are free and no reservation waits before: True;
        else takes nothing (`reserve` waits its turn)."""
        if self.capacity_bytes == UNBOUNDED:
            return True
        assert 0 <= size_bytes <= self.capacity_bytes, (size_bytes, self.capacity_bytes)
        if self._waiters or self.available_bytes < size_bytes:
            return False
        self.available_bytes -= size_bytes
        return True

    def release(self, size_bytes: int) -> None:
        if self.capacity_bytes == UNBOUNDED:
            return
        self.available_bytes += size_bytes
        assert self.available_bytes <= self.capacity_bytes, (self.available_bytes, self.capacity_bytes)
        self._grant()

    @property
    def used_bytes(self) -> int:
        return 0 if self.capacity_bytes == UNBOUNDED else self.capacity_bytes - self.available_bytes

    def _grant(self) -> None:
        while self._waiters and (self._waiters[0][1].done() or self._waiters[0][0] <= self.available_bytes):
            size_bytes, granted = self._waiters.popleft()
            if granted.done():
                continue  # its task was cancelled (which cancels the future) and has not run since
            self.available_bytes -= size_bytes
            granted.set_result(None)
