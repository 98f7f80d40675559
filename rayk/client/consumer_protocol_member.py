"""ConsumerProtocolMember: a consumer's side of KIP-848's consumer group protocol
(`group_protocol="consumer"`), with GroupMember's interface, so that the Consumer drives
either one from its `poll`.

The coordinator assigns (rayk.coordinator.group.consumer_protocol_group). A heartbeat thread sends
ConsumerGroupHeartbeat to the group's coordinator replica (over Ray, as GroupMember's
calls) every heartbeat interval the coordinator answers, and at once when there is news:
a new subscription, or partitions this member has just released. Each heartbeat says what
the member owns, and its answer carries the member's epoch and assignment. The consumer's
`poll` then reconciles towards that assignment:
- a partition no longer assigned is revoked first: the consumer stops fetching it, and
  with auto-commit its consumed offsets are committed; only once that commit is answered
  does the member report the partition released, so its next owner starts where this one
  stopped;
- a new partition is consumed at once (the coordinator assigns a partition only once its
  previous owner released it).
Partitions that stay assigned are never paused: there is no stop-the-world rebalance.

The member id is made here (KIP-1082) and kept for the consumer's life. A static member
(`instance_id`, Kafka's group.instance.id) leaves with epoch -2: its partitions wait for
its session timeout, and a consumer started with the same instance id (a restarted Ray
actor, say) takes them over, in the same epoch, with no other member moving. A heartbeat
answered FENCED_MEMBER_EPOCH or UNKNOWN_MEMBER_ID means the coordinator removed the
member: its partitions are lost (dropped at the next poll without a commit) and it joins
again with epoch 0. A commit or an offset fetch answered STALE_MEMBER_EPOCH (a heartbeat
moved the member on meanwhile) is retried with the new epoch. If the application does
not poll for `max_poll_interval_ms`, the member leaves the group (epoch -1), as the Java
consumer does. Session and heartbeat times are the coordinator's
(`group.consumer.session.timeout.ms`, `group.consumer.heartbeat.interval.ms`).

Thread-safe: `poll` runs in the consumer's thread, the heartbeats in their own; the state
they share is under `_lock`.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from rayk.coordinator.group.consumer_protocol_group import JOIN_EPOCH, LEAVE_EPOCH, STATIC_LEAVE_EPOCH, ConsumerHeartbeat
from rayk.client import calls
from rayk.client.coordinator_link import CoordinatorLink
from rayk.errors import FencedMemberEpochError, KafkaError, KafkaTimeoutError, StaleMemberEpochError, UnknownMemberIdError

logger = logging.getLogger(__name__)

TopicPartition = tuple[str, int]
FIRST_HEARTBEAT_INTERVAL_MS = 1_000  # until the coordinator has said its interval
EVICTED_ERRORS = (FencedMemberEpochError, UnknownMemberIdError)


class ConsumerProtocolMember:
    """A Consumer's membership of a KIP-848 group: owns its member id and epoch, its
    subscription, what it was assigned and what it owns, the revocation in progress, the
    link to the coordinator and the heartbeat thread. Made by the Consumer for
    `group_protocol="consumer"`, lives until it leaves; thread-safe (see above)."""

    def __init__(
        self,
        controller: Any,
        group_id: str,
        client_id: str,
        rebalance_timeout_ms: int,
        on_revoke: Callable[[list[TopicPartition], bool], dict[TopicPartition, tuple[int, str]] | None],
        assignor: str | None = None,
        request_timeout_ms: int = 30_000,
        retry_backoff_ms: int = calls.RETRY_BACKOFF_MS,
        instance_id: str | None = None,
    ) -> None:
        """`on_revoke(partitions, lost)` stops consuming `partitions` and returns the
        offsets to commit for them (None: nothing to commit). `instance_id`: a static
        member's (group.instance.id)."""
        self.group_id, self.client_id, self.instance_id = group_id, client_id, instance_id
        self.member_id = str(uuid.uuid4())
        self._rebalance_timeout_ms = rebalance_timeout_ms
        self._assignor = assignor
        self._request_timeout_ms = request_timeout_ms
        self._retry_backoff_s = retry_backoff_ms / 1000
        self._on_revoke = on_revoke
        self._coordinator = CoordinatorLink(controller, group_id, request_timeout_ms, retry_backoff_ms)
        self._lock = threading.RLock()
        # Shared with the heartbeat thread (under _lock):
        self.member_epoch = JOIN_EPOCH
        self._incarnation = 0  # one per stint in the group: an answer to an earlier one is dropped
        self._join_sent = False  # this stint's join went out (its member may exist, answered or not)
        self._topics: list[str] = []  # the subscription
        self._sent_topics: list[str] | None = None  # the subscription the coordinator has
        self._assigned: frozenset[TopicPartition] = frozenset()  # the latest answer's
        self._owned: frozenset[TopicPartition] = frozenset()  # what heartbeats say this member owns
        self._lost = False  # the coordinator removed the member: drop everything at the next poll
        self._error: KafkaError | None = None  # a refusal for good, raised by the next poll
        self._interval_s = FIRST_HEARTBEAT_INTERVAL_MS / 1000
        self._last_poll_s = time.monotonic()
        # The poll thread's own:
        self._consuming: frozenset[TopicPartition] = frozenset()
        self._revoking: tuple[calls.Pending, frozenset[TopicPartition]] | None = None  # their offsets' commit
        self._auto_commit: calls.Pending | None = None
        self._news = threading.Event()  # heartbeat now
        self._answered: concurrent.futures.Future[None] = concurrent.futures.Future()  # wakes poll: a new assignment
        self._closed = threading.Event()
        self._heartbeats = threading.Thread(target=self._heartbeat_loop, name="rayk-heartbeat", daemon=True)
        self._heartbeats.start()

    @property
    def generation(self) -> int:
        """The member epoch, which commits and transactional offset commits carry."""
        return self.member_epoch

    def request_rejoin(self) -> None:
        """The subscription changed: the next heartbeat, sent now, carries it."""
        with self._lock:
            self._sent_topics = None
        self._news.set()

    # ------------------------------------------------------------------ reconciliation (poll)

    def poll(self, topics: list[str], ready: set[Any], now: float) -> dict[str, list[int]] | None:
        """Moves the consumer towards its assignment (see the module docstring); never
        blocks. Returns the consumer's whole new assignment when it changed, else None."""
        with self._lock:
            self._last_poll_s = now
            if topics != self._topics:
                self._topics, self._sent_topics = list(topics), None
                self._news.set()
            error, self._error = self._error, None
            lost, self._lost = self._lost, False
            assigned = self._assigned
            if self._answered.done():
                self._answered = concurrent.futures.Future()
        if error is not None:
            raise error
        self._coordinator.collect(ready, now)
        self._collect_auto_commit(ready, now)
        before = self._consuming
        changed = lost and bool(before)
        if lost:
            self._drop(lost=True)
        self._collect_revocation(ready, now)
        if self._revoking is None:
            revoked = self._consuming - assigned
            if revoked:
                self._revoke(revoked, now)
            if self._revoking is None:
                self._consuming |= assigned
        self._report_owned()
        if not changed and self._consuming == before:
            return None
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(self._consuming):
            by_topic.setdefault(topic, []).append(partition)
        logger.info("group %s epoch %d: assigned %s", self.group_id, self.member_epoch, by_topic)
        return by_topic

    def _revoke(self, revoked: frozenset[TopicPartition], now: float) -> None:
        """Stops consuming `revoked`; reports them released once their offsets are committed."""
        offsets = self._on_revoke(sorted(revoked), False)
        self._consuming -= revoked
        handle = self._coordinator.handle_nowait(now) if offsets else None
        if handle is None:
            if offsets:
                logger.warning("group %s: coordinator unknown; revoked partitions' offsets not committed", self.group_id)
            self._report_owned()
            return
        ref = handle.commit_offsets.remote(self.group_id, self.member_epoch, self.member_id, offsets)
        self._revoking = (calls.Pending(ref, now + self._request_timeout_ms / 1000, "OffsetCommit of revoked partitions"),
                          revoked)  # fmt: skip

    def _collect_revocation(self, ready: set[Any], now: float) -> None:
        if self._revoking is None:
            return
        pending, revoked = self._revoking
        if pending.ref not in ready and not pending.expired(now):
            return
        self._revoking = None
        try:
            self._coordinator.result(pending)
        except KafkaError as e:  # released anyway: the next owner starts from the last commit
            logger.info("group %s: commit of revoked partitions %s failed: %s", self.group_id, sorted(revoked), e)
        self._report_owned()

    def _report_owned(self) -> None:
        """What heartbeats say this member owns: what it consumes, and what it is revoking
        until their commit is answered."""
        revoking = self._revoking[1] if self._revoking is not None else frozenset()
        with self._lock:
            if self.member_epoch == JOIN_EPOCH:
                return  # (a join owns nothing)
            released = self._owned - self._consuming - revoking
            self._owned = self._consuming | revoking
        if released:
            self._news.set()  # the coordinator hands them on once it hears

    def _drop(self, lost: bool) -> None:
        if self._consuming:
            logger.warning("group %s: partitions lost (removed from the group): %s", self.group_id, sorted(self._consuming))
            self._on_revoke(sorted(self._consuming), lost)
        if self._revoking is not None:
            calls.cancel(self._revoking[0].ref)
        self._consuming, self._revoking = frozenset(), None

    def pending(self) -> list[Any]:
        """What `poll` waits on: calls in flight, and a future the heartbeat thread
        completes when an answer changes the assignment."""
        refs: list[Any] = self._coordinator.pending()
        refs += [c.ref for c in (self._auto_commit, self._revoking[0] if self._revoking else None) if c is not None]
        with self._lock:
            refs.append(self._answered)
        return refs

    def wake_at_s(self) -> float | None:
        """When `poll` should run again without a ready ref: a lookup's backoff or a deadline."""
        times = [self._coordinator.wake_at_s()]
        times += [c.deadline_s for c in (self._auto_commit, self._revoking[0] if self._revoking else None) if c is not None]
        known = [t for t in times if t is not None]
        return min(known) if known else None

    # ------------------------------------------------------------------ heartbeats

    def _heartbeat_loop(self) -> None:
        while not self._closed.is_set():
            self._news.wait(self._interval_s)
            self._news.clear()
            if self._closed.is_set():
                return
            with self._lock:
                topics, idle_s, epoch = list(self._topics), time.monotonic() - self._last_poll_s, self.member_epoch
            if not topics:  # subscribed to nothing: a member leaves, and its partitions with it
                if epoch != JOIN_EPOCH:
                    self._send_leave(self._request_timeout_ms)
                    self._wake_poll(lost=False)
                continue
            if idle_s > self._rebalance_timeout_ms / 1000:  # it joins again once the application polls
                if epoch != JOIN_EPOCH:
                    logger.warning("group %s: no poll for %.1f s (max_poll_interval_ms %d): leaving the group",
                                   self.group_id, idle_s, self._rebalance_timeout_ms)
                    self._send_leave(self._request_timeout_ms)
                    self._wake_poll(lost=True)
                continue
            self._heartbeat()

    def _heartbeat(self) -> None:
        with self._lock:
            epoch, topics, owned, incarnation = self.member_epoch, list(self._topics), self._owned, self._incarnation
            joining = epoch == JOIN_EPOCH
            self._join_sent = self._join_sent or joining
            subscription = tuple(topics) if joining or topics != self._sent_topics else None
        heartbeat = ConsumerHeartbeat(
            self.member_id, epoch, subscribed_topics=subscription, owned=() if joining else tuple(sorted(owned)),
            assignor=self._assignor, rebalance_timeout_ms=self._rebalance_timeout_ms, client_id=self.client_id,
            instance_id=self.instance_id,
        )  # fmt: skip
        try:
            answer = self._coordinator.call("consumer_heartbeat", self.group_id, heartbeat, None,
                                            timeout_ms=self._request_timeout_ms)  # fmt: skip
        except KafkaError as e:
            self._heartbeat_failed(e, epoch, incarnation)
            return
        with self._lock:
            if (self.member_epoch, self._incarnation) != (epoch, incarnation):
                return  # left or fenced meanwhile: this answer is about the old epoch
            self.member_epoch = answer.member_epoch
            self._interval_s = (answer.heartbeat_interval_ms or FIRST_HEARTBEAT_INTERVAL_MS) / 1000
            if subscription is not None:
                self._sent_topics = list(subscription)
            if answer.assignment is not None and answer.assignment != self._assigned:
                self._assigned = answer.assignment
                self._wake_poll()

    def _wake_poll(self, lost: bool = False) -> None:
        with self._lock:
            self._lost = self._lost or lost
            if not self._answered.done():
                self._answered.set_result(None)

    def _heartbeat_failed(self, error: KafkaError, epoch: int, incarnation: int) -> None:
        with self._lock:
            if (self.member_epoch, self._incarnation) != (epoch, incarnation):
                return
            if isinstance(error, EVICTED_ERRORS):
                logger.info("group %s: %s; rejoining, the partitions lost", self.group_id, error.name)
                self.member_epoch, self._sent_topics, self._join_sent = JOIN_EPOCH, None, False
                self._incarnation += 1
                self._assigned = self._owned = frozenset()
                self._wake_poll(lost=True)
                self._news.set()
            elif isinstance(error, KafkaTimeoutError) or error.retriable:
                logger.info("group %s: heartbeat failed (%s); retrying", self.group_id, error)
            else:
                self._error = error  # e.g. UNSUPPORTED_ASSIGNOR, GROUP_AUTHORIZATION_FAILED: poll raises it
        self._coordinator.forget_if_moved(error)

    # ------------------------------------------------------------------ offsets

    def commit(self, offsets: dict[TopicPartition, tuple[int, str]], timeout_ms: int) -> None:
        """Commits synchronously in the member's current epoch, again with the new one if a
        heartbeat moved it on meanwhile (STALE_MEMBER_EPOCH)."""
        deadline_s = time.monotonic() + timeout_ms / 1000
        while True:
            with self._lock:
                epoch = self.member_epoch
            try:
                self._coordinator.call("commit_offsets", self.group_id, epoch, self.member_id, offsets,
                                       timeout_ms=max(1, int((deadline_s - time.monotonic()) * 1000)))  # fmt: skip
                return
            except StaleMemberEpochError:
                if time.monotonic() + self._retry_backoff_s >= deadline_s:
                    raise
                time.sleep(self._retry_backoff_s)

    def commit_async(self, offsets: dict[TopicPartition, tuple[int, str]], now: float) -> bool:
        """Starts a commit without waiting (auto-commit); False if one is still in flight,
        the coordinator is not known yet, or the member has not joined."""
        if self._auto_commit is not None or self.member_epoch == JOIN_EPOCH:
            return False
        handle = self._coordinator.handle_nowait(now)
        if handle is None:
            return False
        ref = handle.commit_offsets.remote(self.group_id, self.member_epoch, self.member_id, offsets)
        self._auto_commit = calls.Pending(ref, now + self._request_timeout_ms / 1000, "OffsetCommit")
        return True

    def _collect_auto_commit(self, ready: set[Any], now: float) -> None:
        pending = self._auto_commit
        if pending is None or (pending.ref not in ready and not pending.expired(now)):
            return
        self._auto_commit = None
        try:
            self._coordinator.result(pending)
        except KafkaError as e:  # the next auto-commit carries the new epoch
            logger.info("group %s: auto-commit failed: %s", self.group_id, e)

    def committed(self, partitions: list[TopicPartition], timeout_ms: int) -> dict[TopicPartition, Any]:
        """The committed offsets (require_stable, as `GroupMember.committed`), asked as this member."""
        deadline_s = time.monotonic() + timeout_ms / 1000
        while True:
            member_id, epoch = self._identity()
            try:
                return self._coordinator.call("fetch_offsets", self.group_id, partitions, True, member_id, epoch,
                                              timeout_ms=max(1, int((deadline_s - time.monotonic()) * 1000)))  # fmt: skip
            except StaleMemberEpochError:
                if time.monotonic() + self._retry_backoff_s >= deadline_s:
                    raise
                time.sleep(self._retry_backoff_s)

    def fetch_committed_async(self, partitions: list[TopicPartition], now: float) -> calls.Pending | None:
        handle = self._coordinator.handle_nowait(now)
        if handle is None:
            return None
        member_id, epoch = self._identity()
        ref = handle.fetch_offsets.remote(self.group_id, partitions, True, member_id, epoch)
        return calls.Pending(ref, now + self._request_timeout_ms / 1000, "OffsetFetch")

    def _identity(self) -> tuple[str | None, int]:
        """Who asks for offsets: this member in its epoch, or (not joined) no member."""
        with self._lock:
            return (None, -1) if self.member_epoch == JOIN_EPOCH else (self.member_id, self.member_epoch)

    def answer(self, pending: calls.Pending) -> Any:
        """The (ready or expired) call's result; a coordinator error makes the member look it up again."""
        return self._coordinator.result(pending)

    # ------------------------------------------------------------------ leaving

    def _send_leave(self, timeout_ms: int) -> None:
        """Leaves with epoch -1 (a static member with -2: it keeps its partitions until its
        session ends, for a process with its instance id to take them over); also when a
        join may be in flight (its answer is then dropped, and the leave ends the member it made)."""
        with self._lock:
            epoch, joined = self.member_epoch, self._join_sent
            self.member_epoch, self._sent_topics, self._join_sent = JOIN_EPOCH, None, False
            self._assigned = self._owned = frozenset()
            self._incarnation += 1
        if epoch == JOIN_EPOCH and not joined:
            return
        try:
            leave = ConsumerHeartbeat(self.member_id, LEAVE_EPOCH if self.instance_id is None else STATIC_LEAVE_EPOCH,
                                      instance_id=self.instance_id)  # fmt: skip
            self._coordinator.call("consumer_heartbeat", self.group_id, leave, None, timeout_ms=timeout_ms)
        except KafkaError as e:
            logger.info("group %s: leave: %s", self.group_id, e)

    def leave(self, timeout_ms: int | None = None) -> None:
        """Leaves the group (epoch -1): the coordinator hands this member's partitions on at once."""
        for call in (self._auto_commit, self._revoking[0] if self._revoking else None):
            if call is not None:
                calls.cancel(call.ref)
        self._auto_commit = self._revoking = None
        self._consuming = frozenset()
        with self._lock:
            self._topics = []
        self._send_leave(timeout_ms or self._request_timeout_ms)

    def close(self, timeout_ms: int | None = None) -> None:
        self._closed.set()
        self._news.set()
        self._heartbeats.join(timeout=5)
        self.leave(timeout_ms)
