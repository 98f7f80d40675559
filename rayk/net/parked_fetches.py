"""ParkedFetches: how many consumer fetches a listener keeps waiting at one replica.

A fetch that waits for `min_bytes` waits inside its replica's call (the replica answers
the moment data arrives), so it holds one of the replica actor's concurrent-call slots
(Ray's max_concurrency, 1000 for an async actor) for up to its max wait. Many such
fetches could leave no slot for the produce requests and follower fetches the replica
must serve. So a listener parks at most MAX_PARKED_PER_PARTITION fetches at one
partition; a fetch past that is answered at once with what is there (as if its max wait
were 0), and its client simply fetches again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

MAX_PARKED_PER_PARTITION = 200  # of the replica's 1000 call slots


class ParkedFetches:
    """A listener's count of consumer fetches waiting at each partition's replica, at most
    `max_per_partition` each; `wait_ms` hands a fetch its wait and counts it while it lasts.
    Held by the BrokerView; not thread-safe (the listener's event loop)."""

    def __init__(self, max_per_partition: int = MAX_PARKED_PER_PARTITION) -> None:
        self.max_per_partition = max_per_partition
        self._parked: Counter[tuple[str, int]] = Counter()

    @asynccontextmanager
    async def wait_ms(self, topic: str, partition: int, wait_ms: int) -> AsyncIterator[int]:
        """The wait a fetch of the partition may have: `wait_ms`, or 0 once
        `max_per_partition` fetches are already waiting there."""
        tp = (topic, partition)
        if wait_ms <= 0 or self._parked[tp] >= self.max_per_partition:
            yield 0
            return
        self._parked[tp] += 1
        try:
            yield wait_ms
        finally:
            self._parked[tp] -= 1
            if not self._parked[tp]:
                del self._parked[tp]

    def parked(self, topic: str, partition: int) -> int:
        return self._parked[(topic, partition)]
