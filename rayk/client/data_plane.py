"""The data plane (rayk/dataplane) for the client's threaded code, the Producer's sender,
the Consumer's fetcher, the ShareConsumer and the read tasks, which are not asyncio.

One daemon thread per process runs an asyncio loop (DataPlaneLoop, made at first use).
Each client opens a DataPlaneSession on it: its own ReplicaLink per replica it sends to or
fetches from, as each Kafka client has its own connections, closed with the client.
`produce` and `fetch` hand a request to the loop and return a concurrent.futures.Future
at once, as `ref.future()` did for a Ray call. A failed request fails its future with the
error: NETWORK_EXCEPTION for a connection that broke, Ray's actor error if the replica's
actor is gone (calls.translate turns both into rayk's errors); a link reconnects at its
next request.

Cancelling a future (the caller's request timeout) abandons the request; the replica
answers each request when it is ready, so an abandoned one holds up no other. A produce
given up on also closes the connection that carried it, as Kafka's clients disconnect on
a request timeout: the replica stops serving it (as `ray.cancel` did) and the session's
other requests on that connection fail, retriably. A fetch is only abandoned: the replica
ends it within its max wait.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import ray

from rayk.dataplane.frames import FetchRequest, ProduceRequest, ProduceResult, ShareFetchRequest
from rayk.dataplane.replica_link import ReplicaLink


class DataPlaneLoop:
    """This process's data plane thread (a forked child makes its own: threads do not survive a fork)."""

    _instance: DataPlaneLoop | None = None
    _instance_lock = threading.Lock()

    @classmethod
    def get(cls) -> DataPlaneLoop:
        with cls._instance_lock:
            if cls._instance is None or cls._instance.pid != os.getpid():
                cls._instance = cls()
            return cls._instance

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.node_id = ray.get_runtime_context().get_node_id()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="rayk-dataplane", daemon=True)
        self._thread.start()


class DataPlaneSession:
    """One client's data plane connections: owns a ReplicaLink per replica it talks to, on the
    process's DataPlaneLoop. Its calls may come from any thread (the links are touched on
    the loop's thread only) and return futures; `close` with its client."""

    def __init__(self, name: str = "client") -> None:
        """`name` says whose links these are, in messages."""
        self._loop = DataPlaneLoop.get()
        self.name = name
        self._links: dict[Any, ReplicaLink] = {}  # by replica actor id; touched on the loop's thread only

    def produce(
        self, replica: Any, records: bytes, acks: int, timeout_ms: int, transactional_id: str | None = None
    ) -> concurrent.futures.Future:
        """PartitionReplica.produce over the data plane: a future of its ProduceResult; with
        acks=0, of ProduceResult(-1, -1, -1) once the request is written (Kafka answers
        nothing then, and its producer does not wait for more)."""
        request = ProduceRequest(records, acks, timeout_ms, transactional_id)
        return self._submit(replica, lambda link: self._produce(link, request))

    def fetch(self, replica: Any, request: FetchRequest) -> concurrent.futures.Future:
        """PartitionReplica.fetch over the data plane: a future of its FetchResult, whose
        records are a view of the answer frame (not copied again: the consumer keeps them
        as they came, rayk.client.fetcher)."""
        return self._submit(replica, lambda link: link.fetch(request, records_view=True))

    def share_fetch(self, replica: Any, request: ShareFetchRequest) -> concurrent.futures.Future:
        """PartitionReplica.share_fetch over the data plane: a future of its ShareFetchResult."""
        return self._submit(replica, lambda link: link.share_fetch(request))

    def close(self) -> None:
        """Closes the session's connections; its requests in flight fail."""
        asyncio.run_coroutine_threadsafe(self._close(), self._loop.loop).result()

    def _submit(self, replica: Any, send: Callable[[ReplicaLink], Coroutine]) -> concurrent.futures.Future:
        return asyncio.run_coroutine_threadsafe(self._send(replica, send), self._loop.loop)

    async def _send(self, replica: Any, send: Callable[[ReplicaLink], Coroutine]) -> Any:
        return await send(self._link(replica))

    @staticmethod
    async def _produce(link: ReplicaLink, request: ProduceRequest) -> ProduceResult:
        if request.acks == 0:
            await link.send_produce([request])
            return ProduceResult(-1, -1, -1)
        (result,) = await link.produce([request], reset_if_abandoned=True)
        return result

    async def _close(self) -> None:
        links, self._links = self._links, {}
        for link in links.values():
            link.close()

    def _link(self, replica: Any) -> ReplicaLink:
        key = replica._actor_id
        link = self._links.get(key)
        if link is None:
            link = self._links[key] = ReplicaLink(replica, self._loop.node_id, f"replica {key.hex()[:8]} ({self.name})")
        return link
