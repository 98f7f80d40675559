"""OffsetsPartitionReplica: a replica of a `__consumer_offsets` partition, whose leader is
the group coordinator of the groups that map to it (see `group_coordinator.py`).

It is a PartitionReplica (replication works unchanged) that, on becoming leader in a new
epoch, replays its log into a fresh GroupCoordinator, and on losing leadership closes it,
so waiting members get NOT_COORDINATOR and look the coordinator up again. Coordinator
writes go through PartitionReplica's produce path with acks=all, so a commit is
acknowledged only once the ISR holds it. Group requests to a replica that is not the
coordinator raise NOT_COORDINATOR.

The coordinator is the only writer: `produce` and `produce_requests`, where clients' records
come in (a listener's Produce, the Python Producer), answer INVALID_TOPIC_EXCEPTION and
append nothing, as Kafka refuses client appends to internal topics. A forged record could
otherwise move another group's offsets, or, unreadable, stop the next load.

The load skips a record it cannot read, with an error logged (see GroupCoordinator.load);
should the whole load fail (the log cannot be read), the error is logged, the replica
leads without a coordinator (NOT_COORDINATOR, which clients retry) and the next
become_leader, even in the same epoch, loads again.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rayk.actors.consumer_group import JoinResult
from rayk.actors.group_coordinator import CommittedOffset, GroupCoordinator
from rayk.actors.partition_replica import PartitionReplica, ProduceResult
from rayk.config import BrokerConfig
from rayk.errors import InvalidTopicError, KafkaError, NotCoordinatorError
from rayk.storage.records import SimpleRecord, build_batch, iter_batches

logger = logging.getLogger(__name__)

COORDINATOR_WRITE_TIMEOUT_MS = 5_000
_LOAD_CHUNK_BYTES = 1 << 20


class OffsetsPartitionReplica(PartitionReplica):
    def __init__(self, *args: Any, broker_config: BrokerConfig | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._broker_config = broker_config or BrokerConfig()
        self._coordinator: GroupCoordinator | None = None
        self._last_load: dict[str, float] = {}  # what the latest coordinator load replayed, and how long it took

    async def become_leader(self, leader_epoch: int, replicas: list[int], isr: list[int], partition_epoch: int = 0) -> None:
        was_leading_this_epoch = self._role == "leader" and self._leader_epoch == leader_epoch
        await super().become_leader(leader_epoch, replicas, isr, partition_epoch)
        if not was_leading_this_epoch or self._coordinator is None:
            self._start_coordinator()

    def _start_coordinator(self) -> None:
        """Replays the log into a new coordinator; if that fails, logs why and leaves none."""
        self._close_coordinator()
        coordinator = GroupCoordinator(self._append_records, self._broker_config)
        started = time.monotonic()
        try:
            records = self._local_records()
            coordinator.load(records, f"{self.topic}-{self.partition}")
        except Exception:  # (not the records': load skips those) a log that cannot be read
            logger.exception("%s-%d: could not load the group coordinator; the next leadership push retries",
                             self.topic, self.partition)
            coordinator.close()
            return
        self._last_load = {"records": len(records), "ms": (time.monotonic() - started) * 1000}
        coordinator.start()
        self._coordinator = coordinator

    async def describe(self) -> dict[str, Any]:
        """PartitionReplica.describe, plus what the last coordinator load replayed: the
        records (bounded by compaction) and the milliseconds it took."""
        return {**await super().describe(), "coordinator_load": dict(self._last_load)}

    async def become_follower(self, leader_epoch: int, leader_id: int, leader: Any, incarnation_id: str = "") -> None:
        await super().become_follower(leader_epoch, leader_id, leader, incarnation_id)
        self._close_coordinator()

    async def close(self) -> Any:
        self._close_coordinator()
        return await super().close()

    async def delete(self) -> None:
        self._close_coordinator()
        await super().delete()

    def _close_coordinator(self) -> None:
        if self._coordinator is not None:
            self._coordinator.close()
            self._coordinator = None

    def _local_records(self) -> list[tuple[int, bytes | None, bytes | None]]:
        """The log's records as (offset, key, value); a batch that does not decode is
        skipped with an error logged (its records are unreadable to any coordinator)."""
        out = []
        offset = self._log.log_start_offset
        while offset < self._log.log_end_offset:
            result = self._log.read(offset, _LOAD_CHUNK_BYTES)
            for batch in iter_batches(result.records):
                try:
                    out += [(r.offset, r.key, r.value) for r in batch.records()]
                except KafkaError as e:
                    logger.error("%s-%d offset %d: skipped a batch that does not decode: %s",
                                 self.topic, self.partition, batch.header.base_offset, e)
            offset = result.next_offset
        return out

    # ------------------------------------------------------------------ writes: the coordinator's only

    async def produce(self, records: bytes, acks: int, timeout_ms: int) -> ProduceResult:
        return (await self.produce_requests([(records, acks, timeout_ms)]))[0]

    async def produce_requests(self, requests: list[tuple[bytes, int, int]]) -> list[ProduceResult]:
        """A client's produce: refused, INVALID_TOPIC_EXCEPTION (see the module docstring)."""
        counters = self._counters
        counters.produce_requests += len(requests)
        counters.failed_produce_requests += len(requests)
        counters.maybe_flush()
        error = InvalidTopicError(f"{self.topic} is an internal topic: only the group coordinator writes to it")
        return [self._produce_error(error) for _ in requests]

    async def _append_records(self, records: list[tuple[bytes, bytes | None]]) -> None:
        batch = build_batch([SimpleRecord(value, key) for key, value in records])
        (result,) = await super().produce_requests([(batch, -1, COORDINATOR_WRITE_TIMEOUT_MS)])
        if result.error is not None:
            raise result.error

    def _require_coordinator(self) -> GroupCoordinator:
        if self._coordinator is None:
            raise NotCoordinatorError(
                f"broker {self.broker_id} does not coordinate groups of {self.topic}-{self.partition}: find the coordinator again"
            )
        return self._coordinator

    # ------------------------------------------------------------------ group requests

    async def join_group(
        self,
        group_id: str,
        member_id: str,
        client_id: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        protocol_type: str,
        protocols: list[tuple[str, bytes]],
        group_instance_id: str | None = None,
    ) -> JoinResult:
        return await self._require_coordinator().join_group(
            group_id, member_id, client_id, session_timeout_ms, rebalance_timeout_ms, protocol_type, protocols,
            group_instance_id,
        )  # fmt: skip

    async def sync_group(
        self, group_id: str, generation: int, member_id: str, assignments: dict | None, group_instance_id: str | None = None
    ) -> bytes:
        return await self._require_coordinator().sync_group(group_id, generation, member_id, assignments, group_instance_id)

    async def heartbeat(self, group_id: str, generation: int, member_id: str, group_instance_id: str | None = None) -> None:
        await self._require_coordinator().heartbeat(group_id, generation, member_id, group_instance_id)

    async def leave_group(self, group_id: str, member_id: str, group_instance_id: str | None = None) -> None:
        await self._require_coordinator().leave_group(group_id, member_id, group_instance_id)

    async def commit_offsets(
        self, group_id: str, generation: int, member_id: str, offsets: dict, group_instance_id: str | None = None
    ) -> None:
        await self._require_coordinator().commit_offsets(group_id, generation, member_id, offsets, group_instance_id)

    async def fetch_offsets(self, group_id: str, partitions: list | None = None) -> dict[tuple[str, int], CommittedOffset]:
        return await self._require_coordinator().fetch_offsets(group_id, partitions)

    async def list_groups(self) -> list[dict]:
        return await self._require_coordinator().list_groups()

    async def describe_group(self, group_id: str) -> dict:
        return await self._require_coordinator().describe_group(group_id)

    async def delete_group(self, group_id: str) -> None:
        await self._require_coordinator().delete_group(group_id)

    async def delete_offsets(self, group_id: str, partitions: list) -> dict:
        return await self._require_coordinator().delete_offsets(group_id, partitions)

    async def committed_offsets(self) -> dict[str, dict[tuple[str, int], int]]:
        """Every group's committed offsets here, {} unless this replica coordinates (see group_lag.py)."""
        return self._coordinator.committed_offsets() if self._coordinator is not None else {}
