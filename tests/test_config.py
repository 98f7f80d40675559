"""Broker and topic configs: Kafka's names, defaults and validation."""

from __future__ import annotations

import pytest

from rayk.config import (
    MIN_INSYNC_REPLICAS,
    UNCLEAN_LEADER_ELECTION_ENABLE,
    BrokerConfig,
    log_config_of,
    min_insync_replicas_of,
    unclean_election_enabled,
    validate_topic_configs,
)
from rayk.errors import InvalidConfigurationError

# --- BrokerConfig -------------------------------------------------------------------


def test_broker_config_defaults_are_kafkas():
    c = BrokerConfig()
    assert c.broker_session_timeout_ms == 9_000
    assert c.broker_heartbeat_interval_ms == 2_000
    assert c.replica_fetch_wait_max_ms == 500
    assert c.replica_fetch_min_bytes == 1
    assert c.replica_fetch_max_bytes == 1_048_576
    assert c.num_partitions == 1
    assert c.default_replication_factor == 1
    assert c.min_insync_replicas == 1
    assert c.unclean_leader_election_enable is False
    assert c.replica_high_watermark_checkpoint_interval_ms == 5_000
    assert c.log_retention_check_interval_ms == 300_000


def test_replica_lag_time_max_default_is_the_designed_10_seconds():
    """The issue and DESIGN.md fix 10000 ms (the seeds' value, Kafka before 2.5); Kafka 2.5+
    (KIP-537) uses 30000. rayk keeps 10 s so a stuck follower leaves the ISR sooner."""
    assert BrokerConfig().replica_lag_time_max_ms == 10_000


def test_from_properties_without_properties_gives_the_defaults():
    assert BrokerConfig.from_properties() == BrokerConfig()
    assert BrokerConfig.from_properties({}) == BrokerConfig()


def test_from_properties_reads_kafkas_dotted_names_and_string_values():
    c = BrokerConfig.from_properties(
        {
            "broker.session.timeout.ms": "18000",
            "broker.heartbeat.interval.ms": 3000,
            "replica.lag.time.max.ms": "30000",
            "replica.fetch.wait.max.ms": "100",
            "num.partitions": "6",
            "unclean.leader.election.enable": "true",
        }
    )
    assert c.broker_session_timeout_ms == 18_000
    assert c.broker_heartbeat_interval_ms == 3_000
    assert c.replica_lag_time_max_ms == 30_000
    assert c.replica_fetch_wait_max_ms == 100
    assert c.num_partitions == 6
    assert c.unclean_leader_election_enable is True
    assert c.replica_fetch_min_bytes == 1  # untouched settings keep their defaults


@pytest.mark.parametrize(("raw", "expected"), [("TRUE", True), (" false ", False), (True, True), (False, False)])
def test_from_properties_parses_booleans(raw, expected):
    assert BrokerConfig.from_properties({"unclean.leader.election.enable": raw}).unclean_leader_election_enable is expected


@pytest.mark.parametrize(
    "props",
    [
        {"no.such.config": "1"},
        {"replica_lag_time_max_ms": "1000"},  # Python field names are not config names
        {"replica.lag.time.max.ms": "ten"},
        {"replica.lag.time.max.ms": "1.5"},
        {"replica.lag.time.max.ms": True},
        {"replica.lag.time.max.ms": None},
        {"unclean.leader.election.enable": "maybe"},
        {"unclean.leader.election.enable": "1"},
        {"broker.heartbeat.interval.ms": "9000"},  # == session timeout
        {"broker.heartbeat.interval.ms": "10000"},  # > session timeout
        {"broker.session.timeout.ms": "2000"},  # == heartbeat interval
        {"replica.fetch.wait.max.ms": "0"},
        {"replica.lag.time.max.ms": "-1"},
        {"broker.session.timeout.ms": 0},
        {"num.partitions": "0"},
        {"default.replication.factor": "0"},
        {"min.insync.replicas": "0"},
        {"replica.fetch.max.bytes": "0"},
        {"socket.request.max.bytes": str(128 * 1024 * 1024), "queued.max.request.bytes": "-1"},  # over a frame
        {"metadata.log.max.record.bytes.between.snapshots": "0"},
        {"metadata.log.max.snapshot.interval.ms": "-1"},
        {"auto.balance.enable": "sometimes"},
        {"balancer.interval.ms": "0"},
        {"balancer.max.concurrent.moves.per.broker": "0"},
        {"leader.replication.throttled.rate": "0"},
        {"follower.replication.throttled.rate": "-1"},
    ],
)
def test_from_properties_rejects_invalid_broker_configs(props):
    with pytest.raises(InvalidConfigurationError):
        BrokerConfig.from_properties(props)


def test_balancer_and_throttle_settings_have_cruise_controls_and_kafkas_defaults():
    c = BrokerConfig()
    assert c.auto_balance_enable is True and c.balancer_interval_ms == 300_000
    assert c.balancer_max_concurrent_moves_per_broker == 5  # num.concurrent.partition.movements.per.broker
    assert c.leader_replication_throttled_rate == c.follower_replication_throttled_rate == 2**63 - 1  # Long.MAX_VALUE
    set_ = BrokerConfig.from_properties({"auto.balance.enable": "false", "follower.replication.throttled.rate": "1048576"})
    assert set_.auto_balance_enable is False and set_.follower_replication_throttled_rate == 1 << 20


