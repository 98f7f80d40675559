"""Brokers follow Ray's autoscaler (rayk.start(autoscale=True), rayk/controller/autoscaling.py).

The pure parts (how many brokers a creation lacks, the settings) are tested here directly;
the whole of it on Ray's fake multi-node autoscaler (tests/fake_autoscaler.py), in PID and
network namespaces of its own: starting with one broker node, a topic that needs three
brings two nodes and their brokers, and lands on the three; one that needs more nodes
than the autoscaler may add is refused with POLICY_VIOLATION naming what was missing;
deleting the topic leaves two brokers idle, they are decommissioned, and their nodes go.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

import rayk
from rayk.config import BrokerConfig
from rayk.controller.autoscaling import AutoscaleSettings, brokers_short
from rayk.errors import InvalidConfigurationError, InvalidReplicationFactorError, PolicyViolationError
from rayk.metadata.replication_control import assign_replicas
from rayk.server.replica_capacity import check_replica_caps
from tests import fake_autoscaler, own_namespaces
from tests.cluster_helpers import FAST_CONFIG, wait_until
from tests.fake_autoscaler import BROKER_RESOURCE, broker_nodes, log

# ---------------------------------------------------------------------------- pure parts


def fits(num_partitions: int, rf: int, nodes: dict[int, str], start: int, held: Counter[int], caps: dict[int, int]) -> bool:
    try:
        assignment = assign_replicas(num_partitions, rf, nodes, start)
        check_replica_caps(held, [b for r in assignment for b in r], caps, configured=True)
    except (InvalidReplicationFactorError, PolicyViolationError):
        return False
    return True


def test_a_replication_factor_above_the_brokers_lacks_the_difference():
    assert brokers_short(3, 3, {0: "a"}, 0, Counter(), {}, configured=False) == 2
    assert brokers_short(3, 3, {0: "a", 1: "b", 2: "c"}, 0, Counter(), {}, configured=False) == 0
    assert brokers_short(1, 0, {0: "a"}, 0, Counter(), {}, configured=False) is None


def test_full_brokers_that_still_get_replicas_are_not_helped_by_more():
    # broker 0 is full, and round-robin gives every broker some of the 200 partitions
    assert brokers_short(200, 1, {0: "a"}, 0, Counter({0: 4}), {0: 4}, configured=True, max_extra=8) is None


@given(
    brokers=st.integers(1, 5), num_partitions=st.integers(1, 12), rf=st.integers(1, 6),
    cap=st.integers(1, 12), start=st.integers(0, 20), fill=st.integers(0, 3),
)  # fmt: skip
def test_brokers_short_is_the_fewest_that_make_a_creation_fit(brokers, num_partitions, rf, cap, start, fill):
    nodes = {b: f"node-{b}" for b in range(brokers)}
    held = Counter({b: min(fill, cap) for b in nodes})
    caps = {b: cap for b in nodes}
    short = brokers_short(num_partitions, rf, nodes, start, held, caps, configured=True, max_extra=16)

    def with_extra(extra: int) -> bool:
        new = {brokers + i: f"~new-{i}" for i in range(extra)}
        return fits(num_partitions, rf, {**nodes, **new}, start, held, {**caps, **{b: cap for b in new}})

    if short is None:
        assert not any(with_extra(extra) for extra in range(17))
    else:
        assert with_extra(short) and not any(with_extra(extra) for extra in range(short))


def test_autoscale_settings_and_idle_removal_are_checked():
    with pytest.raises(InvalidConfigurationError):
        AutoscaleSettings(0, BROKER_RESOURCE)
    with pytest.raises(InvalidConfigurationError):
        AutoscaleSettings(1, "")
    assert BrokerConfig().broker_idle_removal_ms == 600_000
    assert BrokerConfig.from_properties({"broker.idle.removal.ms": "-1"}).broker_idle_removal_ms == -1
    with pytest.raises(InvalidConfigurationError, match="broker.idle.removal.ms"):
        BrokerConfig.from_properties({"broker.idle.removal.ms": "0"})


# ---------------------------------------------------------------------------- on the fake autoscaler

IDLE_REMOVAL_MS = 3_000
SCENARIO_TIMEOUT_S = 600


def grow_and_shrink(data_dir: str) -> None:
    """The scenario, run inside the namespace by tests/fake_autoscaler.py (`main`)."""
    config = {**FAST_CONFIG, "broker.idle.removal.ms": IDLE_REMOVAL_MS}
    cluster = rayk.start(brokers=1, data_dir=data_dir, config=config, autoscale=True, node_resource=BROKER_RESOURCE)
    log(f"rayk started: brokers {[b['broker_id'] for b in cluster.brokers()]}, broker nodes {len(broker_nodes())}")
    assert [b["broker_id"] for b in cluster.brokers()] == [0] and len(broker_nodes()) == 1

    patient = dataclasses.replace(cluster, default_api_timeout_ms=240_000)
    described = patient.create_topic("wide", num_partitions=3, replication_factor=3)
    log(f"topic 'wide' created: replicas {[p['replicas'] for p in described]}, broker nodes {len(broker_nodes())}")
    assert all(sorted(p["replicas"]) == [0, 1, 2] for p in described), described
    brokers = cluster.brokers()
    assert len({b["node_id"] for b in brokers}) == 3 and {b["node_id"] for b in brokers} == set(broker_nodes())
    with cluster.producer(acks="all") as producer:
        for p in range(3):
            producer.send("wide", f"record {p}".encode(), partition=p).result(timeout=60)
    log("a record acknowledged by all three replicas of each partition")

    hasty = dataclasses.replace(cluster, default_api_timeout_ms=20_000)
    with pytest.raises(PolicyViolationError, match=f"needs 1 more brokers than the 3 there are.*'{BROKER_RESOURCE}'"):
        hasty.create_topic("wider", num_partitions=1, replication_factor=4)  # the node type's max_workers is 3
    log("a topic needing a fourth broker node refused")

    cluster.delete_topic("wide")
    wait_until(lambda: [b["broker_id"] for b in cluster.brokers()] == [0], 120, "the idle brokers to be decommissioned")
    log("brokers 1 and 2 decommissioned")
    wait_until(lambda: len(broker_nodes()) == 1, 180, "their nodes to go")
    log("their nodes went")
    assert [b["broker_id"] for b in cluster.brokers()] == [0]
    cluster.shutdown()


@pytest.mark.slow
def test_brokers_follow_rays_fake_autoscaler(tmp_path):
    own_namespaces.skip_unless_root_with(*fake_autoscaler.TOOLS)
    started_s = time.monotonic()
    output = fake_autoscaler.run("tests.test_autoscaling:grow_and_shrink", str(tmp_path), timeout_s=SCENARIO_TIMEOUT_S)
    print(output[-4000:])
    print(f"scenario wall time {time.monotonic() - started_s:.0f} s")
    assert "their nodes went" in output
