"""ParkedRequests (rayk/replication/parked_requests.py): requests answered later without a
task, by wake-ups or at their deadlines; what raises never reaches the code that woke
them; a request is never answered twice. On the event loop, no Ray."""

from __future__ import annotations

import asyncio

from rayk.errors import UnknownServerError
from rayk.replication.parked_requests import ParkedRequests


class Request:
    def __init__(self, ready_at: int, wait_s: float, loop: asyncio.AbstractEventLoop) -> None:
        self.ready_at, self.deadline = ready_at, loop.time() + wait_s
        self.answers: list[object] = []


class Owner:
    """Answers a request once `level` reaches its `ready_at`, or "timed out" at its deadline."""

    def __init__(self, give_up_at_deadline: bool = True) -> None:
        self.level = 0
        self.give_up = give_up_at_deadline
        self.raising: set[Request] = set()
        self.parked: ParkedRequests[Request] = ParkedRequests(
            "t-0", "a test request", self.check, lambda r, e: r.answers.append(e), lambda r: r.deadline)

    def check(self, request: Request, timed_out: bool) -> bool:
        if request in self.raising:
            raise RuntimeError("a bug")
        if self.level >= request.ready_at:
            request.answers.append("ready")
            return True
        if timed_out and self.give_up:
            request.answers.append("timed out")
            return True
        return False


def test_requests_are_answered_by_a_wake_up_or_at_their_deadline_and_only_once():
    async def go():
        loop = asyncio.get_running_loop()
        owner = Owner()
        at_once, later, never = Request(0, 10, loop), Request(2, 10, loop), Request(9, 0.05, loop)
        for r in (at_once, later, never):
            owner.parked.answer_or_park(r)
        assert at_once.answers == ["ready"] and len(owner.parked) == 2
        owner.level = 1
        owner.parked.wake()
        assert later.answers == [] and len(owner.parked) == 2
        owner.level = 2
        owner.parked.wake()
        owner.parked.wake()
        await asyncio.sleep(0.1)
        assert later.answers == ["ready"] and never.answers == ["timed out"] and len(owner.parked) == 0

    asyncio.run(go())


def test_one_not_answered_at_its_deadline_is_parked_again_until_its_next():
    async def go():
        loop = asyncio.get_running_loop()
        owner = Owner(give_up_at_deadline=False)
        request = Request(1, 0.02, loop)
        owner.parked.answer_or_park(request)
        request.deadline = loop.time() + 0.05  # what `deadline` says after the first one
        await asyncio.sleep(0.04)
        assert request.answers == [] and len(owner.parked) == 1
        owner.level = 1
        owner.parked.wake()
        assert request.answers == ["ready"] and len(owner.parked) == 0

    asyncio.run(go())


def test_a_check_that_raises_is_answered_unknown_server_error_and_the_others_are_served():
    async def go():
        loop = asyncio.get_running_loop()
        owner = Owner()
        broken, fine = Request(1, 10, loop), Request(1, 10, loop)
        owner.parked.answer_or_park(broken)
        owner.parked.answer_or_park(fine)
        owner.raising.add(broken)
        owner.level = 1
        owner.parked.wake()  # raises nothing here
        assert [type(a) for a in broken.answers] == [UnknownServerError] and fine.answers == ["ready"]
        assert len(owner.parked) == 0

    asyncio.run(go())


def test_an_answer_that_wakes_the_list_again_never_answers_a_request_twice():
    """A reply can let the endpoint serve more requests at once, whose appends wake the list
    while it is being woken or while a deadline's check runs."""

    async def go():
        loop = asyncio.get_running_loop()
        owner = Owner()
        first, second = Request(1, 0.05, loop), Request(1, 10, loop)
        original = owner.check

        def reentrant(request: Request, timed_out: bool) -> bool:
            done = original(request, timed_out)
            if done:
                owner.parked.wake()  # the answer's side effects wake everything again
            return done

        owner.check = reentrant
        owner.parked = ParkedRequests("t-0", "a test request", reentrant, lambda r, e: r.answers.append(e),
                                      lambda r: r.deadline)  # fmt: skip
        owner.parked.answer_or_park(first)
        owner.parked.answer_or_park(second)
        await asyncio.sleep(0.1)  # first's deadline: answered "timed out", its answer wakes the list
        owner.level = 1
        owner.parked.wake()
        assert first.answers == ["timed out"] and second.answers == ["ready"] and len(owner.parked) == 0

    asyncio.run(go())


def test_dropped_requests_are_never_answered():
    async def go():
        loop = asyncio.get_running_loop()
        owner = Owner()
        request = Request(1, 0.02, loop)
        owner.parked.answer_or_park(request)
        owner.parked.drop()
        await asyncio.sleep(0.05)
        owner.level = 1
        owner.parked.wake()
        assert request.answers == [] and len(owner.parked) == 0

    asyncio.run(go())


def test_a_request_answered_at_once_is_checked_as_at_its_deadline_never_parked_and_a_failing_check_is_failed():
    async def go():
        loop = asyncio.get_running_loop()
        owner = Owner()
        not_ready, failing = Request(5, 10, loop), Request(5, 10, loop)
        owner.raising.add(failing)
        owner.parked.answer_at_once(not_ready)
        owner.parked.answer_at_once(failing)
        assert not_ready.answers == ["timed out"] and len(owner.parked) == 0
        assert len(failing.answers) == 1 and isinstance(failing.answers[0], UnknownServerError)

    asyncio.run(go())
