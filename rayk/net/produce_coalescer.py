"""ProduceCoalescer: a listener's produce requests reach a partition's leader in few calls.

A Ray actor call costs the caller and the callee about half a millisecond of CPU each on
this 2-core machine (measured), and every append the leader makes costs each follower a
fetch call more. A client with `linger.ms` 0 sends one record per request, so one call
per request saturated the brokers' CPUs at a few hundred records/s at RF=3, and latency
grew without bound. So, per partition, one call is in flight at a time; requests that
arrive meanwhile (from any connection) wait and go together in the next call
(`PartitionReplica.produce_requests`, at most CALL_MAX_BYTES of records, one request at
least). An idle partition's request goes at once; a busy one's waits at most for one
call to return, and the busier the partition, the more each call carries: Kafka's group
commit, with the load setting the batch. Two calls in flight measured slower (fewer
requests per call on a CPU-bound machine) and would need the leader to re-order calls
that Ray may deliver out of order.

Order: a partition's requests are appended in the order `submit` was called, which the
listener does in the order they arrived on each connection. Not thread safe: the
listener's event loop owns it.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from typing import Any, Awaitable, Callable

from rayk.dataplane.frames import ProduceRequest as Request

CALL_MAX_BYTES = 8 << 20

TopicPartition = tuple[str, int]
# (topic, partition, requests) -> one ProduceResult per request (raises if the call failed)
SendCall = Callable[[str, int, list[Request]], Awaitable[list[Any]]]


class ProduceCoalescer:
    """A listener's produce requests on their way to the partition leaders: owns, per partition
    with a call in flight, the requests waiting for the next call, and the call tasks. Held
    by the BrokerView; not thread-safe (the listener's event loop)."""

    def __init__(self, send: SendCall, call_max_bytes: int = CALL_MAX_BYTES) -> None:
        self._send = send
        self._call_max_bytes = call_max_bytes
        # Partitions with a call in flight -> the requests waiting for it to return.
        self._waiting: dict[TopicPartition, deque[tuple[Request, asyncio.Future]]] = {}
        self._calls: set[asyncio.Task] = set()

    def submit(self, topic: str, partition: int, records: bytes, acks: int, timeout_ms: int,
               transactional_id: str | None = None, transaction_version: int = 1) -> asyncio.Future:
        """Queues one request; the future resolves to its ProduceResult, or raises what the
        call raised. Call it in the order the requests arrived; it does not wait."""
        tp = (topic, partition)
        request = Request(records, acks, timeout_ms, transactional_id, transaction_version)
        future = asyncio.get_running_loop().create_future()
        waiting = self._waiting.get(tp)
        if waiting is None:  # nothing in flight: send at once
            self._waiting[tp] = deque()
            self._start_call(tp, [request], [future])
        else:
            waiting.append((request, future))
        return future

    def in_flight(self, topic: str, partition: int) -> bool:
        return (topic, partition) in self._waiting

    def _start_call(self, tp: TopicPartition, requests: list[Request], futures: list[asyncio.Future],
                    context: contextvars.Context | None = None) -> None:
        call = asyncio.get_running_loop().create_task(self._call(tp, requests, futures), context=context)
        self._calls.add(call)
        call.add_done_callback(self._calls.discard)

    async def _call(self, tp: TopicPartition, requests: list[Request], futures: list[asyncio.Future]) -> None:
        try:
            results = await self._send(tp[0], tp[1], requests)
            assert len(results) == len(requests), (len(results), len(requests))
            for future, result in zip(futures, results):
                if not future.done():
                    future.set_result(result)
        except Exception as e:  # the call failed (the leader is gone, ...): each of its requests fails
            for future in futures:
                if not future.done():
                    future.set_exception(e)
        finally:
            self._next_call(tp)

    def _next_call(self, tp: TopicPartition) -> None:
        waiting = self._waiting[tp]
        if not waiting:
            del self._waiting[tp]
            return
        requests, futures, size = [], [], 0
        while waiting and (not requests or size + len(waiting[0][0].records) <= self._call_max_bytes):
            request, future = waiting.popleft()
            requests.append(request)
            futures.append(future)
            size += len(request.records)
        # A fresh context: the call carries many clients' requests, so it is charged to
        # none of them (client_quotas.measure_child_tasks), not to the one that started
        # the chain of calls.
        self._start_call(tp, requests, futures, contextvars.Context())
