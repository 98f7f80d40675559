"""The Controller's maintenance pushes dirty partitions again without waiting for them:
a slow broker's pushes must not hold up the next round (and its fencing of silent
brokers). Pure asyncio: the pushes themselves are stood in for."""

from __future__ import annotations

import asyncio

from rayk.controller.channel_manager import ControllerChannelManager


def test_dirty_partitions_are_pushed_in_the_background_one_round_at_a_time():
    async def scenario():
        controller = ControllerChannelManager.__new__(ControllerChannelManager)  # only the push bookkeeping is used
        controller.dirty, controller._dirty_pushes, controller._tasks = {("t", 0), ("t", 1)}, None, set()
        started, release = [], asyncio.Event()

        async def slow_push(topic, partition):
            started.append((topic, partition))
            await release.wait()
            if partition == 1:
                raise RuntimeError("the broker answered with an error")

        controller.push = slow_push
        await asyncio.wait_for(controller.push_dirty(), timeout=1)  # returns while the pushes wait
        await asyncio.sleep(0)
        assert sorted(started) == [("t", 0), ("t", 1)]

        controller.dirty.add(("t", 2))
        await asyncio.wait_for(controller.push_dirty(), timeout=1)  # the last round is still out
        assert controller.dirty == {("t", 2)} and len(started) == 2

        release.set()
        await controller._dirty_pushes
        assert controller.dirty == {("t", 2), ("t", 1)}, "a push that raised is dirty again"
        await controller.push_dirty()
        await controller._dirty_pushes
        assert sorted(started[2:]) == [("t", 1), ("t", 2)] and not controller._tasks

    asyncio.run(scenario())



class _State:
    def __init__(self, epoch: int) -> None:
        self.leader, self.leader_epoch, self.replicas = 1, epoch, [1]


class _Topic:
    def __init__(self, topic_id: str, epoch: int) -> None:
        self.topic_id, self.partitions = topic_id, {0: _State(epoch)}


class _Meta:
    def __init__(self, topic: _Topic) -> None:
        self.topics = {"t": topic}
        self.configs = type("Configs", (), {"of": staticmethod(lambda topic: {})})()


class _Sessions:
    @staticmethod
    def is_attached(broker_id: int) -> bool:
        return True


def channels_answering_when_released(meta: _Meta) -> tuple[ControllerChannelManager, dict, list]:
    """A channel manager whose leader pushes answer once `answers[epoch]` is set; the
    `leads_in` changes it reports go to the list."""
    channels = ControllerChannelManager.__new__(ControllerChannelManager)
    changes: list[int] = []
    channels._meta, channels._sessions, channels._leading_in = meta, _Sessions(), {}
    channels._on_leading_change = lambda: changes.append(channels._leading_in[("t", 0)])
    answers: dict[int, asyncio.Event] = {}

    async def push_to(broker_id, assignment):
        await answers.setdefault(assignment.state.leader_epoch, asyncio.Event()).wait()
        return "the leader's handle"

    channels._push_to = push_to
    return channels, answers, changes


def test_a_slower_push_of_an_older_epoch_does_not_take_back_the_leader_metadata_names():
    """`leads_in` (Metadata names a leader only once it took its push in the current epoch)
    moves only forward: a push of epoch 4 answered after the push of epoch 5 used to set it
    back to 4, and Metadata then named no leader until something pushed the partition
    again. Each move is reported (the listeners' metadata images follow it)."""

    async def scenario() -> tuple[bool, list[int]]:
        meta = _Meta(_Topic("id-1", 4))
        channels, answers, changes = channels_answering_when_released(meta)
        older = asyncio.ensure_future(channels.push("t", 0))
        await asyncio.sleep(0)
        meta.topics["t"].partitions[0] = _State(5)  # a new election, pushed while the first push is out
        newer = asyncio.ensure_future(channels.push("t", 0))
        await asyncio.sleep(0)
        answers[5].set()
        await newer
        answers[4].set()
        await older
        return channels.leads_in("t", 0, 5), changes

    leads, changes = asyncio.run(scenario())
    assert leads, "the older push's answer took the leader back"
    assert changes == [5]


def test_a_late_push_of_a_deleted_topic_does_not_speak_for_the_topic_made_again_under_its_name():
    async def scenario() -> tuple[bool, bool, list[int]]:
        meta = _Meta(_Topic("id-1", 6))
        channels, answers, changes = channels_answering_when_released(meta)
        old = asyncio.ensure_future(channels.push("t", 0))
        await asyncio.sleep(0)
        meta.topics["t"] = _Topic("id-2", 0)  # deleted (its leads_in forgotten) and made again
        answers[6].set()
        await old
        before_its_push = channels.leads_in("t", 0, 0) or channels._leading_in.get(("t", 0)) is not None
        answers[0] = asyncio.Event()
        answers[0].set()
        await channels.push("t", 0)
        return before_its_push, channels.leads_in("t", 0, 0), changes

    before_its_push, after_its_push, changes = asyncio.run(scenario())
    assert not before_its_push, "the old topic's epoch 6 was taken for the new topic"
    assert after_its_push and changes == [0]
