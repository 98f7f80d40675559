"""ConfigurationControlManager: topics' configs (Kafka's ConfigurationControlManager).

Owns each topic's configs (Kafka names; what is not set is at its broker-level default)
and reads them with the broker's defaults: `unclean(topic)` and `min_insync(topic)` are
what elections need.
A topic's configs come with its TopicRecord and are replaced whole by a
TopicConfigsRecord; deleting the topic deletes them. Pure: no I/O, no Ray.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rayk.config import BrokerConfig, min_insync_replicas_of, unclean_election_enabled
from rayk.errors import UnknownTopicOrPartitionError
from rayk.metadata.records import MetadataRecord, RemoveTopicRecord, TopicConfigsRecord, TopicRecord


class ConfigurationControlManager:
    """The topic-config domain of the Controller's image: owns each topic's explicitly set
    configs and resolves them over the broker's defaults for elections. Changes only by
    replay (ClusterMetadata.apply). Pure; called from the Controller's loop."""

    def __init__(self, broker_config: BrokerConfig) -> None:
        self.broker_config = broker_config
        self.topic_configs: dict[str, dict[str, str]] = {}

    def handlers(self) -> dict[type[MetadataRecord], Callable[[Any, int], None]]:
        return {
            TopicRecord: self._replay_topic,
            TopicConfigsRecord: self._replay_topic_configs,
            RemoveTopicRecord: self._replay_remove_topic,
        }

    def _replay_topic(self, record: TopicRecord, offset: int) -> None:
        self.topic_configs[record.name] = dict(record.configs)

    def _replay_topic_configs(self, record: TopicConfigsRecord, offset: int) -> None:
        assert record.name in self.topic_configs, f"configs of an unknown topic {record.name!r}"
        self.topic_configs[record.name] = dict(record.configs)

    def _replay_remove_topic(self, record: RemoveTopicRecord, offset: int) -> None:
        del self.topic_configs[record.name]

    def image_records(self) -> list[MetadataRecord]:
        return []  # a topic's configs travel in its TopicRecord (ReplicationControlManager's image)

    def of(self, topic: str) -> dict[str, str]:
        """The topic's configs (a copy)."""
        return dict(self.topic_configs[topic])

    def unclean(self, topic: str) -> bool:
        """Whether the topic may elect a leader that lacks committed records."""
        return unclean_election_enabled(self.topic_configs[topic], self.broker_config)

    def min_insync(self, topic: str) -> int:
        """The topic's min.insync.replicas (what the ELR is kept by)."""
        return min_insync_replicas_of(self.topic_configs[topic], self.broker_config)

    def plan_alter_topic_configs(self, name: str, configs: Mapping[str, str]) -> list[MetadataRecord]:
        """Replaces the topic's configs (already validated by the caller)."""
        if name not in self.topic_configs:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        return [TopicConfigsRecord(name, dict(configs))]
