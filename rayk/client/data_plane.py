"""DataPlaneClient: the data plane (rayk/dataplane) for the client's threaded code, the
Producer's sender and the Consumer's fetcher, which are not asyncio.

One per process, made at first use: a daemon thread runs an asyncio loop that holds one
ReplicaLink per replica actor this process sends to or fetches from, shared by every
Producer and Consumer in the process. `produce` and `fetch` hand a request to that loop
and return a concurrent.futures.Future at once, as `ref.future()` did for a Ray call;
cancelling a produce's future (a request timeout) closes the link's connection, which
stops the replica serving the request, as `ray.cancel` did, and fails the other requests
on it (retriable): Kafka's clients disconnect on a request timeout too. A fetch, which its
replica answers within its max wait, is only abandoned: its answer is dropped. A failed request fails its future with the error: NETWORK_EXCEPTION for
a connection that broke, Ray's actor error if the replica's actor is gone (calls.translate
turns both into rayk's errors), and a link reconnects at its next request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import ray

from rayk.dataplane.frames import FetchRequest, ProduceResult
from rayk.dataplane.replica_link import ReplicaLink


class DataPlaneClient:
    _instance: DataPlaneClient | None = None
    _instance_lock = threading.Lock()

    @classmethod
    def get(cls) -> DataPlaneClient:
        """This process's client (a forked child makes its own: threads do not survive a fork)."""
        with cls._instance_lock:
            if cls._instance is None or cls._instance._pid != os.getpid():
                cls._instance = cls()
            return cls._instance

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._node_id = ray.get_runtime_context().get_node_id()
        self._links: dict[Any, ReplicaLink] = {}  # by replica actor id; the loop thread's
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="rayk-dataplane", daemon=True)
        self._thread.start()

    def produce(self, replica: Any, records: bytes, acks: int, timeout_ms: int) -> concurrent.futures.Future:
        """PartitionReplica.produce over the data plane: a future of its ProduceResult."""
        return self._submit(replica, lambda link: self._produce(link, records, acks, timeout_ms), close_on_cancel=True)

    def fetch(self, replica: Any, request: FetchRequest) -> concurrent.futures.Future:
        """PartitionReplica.fetch over the data plane: a future of its FetchResult."""
        return self._submit(replica, lambda link: link.fetch(request), close_on_cancel=False)

    def _submit(self, replica: Any, send: Callable[[ReplicaLink], Coroutine], close_on_cancel: bool) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(self._send(replica, send, close_on_cancel), self._loop)

    async def _send(self, replica: Any, send: Callable[[ReplicaLink], Coroutine], close_on_cancel: bool) -> Any:
        link = self._link(replica)
        try:
            return await send(link)
        except asyncio.CancelledError:
            if close_on_cancel:
                # A produce given up on (a request timeout): its connection closes, as Kafka's
                # clients disconnect on a request timeout, since answers come in order and one
                # that never comes would hold up all behind it; the replica stops serving it.
                # A fetch is answered within its max wait anyway: its answer is dropped.
                link.close()
            raise

    @staticmethod
    async def _produce(link: ReplicaLink, records: bytes, acks: int, timeout_ms: int) -> ProduceResult:
        (result,) = await link.produce([(records, acks, timeout_ms)])
        return result

    def _link(self, replica: Any) -> ReplicaLink:
        key = replica._actor_id
        link = self._links.get(key)
        if link is None:
            link = self._links[key] = ReplicaLink(replica, self._node_id, f"replica {key.hex()[:8]}")
        return link
