"""ClusterControlManager alone: registrations, epochs, fencing and the image."""

from __future__ import annotations

import pytest

from rayk.errors import StaleBrokerEpochError
from rayk.metadata.cluster_control import ClusterControlManager, Registration
from rayk.metadata.records import ClusterIdRecord, FenceBrokerRecord, RegisterBrokerRecord
from tests.metadata_helpers import replay_into


def registered(*brokers: tuple[int, str, str, str]) -> ClusterControlManager:
    cluster = ClusterControlManager()
    offset = replay_into(cluster, [ClusterIdRecord("c")])
    for broker_id, node, incarnation, directory in brokers:
        offset = replay_into(cluster, cluster.plan_register(broker_id, node, incarnation, directory, True)[0], offset)
    return cluster


def test_a_broker_epoch_is_its_registration_offset_and_a_new_process_or_disk_is_told_apart():
    cluster = registered((1, "a", "p1", "d1"), (2, "b", "p2", "d2"))
    assert (cluster.brokers[1].epoch, cluster.brokers[2].epoch) == (1, 2)
    assert cluster.plan_register(1, "a", "p1", "d1", True)[1] == Registration(restarted=False, data_lost=False)
    assert cluster.plan_register(1, "a", "p9", "d1", False)[1] == Registration(restarted=True, data_lost=False)
    assert cluster.plan_register(1, "a", "p9", "d9", False)[1] == Registration(restarted=True, data_lost=True)
    assert cluster.plan_register(7, "z", "p7", "d7", True)[1] == Registration(restarted=False, data_lost=False)


def test_fencing_checks_the_epoch_and_is_a_no_op_when_fenced_or_unknown():
    cluster = registered((1, "a", "p1", "d1"))
    with pytest.raises(StaleBrokerEpochError):
        cluster.plan_fence(1, broker_epoch=0)
    records = cluster.plan_fence(1, broker_epoch=1)
    assert records == [FenceBrokerRecord(1, fenced=True)]
    replay_into(cluster, records, 2)
    assert cluster.live_brokers == set()
    assert cluster.plan_fence(1, None) == [] and cluster.plan_fence(9, None) == []


def test_the_image_keeps_epochs_and_fencing():
    cluster = registered((1, "a", "p1", "d1"), (2, "b", "p2", "d2"))
    replay_into(cluster, cluster.plan_fence(2, None), 3)
    image = cluster.image_records()
    assert image[1] == RegisterBrokerRecord(1, "a", "p1", "d1", epoch=1)
    again = ClusterControlManager()
    replay_into(again, image, 100)
    assert again.cluster_id == "c" and again.brokers == cluster.brokers
