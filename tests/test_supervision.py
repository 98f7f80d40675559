"""ChildSupervisor alone, on a clock of its own: which children a probe round pings, and
which it kills. Pure asyncio: the children are stand-ins for actor handles."""

from __future__ import annotations

import asyncio
import time

from rayk.actors import supervision
from rayk.actors.supervision import ChildSupervisor

UNRESPONSIVE_MS = 9_000  # broker.session.timeout.ms
ROUND_S = 2  # the broker's probe rounds: broker.heartbeat.interval.ms
REPORT_S = 5  # its replicas' offset reports: replica.high.watermark.checkpoint.interval.ms


class FakeChild:
    """A handle whose held call never returns and whose pings are answered at once
    ("answers"), never ("wedged"), with an error ("fails"), or when the test says ("later")."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pings: str) -> None:
        self.loop, self.mode, self.pings = loop, pings, []
        self.run_until_stopped = self._method(loop.create_future)
        self.ping = self._method(self._ping)

    @staticmethod
    def _method(call):
        return type("Method", (), {"remote": staticmethod(call)})()

    def _ping(self) -> asyncio.Future:
        future = self.loop.create_future()
        if self.mode == "answers":
            future.set_result(None)
        elif self.mode == "fails":
            future.set_exception(RuntimeError("the call failed"))
        self.pings.append(future)
        return future


def scenario(monkeypatch, modes: dict[str, str], steps) -> tuple[dict[str, int], list[tuple[str, float]]]:
    """Runs `steps(supervisor, children, clock)` (a coroutine function) on a supervisor of
    children in those ping modes; the pings each got, and (child, time) of each kill."""
    clock = [0.0]
    kills: list = []

    async def main():
        loop = asyncio.get_running_loop()
        children = {key: FakeChild(loop, mode) for key, mode in modes.items()}
        names = {id(child): key for key, child in children.items()}
        monkeypatch.setattr(supervision.ray, "kill", lambda handle, no_restart: kills.append((names[id(handle)], clock[0])))
        supervisor = ChildSupervisor("test", lambda key, handle: asyncio.sleep(0), UNRESPONSIVE_MS, lambda: clock[0])
        for key, child in children.items():
            supervisor.watch(key, child)
        await steps(supervisor, children, clock)
        return {key: len(child.pings) for key, child in children.items()}

    return asyncio.run(main()), kills


async def rounds(supervisor, children, clock, seconds: int, reported: tuple[str, ...] = ()) -> None:
    """`seconds` of a broker's life: a probe round every ROUND_S, and the `reported`
    children answering an offset report every REPORT_S."""
    for _ in range(seconds):
        clock[0] += 1
        if clock[0] % REPORT_S == 0:
            for key in reported:
                supervisor.answered(key, children[key])
        if clock[0] % ROUND_S == 0:
            supervisor.probe()
        await asyncio.sleep(0)  # the answers to pings arrive


def test_only_children_silent_for_a_third_of_the_timeout_are_pinged(monkeypatch):
    async def steps(supervisor, children, clock):
        await rounds(supervisor, children, clock, 60, reported=("reported",))

    pings, kills = scenario(monkeypatch, {"reported": "answers", "idle": "answers"}, steps)
    # Every 2 s round pinged every child before: 30 pings each in 60 s.
    assert pings["idle"] == 15, "silent 3 s or more at every other round"
    assert pings["reported"] == 12, "after a report at t, the round at t + 3 or t + 4, and not every time"
    assert kills == []


def test_a_wedged_child_is_killed_about_the_timeout_after_its_last_answer(monkeypatch):
    async def steps(supervisor, children, clock):
        await rounds(supervisor, children, clock, 20)

    pings, kills = scenario(monkeypatch, {"wedged": "wedged", "failing": "fails", "idle": "answers"}, steps)
    assert pings["wedged"] == 1, "one ping out at a time"
    assert pings["failing"] >= 2, "a failed ping is sent again"
    # Last answer at 0 (watched), pinged at the round at 4, killed 6 s later; then (the
    # stand-in's held call does not fail, so it stays watched) once per 6 s of silence.
    assert sorted(kills) == [("failing", 10.0), ("failing", 16.0), ("wedged", 10.0), ("wedged", 16.0)]


def test_a_stall_of_the_owner_kills_no_child_that_answered_meanwhile(monkeypatch):
    async def steps(supervisor, children, clock):
        await rounds(supervisor, children, clock, 4)  # the round at 4 pings both
        clock[0] += 10  # the owner's loop stalls: no round for 10 s; "late" answers meanwhile
        children["late"].pings[-1].set_result(None)
        supervisor.probe()
        await asyncio.sleep(0)
        await rounds(supervisor, children, clock, 4)

    pings, kills = scenario(monkeypatch, {"late": "later", "idle": "answers"}, steps)
    assert kills == []
    # "idle": pinged at 4, at 14 (silent since 4), at 18; "late": at 4, answered during the
    # stall (taken at 14), then at 18.
    assert pings == {"late": 2, "idle": 3}


def test_an_answer_of_a_replaced_handle_is_ignored(monkeypatch):
    async def steps(supervisor, children, clock):
        supervisor.forget("old")
        clock[0] += 5
        supervisor.answered("old", children["old"])  # a late report of a process since replaced
        supervisor.answered("new", children["old"])
        assert supervisor.watching("old") is None
        await rounds(supervisor, children, clock, 4)

    pings, _ = scenario(monkeypatch, {"old": "answers", "new": "answers"}, steps)
    assert pings == {"old": 0, "new": 1}, "'new' was not taken for answered by another handle's report"


def test_a_child_seen_running_is_pinged_only_to_check_it_takes_calls(monkeypatch):
    async def steps(supervisor, children, clock):
        for _ in range(100):  # the board: each child publishes every 2 s (replica_board.py)
            clock[0] += 1
            if clock[0] % 2 == 0:
                for key in ("running", "takes no calls"):
                    supervisor.ran(key, children[key], clock[0] - 0.5)
                if clock[0] <= 10:
                    supervisor.ran("stopped", children["stopped"], clock[0] - 0.5)
            supervisor.ran("future", children["future"], clock[0] + 100)  # a clock ahead counts as now
            if clock[0] % ROUND_S == 0:
                supervisor.probe()
            await asyncio.sleep(0)

    modes = {"running": "answers", "takes no calls": "wedged", "stopped": "wedged", "future": "answers"}
    pings, kills = scenario(monkeypatch, modes, steps)
    # 30 s without an answered call (CALL_CHECK_PINGS pings of 3 s): pinged at 30, 60 and 90.
    assert pings == {"running": 3, "takes no calls": 1, "stopped": 1, "future": 3}
    # "stopped" (SIGSTOP at 10: last seen at 9.5, pinged at 14) is killed when its ping is
    # 6 s late, and once per 6 s of silence after (its stand-in's held call never fails).
    assert [t for key, t in kills if key == "stopped"][:3] == [20.0, 26.0, 32.0]
    # "takes no calls" runs: its ping at 30 is late, not a death, until 5 timeouts (45 s).
    assert [t for key, t in kills if key != "stopped"] == [76.0]


def test_a_late_child_that_answers_in_the_end_was_never_killed(monkeypatch):
    async def steps(supervisor, children, clock):
        for _ in range(70):
            clock[0] += 1
            supervisor.ran("slow", children["slow"], clock[0])  # it runs: its loop is only slow to answer
            if clock[0] == 60:
                children["slow"].pings[-1].set_result(None)  # answered 30 s after the ping at 30
            if clock[0] % ROUND_S == 0:
                supervisor.probe()
            await asyncio.sleep(0)
        assert supervisor.late == 1 and supervisor.killed == 0

    pings, kills = scenario(monkeypatch, {"slow": "later"}, steps)
    assert kills == [] and pings == {"slow": 1}


def test_a_process_that_runs_or_waits_for_a_cpu_moves_and_a_stopped_or_sleeping_one_does_not():
    import signal
    import subprocess
    import sys

    from rayk.actors.supervision import ProcessProgress

    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    asleep = subprocess.Popen(["sleep", "60"])
    try:
        # Until `sleep` has started and sleeps (on a loaded machine its start runs after Popen returns).
        deadline_s = time.monotonic() + 10
        while open(f"/proc/{asleep.pid}/stat").read().rsplit(")", 1)[1].split()[0] != "S" and time.monotonic() < deadline_s:
            time.sleep(0.01)
        time.sleep(0.2)
        watched = {"busy": ProcessProgress(busy.pid), "asleep": ProcessProgress(asleep.pid)}
        assert not any(p.moved() for p in watched.values()), "the first look compares nothing"
        time.sleep(0.3)
        assert {k: p.moved() for k, p in watched.items()} == {"busy": True, "asleep": False}
        busy.send_signal(signal.SIGSTOP)
        time.sleep(0.1)
        watched["busy"].moved()
        time.sleep(0.3)
        assert not watched["busy"].moved(), "stopped (SIGSTOP): not running, whatever its counters"
        assert not ProcessProgress(2**22 + 12345).moved(), "gone"
    finally:
        busy.kill()
        asleep.kill()
