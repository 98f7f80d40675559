"""CoordinatorReplica: a replica of an internal topic's partition whose leader hosts a
coordinator (the group coordinator in `__consumer_offsets`, offsets_replica.py; the
transaction coordinator in `__transaction_state`, transaction_state_replica.py).

It is a PartitionReplica (replication works unchanged) that, on becoming leader in a new
epoch, replays its log into a fresh coordinator (`_open_coordinator`), and on losing
leadership, closing or being deleted closes it (`_close_coordinator`), so that clients get
NOT_COORDINATOR and look the coordinator up again. Coordinator writes go through
PartitionReplica's produce path with acks=all (`_append_records`), so a write is
acknowledged only once the ISR holds it.

Each load grants the new coordinator a CoordinatorLease, its right to write, bound to the
leader epoch it was loaded in; closing the coordinator revokes it. Every append checks the
lease right before producing: a closed coordinator's requests still under way (queued on
one of its group locks while the replica, leading a new epoch, loaded its successor) are
NOT_COORDINATOR and append nothing, so the successor, loaded from the log, stays the only
writer, its memory what the log says.

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
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True, eq=False)
class CoordinatorLease:
    """One loaded coordinator's right to write its partition: granted by its load, in the
    replica's leader epoch of that moment, and revoked when the coordinator is closed (the
    replica holds the current one; compared by identity)."""

    leader_epoch: int


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
        self._lease: CoordinatorLease | None = None  # the current coordinator's (or the loading one's)
        self._last_load: dict[str, float] = {}  # what the latest coordinator load replayed, and how long it took
        # One transactional write per producer at a time (a lock lives while a write holds it).
        self._producer_locks: weakref.WeakValueDictionary[int, asyncio.Lock] = weakref.WeakValueDictionary()
        self._background: set[asyncio.Task] = set()  # the coordinator's tasks, held until done

    # ------------------------------------------------------------------ what a coordinator replica defines

    async def _open_coordinator(self, records: list[LogEntry], lease: CoordinatorLease) -> Any:
        """A coordinator loaded from the partition's log (coordinator_log.py), started,
        writing through the appends bound to `lease` (`_append_records`,
        `_append_transactional_records`)."""
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
        lease = self._lease = CoordinatorLease(self._ctx.leader_epoch)
        try:
            records = read_coordinator_log(self._log, f"{self.topic}-{self.partition}")
            coordinator = await self._open_coordinator(records, lease)
        except Exception:  # (not the records': a coordinator's load skips those) a log that cannot be read
            if self._lease is lease:
                self._lease = None
            logger.exception("%s-%d: could not load the %s; the next leadership push retries",
                             self.topic, self.partition, self.coordinator_name)
            return
        if self._lease is not lease:  # closed (or loaded again) while it loaded: it never serves
            await self._stop_coordinator(coordinator)
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
        self._lease = None  # (first: what the closed coordinator still has under way writes nothing)
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

    def _check_lease(self, lease: CoordinatorLease) -> None:
        """NOT_COORDINATOR unless `lease`'s coordinator is still the current one and the
        replica leads in the epoch it was loaded in (see the module docstring). Called
        right before producing, whose call appends in the epoch it starts in or not at all."""
        if self._lease is not lease or not self._ctx.leads_in(lease.leader_epoch):
            raise NotCoordinatorError(
                f"the {self.coordinator_name} of {self.topic}-{self.partition} loaded in leader epoch "
                f"{lease.leader_epoch} was closed: find the coordinator again"
            )

    async def _append_records(self, lease: CoordinatorLease, records: list[tuple[bytes, bytes | None]],
                              acks: int = -1) -> int:  # fmt: skip
        """Writes the coordinator's records (bound to its `lease` when it is opened); the
        log offset of the first."""
        self._check_lease(lease)
        batch = build_batch([SimpleRecord(value, key) for key, value in records])
        (result,) = await super().produce_requests([ProduceRequest(batch, acks, COORDINATOR_WRITE_TIMEOUT_MS)])
        if result.error is not None:
            raise result.error
        return result.base_offset

    async def _append_transactional_records(
        self, lease: CoordinatorLease, records: list[tuple[bytes, bytes | None]], transactional_id: str,
        producer_id: int, producer_epoch: int,
    ) -> int:
        """Writes records as a transactional producer's batch (TxnOffsetCommit's offsets),
        with the producer's next sequence here, through the produce path: its epoch is
        checked and its first batch of a transaction verified with the transaction
        coordinator (txn_verification.py), as any transactional write. The log offset of
        the first."""
        lock = self._producer_locks.get(producer_id)
        if lock is None:
            lock = self._producer_locks[producer_id] = asyncio.Lock()
        async with lock:
            self._check_lease(lease)  # (after the producer's lock, which may have been awaited)
            entry = self._log.producer_state.producers.get(producer_id)
            sequence = entry.next_sequence % (1 << 31) if entry is not None and entry.epoch == producer_epoch else 0
            batch = build_batch([SimpleRecord(value, key) for key, value in records], producer_id=producer_id,
                                producer_epoch=producer_epoch, base_sequence=sequence, is_transactional=True)  # fmt: skip
            request = ProduceRequest(batch, -1, COORDINATOR_WRITE_TIMEOUT_MS, transactional_id)
            (result,) = await super().produce_requests([request])
        if result.error is not None:
            raise result.error
        return result.base_offset

    def _require_coordinator(self) -> Any:
        if self._coordinator is None:
            raise NotCoordinatorError(
                f"broker {self.broker_id} does not host the {self.coordinator_name} of {self.topic}-{self.partition}: "
                "find the coordinator again"
            )
        return self._coordinator
