"""Internal topics: the topics only the brokers write (Kafka's
org.apache.kafka.common.internals.Topic), shared by the actors, the listener and the clients.

`__consumer_offsets` holds the consumer groups and their committed offsets; its only writer
is the group coordinator inside each partition's leader (actors/offsets_replica.py). As in
Kafka (ReplicaManager.appendToLocalLog: an internal topic and no internalTopicsAllowed), a
client's produce to an internal topic is INVALID_TOPIC_EXCEPTION, and a Metadata request
that auto-creates one creates it with the brokers' settings for it (offsets.topic.*),
never the defaults for client topics. rayk has no transactions, so no
`__transaction_state`.
"""

from __future__ import annotations

OFFSETS_TOPIC = "__consumer_offsets"
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC})


def is_internal(topic: str) -> bool:
    return topic in INTERNAL_TOPICS
