"""OffsetsPartitionReplica: a replica of a `__consumer_offsets` partition, whose leader is
the group coordinator of the groups that map to it (see `group_coordinator.py`).

A CoordinatorReplica (coordinator_replica.py: the coordinator loaded on leadership and
closed without it, the only writer of its partition): group requests to a replica that is
not the coordinator raise NOT_COORDINATOR. The load skips a record it cannot read, with an
error logged (see GroupCoordinator.load).
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial

from ray.exceptions import RayError

from rayk.actors.named_actor import handle_of
from rayk.coordinator.group.consumer_group import JoinResult
from rayk.coordinator.group.consumer_protocol_group import ConsumerHeartbeat, HeartbeatAnswer
from rayk.coordinator.coordinator_log import LogEntry
from rayk.coordinator.coordinator_replica import CoordinatorLease, CoordinatorReplica
from rayk.coordinator.group.group_coordinator import GroupCoordinator
from rayk.coordinator.group.offset_records import CommittedOffset
from rayk.replication.partition_replica import ProduceResult
from rayk.replication.share.share_state import ShareStateRecord
from rayk.coordinator.share.share_group import ShareHeartbeatAnswer
from rayk.dataplane import frames
from rayk.errors import CoordinatorNotAvailableError, KafkaError

logger = logging.getLogger(__name__)

# A reset share state's leaders are told a few times (a leader that moves meanwhile reads
# the new state when it starts; one told nothing still hands out from the old state until
# its next write is fenced).
FORGET_SHARE_STATE_ATTEMPTS = 5
FORGET_SHARE_STATE_BACKOFF_MS = 500
TOPIC_LOOKUP_TIMEOUT_MS = 5_000  # a heartbeat waits no longer for the Controller to list the topics


class OffsetsPartitionReplica(CoordinatorReplica):
    """The replica actor of one `__consumer_offsets` partition: while it leads, it owns the
    GroupCoordinator of the groups mapped to the partition (loaded from its log) and hands it
    every group, offset and share-state request; otherwise NOT_COORDINATOR."""

    coordinator_name = "group coordinator"

    async def _open_coordinator(self, records: list[LogEntry], lease: CoordinatorLease) -> GroupCoordinator:
        coordinator = GroupCoordinator(partial(self._append_records, lease), self._broker_config,
                                       partial(self._append_transactional_records, lease), self._partition_counts,
                                       self._share_members_gone, self._share_states_reset)  # fmt: skip
        try:
            coordinator.load(records, f"{self.topic}-{self.partition}")
        except BaseException:
            coordinator.close()
            raise
        coordinator.start()
        return coordinator

    async def _stop_coordinator(self, coordinator: GroupCoordinator) -> None:
        coordinator.close()

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

    async def fetch_offsets(
        self, group_id: str, partitions: list | None = None, require_stable: bool = False,
        member_id: str | None = None, member_epoch: int = -1,
    ) -> dict[tuple[str, int], CommittedOffset]:
        return await self._require_coordinator().fetch_offsets(group_id, partitions, require_stable, member_id,
                                                               member_epoch)  # fmt: skip

    async def pending_partitions(self, group_id: str) -> set[tuple[str, int]]:
        return self._require_coordinator().pending_partitions(group_id)

    async def txn_commit_offsets(
        self, group_id: str, transactional_id: str, producer_id: int, producer_epoch: int, generation: int,
        member_id: str, offsets: dict, group_instance_id: str | None = None,
    ) -> None:
        await self._require_coordinator().txn_commit_offsets(
            group_id, transactional_id, producer_id, producer_epoch, generation, member_id, offsets, group_instance_id
        )

    async def write_txn_marker(
        self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int, timeout_ms: int
    ) -> ProduceResult:
        """PartitionReplica.write_txn_marker, then the producer's pending transactional
        offsets become committed (or are dropped) in the group coordinator."""
        result = await super().write_txn_marker(producer_id, producer_epoch, commit, coordinator_epoch, timeout_ms)
        if result.error is None and self._coordinator is not None:
            self._coordinator.complete_txn(producer_id, commit)
        return result

    async def list_groups(self) -> list[dict]:
        return await self._require_coordinator().list_groups()

    async def describe_group(self, group_id: str, consumer_protocol_too: bool = False) -> dict:
        return await self._require_coordinator().describe_group(group_id, consumer_protocol_too)

    async def consumer_heartbeat(self, group_id: str, heartbeat: ConsumerHeartbeat,
                                 partition_counts: dict[str, int] | None = None) -> HeartbeatAnswer:  # fmt: skip
        """A ConsumerGroupHeartbeat; `partition_counts`: every topic's (the listener
        passes them; None, from rayk's own consumer: asked of the Controller here)."""
        return await self._require_coordinator().consumer_heartbeat(group_id, heartbeat, partition_counts)

    async def _partition_counts(self) -> dict[str, int]:
        """Every topic's partition count, from the Controller (COORDINATOR_NOT_AVAILABLE if
        it does not answer in time: the member retries)."""
        try:
            controller = await handle_of(self._controller)
            described = await asyncio.wait_for(controller.client_metadata.remote(None), TOPIC_LOOKUP_TIMEOUT_MS / 1000)
        except (asyncio.TimeoutError, RayError) as e:
            raise CoordinatorNotAvailableError(f"could not look the topics up: {e!r}") from None
        return {name: len(t["partitions"]) for name, t in described["topics"].items()}

    async def describe_consumer_group(self, group_id: str) -> dict:
        return await self._require_coordinator().describe_consumer_group(group_id)

    async def delete_group(self, group_id: str) -> None:
        await self._require_coordinator().delete_group(group_id)

    async def delete_offsets(self, group_id: str, partitions: list) -> dict:
        return await self._require_coordinator().delete_offsets(group_id, partitions)

    async def committed_offsets(self) -> dict[str, dict[tuple[str, int], int]]:
        """Every group's committed offsets here, {} unless this replica coordinates (see group_lag.py)."""
        return self._coordinator.committed_offsets() if self._coordinator is not None else {}

    # ------------------------------------------------------------------ share groups (KIP-932)

    async def share_heartbeat(
        self, group_id: str, member_id: str, member_epoch: int, subscribed_topics: list[str] | None = None,
        client_id: str = "", client_host: str = "", rack_id: str | None = None,
        partition_counts: dict[str, int] | None = None,
    ) -> ShareHeartbeatAnswer:
        return await self._require_coordinator().share_heartbeat(group_id, member_id, member_epoch, subscribed_topics,
                                                                 client_id, client_host, rack_id, partition_counts)  # fmt: skip

    async def read_share_state(self, group_id: str, topic: str, partition: int,
                               leader_epoch: int) -> tuple[ShareStateRecord | None, int, str]:  # fmt: skip
        return await self._require_coordinator().read_share_state(group_id, topic, partition, leader_epoch)

    async def write_share_state(self, group_id: str, topic: str, partition: int, leader_epoch: int, state_epoch: int,
                                start_offset: int, batches: list[tuple[int, int, str, int]],
                                create: bool = False) -> None:  # fmt: skip
        await self._require_coordinator().write_share_state(group_id, topic, partition, leader_epoch, state_epoch,
                                                            start_offset, batches, create)  # fmt: skip

    async def _write_share_state_frame(self, write: frames.ShareStateWrite) -> KafkaError | None:
        try:
            await self.write_share_state(write.group_id, write.topic, write.partition, write.leader_epoch,
                                         write.state_epoch, write.start_offset, list(write.batches), write.create)  # fmt: skip
        except KafkaError as e:
            return e
        return None

    async def describe_share_group(self, group_id: str) -> dict:
        return self._require_coordinator().describe_share_group(group_id)

    async def share_group_offsets(self, group_id: str) -> dict[tuple[str, int], int]:
        return self._require_coordinator().share_group_offsets(group_id)

    async def share_group_configs(self, group_id: str) -> dict[str, str]:
        return self._require_coordinator().share_group_configs(group_id)

    async def alter_share_group_configs(self, group_id: str, configs: dict[str, str], replace: bool = False) -> None:
        await self._require_coordinator().alter_share_group_configs(group_id, configs, replace)

    async def alter_share_group_offsets(self, group_id: str, start_offsets: dict[tuple[str, int], int]) -> None:
        await self._require_coordinator().alter_share_group_offsets(group_id, start_offsets)

    async def delete_share_group_offsets(self, group_id: str, topics: list[str]) -> None:
        await self._require_coordinator().delete_share_group_offsets(group_id, topics)

    def _share_members_gone(self, group_id: str, gone: list[tuple[str, frozenset[tuple[str, int]]]]) -> None:
        """Members left or timed out: the leaders of their partitions release what they
        held (in the background; their locks would expire anyway)."""
        task = asyncio.get_running_loop().create_task(self._release_share_members(group_id, gone))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _share_states_reset(self, group_id: str, partitions: list[tuple[str, int]]) -> None:
        """The group's states were altered or deleted: the partitions' leaders read them
        again (in the background; a leader that misses this is fenced at its next write)."""
        task = asyncio.get_running_loop().create_task(self._forget_share_states(group_id, partitions))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _forget_share_states(self, group_id: str, partitions: list[tuple[str, int]]) -> None:
        for topic, partition in partitions:
            for attempt in range(1, FORGET_SHARE_STATE_ATTEMPTS + 1):
                try:
                    controller = await handle_of(self._controller)
                    leader = await controller.leader.remote(topic, partition)
                    await leader.share_forget_group.remote(group_id)
                    break
                except Exception as e:  # no leader now (moving), or it died: a new one reads the state anyway
                    logger.info("share group %s: %s-%d's leader was not told its state was reset (attempt %d): %r",
                                group_id, topic, partition, attempt, e)  # fmt: skip
                    if attempt < FORGET_SHARE_STATE_ATTEMPTS:
                        await asyncio.sleep(FORGET_SHARE_STATE_BACKOFF_MS / 1000)

    async def _release_share_members(self, group_id: str, gone: list[tuple[str, frozenset[tuple[str, int]]]]) -> None:
        for member_id, partitions in gone:
            for topic, partition in sorted(partitions):
                try:
                    controller = await handle_of(self._controller)
                    leader = await controller.leader.remote(topic, partition)
                    await leader.share_release_member.remote(group_id, member_id)
                except Exception as e:  # a leader gone or moving: the locks expire there
                    logger.info("share group %s: %s-%d did not release member %s: %r", group_id, topic, partition,
                                member_id, e)  # fmt: skip
