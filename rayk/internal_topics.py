"""Internal topics: the topics only the brokers write (Kafka's
org.apache.kafka.common.internals.Topic), shared by the actors, the listener and the clients.

`__consumer_offsets` holds the consumer groups and their committed offsets; its only writer
is the group coordinator inside each partition's leader (coordinator/group/offsets_replica.py).
`__transaction_state` holds the transactional ids and their transactions; its only writer is
the transaction coordinator inside each partition's leader
(coordinator/transaction/transaction_state_replica.py). As in Kafka (ReplicaManager.appendToLocalLog: an
internal topic and no internalTopicsAllowed), a client's produce to an internal topic is
INVALID_TOPIC_EXCEPTION, and a Metadata request that auto-creates one creates it with the
brokers' settings for it (offsets.topic.*, transaction.state.log.*), never the defaults
for client topics. The partition count of either is fixed once created: it is what maps a
group or a transactional id to its coordinator (`coordinator_partition`).
"""

from __future__ import annotations

import struct

OFFSETS_TOPIC = "__consumer_offsets"
TRANSACTION_STATE_TOPIC = "__transaction_state"
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC})


def is_internal(topic: str) -> bool:
    return topic in INTERNAL_TOPICS


def java_string_hash(text: str) -> int:
    """Java's String.hashCode: `31*h + c` over UTF-16 code units, as a signed 32-bit int.

    A character outside the Basic Multilingual Plane counts as its two surrogates, as in
    Java; a lone surrogate (possible in a Python str) is one code unit.
    """
    h = 0
    for (unit,) in struct.iter_unpack(">H", text.encode("utf-16-be", "surrogatepass")):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def coordinator_partition(key: str, num_partitions: int) -> int:
    """The partition of an internal topic whose leader coordinates `key` (a group id in
    `__consumer_offsets`, a transactional id in `__transaction_state`): Kafka's
    `Utils.abs(key.hashCode()) % numPartitions`, where Utils.abs is Math.abs except that
    Integer.MIN_VALUE (which has no absolute value) gives 0."""
    if num_partitions < 1:
        raise ValueError(f"a topic has at least one partition, not {num_partitions}")
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions
