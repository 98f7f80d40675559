"""SaslRequests: the SASL exchange of a SASL listener's connections, as Kafka requests
(the request side of Kafka's SaslServerAuthenticator).

Before a connection on a SASL listener has authenticated, only ApiVersions, SaslHandshake
and SaslAuthenticate may come (`SaslAuthenticator.refusal`; anything else closes it); after
a v0 SaslHandshake the client sends bare size-prefixed tokens instead of SaslAuthenticate
requests. `exchange` answers each SASL step of a frame with the connection's
SaslAuthenticator (rayk/net/sasl.py: PLAIN, SCRAM) and hands every other request back to
be served as usual. A step that succeeds sets the connection's principal, so every
request after it carries it; one that fails is answered, then the connection closes
(`CloseAfter`), after FAILED_AUTHENTICATION_DELAY_S, as Kafka slows down guessing. A
connection that has not authenticated within `sasl.server.authentication.timeout.ms`
is closed (`authentication_deadline`). SCRAM credentials are asked of the Controller,
bounded by CREDENTIALS_TIMEOUT_MS.

One per SocketServer, shared by its connections; holds no state of its own (each
connection's is in its KafkaChannel). Runs on the listener's event loop.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from rayk.errors import KafkaError, SaslAuthenticationFailedError
from rayk.net.api_versions import SASL_AUTHENTICATE, SASL_HANDSHAKE
from rayk.net.broker_view import BrokerView
from rayk.net.codec import Request, encode_response, read_head, response_class
from rayk.net.entities import build
from rayk.net.kafka_channel import ConnectionClosed, KafkaChannel
from rayk.net.request_context import RequestContext

FAILED_AUTHENTICATION_DELAY_S = 0.1  # Kafka's connection.failed.authentication.delay.ms
CREDENTIALS_TIMEOUT_MS = 5_000  # a SASL exchange waits no longer for the Controller
_SIZE = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class CloseAfter:
    """An answer after which the connection closes (a failed SASL exchange)."""

    frame: bytes
    reason: str


class SaslRequests:
    """Answers the SASL steps of a SASL listener's connections; the authentication deadline."""

    def __init__(self, view: BrokerView, decode: Callable[[bytes, RequestContext], Request | bytes]) -> None:
        """`decode`: a frame's request, or the error answer for one that does not decode."""
        self._view = view
        self._decode = decode

    async def exchange(self, connection: KafkaChannel, frame: bytes, pending: set[asyncio.Future]
                       ) -> bytes | CloseAfter | None:
        """On a SASL listener: the answer to a SASL step (a SaslHandshake or SaslAuthenticate
        request, or a bare token after a v0 handshake), or None for any other request, which
        is served as usual; ConnectionClosed for a request the connection may not send yet."""
        sasl = connection.sasl
        assert sasl is not None
        if sasl.raw_tokens:
            return await self._raw_answer(connection, frame)
        if len(frame) < 8:
            return None  # no header: the decoding closes the connection
        refusal = sasl.refusal(read_head(frame).api_key)
        if refusal is not None:
            raise ConnectionClosed(refusal)
        if read_head(frame).api_key not in (SASL_HANDSHAKE, SASL_AUTHENTICATE):
            return None
        request = self._decode(frame, connection.context)
        if not isinstance(request, Request):
            return request  # its error answer
        if pending:  # authentication changes the principal of every request after it
            await asyncio.wait(pending)
        return await self._answer(connection, request)

    async def _answer(self, connection: KafkaChannel, request: Request) -> bytes | CloseAfter:
        """SaslHandshake or SaslAuthenticate on a SASL listener, answered by the connection's
        authenticator; a failure is answered, then the connection closed (after
        FAILED_AUTHENTICATION_DELAY_S, as Kafka slows down guessing)."""
        head, sasl = request.head, connection.sasl
        assert sasl is not None
        cls = response_class(head.api_key, head.api_version)
        try:
            if head.api_key == SASL_HANDSHAKE:
                sasl.handshake(request.body.mechanism, raw_tokens=head.api_version == 0)
                values: dict[str, Any] = {"mechanisms": list(sasl.mechanisms)}
            else:
                token, lifetime_ms = await self._authenticate(connection, request.body.auth_bytes)
                values = {"auth_bytes": token, "session_lifetime": lifetime_ms}
            return encode_response(head, build(cls, values))
        except KafkaError as e:
            await asyncio.sleep(FAILED_AUTHENTICATION_DELAY_S)
            values = {"error_code": e.code, "error_message": str(e), "mechanisms": list(sasl.mechanisms)}
            return CloseAfter(encode_response(head, build(cls, values)), str(e))

    async def _raw_answer(self, connection: KafkaChannel, token: bytes) -> bytes | CloseAfter:
        """A bare SASL token (after a v0 SaslHandshake): the server's token, bare; a failure
        cannot be told in this framing, so the connection closes."""
        try:
            reply, _ = await self._authenticate(connection, token)
        except KafkaError as e:
            await asyncio.sleep(FAILED_AUTHENTICATION_DELAY_S)
            return CloseAfter(b"", str(e))
        return _SIZE.pack(len(reply)) + reply

    async def _authenticate(self, connection: KafkaChannel, token: bytes) -> tuple[bytes, int]:
        """One SASL step; once it authenticates, every request after it carries the principal."""
        sasl = connection.sasl
        assert sasl is not None
        reply = await sasl.authenticate(token)
        if sasl.principal is not None:
            connection.context = replace(connection.context, principal=sasl.principal)
            connection.authenticated.set()  # its next frame is read from the pool, without the deadline
        return reply

    async def scram_credentials(self, user: str) -> dict:
        """A user's SCRAM credentials, asked of the Controller (for a SaslAuthenticator)."""
        try:
            return await self._view.ask_controller("scram_credentials", user, timeout_ms=CREDENTIALS_TIMEOUT_MS)
        except KafkaError as e:
            raise SaslAuthenticationFailedError(f"the credentials of {user!r} could not be read: {e}") from None

    @staticmethod
    async def authentication_deadline(connection: KafkaChannel, timeout_s: float) -> None:
        """Fails with ConnectionClosed unless the connection authenticates within `timeout_s`
        (sasl.server.authentication.timeout.ms): ApiVersions requests, which keep it from
        being idle, do not keep an unauthenticated connection open."""
        try:
            await asyncio.wait_for(connection.authenticated.wait(), timeout_s)
        except TimeoutError:
            raise ConnectionClosed(f"not authenticated within sasl.server.authentication.timeout.ms "
                                   f"({timeout_s * 1000:.0f} ms)") from None
