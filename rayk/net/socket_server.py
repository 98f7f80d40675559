"""SocketServer: a broker's Kafka listeners, the reactor of Kafka's SocketServer on asyncio.

One actor per broker, on the broker's node, inside a SocketServerActor
(socket_server_actor.py: its ReplicaManager creates it, supervises it and starts a new
one if it dies; see rayk/actors/supervision.py). It serves every
listener of `listeners` (rayk/listeners.py), TLS on SSL ones (rayk/net/tls.py), and
gives each connection its RequestContext: the listener, and the principal of a client
certificate, or of SASL authentication (rayk/net/sasl.py; its requests and deadline:
sasl_requests.py), kept with the rest of the connection's state in its KafkaChannel
(kafka_channel.py). With an authorizer, the
listener keeps the Controller's ACLs, taken as they change (a long poll), and
handlers check each request against them; so it keeps the client quotas, and a
connection whose client went over its quota starts no further request until its
throttle time has passed (KIP-219: the answer goes at once to a client that waits out
the throttle time itself, else only after it; produce requests pipelined behind the
throttled one had started already). For each connection a reader task reads
size-prefixed frames into a bounded queue, a processor task decodes them in order and
starts answering each (KafkaApis), and a writer task writes the answers in request order.
Consecutive produce requests are pipelined: request N+1 is appended while request N waits
for its high watermark; their appends keep their arrival order (the ProduceCoalescer
queues them in that order and has one call in flight per partition:
rayk/net/produce_coalescer.py). Every other request starts once all before it are
answered, as in Kafka. Many connections are served at once.

Back-pressure, limits and bad input, as in Kafka:
- a connection past `max.connections` or `max.connections.per.ip` is closed at once, and
  one with nothing read or written for `connections.max.idle.ms` while no request of it
  is being answered (or that takes that long to send one request) is closed;
- a frame's declared size is reserved from `queued.max.request.bytes` (memory_pool.py)
  before its body is read, and given back when it is answered;
- before a connection has authenticated (on a SASL listener, until SaslAuthenticate
  succeeds; PLAINTEXT is ANONYMOUS at connect, SSL authenticated by its handshake), as
  Kafka's SaslServerAuthenticator reads outside its MemoryPool: its frames take nothing
  from that pool, are read one at a time (the next once the last is answered), and one
  larger than `sasl.server.max.receive.size` closes it, so what an unauthenticated client
  holds is that much at most, and of its own; one that has not authenticated within
  `sasl.server.authentication.timeout.ms` is closed;
- a frame larger than `socket.request.max.bytes` (or with a negative size) closes the
  connection before its body is read;
- at most `queued.max.requests` requests are read but not yet answered (written) over
  all connections, and per connection at most QUEUED_PER_CONNECTION waiting to start
  and STARTED_PER_CONNECTION started (only produce requests start while others are
  unanswered: a producer with `linger.ms` 0 and acks=all has many in flight; and up to
  METADATA_TOGETHER Metadata requests while only Metadata requests are); past that,
  reading stops and TCP pushes back on the clients;
- a request that does not parse gets INVALID_REQUEST, an API or version this broker does
  not serve gets UNSUPPORTED_VERSION (ApiVersions always answers in v0 so any client can
  read the list), and a frame too short to hold a header closes the connection; every
  close is logged with its reason. Nothing of this reaches the partition replicas.

Each request's time from read off the socket to its answer written is Kafka's TotalTimeMs,
per API, recorded in rayk/metrics.py (a request that did not decode is not timed).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
import struct
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import ray

from rayk.actors import raylet_watch
from rayk.actors.direct_calls import call_methods_directly
from rayk.actors.supervision import Supervised
from rayk.config import BrokerConfig
from rayk.metrics import RequestTimer
from rayk import native_paths
from rayk.errors import InvalidConfigurationError, InvalidRequestError, UnknownServerError, UnsupportedVersionError
from rayk.dataplane import streams
from rayk.net.admin_apis import api_versions_body
from rayk.net.api_versions import API_VERSIONS, METADATA, PRODUCE, client_throttles
from rayk.net.broker_view import BrokerView
from rayk.net.client_quotas import measure_child_tasks
from rayk.net.codec import Request, RequestHead, decode_request, encode_response, has_response_schema, read_head, response_class
from rayk.net.entities import build, error_response
from rayk.net.handoff import Handoff
from rayk.net.kafka_apis import CLOSE_CONNECTION, KafkaApis, Throttle
from rayk.net.kafka_channel import READING_BODY, READING_SIZE, ConnectionClosed, KafkaChannel
from rayk.net.memory_pool import MemoryPool
from rayk.net.native_client import NativeClient
from rayk.net.native_produce import NativeProduce
from rayk.net.request_context import ANONYMOUS, RequestContext, kafka_host
from rayk.net.sasl import SaslAuthenticator
from rayk.net.sasl_requests import CloseAfter, SaslRequests
from rayk.net.tls import certificate_principal, server_context
from rayk.listeners import Listener, broker_port

logger = logging.getLogger(__name__)

QUEUED_PER_CONNECTION = 16  # frames read, waiting to start
STARTED_PER_CONNECTION = 256  # requests started, not yet answered: pipelined produce requests
# Metadata requests of one connection that may run at once (while nothing else is before
# them): a new librdkafka client's brokers-only and topic requests need two; unbounded, a
# client pipelining Metadata for every topic would hold up to STARTED_PER_CONNECTION
# Controller calls of one connection, and their answers, at once.
METADATA_TOGETHER = 2
TLS_HANDSHAKE_TIMEOUT_S = 10.0  # a client that has not finished its TLS handshake by then is cut
STREAM_LIMIT_BYTES = 1 << 16  # a connection's StreamReader buffer
CHANGE_WAIT_MS = 30_000  # a lookup of the ACLs, client quotas or metadata waits this long at the Controller for a change
REFRESH_RETRY_S = 0.5  # the pause before looking them up again after a lookup that failed or took nothing
QUOTA_PRUNE_INTERVAL_S = 5.0  # idle clients' quota rates are forgotten (a quota window is 11 s by default)
_SIZE = struct.Struct(">i")
_BARE_ERROR = struct.Struct(">iih")  # size, correlation id, error code


class SocketServer(Supervised):
    """The actor serving one broker's Kafka listeners: owns their listening sockets, every
    client connection's tasks and KafkaChannel, the request limits (queued requests, the
    MemoryPool, connections per host) and the KafkaApis. Created, supervised and replaced
    if it dies by its broker's ReplicaManager; `start` binds the listeners. Not thread-safe
    (the actor's event loop)."""

    def __init__(self, broker_id: int, controller: Any, config: BrokerConfig) -> None:
        raylet_watch.start()  # this process goes with its node's raylet (raylet_watch.py)
        call_methods_directly(self)
        self.broker_id = broker_id
        self.config = config
        self.apis = KafkaApis(BrokerView(broker_id, controller, config))
        self._sasl = SaslRequests(self.apis.view, self._decode)
        self._servers: list[streams.AcceptingServer] = []
        self._slots = MemoryPool(config.queued_max_requests)  # queued.max.requests, a slot a frame
        self._queued_count = 0  # slots taken: requests read but not yet answered
        self._memory = MemoryPool(config.queued_max_request_bytes)
        self._per_host: Counter[str] = Counter()  # open connections by client host
        self._host_limits = config.connection_limits_per_ip()
        self._connections: dict[asyncio.Task, KafkaChannel] = {}
        self._request_timers: dict[str, RequestTimer] = {}  # by listener name
        self.endpoints: dict[str, tuple[str, int]] | None = None
        self._bound_ports: dict[str, int] = {}  # listener name -> the port it listens on
        self._refresher: asyncio.Future | None = None

    async def start(self, ports: dict[str, int] | None = None) -> dict[str, tuple[str, int]]:
        """Binds every listener; returns their advertised (host, port) by listener name, in
        `listeners` order. `ports` (by listener name) are the ports a listener of the same
        broker had before it died: a restarted listener binds them again, so that clients'
        bootstrap lists still reach it (with port 0 in `listeners` it would get new ones).
        Idempotent."""
        if self.endpoints is not None:
            return self.endpoints
        if self.config.authorizes:  # the ACLs first: no listener opens before they are loaded
            await self._load_acls()
        # Quotas do not hold the listener back: until they arrive, no client is throttled.
        self._refresher = asyncio.ensure_future(self._refresh_forever())
        measure_child_tasks(asyncio.get_running_loop())  # request_percentage counts a handler's tasks
        node_ip = ray.util.get_node_ip_address()
        endpoints: dict[str, tuple[str, int]] = {}
        try:
            for listener in self.config.kafka_listeners():
                endpoints[listener.name] = await self._bind(listener, node_ip, (ports or {}).get(listener.name))
        except BaseException:
            await self._close_servers()
            self._refresher.cancel()
            self._refresher = None
            raise
        self.endpoints = endpoints
        return endpoints

    async def _load_acls(self) -> None:
        """The first ACL lookup, retried until the Controller answers (it restarts)."""
        while True:
            try:
                await self.apis.view.refresh_acls()
                return
            except Exception as e:
                logger.warning("broker %d: waiting for the Controller's ACLs before listening: %r", self.broker_id, e)
                await asyncio.sleep(REFRESH_RETRY_S)

    async def _refresh_forever(self) -> None:
        """ACL, quota and metadata changes reach this listener as the Controller makes them: each
        is looked up with a long poll (CHANGE_WAIT_MS) that the Controller answers when
        they change, so an idle cluster makes no calls for them. A failed lookup keeps the
        last ones and is tried again after REFRESH_RETRY_S; it is logged once until one
        succeeds. Each is looked up independently, and idle clients' quota state is
        forgotten every QUOTA_PRUNE_INTERVAL_S."""
        view = self.apis.view
        refreshes = [self._refresh("client quotas", self._refresh_quotas), self._prune_quotas(),
                     self._refresh("metadata image", view.refresh_metadata_image, at_once_if_unchanged=True)]
        if self.config.authorizes:
            refreshes.append(self._refresh("ACLs", view.refresh_acls))
        await asyncio.gather(*refreshes)

    async def _refresh(self, what: str, lookup: Callable[..., Awaitable[bool]], at_once_if_unchanged: bool = False) -> None:
        """Asks again at once after taking a change; after a lookup that took nothing (the
        wait ran out, or the Controller's were not newer: one that restarted from a log that
        lost its tail) or failed, after REFRESH_RETRY_S, so it never spins. With
        `at_once_if_unchanged` (a lookup that takes nothing only once its wait ran out at
        the Controller), only a failed lookup waits before the next."""
        failing = False
        while True:
            try:
                took = await lookup(wait_ms=CHANGE_WAIT_MS) or at_once_if_unchanged
                failing = False
            except Exception as e:
                if not failing:
                    logger.warning("broker %d: the %s could not be read from the Controller (%r); keeping the last "
                                   "ones", self.broker_id, what, e)
                failing, took = True, False
            if not took:
                await asyncio.sleep(REFRESH_RETRY_S)

    async def _prune_quotas(self) -> None:
        while True:
            await asyncio.sleep(QUOTA_PRUNE_INTERVAL_S)
            self.apis.view.quotas.prune()

    async def _bind(self, listener: Listener, node_ip: str, port: int | None = None) -> tuple[str, int]:
        """Starts serving one listener (on `port` if given, else its configured one); its
        advertised (host, port)."""
        host = listener.host or node_ip
        if port is None:
            port = broker_port(listener.base_port, self.broker_id)
        tls = server_context(self.config, listener.name) if listener.uses_tls else None
        on_connection = functools.partial(self._on_connection, listener, tls)
        try:
            server = await streams.start_server(on_connection, host, port)
        except OSError as e:
            raise InvalidConfigurationError(
                f"broker {self.broker_id} cannot listen on {host}:{port} (listener {listener.name}): {e}"
            ) from None
        self._servers.append(server)
        self._request_timers[listener.name] = RequestTimer(self.broker_id, listener.name)
        bound_port = server.sockets[0].getsockname()[1]
        self._bound_ports[listener.name] = bound_port
        if listener.advertised_host is None:
            endpoint = (node_ip if host in ("0.0.0.0", "::") else host, bound_port)
        else:
            endpoint = (listener.advertised_host or node_ip, broker_port(listener.advertised_base_port or 0, self.broker_id) or bound_port)
        logger.info("broker %d: Kafka listener %s (%s) on %s:%d, advertised as %s:%d", self.broker_id, listener.name,
                    listener.security_protocol, host, bound_port, *endpoint)
        return endpoint

    async def _close_servers(self) -> None:
        """Stops accepting; returns once the listening sockets are closed."""
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()
        for server in servers:
            await server.wait_closed()

    async def stop(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
        await self._close_servers()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        self.apis.view.close()
        self._stop_supervision()

    async def bound_ports(self) -> dict[str, int]:
        """The port each listener listens on, by name (what a restart binds again)."""
        return dict(self._bound_ports)

    async def connections(self) -> int:
        return len(self._connections)

    async def describe_connections(self) -> list[RequestContext]:
        """Who is connected, one RequestContext per open connection: listener, security
        protocol, principal and client host."""
        return [connection.context for connection in self._connections.values()]

    async def queued_requests(self) -> int:
        """Requests read but not yet answered, over all connections (<= queued.max.requests)."""
        return self._queued_count

    async def queued_request_bytes(self) -> int:
        """Bytes reserved for requests read (or being read) and not yet answered
        (<= queued.max.request.bytes)."""
        return self._memory.used_bytes

    async def _take_slot(self) -> None:
        await self._slots.reserve(1)
        self._queued_count += 1
        assert self._queued_count <= self.config.queued_max_requests, self._queued_count

    def _give_slot(self) -> None:
        self._queued_count -= 1
        assert self._queued_count >= 0, self._queued_count
        self._slots.release(1)

    def _admit_now(self, connection: KafkaChannel, size: int) -> bool:
        """For a natively read connection (native_client.py), what `_read_frames` takes
        around a frame's body: its `size` pool bytes before it, its slot (size -1) once it
        is whole; taken now if free with no one waiting before (True), else nothing taken
        (`_admit` waits for it)."""
        if size < 0:
            if not self._slots.try_reserve(1):
                return False
            self._queued_count += 1
            self._held(connection, 0, 1)
        elif self._memory.try_reserve(size):
            self._held(connection, size, 0)
        else:
            return False
        return True

    async def _admit(self, connection: KafkaChannel, size: int) -> None:
        """`_admit_now`, waiting in turn."""
        if size < 0:
            await self._take_slot()
            self._held(connection, 0, 1)
        else:
            await self._memory.reserve(size)
            self._held(connection, size, 0)

    @staticmethod
    def _held(connection: KafkaChannel, size: int, slots: int) -> None:
        connection.bytes_held += size
        if slots:
            connection.slots_held += slots
            connection.all_answered.clear()

    def _freed(self, connection: KafkaChannel, size: int) -> None:
        """A frame's slot and pool bytes go back: it is answered (or its connection closed)."""
        connection.slots_held -= 1
        self._give_slot()
        if connection.slots_held == 0:
            connection.all_answered.set()
        connection.bytes_held -= size
        self._memory.release(size)

    # ------------------------------------------------------------------ one connection

    async def _on_connection(self, listener: Listener, tls: ssl.SSLContext | None,
                             accepted: streams.AcceptedSocket) -> None:
        """One connection: counted against the limits as it is accepted (before any TLS
        handshake, as Kafka counts at accept), then its TLS handshake, then served."""
        task = asyncio.current_task()
        peer = accepted.peer
        host = kafka_host(peer[0]) if peer else ""
        refusal = self._refusal(host)
        if refusal is not None:
            logger.info("broker %d: closing connection from %s: %s", self.broker_id, peer, refusal)
            accepted.refuse()
            return
        connection = self._connections[task] = KafkaChannel(
            RequestContext(listener.name, listener.security_protocol, ANONYMOUS, host), None)
        self._per_host[host] += 1
        writer = None
        try:
            native = self._native_reader(listener)
            if native is not None:
                connection.authenticated.set()  # PLAINTEXT: ANONYMOUS from the start
                await self._serve_natively(connection, native, accepted)
                return
            reader, writer = await accepted.open_streams(tls, handshake_timeout_s=TLS_HANDSHAKE_TIMEOUT_S,
                                                         limit_bytes=STREAM_LIMIT_BYTES)
            connection.context = _context_of(listener, self.config, writer)
            if listener.uses_sasl:
                connection.sasl = SaslAuthenticator(self.config.sasl_mechanisms(listener.name), self._sasl.scram_credentials,
                                                    self.config.connections_max_reauth_ms)
                connection.unauthenticated_max_bytes = self.config.sasl_server_max_receive_bytes(listener.name)
            else:  # PLAINTEXT: ANONYMOUS from the start; SSL: its certificate's, by the handshake
                connection.authenticated.set()
            await self._serve(connection, listener, reader, writer)
        except (OSError, TimeoutError) as e:  # a failed TLS handshake, or the client left during it
            logger.info("broker %d: closing connection from %s (%s): %r", self.broker_id, peer, listener.name, e)
        except asyncio.CancelledError:
            pass  # the listener stops
        except Exception:
            logger.exception("broker %d: closing connection from %s after an unexpected error", self.broker_id, peer)
        finally:
            if writer is not None:
                writer.close()
            self._connections.pop(task, None)
            self._per_host[host] -= 1
            if not self._per_host[host]:
                del self._per_host[host]

    async def _serve(self, connection: KafkaChannel, listener: Listener, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> None:
        """Reads, answers and writes until the connection ends; gives back every slot and
        byte its unanswered requests held."""
        peer = writer.get_extra_info("peername")
        timer = self._request_timers[listener.name]
        # Frames carry when they were read and the pool bytes they hold; answers, those and
        # the request's API name (None for a frame that did not decode), for TotalTimeMs.
        frames: Handoff[tuple[bytes, float, int] | None] = Handoff(QUEUED_PER_CONNECTION)
        answers: Handoff[tuple[asyncio.Future, float, str | None, int] | None] = Handoff(STARTED_PER_CONNECTION)
        reading = asyncio.ensure_future(self._read_frames(reader, frames, peer, connection))
        writing = asyncio.ensure_future(self._write_answers(answers, writer, connection, timer))
        processing = asyncio.ensure_future(self._process(frames, answers, connection))
        parts = [reading, processing, writing]
        if not connection.authenticated.is_set():
            timeout_s = self.config.sasl_server_authentication_timeout_s(listener.name)
            parts.append(asyncio.ensure_future(self._sasl.authentication_deadline(connection, timeout_s)))
        try:
            # Until every answer is written (processing ended at EOF) or a part fails. `reading`
            # is watched too: a read that failed unexpectedly ends the connection instead of
            # leaving the others waiting for frames that never come. The deadline ends it by
            # failing, and is done without effect once the client authenticated.
            running = set(parts)
            while writing in running:
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for finished in done:
                    finished.result()  # raises why the connection ends, if it failed
        except ConnectionClosed as e:
            logger.info("broker %d: closing connection from %s: %s", self.broker_id, peer, e)
        except (OSError, asyncio.IncompleteReadError):
            pass  # the client left (or broke its TLS stream)
        finally:
            await self._settle(connection, parts, answers)

    async def _settle(self, connection: KafkaChannel, parts: list[asyncio.Future], answers: Handoff) -> None:
        """The connection ended: its tasks are cancelled, and every slot and byte of its
        frames read but never answered goes back."""
        for part in parts:
            part.cancel()
        await asyncio.gather(*parts, return_exceptions=True)  # their slots settled
        while not answers.empty():
            if (started := answers.get_nowait()) is not None:
                started[0].cancel()
        for _ in range(connection.slots_held):  # frames read but never answered
            self._give_slot()
        self._memory.release(connection.bytes_held)
        connection.slots_held = connection.bytes_held = 0
        connection.all_answered.set()

    # ------------------------------------------------------------------ connections read natively

    def _native_reader(self, listener: Listener) -> NativeProduce | None:
        """The native side that reads a new connection of `listener` (native_client.py), or
        None: it is served in Python (TLS or SASL, not built, the path off or stopped)."""
        if listener.uses_tls or listener.uses_sasl or not native_paths.enabled("kafka_conns"):
            return None
        native = self.apis.view.native_produce()
        if native is not None:
            native.set_produce_natively(self._produce_natively())
        return native

    def _produce_natively(self) -> bool:
        """Whether Produce may be served without Python: no ACL to check, and no quota of
        any kind (a produce or request quota measures the client; a fetch quota's
        throttle mutes its connection, KIP-219, which Python's processing waits out)."""
        return not self.config.authorizes and not self.apis.view.quotas.config.keys_set

    async def _refresh_quotas(self, wait_ms: int) -> bool:
        took = await self.apis.view.refresh_quotas(wait_ms=wait_ms)
        if took:
            self._quotas_changed()
        return took

    def _quotas_changed(self) -> None:
        """A quota set (or the last one gone) takes natively served Produce requests to
        Python (or back), from the next request on."""
        native = self.apis.view.native_produce() if native_paths.enabled("kafka_conns") else None
        if native is not None:
            native.set_produce_natively(self._produce_natively())

    async def _serve_natively(self, connection: KafkaChannel, native: NativeProduce,
                              accepted: streams.AcceptedSocket) -> None:  # fmt: skip
        """Serves a connection whose socket the native side reads and writes (see
        native_client.py): its frames for Python are processed and answered by the same
        tasks as a connection's of its own, until the native side ends it, a task fails or
        it is idle too long; then every slot and byte its unanswered requests held goes back."""
        peer, fd = accepted.peer, accepted.sock.fileno()
        listener = connection.context.listener_name
        timer = self._request_timers[listener]
        frames: Handoff[tuple[bytes, float, int] | None] = Handoff(QUEUED_PER_CONNECTION + 1)  # (+1: the EOF)
        answers: Handoff[tuple[asyncio.Future, float, str | None, int] | None] = Handoff(STARTED_PER_CONNECTION)

        def freed(size: int, seconds: float) -> None:
            connection.last_active_s = time.monotonic()
            self._freed(connection, size)
            timer.record("Produce", connection.last_active_s - seconds)

        client = NativeClient(native, fd, frames, QUEUED_PER_CONNECTION, connection.reader_done,
                              functools.partial(self._admit_now, connection),
                              lambda size: asyncio.ensure_future(self._admit(connection, size)), freed)  # fmt: skip
        parts = [asyncio.ensure_future(self._process(frames, answers, connection)),
                 asyncio.ensure_future(self._write_answers(answers, client, connection, timer)),
                 asyncio.ensure_future(self._close_native_when_idle(native, fd, connection))]
        why: str | None = None
        try:
            native.adopt_client(fd, self.config.socket_request_max_bytes, client)
            running: set[asyncio.Future] = {client.ended, client.failed, *parts}
            while not client.ended.done():
                done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for finished in done:
                    finished.result()  # raises why the connection ends, if a task failed
            why = client.ended.result()
        except ConnectionClosed as e:
            # What is written already goes (as a StreamWriter's close flushes it), nothing after:
            # the tasks stop first, so that no answer of theirs meets the abandoned order.
            why = str(e)
            for part in parts:
                part.cancel()
            native.client_shutdown(fd, why, True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(client.ended), self.config.connections_max_idle_ms / 1000)
        except UnknownServerError:
            pass  # the native path stopped (logged there): the client reconnects to a Python one
        finally:
            client.close()
            native.forget_client(fd)
            accepted.sock.close()
            await self._settle(connection, parts, answers)
        if why is not None:
            logger.info("broker %d: closing connection from %s: %s", self.broker_id, peer, why)

    async def _close_native_when_idle(self, native: NativeProduce, fd: int, connection: KafkaChannel) -> None:
        """`_close_when_idle` for a natively read connection: it reads no more once it
        waits for its next request with nothing out and nothing read or written for
        connections.max.idle.ms, or once a request's body has taken that long to arrive;
        what it sent before is answered, then it closes (as when `_read_frames` is ended)."""
        idle_s = self.config.connections_max_idle_ms / 1000
        while True:
            idle, body = native.client_idle_s(fd)
            if body is not None and body >= idle_s:
                reason = "a request's body did not arrive within connections.max.idle.ms"
                break
            if idle is not None and idle >= idle_s and connection.slots_held == 0:
                reason = "idle for connections.max.idle.ms"
                break
            waits = [idle_s - seconds for seconds in (idle, body) if seconds is not None]
            await asyncio.sleep(max(min(waits, default=idle_s), 0.01))
        native.client_shutdown(fd, reason, False)

    def _refusal(self, host: str) -> str | None:
        """Why a new connection from `host` is refused, or None (max.connections and
        max.connections.per.ip, as Kafka counts them: over all listeners)."""
        if len(self._connections) >= self.config.max_connections:
            return f"max.connections ({self.config.max_connections}) reached"
        limit = self._host_limits.get(host, self.config.max_connections_per_ip)
        if self._per_host[host] >= limit:
            return f"max.connections.per.ip ({limit}) reached for {host}"
        return None

    async def _process(self, frames: Handoff, answers: Handoff, connection: KafkaChannel) -> None:
        """Starts answering each frame in arrival order, and queues the answers in that order
        for `_write_answers`. A produce request starts while produce requests before it still
        wait for their high watermark (their appends keep their order: produce_coalescer.py);
        a Metadata request starts while only Metadata requests, fewer than METADATA_TOGETHER,
        are before it (a new client's brokers-only Metadata and its first topic's come back
        to back: librdkafka may close the connection on the first answer, and the second
        was lost with it while it waited);
        any other request starts once everything before it is answered, as in Kafka."""
        pending: set[asyncio.Future] = set()  # started, not answered
        pending_other: set[asyncio.Future] = set()  # those of them that are not produce requests
        pending_metadata: set[asyncio.Future] = set()  # those of them that are Metadata requests
        while (read := await frames.get()) is not None:
            frame, received_s, pool_bytes = read
            exchanged = None if connection.sasl is None else await self._sasl.exchange(connection, frame, pending)
            if exchanged is not None:
                answer = asyncio.get_running_loop().create_future()
                answer.set_result(exchanged)
                await answers.put((answer, received_s, None, pool_bytes))
                if isinstance(exchanged, CloseAfter):
                    break  # nothing after a failed authentication is served
                continue
            # The thread's CPU clock is a system call (~1 µs): read only for request_percentage quotas.
            measured = self.apis.view.quotas.measures_request_time
            decode_started_ns = time.thread_time_ns() if measured else 0
            request = self._decode(frame, connection.context)
            throttle = Throttle(thread_ns=time.thread_time_ns() - decode_started_ns if measured else 0)
            api_key = request.head.api_key if isinstance(request, Request) else None
            is_produce = api_key == PRODUCE
            if (pending_other or (pending and not is_produce)) and not (
                api_key == METADATA and len(pending_metadata) == len(pending) < METADATA_TOGETHER
            ):
                await asyncio.wait(pending)
            if (muted_s := connection.muted_until_s - time.monotonic()) > 0:
                await self._wait_out_throttle(connection, muted_s)
            if isinstance(request, Request):
                # Tasks start in the order they are created, so produce requests reach the
                # ProduceCoalescer in arrival order.
                answer = asyncio.ensure_future(self._answer(request, throttle, connection))
                if not is_produce:
                    pending_other.add(answer)
                    answer.add_done_callback(pending_other.discard)
                if api_key == METADATA:
                    pending_metadata.add(answer)
                    answer.add_done_callback(pending_metadata.discard)
                pending.add(answer)
                answer.add_done_callback(pending.discard)
            else:  # the request did not decode: its error answer is ready
                answer = asyncio.get_running_loop().create_future()
                answer.set_result(request)
            name = type(request.body).__name__.removesuffix("Request") if isinstance(request, Request) else None
            await answers.put((answer, received_s, name, pool_bytes))
        await answers.put(None)

    async def _wait_out_throttle(self, connection: KafkaChannel, muted_s: float) -> None:
        """The client is throttled (KIP-219): nothing more of it starts for `muted_s`. If
        it leaves meanwhile, the connection closes then, and what it sent is not served
        (the reader keeps reading, at most QUEUED_PER_CONNECTION frames ahead, so that a
        client leaving is noticed)."""
        try:
            await asyncio.wait_for(connection.reader_done.wait(), muted_s)
        except TimeoutError:
            return
        raise ConnectionClosed("the client left while throttled")

    async def _write_answers(self, answers: Handoff, writer: asyncio.StreamWriter | NativeClient, connection: KafkaChannel,
                             timer: RequestTimer) -> None:
        """Writes each answer when it is ready, in request order; gives back its slot and
        its pool bytes (none for a frame read before authentication)."""
        while (started := await answers.get()) is not None:
            answer, received_s, name, pool_bytes = started
            try:
                response = await answer
            finally:
                connection.last_active_s = time.monotonic()  # not idle while the answer is written
                self._freed(connection, pool_bytes)
            if response is CLOSE_CONNECTION:
                raise ConnectionClosed("an acks=0 produce failed")
            if isinstance(response, CloseAfter):
                writer.write(response.frame)
                await writer.drain()
                raise ConnectionClosed(response.reason)
            if response is not None:
                writer.write(response)
                await writer.drain()
                connection.last_active_s = time.monotonic()
            elif isinstance(writer, NativeClient):
                writer.write(b"")  # its place in the order is let go: nothing to write for it
            if name is not None:
                timer.record(name, received_s)

    async def _read_frames(self, reader: asyncio.StreamReader, frames: Handoff, peer: Any,
                           connection: KafkaChannel) -> None:
        """Reads frames into `frames`, each with when it was read and the pool bytes it holds,
        until EOF, a bad size or an idle connection, then puts None. An authenticated
        connection's frame has its bytes reserved at the pool before its body is read; an
        unauthenticated one's takes nothing from the pool, and is read only once every frame
        before it is answered (so it is known whether that authenticated the connection).
        (Cancelled when the connection closes: then it puts nothing.)"""
        idle_s = self.config.connections_max_idle_ms / 1000
        reading = asyncio.current_task()
        assert reading is not None
        watch = asyncio.ensure_future(self._close_when_idle(connection, idle_s, reading))
        try:
            while True:
                if not connection.authenticated.is_set():
                    await connection.all_answered.wait()
                connection.reading = READING_SIZE
                size = _SIZE.unpack(await reader.readexactly(_SIZE.size))[0]
                connection.reading = None
                authenticated = connection.authenticated.is_set()
                assert authenticated == (connection.sasl is None or connection.sasl.principal is not None)
                if authenticated:
                    limit, setting = self.config.socket_request_max_bytes, "socket.request.max.bytes"
                else:
                    assert connection.slots_held == 0, connection.slots_held
                    limit, setting = connection.unauthenticated_max_bytes, "sasl.server.max.receive.size"
                if not 0 <= size <= limit:
                    logger.info("broker %d: closing connection from %s: request size %d is outside 0..%d (%s)",
                                self.broker_id, peer, size, limit, setting)
                    break
                pool_bytes = size if authenticated else 0
                if authenticated:  # (not even a 0-byte wait: it would queue behind the pool's waiters)
                    await self._memory.reserve(pool_bytes)
                    connection.bytes_held += pool_bytes
                connection.reading, connection.body_started_s, connection.body_bytes = READING_BODY, time.monotonic(), size
                frame = await reader.readexactly(size)
                connection.reading = None
                received_s = connection.last_active_s = time.monotonic()
                await self._take_slot()
                connection.slots_held += 1
                connection.all_answered.clear()
                await frames.put((frame, received_s, pool_bytes))
        except (asyncio.IncompleteReadError, OSError):  # OSError: a connection error, or a broken TLS record
            pass
        except asyncio.CancelledError:
            if connection.idle_close_reason is None or reading.uncancel() > 0:
                raise  # the connection closes: not `_close_when_idle`'s doing
            logger.info("broker %d: closing connection from %s (%s): %s", self.broker_id, peer,
                        connection.context.listener_name, connection.idle_close_reason)
        finally:
            watch.cancel()
        connection.reader_done.set()
        await frames.put(None)

    async def _close_when_idle(self, connection: KafkaChannel, idle_s: float, reading: asyncio.Task) -> None:
        """Ends `reading` (connections.max.idle.ms) once the connection waits for its next
        request with none of its requests unanswered and nothing read or written for
        `idle_s`, or once a request's body has taken `idle_s` to arrive. A task of its own,
        as the data plane endpoint's: a timeout around each read cost two timers per frame."""
        while True:
            now = time.monotonic()
            activity_deadline_s = connection.last_active_s + idle_s
            if connection.reading == READING_BODY:
                body_deadline_s = connection.body_started_s + idle_s
                if now >= body_deadline_s:
                    reason = f"a request of {connection.body_bytes} bytes did not arrive within connections.max.idle.ms"
                    break
                wait_s = body_deadline_s - now
            elif connection.reading == READING_SIZE and connection.slots_held == 0 and now >= activity_deadline_s:
                reason = "idle for connections.max.idle.ms"
                break
            else:
                wait_s = activity_deadline_s - now if activity_deadline_s > now else idle_s
            await asyncio.sleep(wait_s)
        connection.idle_close_reason = reason
        reading.cancel()

    def _decode(self, frame: bytes, context: RequestContext) -> Request | bytes:
        """The request, or the error response for a frame that does not decode."""
        try:
            return decode_request(frame, context)
        except UnsupportedVersionError as e:
            return self._unsupported(read_head(frame), str(e))
        except InvalidRequestError as e:
            if len(frame) < 8:
                raise ConnectionClosed(str(e)) from None
            head = read_head(frame)
            logger.info("broker %d: %s", self.broker_id, e)
            return encode_response(head, error_response(response_class(head.api_key, head.api_version), InvalidRequestError.code))

    async def _answer(self, request: Request, throttle: Throttle, connection: KafkaChannel) -> bytes | object | None:
        """The response frame for one request, None for none, or CLOSE_CONNECTION. A
        throttled client's connection starts nothing more until its throttle time has
        passed; to a client that does not wait it out itself, the answer waits instead."""
        response = await self.apis.handle(request, throttle)
        if not (response is None or response is CLOSE_CONNECTION or isinstance(response, bytes)):
            quotas = self.apis.view.quotas
            measured = quotas.measures_request_time
            encode_started_ns = time.thread_time_ns() if measured else 0
            response = encode_response(request.head, response)
            if measured:
                quotas.record_request_time(request.context, request.client_id, time.thread_time_ns() - encode_started_ns)
        if throttle.ms > 0:
            connection.muted_until_s = max(connection.muted_until_s, time.monotonic() + throttle.ms / 1000)
            if not client_throttles(request.head.api_key, request.head.api_version):
                await asyncio.sleep(throttle.ms / 1000)
        return response

    def _unsupported(self, head: RequestHead, reason: str) -> bytes:
        logger.info("broker %d: %s", self.broker_id, reason)
        if head.api_key == API_VERSIONS:  # KIP-511: answer in v0, listing what is served
            body = build(response_class(API_VERSIONS, 0), api_versions_body(UnsupportedVersionError.code))
            return encode_response(RequestHead(API_VERSIONS, 0, head.correlation_id), body)
        if has_response_schema(head.api_key, head.api_version):
            body = error_response(response_class(head.api_key, head.api_version), UnsupportedVersionError.code)
            return encode_response(head, body)
        # No schema to answer in (an unknown API key, or a version older than Kafka 4.0's
        # floor): a response header and the error code, which is how every v0 answer starts.
        return _BARE_ERROR.pack(_BARE_ERROR.size - 4, head.correlation_id, UnsupportedVersionError.code)


def _context_of(listener: Listener, config: BrokerConfig, writer: asyncio.StreamWriter) -> RequestContext:
    """A new connection's RequestContext: on TLS, the principal of its client certificate."""
    peer = writer.get_extra_info("peername")
    principal = ANONYMOUS
    if listener.uses_tls:
        principal = certificate_principal(writer.get_extra_info("ssl_object").getpeercert(binary_form=True))
    authenticates = listener.uses_sasl or (
        listener.uses_tls and config.listener_setting(listener.name, "ssl.client.auth") == "required"
    )
    return RequestContext(listener.name, listener.security_protocol, principal, kafka_host(peer[0]) if peer else "",
                          authenticates)
