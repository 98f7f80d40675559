"""ReplicaFollower: a follower's fetcher task (Kafka's ReplicaFetcherManager, for one
partition).

While the replica follows a leader in a leader epoch, one ReplicaFetcher
(replica_fetcher.py) runs as a task on the replica's event loop: it truncates the log
where it diverges from the leader's (KIP-101/279) and copies the leader's batches over the
data plane (leader_link.py). A new leader or a new epoch stops the task and starts
another; becoming leader, closing and deleting stop it. With no leader (NO_LEADER) the
replica follows nobody and waits for its next assignment.

It owns the task. The log is the context's (replica_context.py); `on_progress` is called
after each append, HW move or truncation. Not thread-safe: the replica actor's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import ray

from rayk.replication.leader_link import LeaderLink
from rayk.replication.replica_context import ReplicaContext
from rayk.replication.remote_log_manager import RemoteLogManager
from rayk.replication.replica_fetcher import ReplicaFetcher
from rayk.replication.replication_throttle import ReplicationThrottle

NO_LEADER = -1


class ReplicaFollower:
    """The fetcher task of the epoch this replica follows in (see the module docstring)."""

    def __init__(self, ctx: ReplicaContext, on_progress: Callable[[], None], remote: RemoteLogManager | None = None) -> None:
        self._ctx = ctx
        self._remote = remote  # tiered storage: where a log that starts over past the leader's gets its state
        self._on_progress = on_progress
        self._fetcher: asyncio.Task | None = None
        self._copier: ReplicaFetcher | None = None
        # Its share of follower.replication.throttled.rate while a reassignment adds it; the
        # fetchers of every epoch pace by it, so a new share applies at once.
        self.throttle = ReplicationThrottle()

    @property
    def fetching(self) -> bool:
        """Whether a fetcher task runs."""
        return self._fetcher is not None and not self._fetcher.done()

    def start(self, leader_epoch: int, leader_id: int, leader: Any, incarnation_id: str) -> None:
        """Fetches from `leader` (an actor handle of the leader's PartitionReplica) in
        `leader_epoch`, unless there is no leader. Any earlier task is stopped already."""
        assert self._fetcher is None, "one fetcher at a time"
        if leader is None or leader_id == NO_LEADER:
            return
        ctx = self._ctx
        link = LeaderLink(leader, ray.get_runtime_context().get_node_id(), ctx.name)
        fetcher = ReplicaFetcher(
            ctx.log, ctx.name, ctx.broker_id, link, leader_epoch, ctx.config, self._on_progress, incarnation_id,
            self.throttle, None if self._remote is None else self._remote.remote_start_state,
        )
        self._fetcher = asyncio.get_running_loop().create_task(fetcher.run())
        self._copier = fetcher

    def set_throttle(self, rate_bytes_per_s: int | None) -> None:
        """This replica's share of follower.replication.throttled.rate (None: none), applied
        from the fetcher's next answer."""
        self.throttle.set_rate(rate_bytes_per_s)
        if self._copier is not None:
            self._copier.throttle_changed()

    @property
    def native_copy_runs(self) -> int:
        """Runs of the native copy loop (native_copy.py) the current fetcher started."""
        return self._copier.native_copy_runs if self._copier is not None else 0

    async def stop(self) -> None:
        """Cancels the task and waits until it is gone: the log is not written by it afterwards."""
        if self._fetcher is not None:
            self._fetcher.cancel()
            try:
                await self._fetcher
            except (asyncio.CancelledError, Exception):
                pass
            self._fetcher = None
