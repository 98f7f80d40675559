"""ChildSupervisor alone, on a fake clock: which children a probe round pings, and which it
kills. Pure asyncio: the children are stand-ins for actor handles."""

from __future__ import annotations

import asyncio

from rayk.actors import supervision
from rayk.actors.supervision import ChildSupervisor

UNRESPONSIVE_MS = 9_000
ROUND_S = 2.0  # the broker's probe rounds: broker.heartbeat.interval.ms


class _Method:
    def __init__(self, answer) -> None:
        self._answer = answer
        self.calls = 0

    def remote(self) -> asyncio.Future:
        self.calls += 1
        return self._answer()


class FakeChild:
    """A handle whose held call never returns and whose ping answers at once, or never."""

    def __init__(self, loop: asyncio.AbstractEventLoop, answers_pings: bool) -> None:
        def ping() -> asyncio.Future:
            future = loop.create_future()
            if answers_pings:
                future.set_result(None)
            return future

        self.ping = _Method(ping)
        self.run_until_stopped = _Method(loop.create_future)


def run_rounds(monkeypatch, rounds: int, answered_by_reports: set[str]) -> tuple[dict[str, int], list[str]]:
    """Probe rounds every ROUND_S of a fake clock over three children: 'reported' answers
    another call of its owner's each round, 'idle' answers only pings, 'wedged' nothing.
    The pings each child got, and the children killed."""
    clock = [1_000.0]
    monkeypatch.setattr(supervision.time, "monotonic", lambda: clock[0])
    killed: list = []
    monkeypatch.setattr(supervision.ray, "kill", lambda handle, no_restart: killed.append(handle))

    async def scenario() -> tuple[dict[str, int], list[str]]:
        loop = asyncio.get_running_loop()
        children = {"reported": FakeChild(loop, True), "idle": FakeChild(loop, True), "wedged": FakeChild(loop, False)}
        supervisor = ChildSupervisor("test", lambda key, handle: asyncio.sleep(0), UNRESPONSIVE_MS)
        for key, child in children.items():
            supervisor.watch(key, child)
        for _ in range(rounds):
            clock[0] += ROUND_S
            for key in answered_by_reports:
                supervisor.answered(key, children[key])
            supervisor.probe()
            await asyncio.sleep(0)  # the pings' answers arrive
        names = {id(child): key for key, child in children.items()}
        return {key: child.ping.calls for key, child in children.items()}, [names[id(h)] for h in killed]

    return asyncio.run(scenario())


def test_a_child_answering_its_owners_calls_is_not_pinged_and_an_idle_one_rarely(monkeypatch):
    pings, killed = run_rounds(monkeypatch, rounds=15, answered_by_reports={"reported"})  # 30 s
    assert pings["reported"] == 0
    # Silent for a third of UNRESPONSIVE_MS (3 s) before each ping: every other round of 2 s.
    assert pings["idle"] == 7
    assert "idle" not in killed and "reported" not in killed


def test_a_wedged_child_has_one_ping_out_and_is_killed_once_it_is_silent_too_long(monkeypatch):
    pings, killed = run_rounds(monkeypatch, rounds=5, answered_by_reports=set())  # 10 s
    assert pings["wedged"] == 1, "one ping out at a time"
    assert killed == ["wedged"]


def test_an_answer_from_a_forgotten_or_replaced_handle_is_ignored(monkeypatch):
    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        old, new = FakeChild(loop, True), FakeChild(loop, True)
        supervisor = ChildSupervisor("test", lambda key, handle: asyncio.sleep(0), UNRESPONSIVE_MS)
        supervisor.watch("k", new)
        before = supervisor._children["k"].answered_at_s
        clock[0] += 5
        supervisor.answered("k", old)  # a late report of the process this one replaced
        return supervisor._children["k"].answered_at_s - before

    clock = [1_000.0]
    monkeypatch.setattr(supervision.time, "monotonic", lambda: clock[0])
    assert asyncio.run(scenario()) == 0