def test_metadata_snapshot_settings_have_krafts_defaults_and_an_interval_of_0_is_off():
    config = BrokerConfig()
    assert config.metadata_log_max_record_bytes_between_snapshots == 20 * 1024 * 1024
    assert config.metadata_log_max_snapshot_interval_ms == 3_600_000
    assert BrokerConfig.from_properties({"metadata.log.max.snapshot.interval.ms": "0"}).metadata_log_max_snapshot_interval_ms == 0


def test_broker_config_constructor_checks_heartbeat_against_session_timeout():
    with pytest.raises(InvalidConfigurationError):
        BrokerConfig(broker_session_timeout_ms=1_000, broker_heartbeat_interval_ms=1_000)
    assert BrokerConfig(broker_session_timeout_ms=1_000, broker_heartbeat_interval_ms=999).broker_session_timeout_ms == 1_000


def test_topic_defaults_come_from_the_broker_config():
    c = BrokerConfig(min_insync_replicas=2, unclean_leader_election_enable=True)
    assert c.topic_defaults() == {MIN_INSYNC_REPLICAS: "2", UNCLEAN_LEADER_ELECTION_ENABLE: "true"}
    assert BrokerConfig().topic_defaults() == {MIN_INSYNC_REPLICAS: "1", UNCLEAN_LEADER_ELECTION_ENABLE: "false"}


# --- validate_topic_configs ---------------------------------------------------------


def test_validate_topic_configs_of_nothing_is_empty():
    assert validate_topic_configs(None) == {}
    assert validate_topic_configs({}) == {}


def test_validate_topic_configs_normalises_values_to_strings():
    assert validate_topic_configs(
        {
            "retention.ms": 60_000,
            "segment.bytes": "1048576",
            MIN_INSYNC_REPLICAS: 2,
            UNCLEAN_LEADER_ELECTION_ENABLE: True,
        }
    ) == {
        "retention.ms": "60000",
        "segment.bytes": "1048576",
        MIN_INSYNC_REPLICAS: "2",
        UNCLEAN_LEADER_ELECTION_ENABLE: "true",
    }


@pytest.mark.parametrize(("raw", "expected"), [("TRUE", "true"), ("False", "false"), (False, "false")])
def test_validate_topic_configs_normalises_booleans_to_lower_case(raw, expected):
    assert validate_topic_configs({UNCLEAN_LEADER_ELECTION_ENABLE: raw}) == {UNCLEAN_LEADER_ELECTION_ENABLE: expected}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("retention.ms", "-1"),
        ("retention.bytes", "1000000"),
        ("segment.ms", "3600000"),
        ("segment.index.bytes", "4096"),
        ("index.interval.bytes", "0"),
        ("max.message.bytes", "2000000"),
        ("flush.messages", "1"),
        ("flush.ms", "1000"),
        ("message.timestamp.type", "LogAppendTime"),
        ("cleanup.policy", "compact"),
        ("cleanup.policy", "compact,delete"),
        ("cleanup.policy", ""),  # neither: every record kept (Kafka's list validator lets the empty list through)
        ("min.cleanable.dirty.ratio", "0.1"),
        ("min.compaction.lag.ms", "0"),
        ("max.compaction.lag.ms", "60000"),
        ("delete.retention.ms", "0"),
    ],
)
def test_validate_topic_configs_accepts_storage_configs(name, value):
    assert validate_topic_configs({name: value}) == {name: value}


@pytest.mark.parametrize(
    "configs",
    [
        {"no.such.config": "1"},
        {"cleanup.policy": "shred"},
        {"min.cleanable.dirty.ratio": "1.5"},
        {"min.cleanable.dirty.ratio": "half"},
        {"delete.retention.ms": "-1"},
        {"max.compaction.lag.ms": "0"},
        {MIN_INSYNC_REPLICAS: "0"},
        {MIN_INSYNC_REPLICAS: 0},
        {MIN_INSYNC_REPLICAS: "two"},
        {MIN_INSYNC_REPLICAS: True},
        {UNCLEAN_LEADER_ELECTION_ENABLE: "maybe"},
        {UNCLEAN_LEADER_ELECTION_ENABLE: "yes"},
        {"retention.ms": "abc"},
        {"retention.ms": "-2"},
        {"segment.bytes": "10"},
        {"message.timestamp.type": "Whenever"},
        {"retention.ms": "1000", "bogus": "x"},  # one bad name spoils the whole map
        {"max.message.bytes": str(128 * 1024 * 1024)},  # a batch must fit in one data plane frame
    ],
)
def test_validate_topic_configs_rejects_bad_names_and_values(configs):
    with pytest.raises(InvalidConfigurationError):
        validate_topic_configs(configs)


def test_validated_topic_configs_split_into_storage_and_replication_settings():
    configs = validate_topic_configs({"retention.ms": 5000, MIN_INSYNC_REPLICAS: 2, UNCLEAN_LEADER_ELECTION_ENABLE: "true"})
    assert log_config_of(configs).retention_ms == 5000
    assert min_insync_replicas_of(configs, BrokerConfig()) == 2
    assert unclean_election_enabled(configs, BrokerConfig()) is True


def test_topic_without_replication_configs_uses_the_broker_defaults():
    broker = BrokerConfig(min_insync_replicas=3, unclean_leader_election_enable=True)
    assert min_insync_replicas_of({}, broker) == 3
    assert unclean_election_enabled({}, broker) is True
    assert unclean_election_enabled({UNCLEAN_LEADER_ELECTION_ENABLE: "false"}, broker) is False
