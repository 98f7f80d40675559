"""Supervision of child actors: how an owner learns that an actor it created is gone.

Ray is the authority on death. Ray tells a caller that an actor died by failing the calls
in flight to it. So the owner keeps one call to each child open, `run_until_stopped`, which
returns only when the child is stopped on purpose and fails (RayActorError) the moment its
process dies, whoever killed it: Ray's memory monitor, a node Ray declared dead, SIGKILL.

A process that is alive but does not run (SIGSTOP, a wedged event loop) fails nothing, so
the owner also `ping`s, in its probe rounds, each child that has answered nothing for a
third of `unresponsive_ms`. A ping with no answer for the other two thirds makes the child
*late*, and late is not dead: on a node short of CPU every process answers late, and
killing the slow ones only adds the load of starting them again (a metastable failure). So
a late child is killed only if the owner has not seen it run since its ping went out
(`ran`: a replica's publication on its broker's board, or its process running or waiting
for a CPU: `ProcessProgress`), which is how a stopped or wedged process looks; one that runs but has answered no ping for
LATE_KILL_FACTOR times `unresponsive_ms` cannot be managed, and is killed all the same.
Killing fails the held call too. A wedged child goes ~`unresponsive_ms` after its last
sign of life, while a stall of the owner's own event loop kills nothing (a ping out during
it was answered meanwhile, and none was sent during it). Either way the owner's
`on_death(key, handle)` runs once, and it backs off before starting the child again
(restart_backoff.py).

Any sign of life counts, not only a ping's answer: an owner that calls its children anyway
tells the supervisor with `answered`, one that sees them run otherwise with `ran`. A
broker's replicas publish on its board every 2.25 s (replica_board.py), so a live replica
is pinged only every CALL_CHECK_PINGS intervals (30 s), to find one that runs but takes no
calls: an idle actor call costs ~1-2 ms of CPU across the two processes, and replicas are
most of a broker's children.

- `Supervised`: the child's half, mixed into an actor class (`run_until_stopped`, `ping`,
  `pid`, and `_stop_supervision` to call when it stops on purpose).
- `ChildSupervisor`: the owner's half. `watch(key, handle)` once the child has answered
  its first call (creation, including log recovery, may take long and is not probed),
  `forget(key)` before stopping it on purpose, `probe()` from the owner's periodic loop,
  `answered(key, handle)` when the child answered another call, `ran(key, handle, at_s)`
  when it was seen running otherwise. `late` counts the pings found late and `killed` the
  children it killed, for the owner's metrics and tests.
- `start_again_if_restarted`: for the actors Ray itself restarts (max_restarts=-1: the
  Controller, the brokers), which have no owner to start them again: called from
  `__init__`, it calls the actor's own `start` once the actor is back.

Not thread-safe: both halves run on their actor's event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
import warnings
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import RayActorError

logger = logging.getLogger(__name__)

# A child seen running (`ChildSupervisor.ran`) but answering no call is still pinged once
# its last answer is this many ping intervals old (30 s at Kafka's 9 s session timeout).
CALL_CHECK_PINGS = 10
# A child seen running but whose ping has had no answer this many times `unresponsive_ms`
# (45 s at Kafka's 9 s session timeout) runs but takes no calls: it is killed. Far above
# the slowest answer measured on a starved node (tests/faults/test_overload.py).
LATE_KILL_FACTOR = 5


class Supervised:
    """The child's half: a call its owner holds open, and a liveness probe."""

    _supervision_stopped: asyncio.Event | None = None

    def _supervision_event(self) -> asyncio.Event:
        if self._supervision_stopped is None:
            self._supervision_stopped = asyncio.Event()
        return self._supervision_stopped

    async def run_until_stopped(self) -> None:
        """Returns when this actor stops on purpose; fails the moment its process dies."""
        await self._supervision_event().wait()

    async def ping(self) -> None:
        """Answers at once while the actor's event loop runs."""

    async def pid(self) -> int:
        """This actor's process, for an owner on its node to see it run (its CPU time)."""
        return os.getpid()

    def _stop_supervision(self) -> None:
        """This actor stops on purpose: its owner's held call returns normally."""
        self._supervision_event().set()


@dataclass(slots=True)
class _Child:
    handle: Any
    held: asyncio.Task
    answered_at_s: float  # its last sign of life: an answer, or seen running (`ran`)
    called_at_s: float  # its last answer to a call
    probe: asyncio.Future | None = None  # the ping out, if any
    unanswered_since_s: float | None = None  # when the first ping of those not answered since went
    late: bool = False  # its ping is late, and it was seen running since: logged once per silence


