"""ParkedRequests: requests a leader answers later without a task of their own (the waiting
half of Kafka's purgatory): a follower's fetch until records come (leader_fetch.py), a
produce call until the in-sync replicas have it (delayed_produce.py).

Each request is parked with a deadline on the loop's clock (one timer each). It is checked
again at every wake-up (`wake`: an append or a change of the replica) and at its deadline,
by the owner's `check(request, timed_out)`, which answers it and says True, or says False
to keep it parked; at a deadline it is parked again until `deadline(request)` if it is not
answered (a call whose requests have deadlines of their own).

The code that woke the requests (a produce, a follower's fetch) must never fail because of
them: a check that raises is logged and the request answered through `fail(request, error)`
with UNKNOWN_SERVER_ERROR; a `fail` that raises too is logged and the request dropped (its
connection's peer times it out). A check that raised after its answer was written is not
answered twice: the endpoint's reply takes one answer per request (native_endpoint.Reply). A request is out of the list before its check runs, so an
answer that re-enters (a reply that lets the endpoint serve more, waking the list again)
never sees it twice. `drop` (the replica closes) forgets every request unanswered: their
connections close with the endpoint.

Not thread-safe: the replica actor's event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Generic, TypeVar

from rayk.errors import UnknownServerError

logger = logging.getLogger(__name__)

Request = TypeVar("Request")


class ParkedRequests(Generic[Request]):
    """One kind of request parked at one replica (see the module docstring)."""

    def __init__(
        self, name: str, what: str, check: Callable[[Request, bool], bool],
        fail: Callable[[Request, UnknownServerError], None], deadline: Callable[[Request], float],
    ) -> None:  # fmt: skip
        """`name` (the partition) and `what` ("a follower's fetch") are for the logs."""
        self._name, self._what = name, what
        self._check, self._fail, self._deadline = check, fail, deadline
        self._timers: dict[Request, asyncio.TimerHandle] = {}  # in the order they were parked

    def __len__(self) -> int:
        return len(self._timers)

    def answer_or_park(self, request: Request) -> None:
        """Answers the request if it can be now, else parks it until its deadline."""
        if not self._checked(request, timed_out=False):
            self._park(request)

    def park(self, request: Request) -> None:
        """Parks a request its owner knows cannot be answered now (the check would say so)."""
        self._park(request)

    def answer_at_once(self, request: Request) -> None:
        """Answers the request now with what it finds, as at its deadline (one that asked
        for no wait), never parking it."""
        self._checked(request, timed_out=True)

    def wake(self) -> None:
        """Something changed: the requests that can be answered are."""
        if not self._timers:
            return
        parked, self._timers = self._timers, {}
        for request, timer in parked.items():
            if self._checked(request, timed_out=False):
                timer.cancel()
            else:
                self._timers[request] = timer

    def drop(self) -> None:
        """Forgets every request, unanswered, and their timers."""
        parked, self._timers = self._timers, {}
        for timer in parked.values():
            timer.cancel()

    def _park(self, request: Request) -> None:
        loop = asyncio.get_running_loop()
        self._timers[request] = loop.call_at(self._deadline(request), self._expire, request)

    def _expire(self, request: Request) -> None:
        if self._timers.pop(request, None) is None:
            return  # answered meanwhile
        if not self._checked(request, timed_out=True):
            self._park(request)

    def _checked(self, request: Request, timed_out: bool) -> bool:
        """`check`, raising nothing: True once the request is answered (or given up)."""
        try:
            return self._check(request, timed_out)
        except Exception as e:
            logger.exception("%s: %s failed", self._name, self._what)
            try:
                self._fail(request, UnknownServerError(f"{type(e).__name__}: {e}"))
            except Exception:
                logger.exception("%s: %s could not be answered", self._name, self._what)
            return True
