"""LogConfig: Kafka's names and defaults, and rejection of nonsense."""

import pytest

from rayk.errors import InvalidConfigurationError
from rayk.storage import LogConfig
from rayk.storage.records import TimestampType


def test_defaults_are_kafkas():
    config = LogConfig()
    assert config.segment_bytes == 1 << 30
    assert config.segment_ms == 7 * 24 * 3600 * 1000
    assert config.index_interval_bytes == 4096
    assert config.segment_index_bytes == 10 * 1024 * 1024
    assert config.max_message_bytes == 1048588
    assert config.retention_bytes == -1
    assert config.flush_messages is None


def test_from_properties_reads_kafka_topic_config_names():
    config = LogConfig.from_properties(
        {"segment.bytes": "1048576", "retention.ms": 60000, "message.timestamp.type": "LogAppendTime"}
    )
    assert (config.segment_bytes, config.retention_ms) == (1048576, 60000)
    assert config.message_timestamp_type == TimestampType.LOG_APPEND_TIME


def test_to_properties_round_trips():
    config = LogConfig(segment_bytes=4096, flush_messages=10)
    assert LogConfig.from_properties(config.to_properties()) == config


def test_compaction_configs_round_trip_and_normalise():
    config = LogConfig.from_properties(
        {"cleanup.policy": " Delete , compact", "min.cleanable.dirty.ratio": "0.25", "delete.retention.ms": "5"}
    )
    assert (config.cleanup_policy, config.compacts, config.deletes) == ("compact,delete", True, True)
    assert (config.min_cleanable_dirty_ratio, config.delete_retention_ms) == (0.25, 5)
    assert LogConfig.from_properties(config.to_properties()) == config
    assert not LogConfig().compacts and LogConfig().deletes


def test_an_empty_cleanup_policy_neither_deletes_nor_compacts_and_round_trips():
    config = LogConfig.from_properties({"cleanup.policy": " "})
    assert (config.cleanup_policy, config.compacts, config.deletes) == ("", False, False)
    assert config.to_properties()["cleanup.policy"] == ""
    assert LogConfig.from_properties(config.to_properties()) == config


def test_a_compacted_log_rolls_by_max_compaction_lag():
    """The active segment is never cleaned, so max.compaction.lag.ms bounds how long it stays active."""
    assert LogConfig(segment_ms=10_000, max_compaction_lag_ms=500).roll_ms == 10_000
    assert LogConfig(segment_ms=10_000, max_compaction_lag_ms=500, cleanup_policy="compact").roll_ms == 500


def test_kafkas_long_max_means_no_flush_limit():
    assert LogConfig.from_properties({"flush.messages": str((1 << 63) - 1)}).flush_messages is None


@pytest.mark.parametrize(
    "props",
    [{"segment.bytes": "10"}, {"retention.ms": "-2"}, {"segment.bytes": "ten"}, {"no.such.config": "1"},
     {"message.timestamp.type": "Sometime"}, {"flush.messages": "0"}],
)
def test_bad_values_raise_invalid_config(props):
    with pytest.raises(InvalidConfigurationError):
        LogConfig.from_properties(props)
