"""DelayedProduces (rayk/replication/delayed_produce.py): parked produce calls answered by
changes, by their timers, or dropped; on the event loop, no Ray."""

from __future__ import annotations

import asyncio

from rayk.dataplane.frames import ProduceResult
from rayk.errors import KafkaError, NotLeaderOrFollowerError, RequestTimedOutError, UnknownServerError
from rayk.replication.delayed_produce import DelayedProduces, ParkedCall, Pending

WAITING = object()


class State:
    """What the fake leader says: its HW and epoch; the calls' answers as they come."""

    def __init__(self) -> None:
        self.high_watermark, self.epoch = 0, 0
        self.answers: list[list[ProduceResult]] = []

    def outcome(self, required_offset: int, epoch: int) -> object:
        if epoch != self.epoch:
            return NotLeaderOrFollowerError("moved on")
        return None if self.high_watermark >= required_offset else WAITING

    def failed(self, base_offset: int, error: KafkaError) -> ProduceResult:
        return ProduceResult(base_offset, -1, 0, error)


def call(delayed: DelayedProduces, state: State, *pending: tuple[int, int, int], done: int = 0) -> ParkedCall:
    """A call of `done` answered requests, then one acks=-1 request per (base offset,
    required offset, timeout ms)."""
    results: list[ProduceResult | None] = [ProduceResult(-1, -1, 0)] * done + [None] * len(pending)
    waits = [Pending(done + i, required, state.epoch, delayed.deadline(timeout_ms), timeout_ms, ProduceResult(base, -1, 0))
             for i, (base, required, timeout_ms) in enumerate(pending)]
    return ParkedCall(results, waits, state.answers.append)


def test_a_call_is_answered_once_all_its_requests_are_replicated_in_one_reply():
    async def go():
        state = State()
        delayed = DelayedProduces("t-0", state.outcome, state.failed)
        delayed.add(call(delayed, state, (0, 2, 10_000), (2, 5, 10_000), done=1))
        assert len(delayed) == 1
        state.high_watermark = 3
        delayed.on_change()
        assert state.answers == [] and len(delayed) == 1
        state.high_watermark = 5
        delayed.on_change()
        assert [[r.base_offset for r in a] for a in state.answers] == [[-1, 0, 2]] and len(delayed) == 0
        delayed.add(call(delayed, state, (5, 5, 10_000)))  # replicated already: answered at once
        assert len(state.answers) == 2 and len(delayed) == 0

    asyncio.run(go())


def test_each_request_times_out_at_its_own_deadline_and_the_call_waits_for_the_last():
    async def go():
        state = State()
        delayed = DelayedProduces("t-0", state.outcome, state.failed)
        delayed.add(call(delayed, state, (0, 1, 50), (1, 2, 200)))
        await asyncio.sleep(0.12)
        assert state.answers == [] and len(delayed) == 1  # the first timed out, the second waits
        await asyncio.sleep(0.2)
        (answer,) = state.answers
        assert [type(r.error) for r in answer] == [RequestTimedOutError, RequestTimedOutError]
        assert len(delayed) == 0

    asyncio.run(go())


def test_a_leadership_change_fails_the_waiting_requests_and_a_reply_that_raises_fails_nothing_else():
    async def go():
        state = State()
        delayed = DelayedProduces("t-0", state.outcome, state.failed)
        bad = call(delayed, state, (0, 1, 10_000))
        replies: list[list[ProduceResult]] = []

        def reply_once_then_raise(results: list[ProduceResult]) -> None:
            replies.append(results)
            if len(replies) == 1:
                raise ZeroDivisionError("an answer that could not be built")

        bad.reply = reply_once_then_raise
        delayed.add(bad)
        delayed.add(call(delayed, state, (1, 2, 10_000)))
        state.epoch = 1
        delayed.on_change()  # logs the ZeroDivisionError, answers it UNKNOWN_SERVER_ERROR, and the other call
        assert isinstance(replies[0][0].error, NotLeaderOrFollowerError)
        assert isinstance(replies[1][0].error, UnknownServerError)
        (answer,) = state.answers
        assert isinstance(answer[0].error, NotLeaderOrFollowerError) and answer[0].base_offset == 1
        assert len(delayed) == 0

    asyncio.run(go())


def test_dropped_calls_are_never_answered():
    async def go():
        state = State()
        delayed = DelayedProduces("t-0", state.outcome, state.failed)
        delayed.add(call(delayed, state, (0, 1, 50)))
        delayed.drop()
        await asyncio.sleep(0.1)
        state.high_watermark = 1
        delayed.on_change()
        assert state.answers == [] and len(delayed) == 0

    asyncio.run(go())
