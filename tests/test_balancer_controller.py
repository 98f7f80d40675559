"""The Controller's Balancer (rayk/controller/balancer.py) without Ray: the image is a real
ClusterMetadata, the pushes and the brokers' answers are stood in for. When it runs, that
it waits for a whole cluster, follows its moves up until a new broker holds its share,
and elects preferred leaders once moves complete; off, it moves nothing."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from rayk.config import BrokerConfig
from rayk.controller.balancer import Balancer
from rayk.controller.leader_elections import LeaderElections
from rayk.metadata.cluster_metadata import ClusterMetadata
from rayk.metadata.records import ClusterIdRecord


class Image:
    """A ClusterMetadata and the commits applied to it."""

    def __init__(self, brokers: int) -> None:
        self.meta = ClusterMetadata()
        self.offset = 0
        self.commit([ClusterIdRecord("c")])
        for b in range(brokers):
            self.add_broker(b)

    def commit(self, records: list) -> None:
        for record in records:
            self.meta.apply(record, self.offset)
            self.offset += 1

    def add_broker(self, broker_id: int) -> None:
        self.commit(self.meta.plan_register_broker(broker_id, "node"))
        self.meta.attached.add(broker_id)

    def create(self, topic: str, partitions: int, rf: int) -> None:
        self.commit(self.meta.replication.plan_create_topic(topic, partitions, rf, {}, f"id-{topic}"))

    def complete_reassignments(self) -> int:
        """Every adding replica caught up: its leader's AlterPartition adds it to the ISR."""
        done = 0
        for topic, partition, state in self.meta.all_partitions():
            if state.adding:
                self.commit(self.meta.replication.plan_alter_partition(
                    topic, partition, state.leader, state.leader_epoch, state.partition_epoch, state.replicas))
                done += 1
        return done

    def rejoin_isrs(self) -> None:
        """Every replica caught up again: its leader adds it back to the ISR."""
        for topic, partition, state in self.meta.all_partitions():
            if set(state.isr) != set(state.replicas):
                self.commit(self.meta.replication.plan_alter_partition(
                    topic, partition, state.leader, state.leader_epoch, state.partition_epoch, state.replicas))

    def replicas(self, topic: str) -> Counter:
        return Counter(b for t, _, s in self.meta.all_partitions() if t == topic for b in s.replicas)

    def leaders(self, topic: str) -> Counter:
        return Counter(s.leader for t, _, s in self.meta.all_partitions() if t == topic)


class Remote:
    """An actor method stood in for: `.remote()` gives an awaitable of `value`."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def remote(self) -> Any:
        async def answer():
            return self.value

        return answer()


class Channels:
    """The ControllerChannelManager's part the Balancer and LeaderElections use: pushes noted."""

    def __init__(self) -> None:
        self.pushed: list[tuple[str, int]] = []
        self.push_timeout_s = 1.0

    def spawn(self, coro: Any) -> Any:
        return asyncio.get_running_loop().create_task(coro)

    async def push_marking_failures(self, partitions: list) -> None:
        self.pushed += partitions

    async def push_all(self, partitions: Any) -> None:
        self.pushed += list(partitions)


class Sessions:
    def __init__(self, sizes: dict) -> None:
        self.sizes = sizes

    def manager(self, broker_id: int) -> Any:
        manager = type("Manager", (), {})()
        manager.log_sizes = Remote(self.sizes.get(broker_id, {}))
        return manager


def balancer_of(image: Image, **config: Any) -> tuple[Balancer, Channels]:
    c = BrokerConfig.from_properties(config)
    channels = Channels()
    elections = LeaderElections(image.meta, image.commit, channels, c)  # type: ignore[arg-type]
    return Balancer(image.meta, image.commit, channels, Sessions({}), elections, dict, c), channels  # type: ignore[arg-type]


