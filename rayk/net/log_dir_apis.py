"""DescribeLogDirs: a broker's data directory, as Kafka's tools see log directories
(`kafka-log-dirs.sh --describe`, Admin.describeLogDirs).

Each broker answers for its own disk, as in Kafka, where the admin client sends the
request to every broker it asks about: rayk's broker has one log directory (its data
directory), which the listener asks its broker about through the Controller. An offline
directory (its disk failed: rayk/server/log_dir_health.py) is answered with
KAFKA_STORAGE_ERROR and no partitions; an online one with its replicas' sizes as of the
broker's last offset checkpoint (offset_lag 0: rayk has no future logs, no
AlterReplicaLogDirs). Needs DESCRIBE on the cluster (CLUSTER_AUTHORIZATION_FAILED
otherwise, from v3 on; before, an empty answer, as Kafka's).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from rayk.acls import CLUSTER, DESCRIBE
from rayk.errors import ClusterAuthorizationFailedError, KafkaStorageError
from rayk.net.broker_view import BrokerView

DESCRIBE_TIMEOUT_MS = 10_000


async def describe_log_dirs(view: BrokerView, request: Any) -> dict:
    if not view.authorized(request, DESCRIBE, CLUSTER):
        return {"error_code": ClusterAuthorizationFailedError.code, "results": []}
    described = await view.ask_controller("broker_log_dirs", view.broker_id, timeout_ms=DESCRIBE_TIMEOUT_MS)
    if described is None:  # this broker is not attached to the Controller (restarting)
        return {"error_code": KafkaStorageError.code, "results": []}
    return {"error_code": 0, "results": [log_dir_result(described, _wanted(request.body.topics))]}


def _wanted(topics: Any) -> set[tuple[str, int]] | None:
    """The partitions asked about; None: every one."""
    if topics is None:
        return None
    return {(t.topic, int(p)) for t in topics for p in t.partitions}


def log_dir_result(described: dict[str, Any], wanted: set[tuple[str, int]] | None) -> dict:
    """One DescribeLogDirsResult from ReplicaManager.describe_log_dirs' answer."""
    by_topic: dict[str, list[dict]] = defaultdict(list)
    for (topic, partition), size_bytes in sorted(described["partitions"].items()):
        if wanted is None or (topic, partition) in wanted:
            by_topic[topic].append({"partition_index": partition, "partition_size": size_bytes, "offset_lag": 0,
                                    "is_future_key": False})  # fmt: skip
    return {
        "error_code": 0 if described["error"] is None else KafkaStorageError.code,
        "log_dir": described["path"],
        "topics": [{"name": topic, "partitions": partitions} for topic, partitions in by_topic.items()],
        "total_bytes": described["total_bytes"],
        "usable_bytes": described["usable_bytes"],
    }
