"""Calls: how client code calls actors, so that no Ray exception reaches the user.

The client reaches the cluster through actor handles, so where a Kafka client sees a
broken connection or a request timeout, it sees Ray's exceptions. Every actor call the
client makes goes through this module, which turns them into rayk's typed errors:

- a KafkaError the actor raised comes back as itself (Ray wraps it in a RayTaskError
  that also subclasses it; the wrapper is dropped);
- an actor that is restarting or unreachable (ActorUnavailableError: the Controller
  while Ray restarts it), an actor that died (ActorDiedError: a leader replica whose
  broker is gone; its partition gets a new leader), or a crashed worker or node becomes
  NETWORK_EXCEPTION, retriable after a metadata refresh;
- a call left unanswered past its deadline (GetTimeoutError) is cancelled and becomes
  REQUEST_TIMED_OUT, retriable;
- anything else the actor raised becomes UNKNOWN_SERVER_ERROR, not retriable.

`call` makes a call and retries retriable failures after `retry_backoff_ms` until the
caller's deadline, then raises KafkaTimeoutError (naming the last failure, which is its
`__cause__`), as Kafka's clients raise TimeoutException once `max.block.ms` or
`default.api.timeout.ms` has passed. `get` waits for one call within a deadline. Both
block the calling thread; code that must not block (the producer's sender, `poll`) keeps
the ObjectRef in a `Pending` and looks at it when `ray.wait` says it is ready.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError, TaskCancelledError

from rayk.errors import KafkaError, KafkaTimeoutError, NetworkError, RequestTimedOutError, UnknownServerError

logger = logging.getLogger(__name__)

RETRY_BACKOFF_MS = 100  # Kafka's retry.backoff.ms


def translate(error: BaseException, what: str = "call") -> BaseException:
    """The rayk error for an exception an actor call raised (see the module docstring).
    Exceptions that are not Ray's (a TypeError in our own code) are returned unchanged."""
    if isinstance(error, RayTaskError):
        cause = error.cause
        if isinstance(cause, KafkaError):
            return cause
        return UnknownServerError(f"{what}: the actor raised {type(cause).__name__}: {cause}")
    if isinstance(error, KafkaError):
        return error
    if isinstance(error, (GetTimeoutError, TaskCancelledError)):
        return RequestTimedOutError(f"{what}: no answer in time")
    if isinstance(error, RayActorError) and error.actor_init_failed:
        return UnknownServerError(f"{what}: the actor could not start: {error}")
    if isinstance(error, RayError):
        return NetworkError(f"{what}: {type(error).__name__}: {_first_line(error)}")
    return error


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def cancel(ref: Any) -> None:
    """Cancels a call we stopped waiting for (it may have finished already)."""
    try:
        ray.cancel(ref)
    except Exception as e:  # the actor is gone, or the call completed: nothing to stop
        logger.debug("cancel: %s", e)


def get(ref: Any, deadline_s: float, what: str = "call") -> Any:
    """The call's result; raises its rayk error, or REQUEST_TIMED_OUT (after cancelling
    the call) if it is not answered by `deadline_s` (time.monotonic)."""
    try:
        return ray.get(ref, timeout=max(0.0, deadline_s - time.monotonic()))
    except GetTimeoutError:
        cancel(ref)
        raise RequestTimedOutError(f"{what}: no answer in time") from None
    except Exception as e:
        raise translate(e, what) from None


def call(
    make_call: Callable[[], Any],
    deadline_s: float,
    what: str,
    *,
    retry_backoff_ms: int = RETRY_BACKOFF_MS,
    on_retriable: Callable[[KafkaError], None] | None = None,
) -> Any:
    """Makes the call (`make_call` returns its ObjectRef) and retries retriable failures
    after `retry_backoff_ms` until `deadline_s`, then raises KafkaTimeoutError.
    `on_retriable` sees each retriable failure first (to forget a moved leader, say)."""
    while True:
        try:
            return get(make_call(), deadline_s, what)
        except Exception as e:
            error = translate(e, what)
            if not isinstance(error, KafkaError) or not error.retriable:
                raise error from None
        if on_retriable is not None:
            on_retriable(error)
        remaining_s = deadline_s - time.monotonic()
        if remaining_s <= 0:
            raise KafkaTimeoutError(f"{what}: gave up after its timeout; last error {error}") from error
        logger.debug("%s: %s; retrying", what, error)
        time.sleep(min(retry_backoff_ms / 1000, remaining_s))


@dataclass(slots=True, eq=False)
class Pending:
    """A call in flight that the caller does not block on: it passes `ref` to ray.wait
    and reads `result()` once the ref is ready, or `expired(now)` cancels it."""

    ref: Any
    deadline_s: float
    what: str

    def result(self) -> Any:
        """The (ready) call's result, or its rayk error."""
        return get(self.ref, self.deadline_s, self.what)

    def expired(self, now_s: float) -> bool:
        """Whether the call ran out of time; if so it is cancelled."""
        if now_s < self.deadline_s:
            return False
        cancel(self.ref)
        return True


def ready_refs(refs: list[Any], timeout_s: float) -> set[Any]:
    """Every ref of `refs` that is ready, waiting up to `timeout_s` for the first one."""
    if not refs:
        if timeout_s > 0:
            time.sleep(timeout_s)
        return set()
    done, rest = ray.wait(refs, num_returns=1, timeout=max(0.0, timeout_s))
    if done and rest:
        more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
        done += more
    return set(done)
