"""GroupAdmin: an Admin's calls on consumer groups and share groups, at the groups'
coordinators (Kafka's Admin ListGroups, DescribeGroups, DeleteGroups, OffsetDelete and the
share group calls of KIP-932).

A group's calls go to the coordinator of its `__consumer_offsets` partition through a
CoordinatorLink, which finds the coordinator (FindCoordinator, at the Controller) and finds
it again when it moves; the Admin keeps one link per group, at most
MAX_COORDINATOR_LINKS (the oldest is dropped), so a caller that polls a group pays one
FindCoordinator, not one per call. Calls on many groups ask them one after the other; a
description's end offsets are asked of every partition's leader at once.

Every call is bounded by the Admin's `default_api_timeout_ms` (its ApiCalls); what each
answers and raises is documented on the Admin's method of the same name. Thread-safe, as
the Admin: the links are kept under a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

from rayk.client import calls
from rayk.client.coordinator_link import CoordinatorLink
from rayk.client.descriptions import ConsumerGroupDescription, GroupListing, MemberDescription, PartitionLag
from rayk.client.types import TopicPartition, topic_partition_of
from rayk.coordinator.group.consumer_group import GroupState
from rayk.errors import GroupIdNotFoundError, InvalidRequestError, KafkaError, UnknownTopicOrPartitionError
from rayk.internal_topics import OFFSETS_TOPIC

MAX_COORDINATOR_LINKS = 256  # groups whose coordinator an Admin remembers


class GroupAdmin:
    """An Admin's consumer-group and share-group calls, with the links to the groups'
    coordinators it keeps."""

    def __init__(self, controller: Any, api_calls: calls.ApiCalls) -> None:
        self._controller = controller
        self._calls = api_calls
        # Per group, the link to its coordinator (which looks it up again when it moves):
        # one FindCoordinator per group, not per call, for callers that poll a group.
        self._coordinator_links: dict[str, CoordinatorLink] = {}
        self._coordinator_links_lock = threading.Lock()

    # ------------------------------------------------------------------ consumer groups

    def list_consumer_groups(self) -> list[GroupListing]:
        listed = self._calls.retry(self._list_groups, "ListGroups")
        return sorted((GroupListing(**g) for groups in listed for g in groups), key=lambda g: g.group_id)

    def _list_groups(self, deadline_s: float) -> list[list[dict]]:
        coordinators = calls.get(self._controller.coordinators.remote(), deadline_s, "FindCoordinators")
        asked = [c.list_groups.remote() for c in coordinators if c is not None]
        return calls.get_all(asked, deadline_s, "ListGroups")

    def delete_consumer_groups(self, group_ids: Iterable[str]) -> dict[str, KafkaError | None]:
        out: dict[str, KafkaError | None] = {}
        exists = self._offsets_topic_exists()
        for group_id in group_ids:
            try:
                if not exists:
                    raise GroupIdNotFoundError(f"consumer group {group_id!r} does not exist: no group has been used yet")
                self._coordinator(group_id).call("delete_group", group_id, timeout_ms=self._calls.default_api_timeout_ms)
                out[group_id] = None
            except KafkaError as e:
                out[group_id] = e
        return out

    def delete_consumer_group_offsets(
        self, group_id: str, partitions: Iterable[TopicPartition | tuple[str, int]]
    ) -> dict[TopicPartition, KafkaError | None]:
        wanted = [topic_partition_of(key) for key in partitions]
        if not self._offsets_topic_exists():
            raise GroupIdNotFoundError(f"consumer group {group_id!r} does not exist: no group has been used yet")
        missing = set(self._missing_partitions(wanted))
        results: dict[TopicPartition, KafkaError | None] = {
            tp: UnknownTopicOrPartitionError(f"{tp.topic}-{tp.partition} does not exist") for tp in missing}
        existing = [(tp.topic, tp.partition) for tp in wanted if tp not in missing]
        deleted = self._coordinator(group_id).call(
            "delete_offsets", group_id, existing, timeout_ms=self._calls.default_api_timeout_ms
        )
        results.update({TopicPartition(*tp): error for tp, error in deleted.items()})
        return {tp: results[tp] for tp in wanted}

    def describe_consumer_groups(self, group_ids: Iterable[str]) -> dict[str, ConsumerGroupDescription]:
        group_ids = list(group_ids)
        if group_ids and not self._offsets_topic_exists():
            raise GroupIdNotFoundError(f"consumer group {group_ids[0]!r} does not exist: no group has been used yet")
        return {group_id: self._describe_group(group_id) for group_id in group_ids}

    def _describe_group(self, group_id: str) -> ConsumerGroupDescription:
        info = self._coordinator(group_id).call("describe_group", group_id, True,  # consumer-protocol groups too
                                                timeout_ms=self._calls.default_api_timeout_ms)  # fmt: skip
        if info["state"] == GroupState.DEAD.value:
            raise GroupIdNotFoundError(f"consumer group {group_id!r} does not exist (no members, no committed offsets)")
        committed_offsets = sorted(info.pop("offsets").items())
        ends = self._end_offsets([tp for tp, _ in committed_offsets])
        lag = {}
        for ((topic, partition), committed), end in zip(committed_offsets, ends):
            lag[TopicPartition(topic, partition)] = PartitionLag(committed, end, None if end is None else max(0, end - committed))
        members = [MemberDescription(**m) for m in info.pop("members")]
        return ConsumerGroupDescription(**info, members=members, partitions=lag)

    def _offsets_topic_exists(self) -> bool:
        """Whether __consumer_offsets exists: before a group is first used, no group does."""
        return OFFSETS_TOPIC in self._calls(lambda: self._controller.list_topics.remote(), "ListTopics")

    # ------------------------------------------------------------------ share groups (KIP-932)

    def describe_share_groups(self, group_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        return {g: self._coordinator(g).call("describe_share_group", g, timeout_ms=self._calls.default_api_timeout_ms)
                for g in group_ids}  # fmt: skip

    def list_share_group_offsets(self, group_id: str) -> dict[TopicPartition, int]:
        offsets = self._coordinator(group_id).call("share_group_offsets", group_id,
                                                   timeout_ms=self._calls.default_api_timeout_ms)  # fmt: skip
        return {TopicPartition(t, p): o for (t, p), o in sorted(offsets.items())}

    def alter_share_group_offsets(self, group_id: str, start_offsets: Mapping[tuple[str, int], int]) -> None:
        wanted = {topic_partition_of(key): _share_start_offset(key, offset) for key, offset in start_offsets.items()}
        self._check_partitions_exist(wanted)
        self._coordinator(group_id).call("alter_share_group_offsets", group_id,
                                         {(tp.topic, tp.partition): o for tp, o in wanted.items()},
                                         timeout_ms=self._calls.default_api_timeout_ms)  # fmt: skip

    def delete_share_group_offsets(self, group_id: str, topics: Iterable[str]) -> None:
        names = sorted(set(topics))
        self._check_partitions_exist({TopicPartition(name, -1) for name in names})
        self._coordinator(group_id).call("delete_share_group_offsets", group_id, names,
                                         timeout_ms=self._calls.default_api_timeout_ms)  # fmt: skip

    def alter_share_group_config(self, group_id: str, configs: Mapping[str, str]) -> None:
        self._coordinator(group_id).call("alter_share_group_configs", group_id, dict(configs),
                                         timeout_ms=self._calls.default_api_timeout_ms)  # fmt: skip

    # ------------------------------------------------------------------ lookups

    def _missing_partitions(self, wanted: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Those of `wanted` that do not exist, in order (partition -1: the topic only),
        from one Metadata call to the Controller."""
        wanted = sorted(wanted)
        topics = sorted({tp.topic for tp in wanted})
        described = self._calls(lambda: self._controller.client_metadata.remote(topics), "Metadata")["topics"]
        return [tp for tp in wanted if (known := described.get(tp.topic)) is None
                or (tp.partition != -1 and tp.partition not in known["partitions"])]  # fmt: skip

    def _check_partitions_exist(self, wanted: Iterable[TopicPartition]) -> None:
        """UnknownTopicOrPartitionError naming the first of `wanted` that does not exist."""
        missing = self._missing_partitions(wanted)
        if missing:
            tp = missing[0]
            raise UnknownTopicOrPartitionError(f"{tp.topic if tp.partition == -1 else f'{tp.topic}-{tp.partition}'} does not exist")

    def _coordinator(self, group_id: str) -> CoordinatorLink:
        with self._coordinator_links_lock:
            link = self._coordinator_links.get(group_id)
            if link is None:
                while len(self._coordinator_links) >= MAX_COORDINATOR_LINKS:
                    del self._coordinator_links[next(iter(self._coordinator_links))]  # the oldest
                link = self._coordinator_links[group_id] = CoordinatorLink(
                    self._controller, group_id, retry_backoff_ms=self._calls.retry_backoff_ms)
            return link

    def _end_offsets(self, partitions: list[tuple[str, int]]) -> list[int | None]:
        """Each partition's high watermark from its leader, asked of all at once; None
        where there is no leader or it does not answer within default_api_timeout_ms."""
        deadline_s = self._calls.deadline_s()
        leaders = [self._controller.leader.remote(t, p) for t, p in partitions]
        asked = []
        for (topic, partition), leader in zip(partitions, leaders):
            try:
                asked.append(calls.get(leader, deadline_s, f"leader of {topic}-{partition}").list_offset.remote(-1))
            except KafkaError:
                asked.append(None)
        ends: list[int | None] = []
        for (topic, partition), ref in zip(partitions, asked):
            try:
                ends.append(None if ref is None else calls.get(ref, deadline_s, f"end offset of {topic}-{partition}")[0])
            except KafkaError:
                ends.append(None)
        return ends


def _share_start_offset(key: Any, offset: Any) -> int:
    """A share-partition's new start offset: an integer >= 0."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidRequestError(f"{key!r}: a share group's start offset must be an integer >= 0, got {offset!r}")
    return offset
