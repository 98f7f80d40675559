"""SocketServer: a broker's Kafka listener, the reactor of Kafka's SocketServer on asyncio.

One actor per broker, on the broker's node (its ReplicaManager creates it, supervises it
and starts a new one if it dies; see rayk/actors/supervision.py). For each
connection a reader task reads size-prefixed frames into a bounded queue, and a processor
task takes them one at a time: decode, hand to KafkaApis, write the response. So every
connection is answered in request order (and a producer's batches are appended in the
order it sent them), while many connections are served at once.

Back-pressure and bad input, as in Kafka:
- a frame larger than `socket.request.max.bytes` (or with a negative size) closes the
  connection before its body is read;
- at most `queued.max.requests` requests are read but not yet answered over all
  connections, and at most QUEUED_PER_CONNECTION per connection; past that, reading
  stops and TCP pushes back on the clients;
- a request that does not parse gets INVALID_REQUEST, an API or version this broker does
  not serve gets UNSUPPORTED_VERSION (ApiVersions always answers in v0 so any client can
  read the list), and a frame too short to hold a header closes the connection; every
  close is logged with its reason. Nothing of this reaches the partition replicas.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any

import ray

from rayk.actors.supervision import Supervised
from rayk.config import BrokerConfig
from rayk.errors import InvalidConfigurationError, InvalidRequestError, UnsupportedVersionError
from rayk.net.admin_apis import api_versions_body
from rayk.net.api_versions import API_VERSIONS
from rayk.net.broker_view import BrokerView
from rayk.net.codec import RequestHead, decode_request, encode_response, has_response_schema, read_head, response_class
from rayk.net.entities import build, error_response
from rayk.net.kafka_apis import CLOSE_CONNECTION, KafkaApis
from rayk.net.listener_address import broker_port, parse_listener

logger = logging.getLogger(__name__)

QUEUED_PER_CONNECTION = 16
_SIZE = struct.Struct(">i")
_BARE_ERROR = struct.Struct(">iih")  # size, correlation id, error code


class ConnectionClosed(Exception):
    """Why the listener closes a connection (logged)."""


class SocketServer(Supervised):
    def __init__(self, broker_id: int, controller: Any, config: BrokerConfig) -> None:
        self.broker_id = broker_id
        self.config = config
        self.apis = KafkaApis(BrokerView(broker_id, controller, config))
        self._server: asyncio.base_events.Server | None = None
        self._queued = asyncio.Semaphore(config.queued_max_requests)
        self._queued_count = 0  # slots of _queued taken: requests read but not yet answered
        self._connections: set[asyncio.Task] = set()
        self.endpoint: tuple[str, int] | None = None

    async def start(self) -> tuple[str, int]:
        """Binds the listener; returns the advertised (host, port). Idempotent."""
        if self.endpoint is not None:
            return self.endpoint
        listener = parse_listener(self.config.listeners)
        assert listener is not None, "the ReplicaManager starts a listener only when one is configured"
        node_ip = ray.util.get_node_ip_address()
        host = listener[0] or node_ip
        port = broker_port(listener[1], self.broker_id)
        try:
            self._server = await asyncio.start_server(self._on_connection, host, port, limit=1 << 16)
        except OSError as e:
            raise InvalidConfigurationError(f"broker {self.broker_id} cannot listen on {host}:{port} (listeners): {e}") from None
        bound_port = self._server.sockets[0].getsockname()[1]
        advertised = parse_listener(self.config.advertised_listeners, "advertised.listeners")
        if advertised is None:
            self.endpoint = (node_ip if host in ("0.0.0.0", "::") else host, bound_port)
        else:
            port = broker_port(advertised[1], self.broker_id) or bound_port
            self.endpoint = (advertised[0] or node_ip, port)
        logger.info("broker %d: Kafka listener on %s:%d, advertised as %s:%d", self.broker_id, host, bound_port, *self.endpoint)
        return self.endpoint

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        self._stop_supervision()

    async def connections(self) -> int:
        return len(self._connections)

    async def queued_requests(self) -> int:
        """Requests read but not yet answered, over all connections (<= queued.max.requests)."""
        return self._queued_count

    async def _take_slot(self) -> None:
        await self._queued.acquire()
        self._queued_count += 1
        assert self._queued_count <= self.config.queued_max_requests, self._queued_count

    def _give_slot(self) -> None:
        self._queued_count -= 1
        assert self._queued_count >= 0, self._queued_count
        self._queued.release()

    # ------------------------------------------------------------------ one connection

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(QUEUED_PER_CONNECTION)
        reading = asyncio.ensure_future(self._read_frames(reader, queue, peer))
        try:
            while (frame := await queue.get()) is not None:
                try:
                    response = await self._respond(frame)
                finally:
                    self._give_slot()
                if response is CLOSE_CONNECTION:
                    raise ConnectionClosed("an acks=0 produce failed")
                if response is not None:
                    writer.write(response)
                    await writer.drain()
        except ConnectionClosed as e:
            logger.info("broker %d: closing connection from %s: %s", self.broker_id, peer, e)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:
            logger.exception("broker %d: closing connection from %s after an unexpected error", self.broker_id, peer)
        finally:
            reading.cancel()
            while not queue.empty():  # frames read but never processed
                if queue.get_nowait() is not None:
                    self._give_slot()
            writer.close()
            self._connections.discard(task)

    async def _read_frames(self, reader: asyncio.StreamReader, queue: asyncio.Queue, peer: Any) -> None:
        """Reads frames into `queue` until EOF or a bad size, then puts None. (Cancelled when
        the connection closes: then it puts nothing and holds no `queued.max.requests` slot.)"""
        try:
            while True:
                size = _SIZE.unpack(await reader.readexactly(_SIZE.size))[0]
                if not 0 <= size <= self.config.socket_request_max_bytes:
                    logger.info("broker %d: closing connection from %s: request size %d is outside 0..%d "
                                "(socket.request.max.bytes)", self.broker_id, peer, size, self.config.socket_request_max_bytes)
                    break
                frame = await reader.readexactly(size)
                await self._take_slot()
                try:
                    await queue.put(frame)
                except BaseException:
                    self._give_slot()
                    raise
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        await queue.put(None)

    async def _respond(self, frame: bytes) -> bytes | object | None:
        """The response frame for one request frame, None for none, or CLOSE_CONNECTION."""
        try:
            request = decode_request(frame)
        except UnsupportedVersionError as e:
            return self._unsupported(read_head(frame), str(e))
        except InvalidRequestError as e:
            if len(frame) < 8:
                raise ConnectionClosed(str(e)) from None
            head = read_head(frame)
            logger.info("broker %d: %s", self.broker_id, e)
            return encode_response(head, error_response(response_class(head.api_key, head.api_version), InvalidRequestError.code))
        response = await self.apis.handle(request)
        if response is None or response is CLOSE_CONNECTION:
            return response
        return encode_response(request.head, response)

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


SocketServerActor = ray.remote(num_cpus=0, max_restarts=0)(SocketServer)
