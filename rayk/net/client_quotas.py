"""ClientQuotas: a listener's client quotas (Kafka's ClientQuotaManagers for produce, fetch
and request time), and how long each request's client must be throttled.

The limits are the Controller's (rayk/quotas.py, kept in its metadata log); the listener
takes them like its ACLs, and measures its clients itself. As in Kafka, quotas are per
broker: a client of three brokers may send three times its producer_byte_rate in all.

What is measured (each in a SampledRate of `quota.window.num` samples of
`quota.window.size.seconds`):
- `producer_byte_rate`: the size of each Produce request;
- `consumer_byte_rate`: the record bytes each Fetch answers (Kafka counts the whole
  response; the rest is a few dozen bytes per partition);
- `request_percentage`: the listener's thread time spent on the client's requests, in
  percent of one thread: decoding, the handler and every task it starts (the task factory
  of `measure_child_tasks`), building and encoding the answer. rayk's listener does on its
  thread what a Kafka broker's network and request handler threads do; the appends and
  reads themselves run in the partition replicas, whose work the byte rates bound.

A request over its quota is still served, and its answer says how long the client must
wait (throttle_time_ms); the listener starts nothing more from that connection until then
(KIP-219; rayk/net/socket_server.py). A Fetch from a client that is over its
consumer_byte_rate already is answered at once with no records and the time left. (Kafka
instead reads, and answers empty if what it read would put the client over; rayk serves a
client that is within its quota, then throttles it, so that a batch larger than the
window's allowance never stalls a consumer.) A request's throttle time is the longest of
its byte-rate one and its request-time one; request-time throttles are capped at one
sample, as Kafka caps them, and every throttle fits the wire's int32.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Generator, Mapping
from typing import Any

from rayk.quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE, QuotaConfig, QuotaEntity, QuotaKey
from rayk.net.sampled_rate import SampledRate
from rayk.net.request_context import RequestContext

_PERCENT_PER_NS = 100 / 1e9  # one thread busy for 1 s is 100 (%) per second
MAX_THROTTLE_MS = 2**31 - 1  # throttle_time_ms is an int32 on the wire


def _monotonic_ms() -> float:
    return time.monotonic() * 1000


class ClientQuotas:
    """A listener's client quotas: owns the Controller's quota limits as last taken (and their
    version) and a SampledRate per (quota, user/client) measured. Held by the BrokerView;
    `prune` bounds it; not thread-safe (the listener's event loop)."""

    def __init__(self, window_num: int = 11, window_size_ms: int = 1000, clock_ms: Any = _monotonic_ms) -> None:
        self.window_num = window_num
        self.window_size_ms = window_size_ms
        self._clock_ms = clock_ms
        self.config = QuotaConfig()
        self.version = -2  # of the Controller's quotas held; -2: none yet
        self._rates: dict[tuple[str, QuotaKey], SampledRate] = {}

    def update(self, version: int, entries: Mapping[QuotaEntity, Mapping[str, float]]) -> None:
        """Takes the Controller's quotas at `version`; what clients sent so far still counts."""
        self.version = version
        self.config = QuotaConfig(entries)

    @property
    def measures_request_time(self) -> bool:
        """Whether some request_percentage quota is set (only then is thread time measured)."""
        return REQUEST_PERCENTAGE in self.config.keys_set

    def produce_throttle_ms(self, context: RequestContext, client_id: str | None, size_bytes: int) -> int:
        """Records a Produce request's size; the client's throttle time."""
        return self._record(PRODUCER_BYTE_RATE, context, client_id, size_bytes)

    def fetch_throttle_ms(self, context: RequestContext, client_id: str | None, size_bytes: int = 0) -> int:
        """Records what a Fetch answered (nothing: only asks); the client's throttle time."""
        return self._record(CONSUMER_BYTE_RATE, context, client_id, size_bytes)

    def fetch_max_bytes(self, context: RequestContext, client_id: str | None) -> int | None:
        """The most one Fetch may answer: what the client's quota allows over the window
        (Kafka's maxValueInQuotaWindow), or None without a consumer_byte_rate quota."""
        found = self.config.resolve(_user(context), client_id or "", CONSUMER_BYTE_RATE)
        if found is None:
            return None
        return max(int(found[0] * max(self.window_num - 1, 1) * self.window_size_ms / 1000), 1)

    def request_throttle_ms(self, context: RequestContext, client_id: str | None, thread_ns: int) -> int:
        """Records a request's thread time so far; the client's throttle time (at most one sample)."""
        return min(self._record(REQUEST_PERCENTAGE, context, client_id, thread_ns * _PERCENT_PER_NS), self.window_size_ms)

    def record_request_time(self, context: RequestContext, client_id: str | None, thread_ns: int) -> None:
        """Records thread time spent after the throttle was decided (encoding the answer)."""
        self._record(REQUEST_PERCENTAGE, context, client_id, thread_ns * _PERCENT_PER_NS, throttle=False)

    def prune(self) -> None:
        """Forgets clients that sent nothing for a whole window (bounds the memory of
        clients that come and go, or make up client ids)."""
        now = self._clock_ms()
        for key in [k for k, rate in self._rates.items() if rate.idle(now)]:
            del self._rates[key]

    def rate_count(self) -> int:
        return len(self._rates)

    def _record(self, quota: str, context: RequestContext, client_id: str | None, value: float, throttle: bool = True) -> int:
        found = self.config.resolve(_user(context), client_id or "", quota)
        if found is None:
            return 0
        limit, shared_by = found
        rate = self._rates.get((quota, shared_by))
        if rate is None:
            rate = self._rates[(quota, shared_by)] = SampledRate(self.window_num, self.window_size_ms)
        now = self._clock_ms()
        if value:
            rate.record(value, now)
        return min(rate.throttle_ms(limit, now), MAX_THROTTLE_MS) if throttle else 0


def _user(context: RequestContext) -> str:
    """The user a quota is looked up for: the principal's name (ANONYMOUS unauthenticated)."""
    return context.principal.partition(":")[2]


class ThreadCost:
    """The thread time one request took so far."""

    __slots__ = ("ns",)

    def __init__(self, ns: int = 0) -> None:
        self.ns = ns


_REQUEST_COST: contextvars.ContextVar[ThreadCost | None] = contextvars.ContextVar("rayk_request_cost", default=None)


class ThreadTimed:
    """Awaits a coroutine and adds the thread time its steps take to `cost`, leaving out
    the time it spends waiting; tasks it starts meanwhile count into `cost` too (with
    `measure_child_tasks` installed): what request_percentage measures."""

    def __init__(self, coroutine: Any, cost: ThreadCost | None = None) -> None:
        self._coroutine = coroutine
        self.cost = cost if cost is not None else ThreadCost()

    @property
    def ns(self) -> int:
        return self.cost.ns

    def __await__(self) -> Generator[Any, Any, Any]:
        coroutine, to_send, to_throw, cost = self._coroutine, None, None, self.cost
        token = _REQUEST_COST.set(cost)  # tasks started by the coroutine inherit it
        try:
            while True:
                started = time.thread_time_ns()
                try:
                    yielded = coroutine.send(to_send) if to_throw is None else coroutine.throw(to_throw)
                except StopIteration as done:
                    return done.value
                finally:
                    cost.ns += time.thread_time_ns() - started
                try:
                    to_send, to_throw = (yield yielded), None
                except BaseException as e:  # a cancellation goes on into the coroutine
                    to_send, to_throw = None, e
        finally:
            _REQUEST_COST.reset(token)


def measure_child_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Installs a task factory on `loop` under which a task started while a request is
    measured (its context holds the request's ThreadCost) adds its own steps' thread time
    to that request's. Other tasks are created as before. Installing it twice is a no-op."""
    previous = loop.get_task_factory()
    if getattr(previous, "measures_request_cost", False):
        return

    def create(loop: asyncio.AbstractEventLoop, coroutine: Any, context: contextvars.Context | None = None) -> Any:
        cost = _REQUEST_COST.get() if context is None else context.get(_REQUEST_COST)
        if cost is not None and asyncio.iscoroutine(coroutine):
            coroutine = _timed(coroutine, cost)
        kwargs = {} if context is None else {"context": context}
        if previous is not None:
            return previous(loop, coroutine, **kwargs)
        return asyncio.Task(coroutine, loop=loop, **kwargs)

    create.measures_request_cost = True  # type: ignore[attr-defined]
    loop.set_task_factory(create)


async def _timed(coroutine: Any, cost: ThreadCost) -> Any:
    return await ThreadTimed(coroutine, cost)
