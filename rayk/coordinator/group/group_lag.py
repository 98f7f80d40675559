"""Consumer lag per group and partition, as `kafka-consumer-groups.sh --describe` shows it:
the partition's high watermark (where a consumer can read to) minus the group's committed
offset, never below 0.

A broker computes it for the groups its coordinators hold (the `__consumer_offsets`
partitions it leads), every few seconds: one call to each such coordinator for its
committed offsets, one to the Controller for the leaders of the partitions committed, and
one `list_offset(LATEST)` per such partition to its leader, concurrently. A round ends
within LAG_ROUND_TIMEOUT_MS: a partition whose coordinator or leader has not answered by
then (restarting, moving) is left out of that round. The cost grows with the partitions
groups commit offsets for, not with the records.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from ray.exceptions import RayError

from rayk.errors import KafkaError

LAG_ROUND_TIMEOUT_MS = 5_000
LATEST_TIMESTAMP = -1  # ListOffsets: the high watermark

TopicPartition = tuple[str, int]
GroupPartition = tuple[str, str, int]  # group, topic, partition
Committed = dict[str, dict[TopicPartition, int]]  # group -> (topic, partition) -> committed offset


def lags(committed: Committed, end_offsets: dict[TopicPartition, int]) -> dict[GroupPartition, int]:
    """Per (group, topic, partition) with a committed offset and a known end offset: the lag."""
    return {
        (group, topic, partition): max(0, end_offsets[(topic, partition)] - offset)
        for group, table in committed.items()
        for (topic, partition), offset in table.items()
        if offset >= 0 and (topic, partition) in end_offsets
    }


async def group_lags(coordinators: Iterable[Any], controller: Any) -> dict[GroupPartition, int]:
    """The lags of every group whose committed offsets `coordinators` (OffsetsPartitionReplica
    handles) hold, with end offsets from the partitions' leaders (found at `controller`)."""
    deadline_s = time.monotonic() + LAG_ROUND_TIMEOUT_MS / 1000
    committed: Committed = {}
    for table in await _settled((c.committed_offsets.remote() for c in coordinators), deadline_s):
        for group, offsets in (table or {}).items():
            committed.setdefault(group, {}).update(offsets)
    partitions = sorted({tp for table in committed.values() for tp in table})
    if not partitions:
        return {}
    (described,) = await _settled([controller.metadata.remote(sorted({t for t, _ in partitions}))], deadline_s)
    leaders = {
        (topic, p): info["leader_handle"]
        for topic, meta in (described or {}).items()
        for p, info in meta["partitions"].items()
        if info["leader_handle"] is not None
    }
    asked = [tp for tp in partitions if tp in leaders]
    answers = await _settled((leaders[tp].list_offset.remote(LATEST_TIMESTAMP) for tp in asked), deadline_s)
    return lags(committed, {tp: answer[0] for tp, answer in zip(asked, answers) if answer is not None})


async def _settled(refs: Iterable[Any], deadline_s: float) -> list[Any]:
    """Each call's answer, or None for one that failed or was not answered by `deadline_s`."""

    async def one(ref: Any) -> Any:
        try:
            return await asyncio.wait_for(ref, max(deadline_s - time.monotonic(), 0))
        except (RayError, KafkaError, TimeoutError):
            return None

    return list(await asyncio.gather(*(one(r) for r in refs)))
