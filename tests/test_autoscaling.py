"""Brokers follow Ray's autoscaler (rayk.start(autoscale=True), rayk/controller/autoscaling.py).

The pure parts (how many brokers a creation lacks, the settings) are tested here directly;
the whole of it on Ray's fake multi-node autoscaler (tests/fake_autoscaler.py), in PID and
network namespaces of its own: starting with one broker node, a topic that needs three
brings two nodes and their brokers, and lands on the three; one that needs more nodes
than the autoscaler may add is refused with POLICY_VIOLATION naming what was missing;
deleting the topic leaves two brokers idle, they are decommissioned, and their nodes go.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

import rayk
from rayk.actors.wakeup import Wakeup
from rayk.cli import main as cli_main
from rayk.config import BrokerConfig
from rayk.controller import autoscaling
from rayk.controller.autoscaling import AutoscaleSettings, BrokerAutoscaling, brokers_short
from rayk.controller import broker_lifecycle
from rayk.controller.broker_lifecycle import BrokerLifecycle
from rayk.errors import InvalidConfigurationError, InvalidReplicationFactorError, InvalidRequestError, PolicyViolationError
from rayk.metadata.cluster_metadata import ClusterMetadata
from rayk.metadata.records import (
    DecommissionBrokerRecord, PartitionRecord, RegisterBrokerRecord, TopicRecord, UnregisterBrokerRecord,
)
from rayk.metadata.replication_control import assign_replicas
from rayk.server.replica_capacity import check_replica_caps
from tests import fake_autoscaler, own_namespaces
from tests.cluster_helpers import FAST_CONFIG, NO_LISTENERS, wait_until
from tests.fake_autoscaler import BROKER_RESOURCE, broker_nodes, log

# ---------------------------------------------------------------------------- pure parts


def fits(num_partitions: int, rf: int, nodes: dict[int, str], start: int, held: Counter[int], caps: dict[int, int]) -> bool:
    try:
        assignment = assign_replicas(num_partitions, rf, nodes, start, held)  # as the Controller places
        check_replica_caps(held, [b for r in assignment for b in r], caps, configured=True)
    except (InvalidReplicationFactorError, PolicyViolationError):
        return False
    return True


def test_a_replication_factor_above_the_brokers_lacks_the_difference():
    assert brokers_short(3, 3, {0: "a"}, 0, Counter(), {}, configured=False) == 2
    assert brokers_short(3, 3, {0: "a", 1: "b", 2: "c"}, 0, Counter(), {}, configured=False) == 0
    assert brokers_short(1, 0, {0: "a"}, 0, Counter(), {}, configured=False) is None


def test_brokers_to_come_are_not_taken_for_a_leaving_one_that_is_full():
    # broker 1 is being decommissioned (not placeable) and full: a new broker is not it
    assert brokers_short(2, 2, {0: "a"}, 0, Counter({1: 4}), {0: 4, 1: 4}, configured=True) == 1


def test_the_brokers_short_are_counted_as_placement_places_by_the_replicas_each_holds():
    # broker 0 is full (10 of 10), broker 1 has room for 7: placement fills the emptiest
    # first, so 4 partitions x RF 2 need one broker more (not the round-robin's 7 or 8)
    assert brokers_short(4, 2, {0: "a", 1: "b"}, 0, Counter({0: 10, 1: 3}), {0: 10, 1: 10}, configured=True) == 1


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


class FakeCluster:
    """A metadata image and what BrokerAutoscaling asks of Ray and of BrokerLifecycle, recorded:
    a broker added registers at once, one removed is decommissioned and unregistered at once."""

    def __init__(self, monkeypatch, nodes: list[str], min_brokers: int = 1, idle_removal_ms: int = 0) -> None:
        self.meta, self.wakeup, self.nodes = ClusterMetadata(BrokerConfig()), Wakeup(), nodes
        self.added: list[str] = []
        self.removed: list[int] = []
        self.requests: list[int] = []
        monkeypatch.setattr(autoscaling, "candidate_nodes", lambda resource: list(self.nodes))
        monkeypatch.setattr(autoscaling, "request_resources", lambda bundles: self.requests.append(len(bundles)))
        settings = AutoscaleSettings(min_brokers, BROKER_RESOURCE)
        self.autoscaling = BrokerAutoscaling(settings, self.meta, self, lambda: self.wakeup, idle_removal_ms, lambda: None)

    def commit(self, *records) -> None:
        for record in records:
            self.meta.apply(record, self.meta.last_offset + 1)
        self.wakeup, fired = Wakeup(), self.wakeup
        fired.fire()

    def register(self, broker_id: int, node: str) -> None:
        self.commit(RegisterBrokerRecord(broker_id, node))

    async def add_broker(self, node: str, controller) -> int:
        self.added.append(node)
        broker_id = max(self.meta.brokers, default=-1) + 1
        self.register(broker_id, node)
        return broker_id

    async def remove_broker(self, broker_id: int, timeout_ms: int) -> None:
        self.removed.append(broker_id)
        self.commit(DecommissionBrokerRecord(broker_id, decommissioning=True))
        self.autoscaling.brokers_changed()
        self.commit(UnregisterBrokerRecord(broker_id))

    def run_round(self) -> None:
        async def round_and_its_tasks() -> None:
            await self.autoscaling.run_round()
            await asyncio.sleep(0.01)  # the adoptions and removals it started

        asyncio.run(round_and_its_tasks())


def test_each_broker_node_gets_one_broker_and_a_node_whose_broker_left_gets_none(monkeypatch):
    fake = FakeCluster(monkeypatch, ["node-a", "node-b"], idle_removal_ms=-1)
    fake.register(0, "node-a")
    fake.run_round()
    assert fake.added == ["node-b"] and fake.requests == [1]
    fake.run_round()
    assert fake.added == ["node-b"], "a node runs one broker"
    assert fake.requests == [1, 2], "the standing request follows the brokers"
    asyncio.run(fake.remove_broker(1, 1000))  # Cluster.remove_broker: its node is the autoscaler's to take
    fake.run_round()
    assert fake.added == ["node-b"] and fake.requests == [1, 2, 1]


def test_idle_brokers_go_newest_first_never_below_the_minimum_nor_while_a_creation_waits(monkeypatch):
    fake = FakeCluster(monkeypatch, ["node-a", "node-b", "node-c", "node-d"], min_brokers=2)
    for b, node in enumerate(["node-a", "node-b", "node-c", "node-d"]):
        fake.register(b, node)
    fake.commit(TopicRecord("t", "id", {}), PartitionRecord("t", 0, (0,), (0,), 0, 0, 0))
    fake.autoscaling._targets.append(5)  # a creation waiting for a fifth broker
    fake.run_round()
    assert fake.removed == []
    fake.autoscaling._targets.clear()
    fake.run_round()
    assert fake.removed == [3, 2], "the newest idle brokers, down to min_brokers"
    fake.run_round()
    assert sorted(fake.meta.brokers) == [0, 1] and fake.requests == [5, 4, 2], "the request follows them down"
    assert fake.added == [], "their nodes were not given brokers again"


def test_a_creation_waits_for_the_brokers_it_lacks_then_is_refused_naming_them(monkeypatch):
    fake = FakeCluster(monkeypatch, ["node-a"])
    fake.register(0, "node-a")

    async def joins_later(broker_id: int, node: str, after_s: float) -> None:
        await asyncio.sleep(after_s)
        fake.register(broker_id, node)

    async def scale_out_with_joins() -> None:
        joining = asyncio.ensure_future(joins_later(1, "node-b", 0.05))
        await fake.autoscaling.scale_out(1, time.monotonic() + 5, "topic 't'")
        await joining

    asyncio.run(scale_out_with_joins())
    assert fake.requests == [2], "asked for one more than the broker there was, once"
    with pytest.raises(PolicyViolationError, match="topic 'u' needs 2 more brokers than the 2 there are.*0 joined"):
        asyncio.run(fake.autoscaling.scale_out(2, time.monotonic() + 0.1, "topic 'u'"))
    assert fake.requests == [2, 4, 2], "asked for them, and no more once refused"
    with pytest.raises(PolicyViolationError, match="no time to wait"):
        asyncio.run(fake.autoscaling.scale_out(1, time.monotonic() - 1, "topic 'v'"))
    assert fake.requests == [2, 4, 2], "nothing asked without time to wait"


def test_with_one_broker_per_node_a_broker_is_added_only_on_a_node_without_one(monkeypatch):
    fake = FakeCluster(monkeypatch, ["node-a"])
    fake.register(0, "node-a")
    monkeypatch.setattr(broker_lifecycle, "candidate_nodes", lambda resource: ["node-a"])
    factory = dataclasses.make_dataclass("Factory", ["node_resource", "one_per_node"])(BROKER_RESOURCE, True)
    lifecycle = BrokerLifecycle(fake.meta, fake.commit, None, None, BrokerConfig(), factory, lambda: fake.wakeup, lambda: None,
                                dict)
    for node in (None, "node-a"):  # its unit of the resource is taken: the actor would never be placed
        with pytest.raises(InvalidRequestError, match="runs a broker already"):
            asyncio.run(lifecycle.add_broker(node, None))


# ---------------------------------------------------------------------------- on the fake autoscaler

IDLE_REMOVAL_MS = 1_000
SCENARIO_TIMEOUT_S = 600


def grow_and_shrink(data_dir: str) -> None:
    """The scenario, run inside the namespace by tests/fake_autoscaler.py (`main`); the
    cluster started as `rayk start --autoscale` starts it (node resource: its default)."""
    settings = {**FAST_CONFIG, **NO_LISTENERS, "broker.idle.removal.ms": IDLE_REMOVAL_MS}
    config = [f"{key}={value}" for key, value in settings.items()]
    assert cli_main(["start", "--brokers", "1", "--autoscale", "--data-dir", data_dir, "--config", *config]) == 0
    cluster = rayk.connect()
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

    hasty = dataclasses.replace(cluster, default_api_timeout_ms=12_000)  # the Controller waits 2 s of it
    # (counted among the placeable brokers: one fenced for a moment on a loaded machine is not one)
    with pytest.raises(PolicyViolationError, match=rf"needs \d more brokers than the \d there are, each on a Ray node "
                                                   rf"offering '{BROKER_RESOURCE}'; \d joined within"):
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
