"""ReplicaLink: one process's data plane link to one partition replica.

The replica's endpoint (addresses and secret) comes from one Ray call to its actor
(`data_endpoint`, which opens TCP only for a peer on another node); the connection is
opened then and kept, and every fetch, share fetch, produce and share state write goes over it, pipelined.
Requests may run concurrently, and each is answered when it is ready; one that its
caller stops waiting for leaves the connection as it is, as does one the replica failed
(its handler raised), which raises the replica's KafkaError (frames.py: a FAILED answer).
A connection that breaks fails its requests with NETWORK_EXCEPTION and is dropped: the next request asks the replica's
actor again (Ray may have restarted it: a new endpoint, a new secret) and reconnects. If the actor is gone for good, that
call raises Ray's actor error, which the owner of the link turns into its own error. One the actor does not answer
within ENDPOINT_LOOKUP_TIMEOUT_MS (its node cut off without Ray having declared it dead, a lost reply) is
NETWORK_EXCEPTION too: requests wait for the lookup under way, so the link asks again at the next request
rather than waiting on a call that may never return.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any

from rayk.dataplane import connection as connection_module
from rayk.dataplane import frames
from rayk.dataplane.connection import Connection
from rayk.dataplane.frames import (
    FetchRequest,
    FetchResult,
    ProduceRequest,
    ProduceResult,
    ShareFetchRequest,
    ShareFetchResult,
    ShareStateWrite,
)
from rayk.errors import InvalidRequestError, KafkaError, NetworkError

# A live replica answers its data_endpoint call in milliseconds, a restarted one once Ray has
# started it again (seconds; more on a loaded node): past this the lookup is given up.
ENDPOINT_LOOKUP_TIMEOUT_MS = 30_000


class ReplicaLink:
    """One process's way to one partition replica over the data plane: owns the replica's actor
    handle and at most one Connection to it, reopened (after asking the actor again) when it
    breaks; `close` ends it for good. Not thread-safe: one event loop's."""

    def __init__(self, replica: Any, node_id: str, name: str) -> None:
        """`replica` is the replica's actor handle; `node_id` this process's Ray node (a
        replica on the same node is reached over its Unix socket); `name` for messages."""
        self.replica, self._node_id, self.name = replica, node_id, name
        self._connection: Connection | None = None
        self._connecting = asyncio.Lock()
        self._closed = False

    async def fetch(self, request: FetchRequest, records_view: bool = False) -> FetchResult:
        """A fetch's answer; with `records_view`, its records are a view of the answer
        frame, not a copy (frames.decode_fetch_answer)."""
        decode = _decode_fetch_answer_view if records_view else frames.decode_fetch_answer
        return await self._request(frames.FETCH, _encoded(frames.encode_fetch_request, request), decode)

    async def share_fetch(self, request: ShareFetchRequest) -> ShareFetchResult:
        return await self._request(frames.SHARE_FETCH, _encoded(frames.encode_share_fetch_request, request),
                                   frames.decode_share_fetch_answer)  # fmt: skip

    async def write_share_state(self, write: ShareStateWrite) -> KafkaError | None:
        """OffsetsPartitionReplica.write_share_state: None once written, else the coordinator's error."""
        return await self._request(frames.WRITE_SHARE_STATE, _encoded(frames.encode_share_state_write, write),
                                   frames.decode_error_answer)  # fmt: skip

    async def produce(self, requests: list[ProduceRequest], reset_if_abandoned: bool = False) -> list[ProduceResult]:
        """PartitionReplica.produce_requests: appended in order, one result per request.
        With `reset_if_abandoned`, a cancelled call also drops the connection it went on
        (Kafka's clients disconnect on a request timeout; the replica stops serving it)."""
        results = await self._request(
            frames.PRODUCE, _encoded(frames.encode_produce_request, requests), frames.decode_produce_answer,
            reset_if_abandoned,
        )
        if len(results) != len(requests):
            self.reset()
            raise NetworkError(f"{self.name} answered {len(results)} of {len(requests)} produce requests")
        return results

    async def send_produce(self, requests: list[ProduceRequest]) -> None:
        """A produce whose answer nobody waits for (acks=0): done once it is written."""
        await self._request(frames.PRODUCE, _encoded(frames.encode_produce_request, requests), None)

    def reset(self) -> None:
        """Drops the connection (its requests fail); the next request opens a new one."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def close(self) -> None:
        """For good: the connection goes, and a request on the link fails with NETWORK_EXCEPTION."""
        self._closed = True
        self.reset()

    async def _request(
        self, kind: int, body: Any, decode: Callable[[memoryview], Any] | None, reset_if_abandoned: bool = False
    ) -> Any:
        """`decode` of the answer; with `decode` None, nothing once the request is written."""
        connection = await self._connect()
        try:
            if decode is None:
                return await connection.request(kind, body, answered=False)
            return decode(await connection.request(kind, body))
        except asyncio.CancelledError:
            if reset_if_abandoned and self._connection is connection:
                self.reset()
            raise
        except (NetworkError, frames.FrameError) as e:
            if self._connection is connection:
                self.reset()
            if isinstance(e, frames.FrameError):  # the replica is not speaking this protocol
                raise NetworkError(f"{self.name} answered a frame that does not parse: {e}") from None
            raise

    async def _connect(self) -> Connection:
        connection = self._connection
        if connection is not None and not connection.closed and not self._closed:
            return connection  # the common case: no lock taken
        async with self._connecting:
            if self._closed:
                raise NetworkError(f"the data plane link to {self.name} was closed")
            if self._connection is None or self._connection.closed:
                self.reset()
                connection = await Connection.open(await self._endpoint(), self._node_id, self.name)
                if self._closed:  # closed while connecting
                    connection.close()
                    raise NetworkError(f"the data plane link to {self.name} was closed")
                self._connection = connection
            return self._connection


    async def open_socket(self) -> int:
        """A connection of its own to the replica, outside the link, for native code to
        read and write: its descriptor (see connection.open_proven_socket), the caller's to
        close. NETWORK_EXCEPTION if it cannot be had; ValueError if the endpoint is
        behind TLS."""
        if self._closed:
            raise NetworkError(f"the data plane link to {self.name} was closed")
        address = await self._endpoint()
        try:
            return await connection_module.open_proven_socket(address, self._node_id)
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
            raise NetworkError(f"cannot open a data plane connection to {self.name}: {e or type(e).__name__}") from None

    async def _endpoint(self) -> Any:
        """The replica's EndpointAddress, from its actor."""
        try:
            async with asyncio.timeout(ENDPOINT_LOOKUP_TIMEOUT_MS / 1000):
                return await self.replica.data_endpoint.remote(self._node_id)
        except TimeoutError:
            raise NetworkError(f"{self.name} did not give its data plane endpoint within "
                               f"{ENDPOINT_LOOKUP_TIMEOUT_MS} ms") from None


def _decode_fetch_answer_view(body: memoryview) -> FetchResult:
    return frames.decode_fetch_answer(body, copy_records=False)


def _encoded(encode: Callable[[Any], Any], request: Any) -> Any:
    """`encode(request)`; a value out of the frame's range (say a max_bytes over 2^31) is INVALID_REQUEST."""
    try:
        return encode(request)
    except struct.error as e:
        raise InvalidRequestError(f"a data plane request out of range: {e}") from None