def test_a_new_broker_takes_its_share_of_replicas_and_leaders_five_moves_at_a_time():
    image = Image(3)
    image.create("t", 12, 3)
    balancer, channels = balancer_of(image)

    async def scenario() -> list[int]:
        await balancer.maintain()
        assert not channels.pushed, "a cluster created balanced: nothing to do"
        image.add_broker(3)
        balancer.request_run()  # what the Controller does at a first registration
        rounds = []
        for _ in range(10):
            await balancer.maintain()
            await asyncio.sleep(0)  # the background pushes
            rounds.append(image.complete_reassignments())
            if not balancer.busy:
                break
        return rounds

    rounds = asyncio.run(scenario())
    assert rounds[0] == 5 and sum(rounds) == 9, f"five moves touching broker 3 at a time, 9 in all: {rounds}"
    assert image.replicas("t") == {0: 9, 1: 9, 2: 9, 3: 9}
    assert image.leaders("t") == {0: 3, 1: 3, 2: 3, 3: 3}, "the moved partitions' preferred leaders were elected"
    assert all(s.leader == s.replicas[0] for _, _, s in image.meta.all_partitions())


def test_with_auto_balance_off_a_new_broker_gets_nothing_and_the_periodic_check_moves_nothing():
    image = Image(3)
    image.create("t", 12, 3)
    balancer, channels = balancer_of(image, **{"auto.balance.enable": "false", "balancer.interval.ms": "10"})
    image.add_broker(3)
    balancer.request_run()

    async def later() -> None:
        await asyncio.sleep(0.02)
        await balancer.maintain()

    asyncio.run(later())
    assert not channels.pushed and image.replicas("t")[3] == 0 and not balancer.busy


def test_reordered_partitions_get_their_preferred_leader_elected():
    image = Image(3)
    for p in range(3):  # three partitions all preferring broker 0
        image.create(f"t{p}", 1, 3)
        if image.meta.partition(f"t{p}", 0).replicas != (0, 1, 2):
            image.commit(image.meta.replication.plan_reassign(f"t{p}", 0, [0, 1, 2]))
            image.commit(image.meta.replication.plan_elect_leader(f"t{p}", 0))
    balancer, channels = balancer_of(image)
    balancer.request_run()
    asyncio.run(balancer.maintain())
    asyncio.run(balancer.maintain())  # the follow-up finds nothing left
    leaders = Counter(s.leader for _, _, s in image.meta.all_partitions())
    assert leaders == {0: 1, 1: 1, 2: 1} and not balancer.busy
    assert all(s.leader == s.replicas[0] for _, _, s in image.meta.all_partitions())


def test_a_run_waits_while_a_broker_holding_replicas_is_fenced_then_goes():
    image = Image(3)
    image.create("t", 6, 3)
    balancer, channels = balancer_of(image)
    image.add_broker(3)
    image.commit(image.meta.plan_fence_broker(2))
    balancer.request_run()
    asyncio.run(balancer.maintain())
    assert not channels.pushed and balancer.busy, "it waits, keeping the request"
    image.add_broker(2)  # registers again, unfenced
    asyncio.run(balancer.maintain())
    assert not channels.pushed, "its partitions are not in sync yet"
    image.rejoin_isrs()
    asyncio.run(balancer.maintain())
    assert channels.pushed and image.replicas("t")[3] > 0


def test_the_periodic_check_leaves_counts_within_1_of_the_mean_alone_and_a_join_settles_them():
    image = Image(4)
    image.create("t", 2, 2)  # brokers hold 1, 1, 1, 1 replicas
    image.commit(image.meta.replication.plan_reassign("t", 1, [1, 0]))  # now 2, 2, 0, 0: moved by hand
    image.complete_reassignments()
    balancer, channels = balancer_of(image, **{"balancer.interval.ms": "10"})

    async def check() -> None:
        await asyncio.sleep(0.02)
        await balancer.maintain()

    asyncio.run(check())
    assert balancer.last_plan is not None and not balancer.last_plan.moves and not channels.pushed
    balancer.request_run()  # a broker joins: the cluster is settled, within 1 of the mean
    asyncio.run(balancer.maintain())
    assert image.complete_reassignments() and image.replicas("t") == {0: 1, 1: 1, 2: 1, 3: 1}
