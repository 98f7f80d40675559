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
`default.api.timeout.ms` has passed. `get` waits for one call (`get_all` for several)
within a deadline. They block the calling thread; code that must not block (the
producer's sender, `poll`) keeps the ObjectRef in a `Pending` and looks at it when
`ray.wait` says it is ready.

`ApiCalls` is how the blocking API of Admin and Cluster calls: each call bounded by
`default_api_timeout_ms` (Kafka's default.api.timeout.ms, 60 s), retried only while it
goes unanswered (`unanswered`: the actor restarting, unreachable or silent), since any
error the actor answered with (UNKNOWN_TOPIC_OR_PARTITION for a topic that does not
exist) is final for an admin call, as it is for Kafka's Admin. A retried call may find
its work done by an attempt whose answer was lost; the callers of calls that are not
idempotent say what they make of that.

No module of the client calls `ray.get` or `ray.wait` but this one
(tests/test_client_calls.py checks).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError, TaskCancelledError

from rayk.errors import KafkaError, KafkaTimeoutError, NetworkError, RequestTimedOutError, UnknownServerError

logger = logging.getLogger(__name__)

RETRY_BACKOFF_MS = 100  # Kafka's retry.backoff.ms
DEFAULT_API_TIMEOUT_MS = 60_000  # Kafka's default.api.timeout.ms: the bound of one blocking API call

T = TypeVar("T")


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
    if isinstance(error, (GetTimeoutError, TaskCancelledError, concurrent.futures.CancelledError)):
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
    """Cancels a call we stopped waiting for (it may have finished already): a Ray call's
    ref, or a data plane request's future (rayk.client.data_plane)."""
    if isinstance(ref, concurrent.futures.Future):
        ref.cancel()
        return
    try:
        ray.cancel(ref)
    except Exception as e:  # the actor is gone, or the call completed: nothing to stop
        logger.debug("cancel: %s", e)


def get(ref: Any, deadline_s: float, what: str = "call") -> Any:
    """The call's result; raises its rayk error, or REQUEST_TIMED_OUT (after cancelling
    the call) if it is not answered by `deadline_s` (time.monotonic). `ref` is a Ray
    call's ObjectRef or a data plane request's future."""
    timeout_s = max(0.0, deadline_s - time.monotonic())
    try:
        if isinstance(ref, concurrent.futures.Future):
            return ref.result(timeout=timeout_s)
        return ray.get(ref, timeout=timeout_s)
    except (GetTimeoutError, concurrent.futures.TimeoutError):
        cancel(ref)
        if not isinstance(ref, concurrent.futures.Future):
            _leave([ref])
        raise RequestTimedOutError(f"{what}: no answer in time") from None
    except Exception as e:
        raise translate(e, what) from None


def get_all(refs: list[Any], deadline_s: float, what: str = "calls") -> list[Any]:
    """The results of calls made together, in order; raises the rayk error of one that
    failed, or REQUEST_TIMED_OUT (after cancelling those not done) past `deadline_s`."""
    try:
        return ray.get(refs, timeout=max(0.0, deadline_s - time.monotonic()))
    except GetTimeoutError:
        for ref in refs:
            cancel(ref)
        _leave(refs)
        raise RequestTimedOutError(f"{what}: no answer in time") from None
    except Exception as e:
        _leave(refs)
        raise translate(e, what) from None


def _leave(refs: list[Any]) -> None:
    """Calls made together that we stop looking at (one failed, or the deadline passed):
    each outcome still to come is taken by a future no one reads. `ray.get` of a list
    raises the first failure it meets, and Ray logs every failure a caller never took as
    an "Unhandled error" when its ref goes: a user reading a topic while a leader moved
    saw a traceback per partition for an error rayk had handled."""
    for ref in refs:
        ref.future()


def unanswered(error: KafkaError) -> bool:
    """Whether a failed call went unanswered (NETWORK_EXCEPTION: its actor restarting,
    unreachable or dead; REQUEST_TIMED_OUT), rather than being answered with an error."""
    return isinstance(error, (NetworkError, RequestTimedOutError))


def _is_retriable(error: KafkaError) -> bool:
    return error.retriable


def retry(
    attempt: Callable[[], T],
    deadline_s: float,
    what: str,
    *,
    retry_backoff_ms: int = RETRY_BACKOFF_MS,
    retry_if: Callable[[KafkaError], bool] = _is_retriable,
    on_retriable: Callable[[KafkaError], None] | None = None,
) -> T:
    """`attempt()`'s result, trying again after `retry_backoff_ms` while it fails with an
    error that `retry_if` accepts (by default any retriable one) until `deadline_s`, then
    KafkaTimeoutError. Other failures are raised as their rayk error (`translate`).
    `on_retriable` sees each failure that is retried first (to forget a moved leader, say)."""
    while True:
        try:
            return attempt()
        except Exception as e:
            error = translate(e, what)
            if not isinstance(error, KafkaError) or not retry_if(error):
                raise error from None
        if on_retriable is not None:
            on_retriable(error)
        remaining_s = deadline_s - time.monotonic()
        if remaining_s <= 0:
            raise KafkaTimeoutError(f"{what}: gave up after its timeout; last error {error}") from error
        logger.debug("%s: %s; retrying", what, error)
        time.sleep(min(retry_backoff_ms / 1000, remaining_s))


def call(
    make_call: Callable[[], Any],
    deadline_s: float,
    what: str,
    *,
    retry_backoff_ms: int = RETRY_BACKOFF_MS,
    retry_if: Callable[[KafkaError], bool] = _is_retriable,
    on_retriable: Callable[[KafkaError], None] | None = None,
) -> Any:
    """Makes the call (`make_call` returns its ObjectRef) and retries failures `retry_if`
    accepts (any retriable one) after `retry_backoff_ms` until `deadline_s`, then raises
    KafkaTimeoutError. `on_retriable` sees each retried failure first."""
    return retry(
        lambda: get(make_call(), deadline_s, what), deadline_s, what,
        retry_backoff_ms=retry_backoff_ms, retry_if=retry_if, on_retriable=on_retriable,
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class ApiCalls:
    """How the blocking API of Admin and Cluster calls actors (see the module docstring):
    each call within `default_api_timeout_ms`, retried after `retry_backoff_ms` while it
    goes unanswered, then KafkaTimeoutError; only rayk's errors are raised."""

    default_api_timeout_ms: int = DEFAULT_API_TIMEOUT_MS
    retry_backoff_ms: int = RETRY_BACKOFF_MS

    def __post_init__(self) -> None:
        if self.default_api_timeout_ms < 1 or self.retry_backoff_ms < 0:
            raise ValueError("default_api_timeout_ms must be >= 1 and retry_backoff_ms >= 0")

    def deadline_s(self, timeout_ms: int | None = None) -> float:
        """The time.monotonic() by which a call started now must end."""
        return time.monotonic() + (self.default_api_timeout_ms if timeout_ms is None else timeout_ms) / 1000

    def __call__(
        self,
        make_call: Callable[[], Any],
        what: str,
        *,
        timeout_ms: int | None = None,
        deadline_s: float | None = None,
        on_retriable: Callable[[KafkaError], None] | None = None,
    ) -> Any:
        """The answer to the call `make_call` makes (it returns the ObjectRef; it is called
        again for each retry, so it must not consume its arguments), within `timeout_ms`
        (None: default_api_timeout_ms) or by `deadline_s` (time.monotonic, for a call that
        is part of a larger one). `on_retriable` sees each unanswered attempt."""
        deadline_s = self.deadline_s(timeout_ms) if deadline_s is None else deadline_s
        return call(
            make_call, deadline_s, what,
            retry_backoff_ms=self.retry_backoff_ms, retry_if=unanswered, on_retriable=on_retriable,
        )  # fmt: skip

    def retry(self, attempt: Callable[[float], T], what: str, *, timeout_ms: int | None = None) -> T:
        """`attempt(deadline_s)`, which makes several calls (through `get` / `get_all`
        with that deadline), tried again while one of them goes unanswered."""
        deadline_s = self.deadline_s(timeout_ms)
        return retry(
            lambda: attempt(deadline_s), deadline_s, what, retry_backoff_ms=self.retry_backoff_ms, retry_if=unanswered
        )


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
    """Every ref of `refs` (Ray calls' ObjectRefs) that is ready, waiting up to
    `timeout_s` for the first one."""
    if not refs:
        if timeout_s > 0:
            time.sleep(timeout_s)
        return set()
    done, rest = ray.wait(refs, num_returns=1, timeout=max(0.0, timeout_s))
    if done and rest:
        more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
        done += more
    return set(done)


class ReadyWaiter:
    """Waits for the first of Ray calls (ObjectRefs) and data plane requests (futures) to
    be ready, for a loop that keeps both in flight (the consumer's poll). A Ray call
    waited on beside futures is waited on through its future, made once per call and
    kept while the call is pending."""

    def __init__(self) -> None:
        self._ray_futures: dict[Any, concurrent.futures.Future] = {}

    def ready(self, pending: list[Any], timeout_s: float) -> set[Any]:
        futures = [p for p in pending if isinstance(p, concurrent.futures.Future)]
        refs = [p for p in pending if not isinstance(p, concurrent.futures.Future)]
        if not futures:
            self._ray_futures.clear()
            return ready_refs(refs, timeout_s)
        self._ray_futures = {ref: self._ray_futures.get(ref) or ref.future() for ref in refs}
        waited = futures + list(self._ray_futures.values())
        concurrent.futures.wait(waited, timeout=max(0.0, timeout_s), return_when=concurrent.futures.FIRST_COMPLETED)
        return {f for f in futures if f.done()} | {ref for ref, f in self._ray_futures.items() if f.done()}
