"""TransactionStatePartitionReplica: a replica of a `__transaction_state` partition, whose
leader is the transaction coordinator of the transactional ids that map to it (see
transaction_coordinator.py).

A CoordinatorReplica (coordinator_replica.py: the coordinator loaded on leadership and
closed without it, the only writer of its partition). The coordinator's epoch is the
partition's leader epoch, so the markers of a coordinator that lost its partition are
refused by the partition leaders (TRANSACTION_COORDINATOR_FENCED). What the coordinator
needs from the cluster comes through the Controller's handle:
- producer ids, from the Controller's producer id blocks (`init_producer_id`);
- the markers, to each partition's current leader (`PartitionReplica.write_txn_marker`);
  a leader that cannot be reached is NOT_LEADER_OR_FOLLOWER, which the coordinator retries.

While it leads, two timers run (Kafka's names): every
`transaction.abort.timed.out.transaction.cleanup.interval.ms` the transactions past their
timeout are fenced and aborted, and every
`transaction.remove.expired.transaction.cleanup.interval.ms` the ids idle for
`transactional.id.expiration.ms` are deleted.
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import Any

from ray.exceptions import RayError

from rayk.actors.named_actor import handle_of
from rayk.coordinator.coordinator_log import LogEntry
from rayk.coordinator.coordinator_replica import CoordinatorLease, CoordinatorReplica
from rayk.coordinator.transaction.transaction_coordinator import TransactionConfig, TransactionCoordinator
from rayk.coordinator.transaction.transaction_metadata import TV1, TransactionMetadata
from rayk.errors import CoordinatorNotAvailableError, KafkaError, NotLeaderOrFollowerError

logger = logging.getLogger(__name__)

MARKER_TIMEOUT_MS = 30_000  # a marker's acks=all wait at its partition leader (Kafka's request.timeout.ms)


class TransactionStatePartitionReplica(CoordinatorReplica):
    """The replica actor of one `__transaction_state` partition: while it leads, it owns the
    TransactionCoordinator of the ids mapped to the partition, its timers, and the handles
    of the partition leaders its markers go to."""

    coordinator_name = "transaction coordinator"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timers: asyncio.Task | None = None
        self._leaders: dict[tuple[str, int], Any] = {}  # partition -> its leader replica's handle, as last found

    async def _open_coordinator(self, records: list[LogEntry], lease: CoordinatorLease) -> TransactionCoordinator:
        c = self._broker_config
        coordinator = TransactionCoordinator(
            partial(self._append_records, lease), self._write_marker, self._new_producer_id, lease.leader_epoch,
            TransactionConfig(c.transaction_max_timeout_ms, c.transactional_id_expiration_ms),
        )
        # (only the coordinator writes here: no transactional batch or marker is in this log)
        skipped = coordinator.load((r[1], r[2]) for r in records if isinstance(r, tuple) and r[1] is not None)
        if skipped:
            logger.error("%s-%d: the coordinator skipped %d records it cannot read", self.topic, self.partition, skipped)
        coordinator.resume()
        self._timers = asyncio.get_running_loop().create_task(self._run_timers(coordinator))
        return coordinator

    async def _stop_coordinator(self, coordinator: TransactionCoordinator) -> None:
        if self._timers is not None:
            self._timers.cancel()
            await asyncio.gather(self._timers, return_exceptions=True)
            self._timers = None
        await coordinator.close()

    async def _run_timers(self, coordinator: TransactionCoordinator) -> None:
        c = self._broker_config
        abort_every_s = c.transaction_abort_timed_out_transaction_cleanup_interval_ms / 1000
        expire_every_s = c.transaction_remove_expired_transaction_cleanup_interval_ms / 1000
        loop = asyncio.get_running_loop()
        next_expiry = loop.time() + expire_every_s
        while True:
            await asyncio.sleep(min(abort_every_s, max(next_expiry - loop.time(), 0)))
            try:
                aborted = await coordinator.abort_timed_out()
                if aborted:
                    logger.info("%s-%d: aborted the timed-out transactions of %s", self.topic, self.partition, aborted)
                if loop.time() >= next_expiry:
                    next_expiry = loop.time() + expire_every_s
                    expired = await coordinator.expire()
                    if expired:
                        logger.info("%s-%d: expired the idle transactional ids %s", self.topic, self.partition, expired)
            except KafkaError as e:  # a write refused (no longer leading, too few in sync): next round
                logger.warning("%s-%d: transaction timers: %s", self.topic, self.partition, e)
            except Exception:  # a bug: logged, and the timers go on
                logger.exception("%s-%d: transaction timers", self.topic, self.partition)

    async def _new_producer_id(self) -> int:
        try:
            controller = await handle_of(self._controller)
            return await controller.init_producer_id.remote()
        except RayError as e:  # the Controller restarting: the client retries
            raise CoordinatorNotAvailableError(f"no producer id from the Controller: {e}") from None

    async def _write_marker(
        self, topic: str, partition: int, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int
    ) -> None:
        """The marker at the partition's leader, whose handle is kept until a marker to it
        fails (then the Controller is asked again): a transaction's end costs one call per
        partition."""
        tp = (topic, partition)
        try:
            leader = self._leaders.get(tp)
            if leader is None:
                controller = await handle_of(self._controller)
                leader = self._leaders[tp] = await controller.leader.remote(topic, partition)
            result = await leader.write_txn_marker.remote(producer_id, producer_epoch, commit, coordinator_epoch, MARKER_TIMEOUT_MS)
        except KafkaError:
            self._leaders.pop(tp, None)
            raise
        except RayError as e:
            self._leaders.pop(tp, None)
            raise NotLeaderOrFollowerError(f"the leader of {topic}-{partition} could not be reached: {e}") from None
        if result.error is not None:
            self._leaders.pop(tp, None)
            raise result.error

    # ------------------------------------------------------------------ the transaction APIs

    async def init_producer_id(
        self, transactional_id: str, txn_timeout_ms: int, expected: tuple[int, int] | None = None
    ) -> tuple[int, int]:
        return await self._require_coordinator().init_producer_id(transactional_id, txn_timeout_ms, expected)

    async def add_partitions_to_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: list[tuple[str, int]],
        client_transaction_version: int = TV1,
    ) -> None:
        await self._require_coordinator().add_partitions(transactional_id, producer_id, producer_epoch, partitions,
                                                         client_transaction_version)  # fmt: skip

    async def verify_partitions(
        self, transactional_id: str, producer_id: int, producer_epoch: int, partitions: list[tuple[str, int]]
    ) -> list[tuple[str, int]]:
        return await self._require_coordinator().verify_partitions(transactional_id, producer_id, producer_epoch, partitions)

    async def end_txn(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool,
        client_transaction_version: int = TV1,
    ) -> tuple[int, int]:
        return await self._require_coordinator().end_transaction(transactional_id, producer_id, producer_epoch, commit,
                                                                 client_transaction_version)  # fmt: skip

    async def transactions(self) -> list[TransactionMetadata]:
        """Every transactional id's metadata here; [] unless this replica coordinates."""
        return self._coordinator.transactions() if self._coordinator is not None else []

    async def describe_transaction(self, transactional_id: str) -> TransactionMetadata | None:
        return self._require_coordinator().metadata(transactional_id)
