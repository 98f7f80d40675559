"""Kafka's ReplicaManager gauges from the partition states a broker holds (broker_health.py)."""

from __future__ import annotations

from rayk.server.broker_health import broker_health
from rayk.metadata.elections import NO_LEADER, PartitionState
from rayk.metrics import BrokerHealth


def state(leader: int, replicas: tuple[int, ...], isr: tuple[int, ...], adding: tuple[int, ...] = ()) -> PartitionState:
    return PartitionState(replicas, isr, leader, leader_epoch=1, partition_epoch=1, adding=adding)


def test_only_the_partitions_a_broker_leads_count_as_under_replicated_or_under_min_isr():
    held = [
        (state(0, (0, 1, 2), (0, 1, 2)), 2),  # led, healthy
        (state(0, (0, 1, 2), (0, 1)), 2),  # led, one follower out: under-replicated only
        (state(0, (0, 1, 2), (0,)), 2),  # led, alone: under-replicated and under min ISR
        (state(1, (1, 0, 2), (1,)), 2),  # followed: another broker's to count
        (state(NO_LEADER, (2, 0, 1), ()), 2),  # offline: the Controller counts it
    ]
    assert broker_health(0, held) == BrokerHealth(0, leader_count=3, partition_count=5,
                                                  under_replicated_partitions=2, under_min_isr_partition_count=1)


def test_a_reassignment_s_new_replicas_catching_up_do_not_make_a_partition_under_replicated():
    moving = state(0, (0, 1, 2, 3), (0, 1, 2), adding=(3,))
    assert broker_health(0, [(moving, 2)]).under_replicated_partitions == 0
    assert broker_health(0, [(state(0, (0, 1, 2, 3), (0, 1), adding=(3,)), 2)]).under_replicated_partitions == 1
