"""CoordinatorLink: how a client reaches a consumer group's coordinator, the leader
replica of the group's `__consumer_offsets` partition (found with the Controller's
FindCoordinator), looking it up again whenever it moved or is not ready yet.

Two ways to call it: `call` blocks, retrying within its timeout (a coordinator moving,
dying, or not elected yet: NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, a dead or silent
actor; the Controller restarting), then raises KafkaTimeoutError; `handle_nowait` never
blocks: it answers None while a lookup it started runs, whose ref the caller waits on
(`pending`) and hands back (`collect`). Thread-safe.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from rayk.client import calls
from rayk.errors import (
    CoordinatorNotAvailableError,
    KafkaError,
    LeaderNotAvailableError,
    NetworkError,
    NotCoordinatorError,
    RequestTimedOutError,
)

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_MS = 30_000
# Errors after which the coordinator is looked up again.
COORDINATOR_ERRORS = (NotCoordinatorError, CoordinatorNotAvailableError, NetworkError, RequestTimedOutError)


class CoordinatorLink:
    """A client's handle to one group's (or transactional id's) coordinator replica: owns the
    handle as last found and the FindCoordinator lookup in flight, dropping the handle when
    the coordinator moved. Each member, share consumer, transaction manager and GroupAdmin
    keeps its own; thread-safe (one lock)."""

    def __init__(
        self,
        controller: Any,
        group_id: str,
        request_timeout_ms: int = DEFAULT_TIMEOUT_MS,
        retry_backoff_ms: int = calls.RETRY_BACKOFF_MS,
        transactional: bool = False,
    ) -> None:
        """`group_id` names a group, or with `transactional` a transactional id, whose
        transaction coordinator (`__transaction_state`'s) this links to."""
        self._controller, self.group_id = controller, group_id
        self._find_method = "find_transaction_coordinator" if transactional else "find_coordinator"
        self._what = "transactional id" if transactional else "group"
        self._request_timeout_s = request_timeout_ms / 1000
        self._retry_backoff_ms = retry_backoff_ms
        self._handle: Any = None
        self._lookup: calls.Pending | None = None  # a FindCoordinator in flight for handle_nowait
        self._next_lookup_s = 0.0
        self._lock = threading.Lock()

    def call(self, method: str, *args: Any, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> Any:
        deadline = time.monotonic() + timeout_ms / 1000
        return calls.call(
            lambda: getattr(self._find(deadline), method).remote(*args),
            deadline,
            f"{method} ({self._what} {self.group_id!r})",
            retry_backoff_ms=self._retry_backoff_ms,
            on_retriable=self.forget_if_moved,
        )

    def _find(self, deadline_s: float) -> Any:
        with self._lock:
            if self._handle is not None:
                return self._handle
        try:
            _partition, handle = calls.get(
                getattr(self._controller, self._find_method).remote(self.group_id), deadline_s, "FindCoordinator"
            )
        except LeaderNotAvailableError as e:
            raise CoordinatorNotAvailableError(f"{self._what} {self.group_id!r}: {e}") from None
        with self._lock:
            self._handle = handle
        return handle

    def forget_if_moved(self, error: KafkaError) -> None:
        if isinstance(error, COORDINATOR_ERRORS):
            logger.debug("group %s: coordinator unavailable (%s); looking it up again", self.group_id, error)
            with self._lock:
                self._handle = None

    def result(self, pending: calls.Pending) -> Any:
        """A (ready or expired) call's result; a coordinator error makes the link look
        the coordinator up again."""
        try:
            return pending.result()
        except KafkaError as e:
            self.forget_if_moved(e)
            raise

    # ------------------------------------------------------------------ non-blocking

    def handle_nowait(self, now: float) -> Any | None:
        """The coordinator's handle, or None while a lookup (started here) runs."""
        with self._lock:
            if self._handle is not None:
                return self._handle
            if self._lookup is not None and self._lookup.expired(now):
                self._lookup, self._next_lookup_s = None, now + self._retry_backoff_ms / 1000
            if self._lookup is None and now >= self._next_lookup_s:
                ref = getattr(self._controller, self._find_method).remote(self.group_id)
                self._lookup = calls.Pending(ref, now + self._request_timeout_s, "FindCoordinator")
            return None

    def collect(self, ready: set[Any], now: float) -> None:
        with self._lock:
            lookup = self._lookup
        if lookup is None or lookup.ref not in ready:
            return
        try:
            _partition, handle = lookup.result()
        except KafkaError as e:
            logger.debug("group %s: FindCoordinator: %s", self.group_id, e)
            handle = None
        with self._lock:
            if self._lookup is lookup:
                self._lookup = None
                if handle is None:
                    self._next_lookup_s = now + self._retry_backoff_ms / 1000
                else:
                    self._handle = handle

    def pending(self) -> list[Any]:
        with self._lock:
            return [self._lookup.ref] if self._lookup is not None else []

    def wake_at_s(self) -> float | None:
        with self._lock:
            if self._handle is not None:
                return None
            return self._lookup.deadline_s if self._lookup is not None else self._next_lookup_s
