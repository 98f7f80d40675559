"""NativeProduce: a listener's Produce requests from their decoded form to their response
frame in native code (rayk._native's ProducePath, native/src/produce_path.rs), with
RAYK_NATIVE=1 where rayk was built with cargo; otherwise `data_apis.produce` takes the
Python path (ProduceCoalescer, ReplicaLink), which does the same.

Off by default, because measured it does not pay yet (docs/design-notes/
2026-12-03-native-request-path.md, 2026-12-06): the listener's Python still reads each
request, and the hand-offs to and from the native thread cost two more wake-ups per
request than the Python path's (the thread's ~40 µs of CPU per request at 1,000
records/s), and the event loop did not get cheaper. It is the first use of the crate that
step 2 (a native listener owning its clients' sockets, where no request wakes Python)
builds on.

Python keeps the decisions: the request is decoded (kio) and authorized here, each
partition goes to the native path with its records or the error already decided, and the
native thread does what each request costs (per partition one PRODUCE frame in flight to
this broker's replica, the requests that wait meanwhile coalesced into the next one, the
answers read back, the Kafka response written) with the GIL released. It asks for a
replica's endpoint when it needs one: this owns that lookup (the replica's actor, its Unix
socket, the data plane handshake), and hands the proven socket over.

Completions come back through an eventfd the listener's event loop watches: one wake per
batch of completions, no thread of rayk's taking the GIL.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

from rayk import errors
from rayk.dataplane import frames, handshake, streams
from rayk.dataplane.connection import CONNECT_TIMEOUT_MS
from rayk.dataplane.endpoint import EndpointAddress, keep_alive
from rayk.errors import KafkaError, NetworkError, NotLeaderOrFollowerError, UnknownServerError, MAX_RECORD_ERRORS

try:
    from rayk import _native
except ImportError:  # built without cargo: the Python path serves every Produce
    _native = None

logger = logging.getLogger(__name__)

ENABLED_ENV = "RAYK_NATIVE"  # "1": the native path, where it is built
MIN_VERSION, MAX_VERSION = 3, 12  # the Produce versions the native response is written for

# topic, partition -> the address of this broker's replica of it (raises its KafkaError)
ResolveEndpoint = Callable[[str, int], Awaitable[EndpointAddress]]
# (topic name, [(partition index, records or None, error code (0: none), error message)])
Topics = list[tuple[str, list[tuple[int, bytes | None, int, str | None]]]]


def built() -> bool:
    """Whether rayk._native was built (setup.py, where cargo is installed)."""
    return _native is not None


def available() -> bool:
    """Whether the native path is built and turned on (RAYK_NATIVE=1)."""
    return _native is not None and os.environ.get(ENABLED_ENV, "0") == "1"


def error_table() -> dict[str, tuple[int, str]]:
    """rayk.errors' classes by name -> (code, Kafka name): how the native path reads the
    errors a replica's answer names, as frames.py's `_decode_error` does."""
    return {
        name: (cls.code, cls.name)
        for name, cls in vars(errors).items()
        if isinstance(cls, type) and issubclass(cls, KafkaError)
    }


class NativeProduce:
    """One listener's native produce path: owns the ProducePath (its thread), the eventfd it
    wakes the event loop with, the futures of the requests submitted and the endpoint
    lookups under way. Made on the listener's event loop, by its BrokerView; `close` ends
    it. If the native thread dies (a panic), its requests fail with UNKNOWN_SERVER_ERROR,
    `alive` turns False, and the BrokerView serves Produce the Python way from then on."""

    def __init__(self, broker_id: int, node_id: str, resolve: ResolveEndpoint) -> None:
        assert _native is not None, "rayk._native is not built"
        self._loop = asyncio.get_running_loop()
        self._node_id, self._resolve = node_id, resolve
        self._event_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._path = _native.ProducePath(self._event_fd, broker_id, error_table(), MAX_RECORD_ERRORS,
                                         frames.MAX_FRAME_BYTES)
        self._futures: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()
        self._lookups: set[asyncio.Task] = set()
        self.alive = True
        self._loop.add_reader(self._event_fd, self._on_completions)

    def submit(self, api_version: int, correlation_id: int, acks: int, timeout_ms: int,
               transactional_id: str | None, transaction_version: int, topics: Topics) -> asyncio.Future:
        """Queues one Produce request's partitions, in the order they are submitted (call it
        in the order requests arrived); the future resolves to (the response frame with a
        throttle time of 0, whether a partition failed)."""
        assert self.alive and MIN_VERSION <= api_version <= MAX_VERSION
        request_id = next(self._ids)
        self._path.submit(request_id, api_version, correlation_id, acks, timeout_ms, transactional_id,
                          transaction_version, topics)
        future = self._loop.create_future()  # answered in a later turn of the loop: held in time
        self._futures[request_id] = future
        return future

    def close(self) -> None:
        """Ends the native thread; requests not answered yet are cancelled."""
        if self._event_fd < 0:
            return
        self.alive = False
        self._loop.remove_reader(self._event_fd)
        self._path.close()
        os.close(self._event_fd)
        self._event_fd = -1
        for lookup in self._lookups:
            lookup.cancel()
        futures, self._futures = self._futures, {}
        for future in futures.values():
            future.cancel()

    def _on_completions(self) -> None:
        try:  # first: a completion queued after the drain below writes the eventfd again
            os.eventfd_read(self._event_fd)
        except BlockingIOError:
            pass
        for completion in self._path.drain():
            kind = completion[0]
            if kind == _native.ANSWERED:
                _, request_id, frame, failed = completion
                future = self._futures.pop(request_id, None)
                if future is not None and not future.done():  # else its connection went meanwhile
                    future.set_result((frame, failed))
            elif kind == _native.NEED_ENDPOINT:
                lookup = self._loop.create_task(self._connect(completion[1], completion[2]))
                self._lookups.add(lookup)
                lookup.add_done_callback(self._lookups.discard)
            else:
                self._died(completion[1])

    def _died(self, reason: str) -> None:
        logger.error("the native produce path stopped (%s): Produce is served in Python from now on", reason)
        self.alive = False
        futures, self._futures = self._futures, {}
        for future in futures.values():
            if not future.done():
                future.set_exception(UnknownServerError(f"the native produce path stopped: {reason}"))

    async def _connect(self, topic: str, partition: int) -> None:
        """Looks up the replica's endpoint, opens and proves a connection to it, and hands
        the socket to the native path; or tells it why not (its waiting requests fail with
        that error, the next request asks again)."""
        try:
            address = await self._resolve(topic, partition)
            fd, unix = await self._open(address, f"the replica of {topic}-{partition}")
        except KafkaError as e:
            code, message = e.code, str(e)
        except Exception as e:  # a bug: the requests still get an answer (as broker_view.error_message_of words it)
            logger.error("looking up the endpoint of %s-%d failed", topic, partition, exc_info=e)
            code, message = UnknownServerError.code, f"{type(e).__name__}: {e}"
        else:
            if self.alive:
                self._path.set_endpoint(topic, partition, fd, unix)
            else:
                os.close(fd)
            return
        if self.alive:
            self._path.fail_endpoint(topic, partition, code, message)

    async def _open(self, address: EndpointAddress, name: str) -> tuple[int, bool]:
        """A connection to the endpoint through its handshake, as connection.Connection
        opens one, detached from the event loop: (its descriptor, whether it is a Unix
        socket). NOT_LEADER_OR_FOLLOWER if it cannot be had, as for a broken link."""
        local = address.node_id == self._node_id
        if not local and address.tls_certificate:
            # A broker's replicas run on its node (hard node affinity), so its listener
            # reaches them over Unix sockets; TLS is for replicas of other nodes.
            raise NotLeaderOrFollowerError(f"{name} is on another node, behind TLS: not served natively")
        writer = None
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_MS / 1000):
                if local:
                    reader, writer = await streams.open_unix_frame_streams(address.unix_path)
                else:
                    reader, writer = await streams.open_tcp_frame_streams(
                        address.host, address.port, None, handshake_timeout_s=CONNECT_TIMEOUT_MS / 1000)
                    keep_alive(writer.get_extra_info("socket"))
                await handshake.connect(reader, writer, address.secret)
            # The endpoint writes nothing after its proof until a request: nothing is staged.
            fd = os.dup(writer.get_extra_info("socket").fileno())
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
            raise NotLeaderOrFollowerError(
                f"{name} is restarting (cannot open a data plane connection: {e or type(e).__name__})"
            ) from None
        finally:
            if writer is not None:
                writer.close()  # the transport's descriptor; the duplicate is the native path's
        return fd, local


def with_throttle(frame: bytes, api_version: int, throttle_ms: int) -> bytes:
    """`frame` (a native Produce response) with its throttle_time_ms set: the response's
    last field, before the empty tagged fields of a flexible version."""
    if throttle_ms == 0:
        return frame
    patched = bytearray(frame)
    at = len(patched) - (5 if api_version >= 9 else 4)
    patched[at:at + 4] = throttle_ms.to_bytes(4, "big", signed=True)
    return bytes(patched)


def records_of(records: Any) -> bytes | None:
    return records if records is None or type(records) is bytes else bytes(records)
