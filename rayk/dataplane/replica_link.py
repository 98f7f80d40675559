"""ReplicaLink: one process's data plane link to one partition replica.

The replica's endpoint (addresses and secret) comes from one Ray call to its actor
(`data_endpoint`, which opens TCP only for a peer on another node); the connection is
opened then and kept, and every fetch and produce request goes over it, pipelined.
Requests may run concurrently; one that its caller stops waiting for leaves the
connection as it is. A connection that breaks fails its requests with NETWORK_EXCEPTION
and is dropped: the next request asks the replica's actor again (Ray may have restarted
it: a new endpoint, a new secret) and reconnects. If the actor is gone for good, that
call raises Ray's actor error, which the owner of the link turns into its own error.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rayk.dataplane import frames
from rayk.dataplane.connection import Connection
from rayk.dataplane.frames import FetchRequest, FetchResult, ProduceRequest, ProduceResult
from rayk.errors import NetworkError


class ReplicaLink:
    def __init__(self, replica: Any, node_id: str, name: str) -> None:
        """`replica` is the replica's actor handle; `node_id` this process's Ray node (a
        replica on the same node is reached over its Unix socket); `name` for messages."""
        self.replica, self._node_id, self.name = replica, node_id, name
        self._connection: Connection | None = None
        self._connecting = asyncio.Lock()

    async def fetch(self, request: FetchRequest) -> FetchResult:
        answer = await self._request(frames.FETCH, frames.encode_fetch_request(request))
        return frames.decode_fetch_answer(answer)

    async def produce(self, requests: list[ProduceRequest]) -> list[ProduceResult]:
        """PartitionReplica.produce_requests: appended in order, one result per request."""
        results = frames.decode_produce_answer(await self._request(frames.PRODUCE, frames.encode_produce_request(requests)))
        if len(results) != len(requests):
            self.close()
            raise NetworkError(f"{self.name} answered {len(results)} of {len(requests)} produce requests")
        return results

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    async def _request(self, kind: int, body: Any) -> memoryview:
        connection = await self._connect()
        try:
            return await connection.request(kind, body)
        except (NetworkError, frames.FrameError):
            if self._connection is connection:
                self.close()
            raise

    async def _connect(self) -> Connection:
        async with self._connecting:
            if self._connection is None or self._connection.closed:
                self.close()
                address = await self.replica.data_endpoint.remote(self._node_id)
                self._connection = await Connection.open(address, self._node_id, self.name)
            return self._connection
