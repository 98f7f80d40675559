"""rayk's Python front door: deploy or attach to a cluster and use it through actor handles."""

from rayk.client.cluster import Cluster, connect, start
from rayk.client.produce_future import BatchOffsets, SendBatchMetadata
from rayk.client.types import (
    ConsumerRecord,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    PartitionReassignment,
    RecordMetadata,
    TopicPartition,
)

__all__ = [
    "BatchOffsets",
    "Cluster",
    "ConsumerRecord",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "PartitionReassignment",
    "RecordMetadata",
    "SendBatchMetadata",
    "TopicPartition",
    "connect",
    "start",
]
