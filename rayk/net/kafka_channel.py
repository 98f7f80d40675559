"""KafkaChannel: what a Kafka listener keeps per connection (Kafka's KafkaChannel).

Its RequestContext (listener, security protocol, principal, client host; the principal
changes once SASL authenticates the client), its SaslAuthenticator on SASL listeners and
whether it is authenticated yet; its share of the listener's limits: the
`queued.max.requests` slots and `queued.max.request.bytes` its frames read but not yet
answered hold; until when its client is throttled (KIP-219); and what the idle watch
reads (`connections.max.idle.ms`): when it was last active and what its reader waits for.

Created by the SocketServer when it accepts a connection and dropped when the connection
closes, at which point every slot and byte it held is given back. Plain state, changed
by the connection's reader, processor and writer tasks on one event loop; not
thread-safe. `ConnectionClosed` is why a connection is closed (logged).
"""

from __future__ import annotations

import asyncio
import time

from rayk.net.request_context import RequestContext
from rayk.net.sasl import SaslAuthenticator


class ConnectionClosed(Exception):
    """Why the listener closes a connection (logged)."""


READING_SIZE, READING_BODY = "size", "body"


class KafkaChannel:
    """What the listener keeps per connection: its context and authentication, its share
    of the request limits, and what its reader and idle watch need."""

    def __init__(self, context: RequestContext, sasl: SaslAuthenticator | None) -> None:
        self.context = context  # its principal changes when SASL authenticates the client
        self.sasl = sasl  # on SASL listeners
        # Set once the client is authenticated: at once without SASL, else when the SASL
        # exchange succeeds (then its principal is set). Never cleared: re-authentication
        # (KIP-368) keeps the principal.
        self.authenticated = asyncio.Event()
        self.unauthenticated_max_bytes = 0  # sasl.server.max.receive.size, on SASL listeners
        self.slots_held = 0  # queued.max.requests slots of frames read and not yet answered
        self.all_answered = asyncio.Event()  # set exactly while slots_held == 0
        self.all_answered.set()
        self.bytes_held = 0  # queued.max.request.bytes reserved for frames not yet answered
        self.muted_until_s = 0.0  # (monotonic) no request starts before: its client is throttled
        self.last_active_s = time.monotonic()  # a frame read or an answer written (connections.max.idle.ms)
        self.reader_done = asyncio.Event()  # set when nothing more will be read (EOF, a bad frame, idle)
        # What the reader waits for: READING_SIZE, READING_BODY (since body_started_s) or
        # neither; `_close_when_idle` ends the reading only in those two waits.
        self.reading: str | None = None
        self.body_started_s, self.body_bytes = 0.0, 0
        self.idle_close_reason: str | None = None  # why `_close_when_idle` ended the reading
