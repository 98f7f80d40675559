"""Endpoint: where a rayk process (a partition replica) serves data plane requests.

It listens on a Unix domain socket for peers on its node (an abstract one on Linux, so
nothing is left on disk when the process dies) and, from the first time a peer on
another node asks for it, on TCP at its node's address (or the host the brokers'
listeners bind to), over TLS when the brokers' listeners use it (tls.py). Its secret
is made when it opens; the owner hands `EndpointAddress` (addresses, secret and
certificate) to its peers through Ray.

A connection is a stranger until it has proven the endpoint's secret: through TLS (on TCP,
if the endpoint has a keystore), within TLS_HANDSHAKE_TIMEOUT_S, then the handshake
(handshake.py), within HANDSHAKE_TIMEOUT_S; it is closed before any frame is read if it
does not. Only proven connections count against MAX_CONNECTIONS (past it, more are
refused); strangers are bounded apart, MAX_UNAUTHENTICATED_PER_ADDRESS from one IP
address and MAX_UNAUTHENTICATED in all, and past a bound the oldest stranger is closed
to make room for the newcomer (admission.py): idle sockets, however many and from
wherever (a follower's own node included), do not keep out a peer, which proves itself
within a round trip.

Per connection, once proven: each request frame starts a task as the event loop reads it
(FrameReader's push mode, no reading task woken per frame), which writes its answer, with
the request's correlation id, the moment it is ready: a fetch long-polled at the replica
holds up no produce behind it. The requests of one connection start in the order they
arrived. At most `max_in_flight` of a connection are started and not yet answered; past
that the frames are held back (staged, and the transport stops reading once the staging
buffer is full) and the socket's buffers push back on the peer; an answer's slot is free
only once the peer has taken it (`drain`), so a slow follower or consumer never makes the
endpoint buffer without bound.
A fetch answer's records of SENDFILE_MIN_BYTES or more go from the log file to the
socket by sendfile, without entering the process, where the connection is not TLS
(answer_writer.py).

What a request carries fails that request, never its connection, which may carry many
clients' requests (Kafka's rule): a handler that raises answers that request FAILED
(frames.py) with the error, INVALID_REQUEST if its body does not parse, a KafkaError as
itself, anything else UNKNOWN_SERVER_ERROR (logged with its traceback), and the other
requests of the connection go on. Only a frame that does not parse at the framing level
closes the connection: one whose size prefix declares more than MAX_FRAME_BYTES, or whose
header is short or of an unknown kind. The stream cannot be trusted to be in step then
(or the peer speaks another protocol), and the connection that closes is that peer's own.

Where rayk._native is built (and its "endpoint" path is on: rayk/native_paths.py), a proven connection that is not
TLS is read and written by native code once its handshake is done (native_endpoint.py):
the same framing, bounds, answers, sendfile and ends as described here, with the requests
still served by the replica's handler in Python; TLS connections stay in Python.

A connection with no request in flight that sends nothing for `idle_timeout_s` (Kafka's
connections.max.idle.ms, 10 minutes) is closed, so peers that stopped using an endpoint
do not keep its places; peers close theirs first (connection.py), so a request never
meets that close. Idle, an endpoint costs no thread, and each idle connection one timer.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import socket
import ssl
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from rayk.dataplane import admission, answer_writer, frames, handshake, native_endpoint, streams, tls
from rayk.dataplane.frame_reader import FrameReader
from rayk.errors import InvalidRequestError, KafkaError, UnknownServerError
from rayk.storage.file_slice import FileSlice

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT_PER_CONNECTION = 16
MAX_CONNECTIONS = 256  # authenticated ones, per endpoint: more are refused
# Strangers (not yet through TLS and the handshake), per endpoint: past either bound the
# oldest of that address (or of all) is let go for the newcomer (admission.py says why).
# A few per address: a node's real peers prove themselves within a round trip of
# connecting, so only a burst of that many at the same moment from one node meets the bound.
MAX_UNAUTHENTICATED_PER_ADDRESS = 8
MAX_UNAUTHENTICATED = 64
# A stranger has this long to prove the secret after its greeting (its streams open): a
# peer needs a round trip and an HMAC, milliseconds even on a loaded node, and one that
# misses it reconnects (connection.py). It bounds what an idle socket costs, not who
# gets in: admission does that.
HANDSHAKE_TIMEOUT_S = 1.0
# Over TLS, the TLS handshake first has this long: a few ms of CPU (a key exchange and a
# signature) and two round trips, given room for a 2-core node whose event loop a busy
# actor stalls for a second at times; a real peer cut off here only reconnects.
TLS_HANDSHAKE_TIMEOUT_S = 3.0
REFUSAL_LOG_INTERVAL_S = 60
WILDCARD_HOSTS = ("", "0.0.0.0", "::")
# TCP keepalive: a peer node that vanished without closing is found out in ~2 minutes
# (Linux's defaults take over 2 hours).
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 60, 10, 6
IDLE_TIMEOUT_S = 600.0  # Kafka's broker connections.max.idle.ms

# A fetch answer's records of at least this many bytes are sent from the log file by
# sendfile (answer_writer.py); below it, reading them costs less than the extra turns of
# the event loop sendfile takes (benchmarks/sendfile_bench.py: the two cross near 100 KiB).
SENDFILE_MIN_BYTES = 128 * 1024

# (kind, the request's body after its header) -> (answer head, answer tail: records, or a
# slice of the log file for the answer to send by sendfile)
Handler = Callable[[int, memoryview], Awaitable[tuple[bytes, bytes | FileSlice]]]
# The same request served without a task where it can be: (kind, body, reply(head, tail))
# -> True if it took the request (and calls `reply` once, now or later), False: the Handler serves it.
ServeNow = Callable[[int, memoryview, native_endpoint.Reply], bool]


@dataclass(frozen=True, slots=True)
class EndpointAddress:
    """How to reach an endpoint: its Unix socket from `node_id`, TCP from anywhere else."""

    node_id: str
    unix_path: str  # "\0..." for an abstract socket
    host: str
    port: int  # 0 until a peer on another node asked for TCP
    secret: bytes = field(repr=False)
    # The certificate (PEM) its TCP socket presents over TLS, for the peer to pin (tls.py);
    # "": plain TCP.
    tls_certificate: str = field(default="", repr=False)


def _expire_now(deadline: asyncio.Timeout) -> None:
    """Ends a stranger's wait to prove itself at once (Admission let it go for a newer one).
    A deadline that has passed already is ending it anyway."""
    if not deadline.expired():
        deadline.reschedule(-1.0)  # past: it fires at the loop's next turn


def _unix_path() -> str:
    name = f"rayk-dataplane-{os.getpid()}-{secrets.token_hex(8)}"
    if sys.platform == "linux":
        return "\0" + name  # abstract: gone with the process
    return os.path.join(tempfile.gettempdir(), name + ".sock")


def keep_alive(sock: socket.socket) -> None:
    """Keepalive probes on a TCP connection, at KEEPALIVE_IDLE_S where the OS lets us say."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE_S), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL_S),
                          ("TCP_KEEPCNT", KEEPALIVE_PROBES)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def reachable_host(bind_host: str, node_ip: str) -> str:
    """Where peers reach an endpoint bound to `bind_host`: the node's IP for a wildcard."""
    return node_ip if bind_host in WILDCARD_HOSTS and node_ip else bind_host


