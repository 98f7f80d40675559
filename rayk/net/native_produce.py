"""NativeProduce: a listener's Produce requests from their decoded form to their response
frame in native code (rayk._native's ProducePath, native/src/produce_path.rs), where rayk
was built with cargo; without it, or with its "listener" path off (RAYK_NATIVE,
rayk/native_paths.py), `data_apis.produce` takes the
Python path (ProduceCoalescer, ReplicaLink), which does the same.

Python keeps the decisions: the request is decoded (kio) and authorized here, each
partition goes to the native path with its records or the error already decided, and the
native code does what each request costs in Python (per partition one PRODUCE frame in
flight to this broker's replica, the requests that wait meanwhile coalesced into the next
one, the answers read back, the Kafka response written). It runs on the listener's event
loop, called when a request is submitted and when a replica's socket is readable: no
thread of its own, so a request wakes the listener no more often than on the Python path
(a first version with a thread of its own cost two more wake-ups per request, more than
it saved: docs/design-notes/2026-12-03-native-request-path.md, 2026-12-06). It asks for a
replica's endpoint when it needs one: this owns that lookup (the replica's actor, its Unix
socket, the data plane handshake), and hands the proven socket over.

The same native object reads and writes the client connections handed to it
(`adopt_client`, native_client.py): their plain Produce requests go to the path without
Python, everything else to their NativeClient, by the events its calls return.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from rayk import errors, native_paths
from rayk.dataplane import connection, frames
from rayk.dataplane.endpoint import EndpointAddress
from rayk.errors import KafkaError, NetworkError, NotLeaderOrFollowerError, UnknownServerError, MAX_RECORD_ERRORS

from rayk.native_paths import _native

if TYPE_CHECKING:
    from rayk.net.native_client import NativeClient

logger = logging.getLogger(__name__)

MIN_VERSION, MAX_VERSION = 3, 12  # the Produce versions the native response is written for

# topic, partition -> the address of this broker's replica of it (raises its KafkaError)
ResolveEndpoint = Callable[[str, int], Awaitable[EndpointAddress]]
# (topic name, [(partition index, records or None, error code (0: none), error message)])
Topics = list[tuple[str, list[tuple[int, bytes | None, int, str | None]]]]


def available() -> bool:
    """Whether the native path is built and on (rayk/native_paths.py)."""
    return native_paths.enabled("listener")


def error_table() -> dict[str, tuple[int, str]]:
    """rayk.errors' classes by name -> (code, Kafka name): how the native path reads the
    errors a replica's answer names, as frames.py's `_decode_error` does."""
    return {
        name: (cls.code, cls.name)
        for name, cls in vars(errors).items()
        if isinstance(cls, type) and issubclass(cls, KafkaError)
    }


class NativeProduce:
    """One listener's native produce path: owns the ProducePath, the futures of the requests
    submitted, the endpoint lookups under way and the replica sockets it watches for the
    path (their descriptors: the path reads and writes them, this closes them). Made on the
    listener's event loop, by its BrokerView; `close` ends it. If a native call raises (a
    bug, a panic), every request it held fails with UNKNOWN_SERVER_ERROR, `alive` turns
    False, and the BrokerView serves Produce the Python way from then on."""

    def __init__(self, broker_id: int, node_id: str, resolve: ResolveEndpoint) -> None:
        assert _native is not None, "rayk._native is not built"
        self._loop = asyncio.get_running_loop()
        self._node_id, self._resolve = node_id, resolve
        self._path = _native.ProducePath(broker_id, error_table(), MAX_RECORD_ERRORS, frames.MAX_FRAME_BYTES)
        self._futures: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()
        self._lookups: set[asyncio.Task] = set()
        self._fds: set[int] = set()  # the replica sockets watched for the path
        self._clients: dict[int, NativeClient] = {}  # client connections read natively, by descriptor
        self._path.set_admission(self._admit)
        self.alive = True

    def submit(self, api_version: int, correlation_id: int, acks: int, timeout_ms: int,
               transactional_id: str | None, transaction_version: int, topics: Topics) -> asyncio.Future:
        """Queues one Produce request's partitions, in the order they are submitted (call it
        in the order requests arrived); the future resolves to (the response frame with a
        throttle time of 0, whether a partition failed)."""
        assert self.alive and MIN_VERSION <= api_version <= MAX_VERSION
        request_id = next(self._ids)
        future = self._loop.create_future()
        self._futures[request_id] = future  # before the call: a request of decided errors is answered by it
        try:
            self._call(self._path.submit, request_id, api_version, correlation_id, acks, timeout_ms,
                       transactional_id, transaction_version, topics)
        except UnknownServerError:
            if future.done() and not future.cancelled():
                future.exception()  # raised here instead, not left unretrieved
            raise
        return future

    # ------------------------------------------------------------------ client connections

    def adopt_client(self, fd: int, max_frame_bytes: int, client: NativeClient) -> None:
        """A PLAINTEXT client's non-blocking socket, nothing read from it yet, read and
        written natively from now on (its descriptor stays the caller's, which closes it
        after `forget_client`); what it needs is told to `client`. UnknownServerError if
        the path stopped."""
        self._clients[fd] = client
        self._loop.add_reader(fd, self._on_client_readable, fd)
        self._call(self._path.adopt_client, fd, b"", max_frame_bytes)

    def forget_client(self, fd: int) -> None:
        """The connection ended (or its task is done with it): nothing of it is watched or
        written any more."""
        if self._clients.pop(fd, None) is None:
            return
        self._loop.remove_reader(fd)
        self._loop.remove_writer(fd)
        if self.alive:
            try:
                self._path.forget_client(fd)
            except BaseException as e:
                if not native_paths.failure(e):
                    raise
                self._died(repr(e))

    def client_answer(self, fd: int, frame: bytes) -> None:
        if fd in self._clients:
            with contextlib.suppress(UnknownServerError):  # the path stopped: the client ended
                self._call(self._path.client_answer, fd, frame)

    def client_shutdown(self, fd: int, why: str, abandon: bool) -> None:
        """Reads nothing more of the connection: what it sent before is answered (with
        `abandon`, only what is written already is flushed), then it ends."""
        if fd in self._clients:
            with contextlib.suppress(UnknownServerError):
                self._call(self._path.client_shutdown, fd, why, abandon)

    def client_admitted(self, fd: int) -> None:
        if fd in self._clients:
            with contextlib.suppress(UnknownServerError):  # the path stopped: the client ended
                self._call(self._path.client_admitted, fd)

    def client_idle_s(self, fd: int) -> tuple[float | None, float | None]:
        """(seconds idle with nothing of it out, seconds a frame's body has taken so far)."""
        return self._path.client_idle_s(fd) if self.alive and fd in self._clients else (None, None)

    def set_produce_natively(self, on: bool) -> None:
        """Whether client connections' Produce requests may be served without Python."""
        if self.alive:
            self._path.set_produce_natively(on)

    def _admit(self, fd: int, size: int) -> bool:
        client = self._clients.get(fd)
        return client is not None and client.admit(size)

    def _on_client_readable(self, fd: int) -> None:
        with contextlib.suppress(UnknownServerError):
            self._call(self._path.on_client_readable, fd)

    def _on_client_writable(self, fd: int) -> None:
        with contextlib.suppress(UnknownServerError):
            self._call(self._path.on_client_writable, fd)

    def _client_event(self, event: tuple) -> None:
        """One event of a client connection, from a native call."""
        kind, fd = event[0], event[1]
        client = self._clients.get(fd)
        if client is None:
            return
        if kind == _native.CLIENT_REQUEST:
            client.on_request(event[2])
        elif kind == _native.CLIENT_FREED:
            client.on_freed(event[2], event[3])
        elif kind == _native.CLIENT_HOLD:
            if event[2]:
                self._loop.remove_reader(fd)
            else:
                self._loop.add_reader(fd, self._on_client_readable, fd)
        elif kind == _native.CLIENT_WANT_WRITE:
            if event[2]:
                self._loop.add_writer(fd, self._on_client_writable, fd)
            else:
                self._loop.remove_writer(fd)
            client.on_answers_waiting(event[2])
        elif kind == _native.CLIENT_EOF:
            client.on_eof()
        else:
            assert kind == _native.CLIENT_END, event
            self._loop.remove_reader(fd)
            self._loop.remove_writer(fd)
            client.on_end(event[2])

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        """Ends the path: its sockets close, requests not answered yet are cancelled, and
        its client connections end."""
        if not self.alive and not self._fds and not self._futures and not self._clients:
            return
        self.alive = False
        try:
            self._path.close()
        except BaseException as e:
            if not native_paths.failure(e):
                raise
            logger.error("closing the native produce path failed: %r", e)  # the descriptors close below all the same
        for fd in list(self._fds):
            self._release(fd)
        for lookup in self._lookups:
            lookup.cancel()
        futures, self._futures = self._futures, {}
        for future in futures.values():
            future.cancel()
        self._end_clients("the listener closes")

    def _call(self, method: Callable[..., list[tuple]], *args: Any) -> None:
        """`method(*args)` on the path, then what it says to do. A native call that raises
        (a panic is PyO3's PanicException, a BaseException) stops the path."""
        if not self.alive:
            raise UnknownServerError("the native produce path stopped")
        try:
            completions = method(*args)
        except BaseException as e:
            if not native_paths.failure(e):
                raise
            self._died(repr(e))
            raise UnknownServerError(f"the native produce path stopped: {e!r}") from None
        for completion in completions:
            kind = completion[0]
            if kind >= _native.CLIENT_REQUEST:
                try:
                    self._client_event(completion)
                except Exception:  # a bug: that connection ends, the others go on
                    logger.exception("a client connection's event %r failed", completion[:2])
                    client = self._clients.get(completion[1])
                    if client is not None:
                        client.on_end("its event failed")
            elif kind == _native.ANSWERED:
                _, request_id, frame, failed = completion
                future = self._futures.pop(request_id, None)
                if future is not None and not future.done():  # else its connection went meanwhile
                    future.set_result((frame, failed))
            elif kind == _native.NEED_ENDPOINT:
                lookup = self._loop.create_task(self._connect(completion[1], completion[2]))
                self._lookups.add(lookup)
                lookup.add_done_callback(self._lookups.discard)
            elif kind == _native.RELEASE:
                self._release(completion[1])
            elif completion[2]:  # WANT_WRITE: a frame waits for room in the socket
                self._loop.add_writer(completion[1], self._on_writable, completion[1])
            else:
                self._loop.remove_writer(completion[1])

    def _on_readable(self, fd: int) -> None:
        try:
            self._call(self._path.on_readable, fd)
        except UnknownServerError:
            pass  # the path stopped: _died answered its requests

    def _on_writable(self, fd: int) -> None:
        try:
            self._call(self._path.on_writable, fd)
        except UnknownServerError:
            pass

    def _watch(self, fd: int) -> None:
        self._fds.add(fd)
        self._loop.add_reader(fd, self._on_readable, fd)

    def _release(self, fd: int) -> None:
        if fd in self._fds:
            self._fds.discard(fd)
            self._loop.remove_reader(fd)
            self._loop.remove_writer(fd)
            os.close(fd)

    def _died(self, reason: str) -> None:
        logger.error("the native produce path stopped (%s): Produce is served in Python from now on", reason)
        self.alive = False
        for fd in list(self._fds):
            self._release(fd)
        futures, self._futures = self._futures, {}
        for future in futures.values():
            if not future.done():
                future.set_exception(UnknownServerError(f"the native produce path stopped: {reason}"))
        self._end_clients(f"the native produce path stopped: {reason}")

    def _end_clients(self, why: str) -> None:
        """Every client connection read here ends (their tasks close them)."""
        for fd, client in list(self._clients.items()):
            self._loop.remove_reader(fd)
            self._loop.remove_writer(fd)
            client.on_end(why)

    async def _connect(self, topic: str, partition: int) -> None:
        """Looks up the replica's endpoint, opens and proves a connection to it, and hands
        the socket to the path; or tells it why not (its waiting requests fail with that
        error, the next request asks again)."""
        try:
            address = await self._resolve(topic, partition)
            fd = await self._open(address, f"the replica of {topic}-{partition}")
        except KafkaError as e:
            code, message = e.code, str(e)
        except Exception as e:  # a bug: the requests still get an answer (as broker_view.error_message_of words it)
            logger.error("looking up the endpoint of %s-%d failed", topic, partition, exc_info=e)
            code, message = UnknownServerError.code, f"{type(e).__name__}: {e}"
        else:
            if not self.alive:
                os.close(fd)
                return
            self._watch(fd)  # before the call: what it writes is answered on a later turn of the loop
            with contextlib.suppress(UnknownServerError):
                self._call(self._path.set_endpoint, topic, partition, fd)
            return
        if self.alive:
            with contextlib.suppress(UnknownServerError):
                self._call(self._path.fail_endpoint, topic, partition, code, message)

    async def _open(self, address: EndpointAddress, name: str) -> int:
        """A connection to the endpoint through its handshake (connection.open_proven_streams,
        as a Connection's), detached from asyncio's transport: its descriptor (non-blocking, as the
        transport's socket was). NOT_LEADER_OR_FOLLOWER if it cannot be had, as for a broken link."""
        try:
            return await connection.open_proven_socket(address, self._node_id)
        except ValueError:
            # A broker's replicas run on its node (hard node affinity), so its listener
            # reaches them over Unix sockets; TLS is for replicas of other nodes.
            raise NotLeaderOrFollowerError(f"{name} is on another node, behind TLS: not served natively") from None
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as e:
            raise NotLeaderOrFollowerError(
                f"{name} is restarting (cannot open a data plane connection: {e or type(e).__name__})"
            ) from None


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
