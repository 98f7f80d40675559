"""rayk's Python front door: deploy or attach to a cluster (`start`, `connect`) and use it
through its clients (`Producer`, `Consumer`, `Admin`, made by `Cluster.producer()`,
`.consumer()` and `.admin()`).

The clients load on first use, so a process that only unpickles a `Cluster` (a Ray task,
a partition replica) does not import them.
"""

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from rayk.client.admin import Admin, NewTopic
    from rayk.client.consumer import Consumer
    from rayk.client.producer import Producer
    from rayk.client.transactions import ConsumerGroupMetadata

_CLIENTS = {"Admin": "admin", "NewTopic": "admin", "Consumer": "consumer", "Producer": "producer",
            "ConsumerGroupMetadata": "transactions"}

__all__ = [
    "Admin",
    "BatchOffsets",
    "Cluster",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerRecord",
    "NewTopic",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "PartitionReassignment",
    "Producer",
    "RecordMetadata",
    "SendBatchMetadata",
    "TopicPartition",
    "connect",
    "start",
]


def __getattr__(name: str) -> Any:
    if name in _CLIENTS:
        import importlib

        return getattr(importlib.import_module(f"rayk.client.{_CLIENTS[name]}"), name)
    raise AttributeError(f"module 'rayk.client' has no attribute {name!r}")
