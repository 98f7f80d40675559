"""GroupMember: a consumer's side of Kafka's classic group protocol (ConsumerCoordinator).

It finds the group's coordinator (the leader replica of the group's `__consumer_offsets`
partition, via the Controller), joins with its subscription encoded in Kafka's consumer
protocol, and, when elected group leader, computes every member's assignment with the
chosen assignor (range or roundrobin) and sends it with SyncGroup. A heartbeat thread
keeps the session alive every `heartbeat_interval_ms`; when the coordinator answers that a
rebalance started (or the member was dropped), the next `ensure_active` rejoins. If the
application does not poll for `max_poll_interval_ms`, the member leaves the group, as a
Java consumer does, so its partitions go to members that make progress.

Coordinator moves (NOT_COORDINATOR, a dead coordinator actor) lead to looking it up again;
UNKNOWN_MEMBER_ID and ILLEGAL_GENERATION to joining anew. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayActorError

from rayk.client.assignors import ASSIGNORS
from rayk.client.consumer_protocol import decode_assignment, decode_subscription, encode_assignment, encode_subscription
from rayk.errors import (
    CoordinatorNotAvailableError,
    IllegalGenerationError,
    KafkaError,
    LeaderNotAvailableError,
    NotCoordinatorError,
    RebalanceInProgressError,
    UnknownMemberIdError,
)

logger = logging.getLogger(__name__)

PROTOCOL_TYPE = "consumer"
REJOIN_BACKOFF_MS = 100
JOIN_ATTEMPTS_MAX = 100
COORDINATOR_ATTEMPTS_MAX = 100  # 100 ms apart: ten seconds, several elections' worth


class CoordinatorLink:
    """Calls a group's coordinator (the leader replica of its `__consumer_offsets`
    partition), looking it up again whenever it moved or is not ready yet. Thread-safe."""

    def __init__(self, controller: Any, group_id: str) -> None:
        self._controller, self.group_id = controller, group_id
        self._handle: Any = None
        self._lock = threading.Lock()

    def _coordinator(self) -> Any:
        with self._lock:
            if self._handle is None:
                try:
                    _partition, self._handle = ray.get(self._controller.find_coordinator.remote(self.group_id))
                except LeaderNotAvailableError as e:
                    raise CoordinatorNotAvailableError(f"group {self.group_id!r}: {e}") from None
            return self._handle

    def call(self, method: str, *args: Any) -> Any:
        for _attempt in range(COORDINATOR_ATTEMPTS_MAX):
            try:
                return ray.get(getattr(self._coordinator(), method).remote(*args))
            except (NotCoordinatorError, CoordinatorNotAvailableError, RayActorError) as e:
                logger.debug("group %s: coordinator unavailable (%s); looking it up again", self.group_id, e)
                with self._lock:
                    self._handle = None
                time.sleep(REJOIN_BACKOFF_MS / 1000)
        raise CoordinatorNotAvailableError(
            f"group {self.group_id!r}: no coordinator after {COORDINATOR_ATTEMPTS_MAX} attempts"
        )


class GroupMember:
    def __init__(
        self,
        controller: Any,
        group_id: str,
        client_id: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        heartbeat_interval_ms: int,
        assignors: tuple[str, ...],
        partition_counts: Callable[[list[str]], dict[str, int]],
    ) -> None:
        unknown = [a for a in assignors if a not in ASSIGNORS]
        if unknown or not assignors:
            raise ValueError(f"unknown partition_assignment_strategy {unknown}: use {sorted(ASSIGNORS)}")
        self.group_id, self.client_id = group_id, client_id
        self._session_timeout_ms = session_timeout_ms
        self._rebalance_timeout_ms = rebalance_timeout_ms
        self._heartbeat_interval_s = heartbeat_interval_ms / 1000
        self._assignors = assignors
        self._partition_counts = partition_counts
        self.member_id = ""
        self.generation = -1
        self._coordinator = CoordinatorLink(controller, group_id)
        self._needs_join = threading.Event()
        self._needs_join.set()
        self._lock = threading.RLock()
        self._closed = threading.Event()
        self._heartbeats = threading.Thread(target=self._heartbeat_loop, name="rayk-heartbeat", daemon=True)
        self._heartbeats.start()

    @property
    def needs_join(self) -> bool:
        return self._needs_join.is_set()

    def request_rejoin(self) -> None:
        self._needs_join.set()

    def call(self, method: str, *args: Any) -> Any:
        return self._coordinator.call(method, *args)

    # ------------------------------------------------------------------ joining

    def ensure_active(self, topics: list[str]) -> dict[str, list[int]] | None:
        """Joins (or rejoins) the group if needed; returns the new assignment, or None if
        the current one still holds."""
        if not self._needs_join.is_set():
            return None
        subscription = encode_subscription(sorted(topics))
        for _attempt in range(JOIN_ATTEMPTS_MAX):
            self._needs_join.clear()
            try:
                return self._join_and_sync(subscription)
            except (UnknownMemberIdError, IllegalGenerationError) as e:
                logger.info("group %s: %s; joining anew", self.group_id, e)
                with self._lock:
                    self.member_id, self.generation = "", -1
            except RebalanceInProgressError:
                pass
            self._needs_join.set()
            time.sleep(REJOIN_BACKOFF_MS / 1000)
        raise KafkaError(f"group {self.group_id!r}: could not complete a rebalance in {JOIN_ATTEMPTS_MAX} attempts")

    def _join_and_sync(self, subscription: bytes) -> dict[str, list[int]]:
        joined = self.call(
            "join_group",
            self.group_id,
            self.member_id,
            self.client_id,
            self._session_timeout_ms,
            self._rebalance_timeout_ms,
            PROTOCOL_TYPE,
            [(name, subscription) for name in self._assignors],
        )
        with self._lock:
            self.member_id, self.generation = joined.member_id, joined.generation
        assignments = None
        if joined.leader_id == joined.member_id:
            assignments = self._assign(joined.protocol, joined.members)
        raw = self.call("sync_group", self.group_id, joined.generation, joined.member_id, assignments)
        assignment = decode_assignment(raw).partitions if raw else {}
        logger.info("group %s generation %d: assigned %s", self.group_id, joined.generation, assignment)
        return assignment

    def _assign(self, protocol: str, members: list[tuple[str, bytes]]) -> dict[str, bytes]:
        subscriptions = {member_id: decode_subscription(meta).topics for member_id, meta in members}
        topics = sorted({t for ts in subscriptions.values() for t in ts})
        plan = ASSIGNORS[protocol](subscriptions, self._partition_counts(topics))
        return {member_id: encode_assignment(plan.get(member_id, {})) for member_id in subscriptions}

    # ------------------------------------------------------------------ heartbeats, leaving

    def _heartbeat_loop(self) -> None:
        while not self._closed.wait(self._heartbeat_interval_s):
            with self._lock:
                member_id, generation = self.member_id, self.generation
            if not member_id or self._needs_join.is_set():
                continue
            try:
                self.call("heartbeat", self.group_id, generation, member_id)
            except (RebalanceInProgressError, IllegalGenerationError, UnknownMemberIdError) as e:
                logger.info("group %s: %s; rejoining at the next poll", self.group_id, e.name)
                if isinstance(e, UnknownMemberIdError):
                    with self._lock:
                        self.member_id, self.generation = "", -1
                self._needs_join.set()
            except Exception as e:  # keep beating; the next poll surfaces persistent trouble
                logger.warning("group %s: heartbeat failed: %s", self.group_id, e)

    def commit(self, offsets: dict[tuple[str, int], tuple[int, str]]) -> None:
        with self._lock:
            generation, member_id = self.generation, self.member_id
        self.call("commit_offsets", self.group_id, generation, member_id, offsets)

    def committed(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], Any]:
        return self.call("fetch_offsets", self.group_id, partitions)

    def leave(self) -> None:
        with self._lock:
            member_id = self.member_id
            self.member_id, self.generation = "", -1
        self._needs_join.set()
        if member_id:
            try:
                self.call("leave_group", self.group_id, member_id)
            except KafkaError as e:
                logger.info("group %s: leave: %s", self.group_id, e)

    def close(self) -> None:
        self._closed.set()
        self.leave()
        self._heartbeats.join(timeout=5)