class Endpoint:
    """One partition replica's data plane server: owns its listening sockets (Unix, then TCP
    once a peer elsewhere asks), its secret, its open connections and their Admission, and
    hands each request to the replica's handler. Made at the first `data_endpoint` call to
    the replica, closed with it. Not thread-safe: the replica actor's event loop."""

    def __init__(
        self, handler: Handler, name: str, max_in_flight: int = MAX_IN_FLIGHT_PER_CONNECTION,
        idle_timeout_s: float = IDLE_TIMEOUT_S, sendfile: bool = True, serve_now: ServeNow | None = None,
    ) -> None:
        """`name` is for the logs (the partition, say). `sendfile` False reads the log
        slices a handler answers instead of sending them from the file (for comparison).
        `serve_now`, if given, is asked first for each request of a connection served
        natively, and serves without a task the requests it takes (a leader's followers'
        fetches and produce calls)."""
        self._handler, self.name, self._max_in_flight = handler, name, max_in_flight
        self._serve_now = serve_now
        self._sendfile = sendfile
        self._idle_timeout_s = idle_timeout_s
        self._secret = handshake.new_secret()
        self._servers: list[asyncio.AbstractServer | streams.AcceptingServer] = []
        self._connections: set[asyncio.StreamWriter | streams.AcceptedSocket] = set()
        self._address: EndpointAddress | None = None
        self._opening = asyncio.Lock()
        self._refused, self._refusal_logged_at = 0, -float(REFUSAL_LOG_INTERVAL_S)
        self._admission = admission.Admission(MAX_CONNECTIONS, MAX_UNAUTHENTICATED, MAX_UNAUTHENTICATED_PER_ADDRESS)
        self._tls: ssl.SSLContext | None = None  # TCP's, once opened with a keystore
        self._native: native_endpoint.NativeConnections | None = None  # made at the first connection it serves

    async def open(
        self, node_id: str, host: str, tcp: bool = True, node_ip: str = "", keystore: tls.KeyStore | None = None
    ) -> EndpointAddress:
        """Listens on a Unix socket and, with `tcp` (a peer on another node asked), on TCP at
        `host`, over TLS with `keystore`'s certificate if given; a wildcard host ("",
        0.0.0.0, ::) is given out as `node_ip`. Later calls give the same address, with TCP
        added once asked for."""
        async with self._opening:  # a failure leaves what was open before as it was
            if self._address is None:
                unix_path = _unix_path()
                self._servers.append(await streams.start_unix_frame_server(self._serve_unix, unix_path))
                self._address = EndpointAddress(node_id, unix_path, reachable_host(host, node_ip), 0, self._secret)
            if tcp and self._address.port == 0:
                self._tls, certificate = tls.server_context(keystore) if keystore is not None else (None, "")
                # TLS starts in _serve_tcp, once admitted: a stranger's TLS handshake is bounded as its data plane one.
                server = await streams.start_server(self._serve_tcp, host or None, 0)
                self._servers.append(server)
                self._address = replace(
                    self._address, port=server.sockets[0].getsockname()[1], tls_certificate=certificate
                )
            return self._address

    async def close(self) -> None:
        """Stops listening and closes every connection."""
        for server in self._servers:
            server.close()
        if self._native is not None:
            self._native.close()
            self._native = None  # opened again, it serves with a new one
        for connection in list(self._connections):
            if isinstance(connection, asyncio.StreamWriter):
                connection.close()  # a TLS handshake under way ends at its deadline, then sees the endpoint closed
        for server in self._servers:
            await server.wait_closed()
        if self._address is not None and not self._address.unix_path.startswith("\0"):
            try:
                os.unlink(self._address.unix_path)
            except FileNotFoundError:
                pass
        self._servers.clear()
        self._address = None

    @property
    def connection_count(self) -> int:
        """Its connections open, authenticated or not."""
        return len(self._connections)

    @property
    def authenticated_count(self) -> int:
        return self._admission.authenticated_count

    @property
    def unauthenticated_count(self) -> int:
        return self._admission.unauthenticated_count

    async def _serve_unix(self, reader: FrameReader, writer: asyncio.StreamWriter) -> None:
        # A Unix socket's peer is a process on this node, with no address to tell it from
        # the others by: a bound per address would put every local peer (the listener's
        # lanes, each client session on the node, every follower of a one-node cluster)
        # under one handful, and a burst of them reconnecting at once would evict one
        # another. So local strangers count against MAX_UNAUTHENTICATED only (address
        # None), and past it the oldest is let go; a local process that floods could as
        # well flood over TCP from the node's address, where the bound per address holds.
        async def opened() -> tuple[FrameReader, asyncio.StreamWriter]:
            return reader, writer

        self._connections.add(writer)
        try:
            await self._serve(None, "a local process", opened, over_tls=False)
        finally:
            self._connections.discard(writer)
            writer.close()

    async def _serve_tcp(self, accepted: streams.AcceptedSocket) -> None:
        """A TCP connection: its TLS handshake, if any, then the data plane's."""
        handed_over = False  # to the event loop, whose transport closes the socket from then on
        writers: list[asyncio.StreamWriter] = []

        async def opened() -> tuple[FrameReader, asyncio.StreamWriter]:
            nonlocal handed_over
            keep_alive(accepted.sock)
            handed_over = True
            reader, writer = await accepted.open_frame_streams(self._tls, handshake_timeout_s=TLS_HANDSHAKE_TIMEOUT_S)
            writers.append(writer)
            self._connections.discard(accepted)
            self._connections.add(writer)
            return reader, writer

        self._connections.add(accepted)
        try:
            await self._serve(accepted.peer[0], accepted.peer, opened, over_tls=self._tls is not None)
        finally:
            self._connections.discard(accepted)
            for writer in writers:
                self._connections.discard(writer)
                writer.close()
            if not handed_over:
                accepted.refuse()

    async def _serve(
        self, address: str | None, peer: object,
        opened: Callable[[], Awaitable[tuple[FrameReader, asyncio.StreamWriter]]], over_tls: bool,
    ) -> None:
        """One connection from `address` (None: a local process), which its caller closes:
        admitted (admission.py), its streams `opened` (with TLS if `over_tls`) and its
        handshake done within their deadlines, then its requests served."""
        loop = asyncio.get_running_loop()
        ticket: admission.Ticket | None = None
        try:
            async with asyncio.timeout(None) as deadline:
                ticket = self._admission.arrive(address, functools.partial(_expire_now, deadline))
                if ticket is None:
                    self._log_refusal(peer, f"it has {self._admission.authenticated_count} authenticated "
                                            "connections, the most it takes")
                    return
                try:
                    deadline.reschedule(loop.time() + (TLS_HANDSHAKE_TIMEOUT_S if over_tls else HANDSHAKE_TIMEOUT_S))
                    reader, writer = await opened()
                    if over_tls:
                        deadline.reschedule(loop.time() + HANDSHAKE_TIMEOUT_S)
                    await handshake.accept(reader, writer, self._secret)
                except BaseException:
                    # Out of the admission while the deadline is still entered: an eviction
                    # (which moves the deadline) never meets a finished one.
                    self._admission.leave(ticket)
                    raise
                admitted = self._admission.authenticate(ticket)
        except (handshake.HandshakeError, TimeoutError, asyncio.IncompleteReadError, OSError) as e:
            # OSError: ssl.SSLError, a reset, a TLS handshake past its timeout.
            if ticket is not None and ticket.evicted:
                why = "it had not proven the secret yet, and a newer unauthenticated connection took its place"
            elif isinstance(e, TimeoutError):
                why = "it did not prove the secret in time"
            else:
                why = str(e) or type(e).__name__
            self._log_refusal(peer, why)
            return
        try:
            if not admitted:
                self._log_refusal(peer, f"it has {self._admission.authenticated_count} authenticated connections, "
                                        "the most it takes")
                return
            if not self._servers:  # closed during the handshake
                return
            native = self._native_connections() if not over_tls and self._sendfile else None
            if native is None:
                await self._serve_requests(reader, writer, peer)
            elif (ended := await native.serve(reader, writer, peer)) is not None:
                logger.warning("%s: closing the data plane connection from %s: %s", self.name, peer, ended)
        finally:
            self._admission.leave(ticket)

    def _native_connections(self) -> native_endpoint.NativeConnections | None:
        """Where this endpoint's connections are served natively (native_endpoint.py), the
        object that serves them; None: in Python (not built, its path off (rayk/native_paths.py),
        or it failed)."""
        if self._native is None and native_endpoint.available():
            self._native = native_endpoint.NativeConnections(
                self.name, self._answer_natively, self._max_in_flight, self._idle_timeout_s,
                self._answer_now if self._serve_now is not None else None)
        return self._native if self._native is not None and self._native.alive else None

    async def _answer_natively(
        self, served: native_endpoint.Served, correlation_id: int, kind: int, body: memoryview
    ) -> None:
        """`_answer`, for a connection served natively: the answer goes to the native side,
        which writes it once the earlier ones are (and frees the request's place then)."""
        native = served.native
        try:
            head, tail = await self._handler(kind, body)
        except Exception as e:  # not a cancellation (a BaseException): the connection is closing then
            native.answer_frame(served, frames.failed_answer_frame(correlation_id, self._error_of(e, kind, served.peer)))
        else:
            native.answer(served, correlation_id, head, tail)

    def _answer_now(self, served: native_endpoint.Served, correlation_id: int, kind: int, body: memoryview) -> bool:
        """`serve_now` for a request of a connection served natively: True if it took it.
        One that raises is answered FAILED, as a handler's (`_answer`)."""
        assert self._serve_now is not None
        reply = native_endpoint.Reply(served.native, served, correlation_id)
        try:
            return self._serve_now(kind, body, reply)
        except Exception as e:  # answered FAILED, unless it was answered before it raised
            reply.failed(frames.failed_answer_frame(correlation_id, self._error_of(e, kind, served.peer)))
            return True

    def _log_refusal(self, peer: object, why: str) -> None:
        """At most one warning per REFUSAL_LOG_INTERVAL_S: a stranger knocking cannot flood the log."""
        now = time.monotonic()
        self._refused += 1
        if now >= self._refusal_logged_at + REFUSAL_LOG_INTERVAL_S:
            logger.warning("%s: refused a data plane connection from %s: %s (%d refused since the last warning)",
                           self.name, peer, why, self._refused)
            self._refusal_logged_at, self._refused = now, 0

    async def _serve_requests(self, reader: FrameReader, writer: asyncio.StreamWriter, peer: object) -> None:
        """Starts a task for each request frame as the event loop reads it (FrameReader's
        push mode: no reading task woken per frame), holding the frames back while
        `max_in_flight` are started and not answered; returns when the connection ends,
        is idle too long, or sends a frame that does not parse."""
        loop = asyncio.get_running_loop()
        max_in_flight = self._max_in_flight
        started: set[asyncio.Task] = set()
        ended: asyncio.Future[str | None] = loop.create_future()  # why, if it is worth a warning
        reading = asyncio.current_task()
        assert reading is not None, "served in a task of its own"
        last_active_s = time.monotonic()  # the last frame read or answer written
        answers = answer_writer.AnswerWriter(writer, self._sendfile)

        def answered(task: asyncio.Task) -> None:
            nonlocal last_active_s
            started.discard(task)
            last_active_s = time.monotonic()
            if len(started) < max_in_flight:
                reader.release_frames()

        def on_frame(frame: bytes | memoryview) -> None:
            nonlocal last_active_s
            try:
                correlation_id, kind, body = frames.parse_request(frame)
            except frames.FrameError as e:
                reader.stop_frames()  # nothing after it is served, whatever is answered meanwhile
                if not ended.done():
                    ended.set_result(str(e))
                return
            last_active_s = time.monotonic()
            task = loop.create_task(self._answer(correlation_id, kind, body, answers, peer, reading))
            started.add(task)
            task.add_done_callback(answered)
            if len(started) >= max_in_flight:
                reader.hold_frames()  # released when an answer is written

        def on_end(why: str) -> None:
            """The reader's: the stream ended or broke (the peer went away: nothing to warn
            of), or a frame's size is over the bound."""
            if not ended.done():
                oversize = why.startswith("a frame of ")
                ended.set_result(f"{why}, over the limit of {frames.MAX_FRAME_BYTES}" if oversize else None)

        async def close_when_idle() -> None:
            """Ends the serving once no request is in flight and nothing was read or
            answered for the idle timeout. A task of its own, as Connection's: a timeout
            around each read cost a timer per frame."""
            while True:
                idle_s = time.monotonic() - last_active_s
                if idle_s >= self._idle_timeout_s and not started:
                    logger.debug("%s: closing the data plane connection from %s: idle for %.0f s",
                                 self.name, peer, idle_s)
                    reading.cancel()
                    return
                await asyncio.sleep(self._idle_timeout_s - idle_s if idle_s < self._idle_timeout_s else self._idle_timeout_s)

        idle_watch = asyncio.create_task(close_when_idle())
        try:
            reader.deliver_frames(on_frame, on_end, frames.MAX_FRAME_BYTES)
            why = await ended
            if why is not None:
                logger.warning("%s: closing the data plane connection from %s: %s", self.name, peer, why)
        except asyncio.CancelledError:
            pass  # idle, the endpoint closing, or an answer that could not be written to the peer
        finally:
            reader.stop_frames()  # nothing more starts, not even as the tasks cancelled below end
            idle_watch.cancel()
            for task in started:
                task.cancel()

    async def _answer(
        self, correlation_id: int, kind: int, body: memoryview, answers: answer_writer.AnswerWriter, peer: object,
        reading: asyncio.Task,
    ) -> None:
        """Serves one request and writes its answer as soon as it is ready (answers go by
        correlation id, so a long-polled fetch holds up no other request). A handler that
        raises fails this request alone: it is answered FAILED with the error (frames.py),
        and the connection, which may carry many clients' requests, serves on."""
        try:
            head, tail = await self._handler(kind, body)
        except Exception as e:  # not a cancellation (a BaseException): the connection is closing then
            written = answers.write_frame(frames.failed_answer_frame(correlation_id, self._error_of(e, kind, peer)))
        else:
            written = answers.write(correlation_id, head, tail)
        try:
            await written  # the peer takes the answer before this request's slot is free
        except OSError:
            reading.cancel()

    def _error_of(self, e: Exception, kind: int, peer: object) -> KafkaError:
        """What a request whose handler raised `e` is answered, logged once: its body does
        not parse (INVALID_REQUEST; the frame around it did, so the stream is in step), a
        KafkaError as itself, anything else UNKNOWN_SERVER_ERROR, with its traceback."""
        if isinstance(e, frames.FrameError):
            logger.warning("%s: a data plane request (kind %d) from %s does not parse: %s", self.name, kind, peer, e)
            return InvalidRequestError(f"the request does not parse: {e}")
        if isinstance(e, KafkaError):
            logger.warning("%s: a data plane request (kind %d) from %s failed: %s", self.name, kind, peer, e)
            return e
        logger.exception("%s: a data plane request (kind %d) from %s failed", self.name, kind, peer)
        return UnknownServerError(f"{type(e).__name__}: {e}")
