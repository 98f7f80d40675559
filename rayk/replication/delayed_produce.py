"""DelayedProduces: a leader's produce calls whose acks=-1 requests wait for the in-sync
replicas without a task (Kafka's DelayedProduce in its purgatory), for the PRODUCE frames
the native data plane endpoint hands the replica (LeaderProduce.produce_or_park).

A call (one frame: the requests a listener coalesced) is parked (parked_requests.py) with
the answers it has and, per acks=-1 request appended, the offset the HW must pass in the
epoch it was appended in, and its deadline. Every change of the replica
(ReplicaEvents.notify_change: the HW, the role, the ISR or a config moved) checks the parked
calls again, with the same check as the async path's wait (LeaderProduce.replication_outcome);
at a call's earliest deadline what is past it is answered REQUEST_TIMED_OUT, and the call
waits on for the rest. A call is answered once every request of it is, in one reply. A
check or a reply that raises is answered UNKNOWN_SERVER_ERROR for every request of the call
and never fails the change that woke it (a follower's fetch, say). On close the parked
calls are dropped unanswered: their connections close with the endpoint.

Not thread-safe: the replica actor's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from rayk.dataplane.frames import ProduceResult
from rayk.errors import KafkaError, RequestTimedOutError
from rayk.replication.parked_requests import ParkedRequests

# (required offset, epoch) -> None (replicated), the error to answer, or anything else: waiting
Outcome = Callable[[int, int], object]
Reply = Callable[[list[ProduceResult]], None]


def replication_timed_out(required_offset: int, timeout_ms: int) -> RequestTimedOutError:
    return RequestTimedOutError(
        f"offset {required_offset - 1} was not replicated to all in-sync replicas within {timeout_ms} ms"
    )


class Pending:
    """One acks=-1 request of a parked call: its answer once the HW passes `required_offset`."""

    __slots__ = ("slot", "required_offset", "epoch", "deadline", "timeout_ms", "replicated")

    def __init__(self, slot: int, required_offset: int, epoch: int, deadline: float, timeout_ms: int,
                 replicated: ProduceResult) -> None:  # fmt: skip
        self.slot, self.required_offset, self.epoch = slot, required_offset, epoch
        self.deadline, self.timeout_ms, self.replicated = deadline, timeout_ms, replicated


class ParkedCall:
    """A produce call waiting for its acks=-1 requests' replication."""

    __slots__ = ("results", "pending", "reply")

    def __init__(self, results: list[ProduceResult | None], pending: list[Pending], reply: Reply) -> None:
        self.results, self.pending, self.reply = results, pending, reply


class DelayedProduces:
    """One leader's parked produce calls (see the module docstring)."""

    def __init__(self, name: str, outcome: Outcome, failed: Callable[[int, KafkaError], ProduceResult]) -> None:
        """`outcome` says where a request's replication stands; `failed(base offset, error)`
        is the answer of one that failed after its append."""
        self._outcome, self._failed = outcome, failed
        self._parked: ParkedRequests[ParkedCall] = ParkedRequests(
            name, "a produce call waiting for replication", self._settled, self._fail_all,
            lambda call: min(p.deadline for p in call.pending),
        )  # fmt: skip

    def __len__(self) -> int:
        return len(self._parked)

    def deadline(self, timeout_ms: int) -> float:
        """The deadline of a request with `timeout_ms`, received now, on the loop's clock."""
        return asyncio.get_running_loop().time() + timeout_ms / 1000

    def add(self, call: ParkedCall) -> None:
        """Answers the call now if it can be, else parks it until it can."""
        self._parked.answer_or_park(call)

    def on_change(self) -> None:
        """The HW, the role, the ISR or a config moved: answers the calls that can be."""
        self._parked.wake()

    def drop(self) -> None:
        """The replica closes: the parked calls go unanswered, and no timer of theirs runs."""
        self._parked.drop()

    def _settled(self, call: ParkedCall, timed_out: bool) -> bool:
        """Settles what of the call can be, and answers it once all of it is: True then."""
        now = asyncio.get_running_loop().time() if timed_out else None
        still: list[Pending] = []
        for pending in call.pending:
            outcome = self._outcome(pending.required_offset, pending.epoch)
            if outcome is None:
                call.results[pending.slot] = pending.replicated
            elif isinstance(outcome, KafkaError):
                call.results[pending.slot] = self._failed(pending.replicated.base_offset, outcome)
            elif now is not None and now >= pending.deadline:
                timed_out_error = replication_timed_out(pending.required_offset, pending.timeout_ms)
                call.results[pending.slot] = self._failed(pending.replicated.base_offset, timed_out_error)
            else:
                still.append(pending)
        call.pending = still
        if still:
            return False
        results = [r for r in call.results if r is not None]
        assert len(results) == len(call.results), "every request of a call answered"
        call.reply(results)
        return True

    def _fail_all(self, call: ParkedCall, error: KafkaError) -> None:
        call.reply([self._failed(-1, error) for _ in call.results])
