"""CoordinatorReplica: a replica of an internal topic's partition whose leader hosts a
coordinator (the group coordinator in `__consumer_offsets`, offsets_replica.py; the
transaction coordinator in `__transaction_state`, transaction_state_replica.py).

It is a PartitionReplica (replication works unchanged) that, on becoming leader in a new
epoch, replays its log into a fresh coordinator (`_open_coordinator`), and on losing
leadership, closing or being deleted closes it (`_close_coordinator`), so that clients get
NOT_COORDINATOR and look the coordinator up again. Coordinator writes go through
PartitionReplica's produce path with acks=all (`_append_records`), so a write is
acknowledged only once the ISR holds it.

The coordinator is the partition's only writer: `produce` and `produce_requests`, where
clients' records come in (a listener's Produce, the Python Producer), answer
INVALID_TOPIC_EXCEPTION and append nothing, as Kafka refuses client appends to internal
topics. A forged record could otherwise change another group's or transaction's state,
or, unreadable, stop the next load.

Should a load fail (the log cannot be read), the error is logged, the replica leads without
a coordinator (NOT_COORDINATOR, which clients retry) and the next become_leader, even in the
same epoch, loads again.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import Any

from rayk.coordinator.coordinator_log import LogEntry, read_coordinator_log
from rayk.replication.partition_replica import PartitionReplica, ProduceResult
from rayk.replication.replication_throttle import UNTHROTTLED, ThrottleSetting
from rayk.config import BrokerConfig
from rayk.dataplane.frames import ProduceRequest
from rayk.errors import InvalidTopicError, NotCoordinatorError
from rayk.storage.records import SimpleRecord, build_batch

logger = logging.getLogger(__name__)

COORDINATOR_WRITE_TIMEOUT_MS = 5_000


class CoordinatorReplica(PartitionReplica):
    """Base of the internal topics' replica actors: a PartitionReplica that owns, while it
    leads, one coordinator loaded from its log, and the locks and tasks of its writes. A
    subclass says which coordinator (`_open_coordinator`, `_stop_coordinator`). Not
    thread-safe: the actor's event loop."""

    coordinator_name = "coordinator"  # for messages: "group coordinator", "transaction coordinator"

    def __init__(self, *args: Any, broker_config: BrokerConfig | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._broker_config = broker_config or BrokerConfig()
        self._coordinator: Any = None
        self._last_load: dict[str, float] = {}  # what the latest coordinator load replayed, and how long it took
        # One transactional write per producer at a time (a lock lives while a write holds it).
        self._producer_locks: weakref.WeakValueDictionary[int, asyncio.Lock] = weakref.WeakValueDictionary()
        self._background: set[asyncio.Task] = set()  # the coordinator's tasks, held until done

    # ------------------------------------------------------------------ what a coordinator replica defines

    async def _open_coordinator(self, records: list[LogEntry]) -> Any:
        """A coordinator loaded from the partition's log (coordinator_log.py), started."""
        raise NotImplementedError

    async def _stop_coordinator(self, coordinator: Any) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ leadership

    async def become_leader(self, leader_epoch: int, replicas: list[int], isr: list[int], partition_epoch: int = 0,
                            throttle: ThrottleSetting = UNTHROTTLED) -> None:
        was_leading_this_epoch = self._ctx.leads_in(leader_epoch)
        await super().become_leader(leader_epoch, replicas, isr, partition_epoch, throttle)
        if not was_leading_this_epoch or self._coordinator is None:
            await self._start_coordinator()

    async def _start_coordinator(self) -> None:
        """Replays the log into a new coordinator; if that fails, logs why and leaves none."""
        await self._close_coordinator()
        started = time.monotonic()
        try:
            records = read_coordinator_log(self._log, f"{self.topic}-{self.partition}")
            coordinator = await self._open_coordinator(records)
        except Exception:  # (not the records': a coordinator's load skips those) a log that cannot be read
            logger.exception("%s-%d: could not load the %s; the next leadership push retries",
                             self.topic, self.partition, self.coordinator_name)
            return
        self._last_load = {"records": len(records), "ms": (time.monotonic() - started) * 1000}
        self._coordinator = coordinator

    async def describe(self) -> dict[str, Any]:
        """PartitionReplica.describe, plus what the last coordinator load replayed: the
        records (bounded by compaction) and the milliseconds it took."""
        return {**await super().describe(), "coordinator_load": dict(self._last_load)}

    async def become_follower(self, leader_epoch: int, leader_id: int, leader: Any, incarnation_id: str = "",
                              throttle: ThrottleSetting = UNTHROTTLED) -> None:
        await super().become_follower(leader_epoch, leader_id, leader, incarnation_id, throttle)
        await self._close_coordinator()

    async def close(self) -> Any:
        await self._close_coordinator()
        return await super().close()

    async def delete(self) -> None:
        await self._close_coordinator()
        await super().delete()

    async def _close_coordinator(self) -> None:
        if self._coordinator is not None:
            coordinator, self._coordinator = self._coordinator, None
            await self._stop_coordinator(coordinator)

    # ------------------------------------------------------------------ writes: the coordinator's only

    async def produce(self, records: bytes, acks: int, timeout_ms: int) -> ProduceResult:
        return (await self.produce_requests([ProduceRequest(records, acks, timeout_ms)]))[0]

    async def produce_requests(self, requests: list[ProduceRequest]) -> list[ProduceResult]:
        """A client's produce: refused, INVALID_TOPIC_EXCEPTION (see the module docstring)."""
        counters = self._ctx.counters
        counters.produce_requests += len(requests)
        counters.failed_produce_requests += len(requests)
        counters.maybe_flush()
        error = InvalidTopicError(f"{self.topic} is an internal topic: only the {self.coordinator_name} writes to it")
        return [self._produce.produce_error(error) for _ in requests]

    async def _append_records(self, records: list[tuple[bytes, bytes | None]], acks: int = -1) -> None:
        batch = build_batch([SimpleRecord(value, key) for key, value in records])
        (result,) = await super().produce_requests([ProduceRequest(batch, acks, COORDINATOR_WRITE_TIMEOUT_MS)])
        if result.error is not None:
            raise result.error

    async def _append_transactional_records(
        self, records: list[tuple[bytes, bytes | None]], transactional_id: str, producer_id: int, producer_epoch: int
    ) -> None:
        """Writes records as a transactional producer's batch (TxnOffsetCommit's offsets),
        with the producer's next sequence here, through the produce path: its epoch is
        checked and its first batch of a transaction verified with the transaction
        coordinator (txn_verification.py), as any transactional write."""
        lock = self._producer_locks.get(producer_id)
        if lock is None:
            lock = self._producer_locks[producer_id] = asyncio.Lock()
        async with lock:
            entry = self._log.producer_state.producers.get(producer_id)
            sequence = entry.next_sequence % (1 << 31) if entry is not None and entry.epoch == producer_epoch else 0
            batch = build_batch([SimpleRecord(value, key) for key, value in records], producer_id=producer_id,
                                producer_epoch=producer_epoch, base_sequence=sequence, is_transactional=True)  # fmt: skip
            request = ProduceRequest(batch, -1, COORDINATOR_WRITE_TIMEOUT_MS, transactional_id)
            (result,) = await super().produce_requests([request])
        if result.error is not None:
            raise result.error

    def _require_coordinator(self) -> Any:
        if self._coordinator is None:
            raise NotCoordinatorError(
                f"broker {self.broker_id} does not host the {self.coordinator_name} of {self.topic}-{self.partition}: "
                "find the coordinator again"
            )
        return self._coordinator
