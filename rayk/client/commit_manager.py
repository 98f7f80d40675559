"""CommitManager: a Consumer's commits of offsets to its group (Kafka's consumer
CommitRequestManager: commitSync, commitAsync, auto-commit and committed()).

What it commits is `(topic, partition) -> (offset, metadata)` as the group membership
(GroupMember, ConsumerProtocolMember) sends it; the consumer says what (its consumed
positions, or the offsets its caller gave). A synchronous commit waits up to
`default_api_timeout_ms`; asynchronous ones run on one background thread, made at the
first, so they complete in the order they were asked for; auto-commits (with
`enable_auto_commit`, in a group) go every `auto_commit_interval_ms` from `poll`, without
waiting. `close` waits for the asynchronous commits under way, then commits once more.
Commits land in the order they were asked for, whatever their kind: a synchronous one
first waits for the asynchronous ones asked for before it (as Kafka's commitSync does),
and an auto-commit waits its turn while one is under way. Otherwise an asynchronous commit
queued behind a slow one could land after a newer commit and move the group's committed
offset back (records consumed again after a restart).

Used from the consumer's thread; its one commit thread only calls the group membership,
which is thread-safe.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable, Iterable

from rayk.client.consumer_config import ConsumerConfig
from rayk.client.consumer_protocol_member import ConsumerProtocolMember
from rayk.client.group_member import GroupMember
from rayk.client.types import OffsetAndMetadata, TopicPartition
from rayk.errors import KafkaError, KafkaTimeoutError

logger = logging.getLogger(__name__)

Offsets = dict[tuple[str, int], tuple[int, str]]  # (topic, partition) -> (offset, metadata), as commits carry them
CommitCallback = Callable[[dict[TopicPartition, OffsetAndMetadata], KafkaError | None], None]


class CommitManager:
    """A consumer's commits: synchronous, asynchronous (in order, on one thread) and
    automatic, and its lookups of what the group committed."""

    def __init__(self, group: GroupMember | ConsumerProtocolMember | None, config: ConsumerConfig) -> None:
        self._group = group
        self._api_timeout_ms = config.default_api_timeout_ms
        self.auto_commits = config.auto_commits
        self._auto_commit_interval_s = config.auto_commit_interval_ms / 1000
        self.next_auto_commit_s = time.monotonic() + self._auto_commit_interval_s
        self._async_commits: concurrent.futures.ThreadPoolExecutor | None = None  # commit_async, in order
        self._last_async_commit: concurrent.futures.Future[None] | None = None

    def member(self, what: str) -> GroupMember | ConsumerProtocolMember:
        """The group membership; ValueError (naming the consumer's method `what`) without a group_id."""
        if self._group is None:
            raise ValueError(f"{what} needs a group_id")
        return self._group

    def commit(self, offsets: Offsets) -> None:
        """Commits `offsets` (nothing if empty) after the asynchronous commits asked for
        before, waiting up to default_api_timeout_ms in all (KafkaTimeoutError)."""
        if offsets:
            member = self.member("commit")
            deadline_s = time.monotonic() + self._api_timeout_ms / 1000
            self._wait_for_async_commits(deadline_s)
            member.commit(offsets, max(1, int((deadline_s - time.monotonic()) * 1000)))

    def _wait_for_async_commits(self, deadline_s: float) -> None:
        last = self._last_async_commit
        if last is None or last.done():
            return
        done, _ = concurrent.futures.wait([last], timeout=max(0.0, deadline_s - time.monotonic()))
        if not done:
            raise KafkaTimeoutError("the asynchronous commits asked for before this one did not complete in time")

    def commit_async(self, offsets: Offsets, callback: CommitCallback | None) -> concurrent.futures.Future[None]:
        """Commits `offsets` on the commit thread, after the commits asked for before."""
        group, timeout_ms = self.member("commit_async"), self._api_timeout_ms
        if self._async_commits is None:
            self._async_commits = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rayk-commit-async")
        future = self._async_commits.submit(lambda: group.commit(offsets, timeout_ms) if offsets else None)
        self._last_async_commit = future
        if callback is not None:
            done = {TopicPartition(*tp): OffsetAndMetadata(*value) for tp, value in offsets.items()}
            future.add_done_callback(lambda f: callback(done, f.exception()))  # type: ignore[arg-type]
        return future

    def maybe_auto_commit(self, consumed: Callable[[], Offsets], now: float) -> None:
        """Starts an auto-commit of the `consumed()` positions if one is due (never waits)."""
        if self.auto_commits and now >= self.next_auto_commit_s:
            if self._last_async_commit is not None and not self._last_async_commit.done():
                return  # after the asynchronous commits under way, at a later poll
            offsets = consumed()
            if not offsets or self.member("auto-commit").commit_async(offsets, now):
                self.next_auto_commit_s = now + self._auto_commit_interval_s

    def committed(
        self, partitions: Iterable[TopicPartition | tuple[str, int]], what: str
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """The group's committed offsets and metadata of `partitions` (those with a commit),
        in one lookup within default_api_timeout_ms."""
        group = self.member(what)
        tps = [TopicPartition(*tp) for tp in partitions]
        found = group.committed([(tp.topic, tp.partition) for tp in tps], self._api_timeout_ms)
        out = {}
        for tp in tps:
            value = found.get((tp.topic, tp.partition))
            if value is not None and value.offset >= 0:
                out[tp] = OffsetAndMetadata(value.offset, value.metadata)
        return out

    def close(self, consumed: Offsets | None, timeout_ms: int) -> None:
        """Waits for the asynchronous commits under way, then commits `consumed` if
        auto-commit is on (None: nothing to commit); an error is logged, not raised."""
        if self._async_commits is not None:
            if self._last_async_commit is not None:
                concurrent.futures.wait([self._last_async_commit], timeout=timeout_ms / 1000)
            self._async_commits.shutdown(wait=False, cancel_futures=True)
        if consumed is not None and self.auto_commits:
            try:
                self.member("close").commit(consumed, timeout_ms)
            except KafkaError as e:
                logger.info("commit on close: %s", e)


def commit_payload(offsets: dict[TopicPartition, OffsetAndMetadata | int]) -> Offsets:
    """What a commit sends for `offsets`: (topic, partition) -> (offset, metadata)."""
    payload = {}
    for tp, value in offsets.items():
        offset, metadata = (value, "") if isinstance(value, int) else (value.offset, value.metadata)
        payload[(tp[0], tp[1])] = (offset, metadata)
    return payload