class ChildSupervisor:
    """The owner's half: holds a call open on each child, pings the quiet ones, kills the
    wedged ones (see the module docstring)."""

    def __init__(self, name: str, on_death: Callable[[Hashable, Any], Awaitable[None]], unresponsive_ms: int,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.name = name
        self._on_death = on_death
        self._ping_after_s = unresponsive_ms / 1000 / 3
        self._ping_timeout_s = unresponsive_ms / 1000 - self._ping_after_s
        self._late_kill_s = unresponsive_ms / 1000 * LATE_KILL_FACTOR
        self._clock = clock
        self._children: dict[Hashable, _Child] = {}
        self.late = 0  # pings found late from a child seen running (not killed for it)
        self.killed = 0  # children killed for answering nothing

    def watch(self, key: Hashable, handle: Any) -> None:
        """Supervises `handle` under `key` (replacing whatever was watched there)."""
        self.forget(key)
        held = asyncio.get_running_loop().create_task(self._hold(key, handle))
        now = self._clock()
        self._children[key] = _Child(handle, held, now, now)

    def forget(self, key: Hashable) -> None:
        """Stops supervising `key`: its owner stops it on purpose, or it was replaced."""
        child = self._children.pop(key, None)
        if child is not None:
            child.held.cancel()
            if child.probe is not None:
                child.probe.cancel()

    def answered(self, key: Hashable, handle: Any) -> None:
        """`handle`, watched under `key`, answered a call just now: it runs (so a ping of it
        still out is not counted against it)."""
        child = self._children.get(key)
        if child is not None and child.handle is handle:
            child.answered_at_s = child.called_at_s = self._clock()
            child.unanswered_since_s = None
            child.late = False

    def ran(self, key: Hashable, handle: Any, at_s: float) -> None:
        """`handle`, watched under `key`, was seen running at `at_s` (the supervisor's
        clock), without answering anything: it is not pinged for a while, and a ping of it
        out for longer than the timeout is late, not a sign of death. But an actor that
        runs and takes no calls cannot be managed: it is pinged anyway once it has answered
        no call for CALL_CHECK_PINGS times the ping interval, and killed if a ping stays
        unanswered for LATE_KILL_FACTOR times `unresponsive_ms`."""
        child = self._children.get(key)
        if child is not None and child.handle is handle:
            child.answered_at_s = max(child.answered_at_s, min(at_s, self._clock()))

    def unanswered(self) -> list[Hashable]:
        """The children with a ping out not answered yet (those whose owner may look for
        other signs that they run: `ran`)."""
        return [key for key, child in self._children.items() if child.unanswered_since_s is not None]

    def watching(self, key: Hashable) -> Any:
        child = self._children.get(key)
        return None if child is None else child.handle

    async def _hold(self, key: Hashable, handle: Any) -> None:
        try:
            await handle.run_until_stopped.remote()
            died = None
        except asyncio.CancelledError:
            raise
        except RayActorError as e:
            died = e
        except Exception as e:  # the call itself cannot fail but by the actor's death
            died = e
        child = self._children.get(key)
        if child is None or child.handle is not handle:
            return  # forgotten or replaced meanwhile
        del self._children[key]
        if died is None:
            return  # stopped on purpose by someone else (e.g. deleted with its topic)
        logger.warning("%s: %s died: %s", self.name, key, str(died).splitlines()[0] if str(died) else type(died).__name__)
        # Ray also fails a held call when the actor is only unreachable for a while
        # (ActorUnavailableError): make sure it is gone, with its locks and its leadership,
        # before its owner replaces it.
        ray.kill(handle, no_restart=True)
        await self._on_death(key, handle)

    def probe(self) -> None:
        """One probe round: kills a child whose pings have had no answer for two thirds of
        `unresponsive_ms` (a ping that failed counts as unanswered) unless it was seen running
        since, or for LATE_KILL_FACTOR times `unresponsive_ms` whatever it was seen doing;
        pings those that answered nothing for a third of it and have no ping out."""
        now = self._clock()
        for key, child in list(self._children.items()):
            ping = child.probe
            if ping is not None and ping.done():
                self._pinged(key, child.handle, ping)  # its callback may not have run yet
            if child.unanswered_since_s is not None and self._judge(key, child, now):
                continue
            quiet = now - child.answered_at_s >= self._ping_after_s
            if child.probe is None and (quiet or now - child.called_at_s >= self._ping_after_s * CALL_CHECK_PINGS):
                child.probe = asyncio.ensure_future(child.handle.ping.remote())
                if child.unanswered_since_s is None:
                    child.unanswered_since_s = now
                child.probe.add_done_callback(functools.partial(self._pinged, key, child.handle))

    def _judge(self, key: Hashable, child: _Child, now: float) -> bool:
        """Whether a child with a ping unanswered was killed: late and not seen running
        since the ping went, or late for too long."""
        assert child.unanswered_since_s is not None
        unanswered_s = now - child.unanswered_since_s
        if unanswered_s < self._ping_timeout_s:
            return False
        seen_running = child.answered_at_s > child.unanswered_since_s
        if seen_running and unanswered_s < self._late_kill_s:
            if not child.late:
                child.late = True
                self.late += 1
                logger.info("%s: %s is late (a ping unanswered for %.1f s) but runs: slow, not dead", self.name, key,
                            unanswered_s)  # fmt: skip
            return False
        logger.warning("%s: %s answered nothing for %.1f s%s: killing it", self.name, key, now - child.answered_at_s,
                       "" if not seen_running else f" (running, but no ping answered for {unanswered_s:.0f} s)")  # fmt: skip
        ray.kill(child.handle, no_restart=True)  # its held call fails: on_death follows
        self.killed += 1
        child.unanswered_since_s = now  # one kill per silence
        child.late = False
        return True

    def _pinged(self, key: Hashable, handle: Any, ping: asyncio.Future) -> None:
        child = self._children.get(key)
        if child is None or child.handle is not handle or child.probe is not ping:
            return  # forgotten, replaced, or this answer was taken already
        child.probe = None
        if not ping.cancelled() and ping.exception() is None:
            child.answered_at_s = child.called_at_s = self._clock()
            child.unanswered_since_s = None
            child.late = False


def process_progress_ns(pid: int) -> int | None:
    """How long a process on this node has run and waited for a CPU to run, over all its
    threads (ns, /proc/<pid>/task/*/schedstat); None if it is gone or stopped (SIGSTOP, or
    traced): such a process does not run, whatever its counters say. A process starved of
    CPU still waits on a run queue, so this moves while it is alive and wants to run; one
    blocked for good (every thread asleep) or stopped does not move it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        if state in (b"T", b"t", b"Z", b"X"):
            return None
        total = 0
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                on_cpu_ns, waiting_ns = f.read().split()[:2]
            total += int(on_cpu_ns) + int(waiting_ns)
        return total
    except (OSError, IndexError, ValueError):
        return None


class ProcessProgress:
    """Whether a child's process, on its owner's node, ran or wanted to run since the last
    look (`process_progress_ns`): what tells a starved child from a stopped one when its
    ping is late. Not thread-safe."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._last_ns: int | None = None

    def moved(self) -> bool:
        """Whether it moved since the previous call (False at the first: nothing to compare)."""
        now_ns = process_progress_ns(self.pid)
        moved = now_ns is not None and self._last_ns is not None and now_ns > self._last_ns
        self._last_ns = now_ns
        return moved


def start_again_if_restarted(method: str = "start", retry_backoff_ms: int = 50) -> bool:
    """From an actor's `__init__`: if Ray is restarting this actor after its process died,
    calls its `method` (by a call to itself, from a thread, retried until answered: a call
    sent while the actor is still being restarted can be refused). True if it will."""
    context = ray.get_runtime_context()
    with warnings.catch_warnings():  # Ray 2.60's property reads its own deprecated `actor_id`,
        warnings.simplefilter("ignore", DeprecationWarning)  # which printed a warning per restart
        reconstructed = context.was_current_actor_reconstructed
    if not reconstructed:
        return False
    handle = context.current_actor

    def call_until_answered() -> None:
        while True:
            try:
                ray.get(getattr(handle, method).remote())
                return
            except RayActorError as e:  # not accepting calls yet
                logger.info("restarted actor: %s not taken yet: %s", method, e)
            except Exception:
                logger.exception("restarted actor: %s failed; trying again", method)
            time.sleep(retry_backoff_ms / 1000)

    threading.Thread(target=call_until_answered, name=f"restart-{method}", daemon=True).start()
    return True
