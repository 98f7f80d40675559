"""Kafka's producer-side partitioning: which partition a record goes to.

Two Java computations must be reproduced bit for bit, since every Kafka client agrees on
them:

* Keyed records go to `toPositive(murmur2(key)) % numPartitions` (the producer's
  BuiltInPartitioner.partitionForKey). `murmur2` is Java's `Utils.murmur2`: MurmurHash2
  with seed 0x9747b28c over the key bytes, 4-byte little-endian blocks, returned as a
  signed 32-bit int. `toPositive(x)` is `x & 0x7fffffff` (not `abs`).
* Unkeyed records stick to one partition per topic until the producer reports that a
  batch for it is complete, then move to a different random one (KIP-480's sticky
  partitioner, Java's StickyPartitionCache).
(A group's coordinator partition, which uses Utils.abs rather than toPositive, is the
broker's business: `rayk.internal_topics.coordinator_partition`.)

All results are Python ints in Java's signed 32-bit range.
"""

from __future__ import annotations

import random
import struct

__all__ = [
    "StickyPartitioner",
    "murmur2",
    "partition_for_key",
]

_MASK_32 = 0xFFFFFFFF
_MURMUR2_SEED = 0x9747B28C
_MURMUR2_M = 0x5BD1E995
_MURMUR2_R = 24


def _signed_32(value: int) -> int:
    """Reads the low 32 bits of `value` as a Java int."""
    value &= _MASK_32
    return value - (1 << 32) if value & 0x80000000 else value


def _to_positive(value: int) -> int:
    """Kafka's Utils.toPositive: clears the sign bit (so -1 -> 2147483647, MIN_VALUE -> 0)."""
    return value & 0x7FFFFFFF


def _check_num_partitions(num_partitions: int) -> None:
    if num_partitions < 1:
        raise ValueError(f"a topic has at least one partition, not {num_partitions}")


def murmur2(data: bytes | bytearray | memoryview) -> int:
    """Java's `Utils.murmur2(byte[])`: MurmurHash2 (seed 0x9747b28c) as a signed 32-bit int."""
    view = memoryview(data).cast("B")
    length = len(view)
    m = _MURMUR2_M
    h = (_MURMUR2_SEED ^ length) & _MASK_32
    tail = length & ~3
    for (k,) in struct.iter_unpack("<I", view[:tail]):
        k = (k * m) & _MASK_32
        k ^= k >> _MURMUR2_R
        k = (k * m) & _MASK_32
        h = ((h * m) & _MASK_32) ^ k
    remaining = length - tail
    if remaining:  # Java's switch falls through: 3 -> 2 -> 1, multiplying once at the end
        if remaining == 3:
            h ^= view[tail + 2] << 16
        if remaining >= 2:
            h ^= view[tail + 1] << 8
        h ^= view[tail]
        h = (h * m) & _MASK_32
    h ^= h >> 13
    h = (h * m) & _MASK_32
    h ^= h >> 15
    return _signed_32(h)


def partition_for_key(key: bytes | bytearray | memoryview, num_partitions: int) -> int:
    """The partition Kafka's producer picks for a serialized key: toPositive(murmur2) % n
    (with the compiled murmur2 where it is built; `murmur2` here is its reference)."""
    _check_num_partitions(num_partitions)
    return _to_positive(_fast_murmur2(key)) % num_partitions


try:
    from rayk.storage._columns import murmur2 as _fast_murmur2  # ~20x the pure one; same result
except ImportError:  # pragma: no cover - no C compiler at install time
    _fast_murmur2 = murmur2


class StickyPartitioner:
    """Partition choice for unkeyed records (KIP-480, Java's StickyPartitionCache).

    Each topic has a sticky partition, chosen at random on first use; unkeyed records
    keep going to it so they fill one batch instead of many small ones. When the
    producer closes a batch for that partition it calls `on_new_batch`, and the topic
    moves to a different partition chosen uniformly among the others. A call naming a
    partition that is no longer the sticky one is stale (another batch already moved
    it) and changes nothing.

    The partition count is passed on every call since it can grow; a sticky partition
    at or beyond the current count is replaced. Pass a seeded `random.Random` for
    reproducible choices. Not thread-safe: give each producer its own instance.
    """

    __slots__ = ("_rng", "_sticky_by_topic")

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else random.Random()
        self._sticky_by_topic: dict[str, int] = {}

    def partition(self, topic: str, num_partitions: int) -> int:
        """The partition for the next unkeyed record of `topic`."""
        current = self._sticky_by_topic.get(topic)
        if current is not None and current < num_partitions:
            return current
        _check_num_partitions(num_partitions)
        chosen = self._rng.randrange(num_partitions)
        self._sticky_by_topic[topic] = chosen
        return chosen

    def on_new_batch(self, topic: str, prev_partition: int, num_partitions: int) -> int:
        """The producer closed a batch for `prev_partition` of `topic`: move off it.

        Returns the topic's sticky partition afterwards. With one partition it stays 0;
        with more, the new one always differs from `prev_partition`.
        """
        _check_num_partitions(num_partitions)
        current = self._sticky_by_topic.get(topic)
        if current is not None and current != prev_partition and current < num_partitions:
            return current  # stale: the topic already moved off prev_partition
        if current is None or current >= num_partitions or num_partitions == 1:
            chosen = self._rng.randrange(num_partitions)
        else:
            # Uniform over the other num_partitions - 1 partitions, without retrying.
            chosen = self._rng.randrange(num_partitions - 1)
            if chosen >= current:
                chosen += 1
        self._sticky_by_topic[topic] = chosen
        return chosen
