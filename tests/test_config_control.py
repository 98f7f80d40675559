"""ConfigurationControlManager alone: topics' configs from their records, and the
broker's defaults under them."""

from __future__ import annotations

import pytest

from rayk.config import UNCLEAN_LEADER_ELECTION_ENABLE, BrokerConfig
from rayk.errors import UnknownTopicOrPartitionError
from rayk.metadata.config_control import ConfigurationControlManager
from rayk.metadata.records import RemoveTopicRecord, TopicConfigsRecord, TopicRecord
from tests.metadata_helpers import replay_into


def test_a_topics_configs_come_with_it_are_replaced_whole_and_go_with_it():
    configs = ConfigurationControlManager(BrokerConfig())
    offset = replay_into(configs, [TopicRecord("t", "id", {"retention.ms": "5"})])
    assert configs.of("t") == {"retention.ms": "5"}
    offset = replay_into(configs, configs.plan_alter_topic_configs("t", {"cleanup.policy": "compact"}), offset)
    assert configs.of("t") == {"cleanup.policy": "compact"}
    configs.of("t")["x"] = "y"
    assert configs.of("t") == {"cleanup.policy": "compact"}, "readers get a copy"
    replay_into(configs, [RemoveTopicRecord("t")], offset)
    with pytest.raises(UnknownTopicOrPartitionError):
        configs.plan_alter_topic_configs("t", {})


@pytest.mark.parametrize(("broker_default", "topic", "unclean"), [
    (False, {}, False), (True, {}, True), (True, {UNCLEAN_LEADER_ELECTION_ENABLE: "false"}, False),
    (False, {UNCLEAN_LEADER_ELECTION_ENABLE: "true"}, True),
])
def test_unclean_election_is_the_topics_setting_over_the_brokers(broker_default, topic, unclean):
    configs = ConfigurationControlManager(BrokerConfig(unclean_leader_election_enable=broker_default))
    replay_into(configs, [TopicRecord("t", "id", topic)])
    assert configs.unclean("t") is unclean


def test_configs_of_an_unknown_topic_are_refused_on_replay():
    with pytest.raises(AssertionError):
        replay_into(ConfigurationControlManager(BrokerConfig()), [TopicConfigsRecord("nope", {})])
