"""SCRAM (RFC 5802, 7677) as Kafka does it: credentials, and the server's side of an
exchange.

A credential is, per user and mechanism, a salt, an iteration count, and the StoredKey
and ServerKey derived from the salted password; the password itself is never kept. It is
made from a password (the Python Admin, `rayk users`) or from a salted password (the
AlterUserScramCredentials API, whose clients salt it themselves), and checked against a
password for SASL/PLAIN. A password is salted as its UTF-8 bytes, without SASLprep, as
Kafka's ScramFormatter does, so credentials made by Java or librdkafka admin clients and
by rayk agree for every password.

`ScramServerExchange` is the server's two rounds. It is written here rather than taken
from scramp because Kafka's server accepts a client-final nonce that *ends with* the
combined nonce (RFC 5802 wants it equal), and librdkafka up to 2.0 (Debian's kcat) sends
its client nonce twice there; scramp, rightly strict, refuses those clients. The proof is
checked over the messages as the client sent them, so this leniency admits no one
without the password.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass

from rayk.errors import SaslAuthenticationFailedError, UnacceptableCredentialError, UnsupportedSaslMechanismError

SCRAM_SHA_256, SCRAM_SHA_512 = "SCRAM-SHA-256", "SCRAM-SHA-512"
MECHANISMS = {SCRAM_SHA_256: "sha256", SCRAM_SHA_512: "sha512"}  # name -> hash
WIRE_MECHANISMS = {1: SCRAM_SHA_256, 2: SCRAM_SHA_512}  # Kafka's ScramMechanism type codes
MIN_ITERATIONS, MAX_ITERATIONS = 4096, 16384  # Kafka's bounds
DEFAULT_ITERATIONS = 8192


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """One user's credential for one mechanism (SCRAM-SHA-256 or -512): the salt, the
    iteration count, and the StoredKey and ServerKey derived from the salted password, which
    is never kept. What the Controller stores and a listener checks a login against."""

    mechanism: str
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


def check_mechanism_and_iterations(mechanism: str, iterations: int) -> None:
    if mechanism not in MECHANISMS:
        raise UnsupportedSaslMechanismError(f"unknown SCRAM mechanism {mechanism!r}; rayk has {', '.join(MECHANISMS)}")
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise UnacceptableCredentialError(f"iterations must be {MIN_ITERATIONS}..{MAX_ITERATIONS}, got {iterations}")


def credential_from_password(mechanism: str, password: str, iterations: int = DEFAULT_ITERATIONS,
                             salt: bytes | None = None) -> ScramCredential:
    check_mechanism_and_iterations(mechanism, iterations)
    salt = os.urandom(32) if salt is None else salt
    salted = hashlib.pbkdf2_hmac(MECHANISMS[mechanism], password.encode(), salt, iterations)  # RFC 5802's Hi()
    return credential_from_salted_password(mechanism, salt, salted, iterations)


def credential_from_salted_password(mechanism: str, salt: bytes, salted_password: bytes, iterations: int) -> ScramCredential:
    """RFC 5802: ClientKey = HMAC(SaltedPassword, "Client Key"), StoredKey = H(ClientKey),
    ServerKey = HMAC(SaltedPassword, "Server Key")."""
    check_mechanism_and_iterations(mechanism, iterations)
    digest = MECHANISMS[mechanism]
    client_key = hmac.digest(salted_password, b"Client Key", digest)
    stored_key = hashlib.new(digest, client_key).digest()
    server_key = hmac.digest(salted_password, b"Server Key", digest)
    return ScramCredential(mechanism, bytes(salt), stored_key, server_key, iterations)


def password_matches(credential: ScramCredential, password: str) -> bool:
    """SASL/PLAIN: whether `password` is the one `credential` was made from (a PBKDF2 of
    its iterations: run it off the event loop)."""
    again = credential_from_password(credential.mechanism, password, credential.iterations, credential.salt)
    return hmac.compare_digest(again.stored_key, credential.stored_key)


class ScramServerExchange:
    """One SCRAM exchange, server side: `first` answers the client-first message with the
    user's credential, `final` checks the client's proof and answers with the server's
    signature. Any flaw raises SaslAuthenticationFailedError."""

    def __init__(self, mechanism: str) -> None:
        self.mechanism = mechanism
        self._digest = MECHANISMS[mechanism]
        self._credential: ScramCredential | None = None
        self._client_first_bare = self._server_first = self._nonce = ""

    @staticmethod
    def user_of(client_first: str) -> str:
        """The user a client-first message (`n,,n=<saslname>,r=<nonce>`) names, unescaped."""
        return _attributes(_client_first_bare(client_first)).get("n", "").replace("=2C", ",").replace("=3D", "=")

    def first(self, client_first: str, credential: ScramCredential) -> str:
        bare = _client_first_bare(client_first)
        client_nonce = _attributes(bare).get("r", "")
        if not client_nonce:
            raise _flaw("the client-first message has no nonce")
        self._credential, self._client_first_bare = credential, bare
        self._nonce = client_nonce + secrets.token_urlsafe(24)
        self._server_first = f"r={self._nonce},s={base64.b64encode(credential.salt).decode()},i={credential.iterations}"
        return self._server_first

    def final(self, client_final: str) -> str:
        credential = self._credential
        if credential is None:
            raise _flaw("client-final before client-first")
        without_proof, sep, proof_text = client_final.rpartition(",p=")
        nonce = _attributes(without_proof).get("r", "")
        if not sep or not nonce.endswith(self._nonce):  # Kafka's check: see the module docstring
            raise _flaw("the client-final message does not carry the exchange's nonce")
        try:
            proof = base64.b64decode(proof_text, validate=True)
        except ValueError:
            raise _flaw("the client proof is not base64") from None
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        client_signature = hmac.digest(credential.stored_key, auth_message, self._digest)
        if len(proof) != len(client_signature):
            raise _flaw("the client proof has the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature))
        if not hmac.compare_digest(hashlib.new(self._digest, client_key).digest(), credential.stored_key):
            raise _flaw("the client proof does not match")
        server_signature = hmac.digest(credential.server_key, auth_message, self._digest)
        return "v=" + base64.b64encode(server_signature).decode()


def _client_first_bare(client_first: str) -> str:
    """The message after its GS2 header; channel binding ("p=...") is refused, as Kafka does."""
    flag, _, rest = client_first.partition(",")
    _authzid, sep, bare = rest.partition(",")
    if flag not in ("n", "y") or not sep:
        raise _flaw("the client-first message has no GS2 header, or asks for channel binding")
    return bare


def _attributes(message: str) -> dict[str, str]:
    return {part[0]: part[2:] for part in message.split(",") if len(part) >= 2 and part[1] == "="}


def _flaw(reason: str) -> SaslAuthenticationFailedError:
    return SaslAuthenticationFailedError(f"SCRAM: {reason}")
