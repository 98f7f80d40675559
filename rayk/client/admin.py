"""Admin: topics, topic configs and consumer groups of a rayk cluster (kafka-python's
KafkaAdminClient, over the Controller's and the group coordinators' actor handles)."""

from __future__ import annotations

from typing import Any, NamedTuple

import ray

from rayk.actors.consumer_group import GroupState
from rayk.actors.group_coordinator import OFFSETS_TOPIC
from rayk.client.group_member import CoordinatorLink
from rayk.client.types import TopicPartition
from rayk.errors import GroupIdNotFoundError, KafkaError


class NewTopic(NamedTuple):
    """-1 (or None) takes the brokers' `num.partitions` / `default.replication.factor`."""

    name: str
    num_partitions: int | None = -1
    replication_factor: int | None = -1
    topic_configs: dict[str, Any] | None = None


class Admin:
    def __init__(self, cluster: Any) -> None:
        self._cluster = cluster
        self._controller = cluster.controller

    # ------------------------------------------------------------------ topics

    def create_topic(
        self,
        name: str,
        num_partitions: int | None = None,
        replication_factor: int | None = None,
        config: dict[str, Any] | None = None,
    ) -> list[dict]:
        """Counts left out take the brokers' `num.partitions` / `default.replication.factor`."""
        return ray.get(self._controller.create_topic.remote(name, num_partitions, replication_factor, config))

    def create_topics(self, new_topics: list[NewTopic]) -> None:
        for topic in new_topics:
            self.create_topic(topic.name, topic.num_partitions, topic.replication_factor, topic.topic_configs)

    def delete_topics(self, names: list[str]) -> None:
        for name in names:
            ray.get(self._controller.delete_topic.remote(name))

    def list_topics(self, include_internal: bool = False) -> list[str]:
        names = ray.get(self._controller.list_topics.remote())
        return [n for n in names if include_internal or not n.startswith("__")]

    def describe_topics(self, names: list[str] | None = None) -> dict[str, list[dict]]:
        names = names if names is not None else self.list_topics()
        return {n: ray.get(self._controller.describe_topic.remote(n)) for n in names}

    def describe_topic_configs(self, name: str) -> dict[str, str]:
        """The topic's own configs (Kafka names); everything else has the broker default."""
        return ray.get(self._controller.topic_configs.remote(name))

    def alter_topic_configs(self, name: str, configs: dict[str, Any]) -> dict[str, str]:
        """Sets configs on top of the topic's current ones; returns the result."""
        merged = {**self.describe_topic_configs(name), **configs}
        return ray.get(self._controller.alter_topic_configs.remote(name, merged))

    # ------------------------------------------------------------------ consumer groups

    def list_consumer_groups(self) -> list[dict]:
        """[{group_id, state, protocol_type}] across every coordinator."""
        out = []
        for coordinator in ray.get(self._controller.coordinators.remote()):
            if coordinator is not None:
                out += ray.get(coordinator.list_groups.remote())
        return sorted(out, key=lambda g: g["group_id"])

    def describe_consumer_group(self, group_id: str) -> dict:
        """State, members with their assignments, and per partition the committed offset,
        the end offset (high watermark) and the lag between them. GROUP_ID_NOT_FOUND for a
        group with neither members nor committed offsets."""
        if OFFSETS_TOPIC not in ray.get(self._controller.list_topics.remote()):
            raise GroupIdNotFoundError(f"consumer group {group_id!r} does not exist: no group has been used yet")
        info = CoordinatorLink(self._controller, group_id).call("describe_group", group_id)
        if info["state"] == GroupState.DEAD.value:
            raise GroupIdNotFoundError(f"consumer group {group_id!r} does not exist (no members, no committed offsets)")
        lag = {}
        for (topic, partition), committed in sorted(info["offsets"].items()):
            try:
                leader = self._cluster.leader(topic, partition)
                end, _ = ray.get(leader.list_offset.remote(-1))
            except KafkaError:
                end = None
            lag[TopicPartition(topic, partition)] = {
                "committed": committed,
                "end_offset": end,
                "lag": None if end is None else max(0, end - committed),
            }
        info["partitions"] = lag
        del info["offsets"]
        return info
