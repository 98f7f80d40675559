"""SaslAuthenticator: one connection's SASL exchange on a SASL_PLAINTEXT or SASL_SSL
listener (Kafka's SaslServerAuthenticator).

A client sends SaslHandshake naming a mechanism, then SaslAuthenticate requests
carrying the mechanism's tokens; after a v0 SaslHandshake (clients older than Kafka 1.0's,
and librdkafka up to 2.0 checks that v0 is served) the tokens travel as bare
size-prefixed frames instead (`raw_tokens`). Until it has authenticated, a connection may send only
ApiVersions and those two; anything else closes it, as in Kafka, and the listener reads
its frames outside the request pool, each at most `sasl.server.max.receive.size`, and
closes it if `principal` is not set within `sasl.server.authentication.timeout.ms`
(rayk/net/socket_server.py). Mechanisms:
- PLAIN (RFC 4616): the password is checked against the user's SCRAM credential (no
  password is stored anywhere, see rayk/scram.py);
- SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, 7677; rayk/scram.py).
A user is `User:<name>`. An unknown mechanism gets UNSUPPORTED_SASL_MECHANISM, failed
credentials SASL_AUTHENTICATION_FAILED (an unknown user is not told apart from a wrong
password), a request out of order ILLEGAL_SASL_STATE; each then closes the connection.

Re-authentication (KIP-368): with `connections.max.reauth.ms` > 0 a session lasts that
long (SaslAuthenticate v1+ tells the client); the client authenticates again on the same
connection, as the same principal with the same mechanism, before it ends, or its next
request closes the connection.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from rayk.errors import (
    IllegalSaslStateError,
    KafkaError,
    SaslAuthenticationFailedError,
    UnsupportedSaslMechanismError,
)
from rayk.net.api_versions import API_VERSIONS, SASL_AUTHENTICATE, SASL_HANDSHAKE
from rayk.scram import MECHANISMS as SCRAM_MECHANISMS
from rayk.scram import SCRAM_SHA_512, ScramCredential, ScramServerExchange, credential_from_password, password_matches

PLAIN = "PLAIN"
SASL_MECHANISMS = (PLAIN, *SCRAM_MECHANISMS)
BEFORE_AUTHENTICATION = (API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE)  # what an unauthenticated client may send

Credentials = Callable[[str], Awaitable[dict[str, ScramCredential]]]  # user -> its credentials by mechanism
# What PLAIN checks an unknown user's password against: as costly as a real credential.
_UNKNOWN_USER = credential_from_password(SCRAM_SHA_512, "", 8192, b"\0" * 32)


class SaslAuthenticator:
    """One connection's SASL state: the mechanism chosen, a SCRAM exchange between its rounds,
    and once authenticated the principal and when its session expires. Made by the
    SocketServer for each connection to a SASL listener, lives as long as the connection;
    not thread-safe (the listener's event loop)."""

    def __init__(self, mechanisms: tuple[str, ...], credentials: Credentials, reauth_ms: int = 0) -> None:
        self.mechanisms = mechanisms
        self._credentials = credentials
        self._reauth_ms = reauth_ms
        self.principal: str | None = None  # once authenticated
        self._expires_s: float | None = None  # when the session ends (re-authentication)
        self._mechanism: str | None = None  # chosen by a handshake, its exchange not finished
        self._scram: ScramServerExchange | None = None  # between the two SCRAM rounds
        self._scram_user = ""
        self.raw_tokens = False  # a v0 handshake: the next frames are bare tokens until done
        self._session_mechanism: str | None = None  # what authenticated the principal; re-authentication keeps it

    def refusal(self, api_key: int) -> str | None:
        """Why a request of `api_key` closes the connection now, or None."""
        if api_key in BEFORE_AUTHENTICATION:
            return None
        if self.principal is None:
            return f"API key {api_key} before SASL authentication"
        if self._expires_s is not None and time.monotonic() > self._expires_s:
            return "its SASL session expired (connections.max.reauth.ms) without re-authentication"
        return None

    def handshake(self, mechanism: str, raw_tokens: bool = False) -> None:
        """SaslHandshake (v0: `raw_tokens`); UNSUPPORTED_SASL_MECHANISM or ILLEGAL_SASL_STATE."""
        if self._mechanism is not None:
            raise IllegalSaslStateError("SaslHandshake in the middle of an authentication")
        if self.principal is not None and mechanism != self._session_mechanism:
            raise SaslAuthenticationFailedError(
                f"re-authentication with {mechanism} on a connection authenticated with {self._session_mechanism}")
        if mechanism not in self.mechanisms:
            raise UnsupportedSaslMechanismError(
                f"{mechanism!r} is not enabled on this listener (sasl.enabled.mechanisms: {', '.join(self.mechanisms)})"
            )
        self._mechanism = mechanism
        self.raw_tokens = raw_tokens

    async def authenticate(self, token: bytes) -> tuple[bytes, int]:
        """One SaslAuthenticate: the server's token, and the session's lifetime in ms once
        authenticated (0: no limit, or not done yet). Raises the KafkaError that ends it."""
        if self._mechanism is None:
            raise IllegalSaslStateError("SaslAuthenticate without a SaslHandshake before it")
        try:
            if self._mechanism == PLAIN:
                user = await self._plain(token)
                return b"", self._done(user)
            if self._scram is None:
                return await self._scram_first(token), 0
            return self._scram_final(token), self._done(self._scram_user)
        except KafkaError:
            self._mechanism = None
            self.raw_tokens = False
            raise

    async def _plain(self, token: bytes) -> str:
        """The user, once its password matches its SCRAM credential. The PBKDF2 runs in a
        thread (it releases the GIL), not on the listener's event loop; an unknown user is
        checked against a stand-in credential, so it costs what a wrong password costs."""
        authzid, user, password = _split_plain(token)
        if authzid and authzid != user:
            raise SaslAuthenticationFailedError("PLAIN: authorization id must be empty or the user name")
        credentials = await self._credentials(user)
        credential = credentials.get(SCRAM_SHA_512) or next(iter(credentials.values()), _UNKNOWN_USER)
        if not await asyncio.to_thread(password_matches, credential, password) or credential is _UNKNOWN_USER:
            raise _failed(PLAIN)
        return user

    async def _scram_first(self, token: bytes) -> bytes:
        message = _text(token, self._mechanism)
        user = ScramServerExchange.user_of(message)
        credential = (await self._credentials(user)).get(self._mechanism) if user else None
        if credential is None:
            raise _failed(self._mechanism)
        self._scram, self._scram_user = ScramServerExchange(self._mechanism), user
        return self._scram.first(message, credential).encode()

    def _scram_final(self, token: bytes) -> bytes:
        exchange, self._scram = self._scram, None
        try:
            return exchange.final(_text(token, self._mechanism)).encode()
        except SaslAuthenticationFailedError:
            raise _failed(self._mechanism) from None

    def _done(self, user: str) -> int:
        principal = f"User:{user}"
        self._session_mechanism = self._mechanism
        self._mechanism = None
        self.raw_tokens = False
        if self.principal is not None and principal != self.principal:
            raise SaslAuthenticationFailedError(f"re-authentication as {principal} on a connection of {self.principal}")
        self.principal = principal
        if self._reauth_ms > 0:
            self._expires_s = time.monotonic() + self._reauth_ms / 1000
        return self._reauth_ms


def _failed(mechanism: str | None) -> SaslAuthenticationFailedError:
    return SaslAuthenticationFailedError(
        f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"
    )


def _text(token: bytes, mechanism: str | None) -> str:
    try:
        return bytes(token).decode()
    except UnicodeDecodeError:
        raise _failed(mechanism) from None


def _split_plain(token: bytes) -> tuple[str, str, str]:
    parts = _text(token, PLAIN).split("\0")
    if len(parts) != 3 or not parts[1]:
        raise SaslAuthenticationFailedError("PLAIN: expected authzid NUL user NUL password")
    return parts[0], parts[1], parts[2]
