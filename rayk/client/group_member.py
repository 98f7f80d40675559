"""GroupMember: a consumer's side of Kafka's classic group protocol (ConsumerCoordinator),
driven by the consumer's `poll` without ever blocking it (KIP-266).

It finds the group's coordinator (the leader replica of the group's `__consumer_offsets`
partition, via the Controller), joins with its subscription encoded in Kafka's consumer
protocol, and, when elected group leader, computes every member's assignment with the
chosen assignor (range or roundrobin) and sends it with SyncGroup. Joining is a state
machine (`Phase`) that `poll` advances: each step starts one call and keeps its
ObjectRef; the consumer's `poll` passes those refs to `ray.wait` within its own timeout
and hands the ready ones back, so a JoinGroup the coordinator holds for a slow member
never holds `poll` past its timeout. While the member has no assignment, `poll` returns
nothing, on time.

A heartbeat thread keeps the session alive every `heartbeat_interval_ms` while the member
is stable. What it learns takes effect at the next `poll`:
- REBALANCE_IN_PROGRESS: the eager protocol: the consumer commits what it consumed (if
  auto-commit is on) and revokes every partition (`on_revoke(lost=False)`), the commit
  completes, then the member rejoins;
- UNKNOWN_MEMBER_ID or ILLEGAL_GENERATION (from a heartbeat, a commit or a sync): the
  member was evicted, so its partitions already belong to someone else: they are dropped
  at once without a commit (`on_revoke(lost=True)`) before rejoining. The member also
  counts itself evicted when no heartbeat sent in the last `session_timeout_ms` has been
  answered (the coordinator has evicted it by then; a stopped process learns it this way,
  even if a heartbeat sent before it stopped is answered OK as it resumes).
If the application does not poll for `max_poll_interval_ms` (the rebalance timeout), the
member leaves the group, as a Java consumer does, so its partitions go to members that
make progress.

A static member (`instance_id`, KIP-345) sends its instance id with every call and never
LeaveGroup: closed, its partitions wait for its session timeout, and a consumer joining
with the same instance id takes its place and its assignment with no rebalance. If
another consumer takes the instance id while this one lives, the coordinator answers
FENCED_INSTANCE_ID, which the next `poll` raises (for good, as Kafka's consumer does).

Coordinator moves (NOT_COORDINATOR, a dead or silent coordinator actor) lead to looking
it up again (coordinator_link.CoordinatorLink). Thread-safe: `poll` runs in the consumer's thread, the
heartbeats in their own; the state they share is under `_lock`.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from rayk.client import calls
from rayk.client.assignors import ASSIGNORS
from rayk.consumer_protocol import decode_assignment, decode_subscription, encode_assignment, encode_subscription
from rayk.client.coordinator_link import DEFAULT_TIMEOUT_MS, CoordinatorLink
from rayk.errors import (
    CoordinatorLoadInProgressError,
    FencedInstanceIdError,
    IllegalGenerationError,
    KafkaError,
    NotCoordinatorError,
    RebalanceInProgressError,
    UnknownMemberIdError,
)

__all__ = ["CoordinatorLink", "GroupMember", "Phase"]

logger = logging.getLogger(__name__)

PROTOCOL_TYPE = "consumer"
JOIN_TIMEOUT_GRACE_MS = 5_000  # a JoinGroup may be held for the rebalance timeout; Kafka adds 5 s
EVICTED_ERRORS = (UnknownMemberIdError, IllegalGenerationError)


class Phase(enum.Enum):
    """Where a classic member stands in joining its group, the state machine `poll` advances:
    from no assignment, through the commit before a rejoin, JoinGroup, the leader's
    assignment and SyncGroup, to stable."""

    UNJOINED = "unjoined"  # no assignment; JoinGroup goes out when the coordinator is known
    COMMITTING = "committing"  # the revoked partitions' offsets are being committed before the rejoin
    JOINING = "joining"  # JoinGroup in flight
    ASSIGNING = "assigning"  # the leader waits for partition counts to compute the assignment
    SYNCING = "syncing"  # SyncGroup in flight
    STABLE = "stable"  # assigned; heartbeats go out


class GroupMember:
    """A Consumer's membership of a classic group: owns its member id, generation and Phase,
    the call in flight, the assignment, the link to the coordinator and the heartbeat
    thread. Made by the Consumer for the classic protocol, lives until it leaves;
    thread-safe (see above)."""

    def __init__(
        self,
        controller: Any,
        group_id: str,
        client_id: str,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        heartbeat_interval_ms: int,
        assignors: tuple[str, ...],
        partition_counts: Callable[[list[str]], dict[str, int] | None],
        on_revoke: Callable[[bool], dict[tuple[str, int], tuple[int, str]] | None],
        request_timeout_ms: int = DEFAULT_TIMEOUT_MS,
        retry_backoff_ms: int = calls.RETRY_BACKOFF_MS,
        instance_id: str | None = None,
    ) -> None:
        """`partition_counts(topics)` answers without blocking (None while unknown);
        `on_revoke(lost)` drops the consumer's assignment and returns the offsets to
        commit first (None: nothing to commit); `instance_id` makes a static member
        (KIP-345's group.instance.id)."""
        unknown = [a for a in assignors if a not in ASSIGNORS]
        if unknown or not assignors:
            raise ValueError(f"unknown partition_assignment_strategy {unknown}: use {sorted(ASSIGNORS)}")
        if not 0 < heartbeat_interval_ms < session_timeout_ms:
            raise ValueError(
                f"heartbeat_interval_ms ({heartbeat_interval_ms}) must be > 0 and below session_timeout_ms ({session_timeout_ms})"
            )
        self.group_id, self.client_id, self.instance_id = group_id, client_id, instance_id
        self._session_timeout_ms = session_timeout_ms
        self._rebalance_timeout_ms = rebalance_timeout_ms
        self._heartbeat_interval_s = heartbeat_interval_ms / 1000
        self._request_timeout_ms = request_timeout_ms
        self._retry_backoff_s = retry_backoff_ms / 1000
        self._assignors = assignors
        self._partition_counts = partition_counts
        self._on_revoke = on_revoke
        self._coordinator = CoordinatorLink(controller, group_id, request_timeout_ms, retry_backoff_ms)
        self._lock = threading.RLock()
        # Shared with the heartbeat thread (under _lock):
        self.member_id = ""
        self.generation = -1
        self._phase = Phase.UNJOINED
        self._rejoin_requested = False
        self._evicted = False
        self._fenced: FencedInstanceIdError | None = None  # another consumer took the instance id: poll raises it
        self._last_answer_s = time.monotonic()  # the coordinator's last answer to this member
        self._last_poll_s = time.monotonic()
        # The poll thread's own:
        self._call: calls.Pending | None = None  # the phase's call in flight
        self._joined: Any = None  # the JoinGroup answer, while ASSIGNING
        self._joined_topics: list[str] = []
        self._assigned_counts: dict[str, int] | None = None  # as leader: the partition counts assigned over
        self._retry_at_s = 0.0
        self._auto_commit: calls.Pending | None = None
        self._auto_commit_by = (-1, "")  # (generation, member id) it was sent with
        self._closed = threading.Event()
        self._heartbeats = threading.Thread(target=self._heartbeat_loop, name="rayk-heartbeat", daemon=True)
        self._heartbeats.start()

    @property
    def phase(self) -> Phase:
        return self._phase

    def request_rejoin(self) -> None:
        with self._lock:
            self._rejoin_requested = True

    # ------------------------------------------------------------------ the state machine

    def poll(self, topics: list[str], ready: set[Any], now: float) -> dict[str, list[int]] | None:
        """Advances the group state machine with the calls `ray.wait` found `ready`; never
        blocks. Returns the new assignment once a rebalance completes, else None.
        Raises the typed error of a JoinGroup the coordinator refused for good."""
        with self._lock:
            self._last_poll_s = now
            if self._fenced is not None:
                raise self._fenced
        self._coordinator.collect(ready, now)
        self._collect_auto_commit(ready, now)
        assignment = self._collect_call(ready, now)
        if self._phase is Phase.STABLE:
            self._maybe_leave_stable(topics, now)
        if self._phase is Phase.UNJOINED and topics and now >= self._retry_at_s:
            self._send_join(topics, now)
        if self._phase is Phase.ASSIGNING:
            self._send_sync_as_leader(now)
        return assignment

    def _maybe_leave_stable(self, topics: list[str], now: float) -> None:
        grown = self._counts_changed()  # outside the lock: it may start a metadata refresh
        with self._lock:
            silent_s = now - self._last_answer_s
            lost = self._evicted or silent_s > self._session_timeout_ms / 1000
            if not (lost or self._rejoin_requested or topics != self._joined_topics or grown):
                return
            if lost and not self._evicted:
                logger.warning("group %s: no heartbeat answered for %.1f s (session timeout %d ms): evicted",
                               self.group_id, silent_s, self._session_timeout_ms)
            self._phase, self._rejoin_requested, self._evicted = Phase.UNJOINED, False, False
        offsets = self._on_revoke(lost)
        if lost or not offsets:
            return
        handle = self._coordinator.handle_nowait(now)
        if handle is None:
            logger.warning("group %s: coordinator unknown; revoked partitions' offsets not committed", self.group_id)
            return
        ref = handle.commit_offsets.remote(self.group_id, self.generation, self.member_id, offsets, self.instance_id)
        self._call = calls.Pending(ref, now + self._request_timeout_ms / 1000, "OffsetCommit before rejoining")
        self._phase = Phase.COMMITTING

    def _counts_changed(self) -> bool:
        """As the group's leader: a subscribed topic now has another partition count than
        the one the assignment was made for (partitions were added; it was deleted, 0; it
        was created), so the group rejoins and the partitions get consumers, or none are
        kept for a topic that is gone, as Kafka's ConsumerCoordinator does."""
        if self._assigned_counts is None:
            return False
        now_counts = self._partition_counts(list(self._assigned_counts))
        return now_counts is not None and now_counts != self._assigned_counts

    def _send_join(self, topics: list[str], now: float) -> None:
        handle = self._coordinator.handle_nowait(now)
        if handle is None:
            return  # the lookup's ref is in pending(); poll comes back when it is ready
        subscription = encode_subscription(sorted(topics))
        ref = handle.join_group.remote(
            self.group_id,
            self.member_id,
            self.client_id,
            self._session_timeout_ms,
            self._rebalance_timeout_ms,
            PROTOCOL_TYPE,
            [(name, subscription) for name in self._assignors],
            self.instance_id,
        )
        self._call = calls.Pending(ref, now + (self._rebalance_timeout_ms + JOIN_TIMEOUT_GRACE_MS) / 1000, "JoinGroup")
        self._joined_topics, self._assigned_counts = list(topics), None
        with self._lock:
            self._phase, self._rejoin_requested = Phase.JOINING, False

    def _send_sync_as_leader(self, now: float) -> None:
        joined = self._joined
        subscriptions = {member_id: decode_subscription(meta).topics for member_id, meta in joined.members}
        topics = sorted({t for ts in subscriptions.values() for t in ts})
        counts = self._partition_counts(topics)
        if counts is None:
            return  # metadata on its way
        plan = ASSIGNORS[joined.protocol](subscriptions, counts)
        self._assigned_counts = dict(counts)
        self._send_sync({m: encode_assignment(plan.get(m, {})) for m in subscriptions}, now)

    def _send_sync(self, assignments: dict[str, bytes] | None, now: float) -> None:
        handle = self._coordinator.handle_nowait(now)
        if handle is None:
            self._join_failed(NotCoordinatorError("the coordinator moved during the rebalance"), now)
            return
        ref = handle.sync_group.remote(self.group_id, self.generation, self.member_id, assignments, self.instance_id)
        self._call = calls.Pending(ref, now + (self._rebalance_timeout_ms + JOIN_TIMEOUT_GRACE_MS) / 1000, "SyncGroup")
        with self._lock:
            self._phase = Phase.SYNCING

    def _collect_call(self, ready: set[Any], now: float) -> dict[str, list[int]] | None:
        call = self._call
        if call is None or (call.ref not in ready and not call.expired(now)):
            return None
        self._call = None
        try:
            result = call.result()
        except KafkaError as e:
            if self._phase is Phase.COMMITTING:
                logger.info("group %s: commit before rejoining failed: %s", self.group_id, e)
                self._coordinator.forget_if_moved(e)
                with self._lock:
                    self._phase = Phase.UNJOINED
                return None
            self._join_failed(e, now)
            return None
        if self._phase is Phase.COMMITTING:
            with self._lock:
                self._phase = Phase.UNJOINED
            return None
        if self._phase is Phase.JOINING:
            with self._lock:
                self.member_id, self.generation, self._last_answer_s = result.member_id, result.generation, now
            if result.leader_id == result.member_id:
                self._joined = result
                with self._lock:
                    self._phase = Phase.ASSIGNING
                self._send_sync_as_leader(now)
            else:
                self._send_sync(None, now)
            return None
        assert self._phase is Phase.SYNCING, self._phase
        assignment = decode_assignment(result).partitions if result else {}
        logger.info("group %s generation %d: assigned %s", self.group_id, self.generation, assignment)
        with self._lock:
            self._phase, self._last_answer_s, self._evicted = Phase.STABLE, now, False
        return assignment

    def _join_failed(self, error: KafkaError, now: float) -> None:
        with self._lock:
            self._phase = Phase.UNJOINED
            if isinstance(error, UnknownMemberIdError):
                self.member_id, self.generation = "", -1
        self._joined = None
        if isinstance(error, (UnknownMemberIdError, IllegalGenerationError, RebalanceInProgressError)):
            logger.info("group %s: %s; joining again", self.group_id, error.name)
            self._retry_at_s = now
            return
        self._coordinator.forget_if_moved(error)
        self._retry_at_s = now + self._retry_backoff_s
        if isinstance(error, FencedInstanceIdError):
            self._fenced = error  # for good: every later poll raises it too
        if not error.retriable:
            raise error
        logger.info("group %s: rebalance failed (%s); retrying", self.group_id, error)

    def pending(self) -> list[Any]:
        refs = self._coordinator.pending()
        refs += [c.ref for c in (self._call, self._auto_commit) if c is not None]
        return refs

    def wake_at_s(self) -> float | None:
        """When `poll` should run again without a ready ref: a backoff or a deadline ends."""
        times = [self._coordinator.wake_at_s()]
        times += [c.deadline_s for c in (self._call, self._auto_commit) if c is not None]
        if self._phase is Phase.UNJOINED:
            times.append(self._retry_at_s)
        elif self._phase is Phase.STABLE:
            times.append(self._last_answer_s + self._session_timeout_ms / 1000)
        known = [t for t in times if t is not None]
        return min(known) if known else None

    # ------------------------------------------------------------------ offsets

    def commit(self, offsets: dict[tuple[str, int], tuple[int, str]], timeout_ms: int) -> None:
        """Commits synchronously; raises the coordinator's typed error (an evicted member
        is marked so and drops its partitions at the next poll)."""
        with self._lock:
            generation, member_id = self.generation, self.member_id
        try:
            self._coordinator.call("commit_offsets", self.group_id, generation, member_id, offsets, self.instance_id,
                                   timeout_ms=timeout_ms)  # fmt: skip
        except KafkaError as e:
            self._commit_failed(e, generation, member_id)
            raise

    def commit_async(self, offsets: dict[tuple[str, int], tuple[int, str]], now: float) -> bool:
        """Starts a commit without waiting (auto-commit); False if one is still in flight
        or the coordinator is not known yet."""
        if self._auto_commit is not None:
            return False
        handle = self._coordinator.handle_nowait(now)
        if handle is None:
            return False
        ref = handle.commit_offsets.remote(self.group_id, self.generation, self.member_id, offsets, self.instance_id)
        self._auto_commit = calls.Pending(ref, now + self._request_timeout_ms / 1000, "OffsetCommit")
        self._auto_commit_by = (self.generation, self.member_id)
        return True

    def _collect_auto_commit(self, ready: set[Any], now: float) -> None:
        pending = self._auto_commit
        if pending is None or (pending.ref not in ready and not pending.expired(now)):
            return
        self._auto_commit = None
        try:
            pending.result()
        except KafkaError as e:
            logger.info("group %s: auto-commit failed: %s", self.group_id, e)
            self._commit_failed(e, *self._auto_commit_by)

    def _commit_failed(self, error: KafkaError, generation: int, member_id: str) -> None:
        self._coordinator.forget_if_moved(error)
        with self._lock:
            if isinstance(error, FencedInstanceIdError):
                self._fenced = error
            if (generation, member_id) != (self.generation, self.member_id) or self._phase is not Phase.STABLE:
                return  # about an older generation
            if isinstance(error, EVICTED_ERRORS):
                self._evicted = True
                if isinstance(error, UnknownMemberIdError):
                    self.member_id, self.generation = "", -1
            elif isinstance(error, RebalanceInProgressError):
                self._rejoin_requested = True

    def committed(self, partitions: list[tuple[str, int]], timeout_ms: int) -> dict[tuple[str, int], Any]:
        """The committed offsets, once no transaction's offsets for them await their marker
        (require_stable, retried as UNSTABLE_OFFSET_COMMIT), as Kafka's consumer asks."""
        return self._coordinator.call("fetch_offsets", self.group_id, partitions, True, timeout_ms=timeout_ms)

    def fetch_committed_async(self, partitions: list[tuple[str, int]], now: float) -> calls.Pending | None:
        """Starts an OffsetFetch without waiting; None while the coordinator is unknown.
        Read its answer with `answer(pending)`."""
        handle = self._coordinator.handle_nowait(now)
        if handle is None:
            return None
        ref = handle.fetch_offsets.remote(self.group_id, partitions, True)  # require_stable, as `committed`
        return calls.Pending(ref, now + self._request_timeout_ms / 1000, "OffsetFetch")

    def answer(self, pending: calls.Pending) -> Any:
        """The (ready or expired) call's result; a coordinator error makes the member look it up again."""
        return self._coordinator.result(pending)

    # ------------------------------------------------------------------ heartbeats, leaving

    def _heartbeat_loop(self) -> None:
        while not self._closed.wait(self._heartbeat_interval_s):
            with self._lock:
                phase, member_id, generation = self._phase, self.member_id, self.generation
                idle_s = time.monotonic() - self._last_poll_s
            if phase is not Phase.STABLE or not member_id:
                continue
            if idle_s > self._rebalance_timeout_ms / 1000:
                logger.warning("group %s: no poll for %.1f s (max_poll_interval_ms %d): leaving the group",
                               self.group_id, idle_s, self._rebalance_timeout_ms)
                self._leave_quietly(member_id)
                with self._lock:
                    if (self.member_id, self.generation) == (member_id, generation):
                        self._evicted, self.member_id, self.generation = True, "", -1
                continue
            self._heartbeat(member_id, generation)

    def _heartbeat(self, member_id: str, generation: int) -> None:
        timeout_ms = min(self._request_timeout_ms, self._session_timeout_ms)
        # The coordinator's session for this member restarts when it handles the heartbeat,
        # which is after it was sent and may be long before its answer is read here: a
        # process stopped (SIGSTOP, a long pause) with a heartbeat in flight reads an OK
        # answer on resuming, when the coordinator has evicted it since. Counting the
        # session from the send errs early, by a round trip, never late.
        sent_s = time.monotonic()
        try:
            self._coordinator.call("heartbeat", self.group_id, generation, member_id, self.instance_id,
                                   timeout_ms=timeout_ms)  # fmt: skip
            error = None
        except KafkaError as e:
            error = e
        with self._lock:
            if (self.member_id, self.generation) != (member_id, generation) or self._phase is not Phase.STABLE:
                return  # a rebalance started meanwhile; this answer is about the old generation
            if error is None or isinstance(error, RebalanceInProgressError):
                self._last_answer_s = max(self._last_answer_s, sent_s)
            if isinstance(error, RebalanceInProgressError):
                logger.info("group %s: rebalance in progress; rejoining at the next poll", self.group_id)
                self._rejoin_requested = True
            elif isinstance(error, EVICTED_ERRORS):
                logger.info("group %s: %s; dropping the assignment at the next poll", self.group_id, error.name)
                self._evicted = True
                if isinstance(error, UnknownMemberIdError):
                    self.member_id, self.generation = "", -1
            elif isinstance(error, FencedInstanceIdError):  # another process has this instance id now
                self._fenced = error
            elif isinstance(error, CoordinatorLoadInProgressError):
                self._last_answer_s = max(self._last_answer_s, sent_s)
            elif error is not None:  # keep beating; the session check in poll catches a lasting silence
                logger.warning("group %s: heartbeat failed: %s", self.group_id, error)

    def _leave_quietly(self, member_id: str, timeout_ms: int | None = None) -> None:
        try:
            self._coordinator.call(
                "leave_group", self.group_id, member_id, timeout_ms=timeout_ms or self._request_timeout_ms
            )
        except KafkaError as e:
            logger.info("group %s: leave: %s", self.group_id, e)

    def leave(self, timeout_ms: int | None = None) -> None:
        """Leaves the group (LeaveGroup), so the others rebalance without waiting for this
        member's session to time out (within `timeout_ms`, default request_timeout_ms). A
        static member sends none, as Kafka's consumers do: its partitions wait for its
        session to end, for a consumer with its instance id to take them back."""
        with self._lock:
            member_id = self.member_id
            self.member_id, self.generation, self._phase = "", -1, Phase.UNJOINED
        for call in (self._call, self._auto_commit):
            if call is not None:
                calls.cancel(call.ref)
        self._call = self._auto_commit = None
        self._joined = None
        if member_id and self.instance_id is None:
            self._leave_quietly(member_id, timeout_ms)

    def close(self, timeout_ms: int | None = None) -> None:
        self._closed.set()
        self.leave(timeout_ms)
        self._heartbeats.join(timeout=5)
