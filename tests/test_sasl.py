"""SaslAuthenticator (rayk/net/sasl.py) and SCRAM credentials (rayk/scram.py), without a
cluster: scramp's own client authenticates with SCRAM-SHA-256/512, PLAIN checks the
password against the SCRAM credential, and every wrong step fails with Kafka's error."""

from __future__ import annotations

import asyncio
import hashlib

import pytest
import scramp
from hypothesis import given, settings
from hypothesis import strategies as st

from rayk.errors import (
    IllegalSaslStateError,
    SaslAuthenticationFailedError,
    UnacceptableCredentialError,
    UnsupportedSaslMechanismError,
)
from rayk.net.sasl import SaslAuthenticator
from rayk.scram import (
    SCRAM_SHA_256,
    SCRAM_SHA_512,
    credential_from_password,
    credential_from_salted_password,
    password_matches,
)

USERS = {"alice": "alice-secret", "bob,=odd": "b0b"}
CREDENTIALS = {user: {m: credential_from_password(m, password, 4096) for m in (SCRAM_SHA_256, SCRAM_SHA_512)}
               for user, password in USERS.items()}


async def lookup(user: str) -> dict:
    return CREDENTIALS.get(user, {})


def scram_login(authenticator: SaslAuthenticator, mechanism: str, user: str, password: str) -> str | None:
    """Runs a SCRAM exchange with scramp's client; the principal, or raises the failure."""
    async def run() -> None:
        client = scramp.ScramClient([mechanism], user, password)
        authenticator.handshake(mechanism)
        server_first, _ = await authenticator.authenticate(client.get_client_first().encode())
        client.set_server_first(server_first.decode())
        server_final, _ = await authenticator.authenticate(client.get_client_final().encode())
        client.set_server_final(server_final.decode())  # the client checks the server too

    asyncio.run(run())
    return authenticator.principal


@pytest.mark.parametrize("mechanism", [SCRAM_SHA_256, SCRAM_SHA_512])
@pytest.mark.parametrize("user", sorted(USERS))
def test_scram_authenticates_a_user_with_its_password(mechanism, user):
    sasl = SaslAuthenticator((SCRAM_SHA_256, SCRAM_SHA_512), lookup)
    assert sasl.refusal(3) is not None, "nothing but SASL before authentication"
    assert scram_login(sasl, mechanism, user, USERS[user]) == f"User:{user}"
    assert sasl.refusal(3) is None


@pytest.mark.parametrize("user, password", [("alice", "wrong"), ("mallory", "anything")])
def test_a_wrong_password_and_an_unknown_user_fail_alike(user, password):
    sasl = SaslAuthenticator((SCRAM_SHA_512,), lookup)
    with pytest.raises(SaslAuthenticationFailedError, match="invalid credentials with SASL mechanism SCRAM-SHA-512"):
        scram_login(sasl, SCRAM_SHA_512, user, password)
    assert sasl.principal is None


def test_plain_checks_the_password_against_the_scram_credential():
    sasl = SaslAuthenticator(("PLAIN",), lookup)
    sasl.handshake("PLAIN")
    assert asyncio.run(sasl.authenticate(b"\0alice\0alice-secret")) == (b"", 0)
    assert sasl.principal == "User:alice"
    for token in (b"\0alice\0wrong", b"\0nobody\0x", b"bob\0alice\0alice-secret", b"no-separators", b"\xff\0a\0b"):
        fresh = SaslAuthenticator(("PLAIN",), lookup)
        fresh.handshake("PLAIN")
        with pytest.raises(SaslAuthenticationFailedError):
            asyncio.run(fresh.authenticate(token))


def test_out_of_order_and_unknown_mechanisms_are_kafkas_errors():
    sasl = SaslAuthenticator((SCRAM_SHA_512,), lookup)
    with pytest.raises(IllegalSaslStateError):
        asyncio.run(sasl.authenticate(b"n,,n=alice,r=abc"))
    with pytest.raises(UnsupportedSaslMechanismError, match="sasl.enabled.mechanisms"):
        sasl.handshake("PLAIN")
    sasl.handshake(SCRAM_SHA_512)
    with pytest.raises(IllegalSaslStateError):
        sasl.handshake(SCRAM_SHA_512)


def test_a_session_expires_unless_the_client_authenticates_again_as_itself():
    sasl = SaslAuthenticator((SCRAM_SHA_512,), lookup, reauth_ms=200)
    scram_login(sasl, SCRAM_SHA_512, "alice", USERS["alice"])
    assert sasl.refusal(0) is None
    asyncio.run(asyncio.sleep(0.3))
    assert "expired" in sasl.refusal(0)
    scram_login(sasl, SCRAM_SHA_512, "alice", USERS["alice"])  # re-authentication (KIP-368)
    assert sasl.refusal(0) is None
    with pytest.raises(SaslAuthenticationFailedError, match="re-authentication as User:bob"):
        scram_login(sasl, SCRAM_SHA_512, "bob,=odd", USERS["bob,=odd"])
    both = SaslAuthenticator((SCRAM_SHA_256, SCRAM_SHA_512), lookup, reauth_ms=200)
    scram_login(both, SCRAM_SHA_512, "alice", USERS["alice"])
    with pytest.raises(SaslAuthenticationFailedError, match="re-authentication with SCRAM-SHA-256"):
        both.handshake(SCRAM_SHA_256)


def test_a_credential_from_a_salted_password_is_the_one_from_the_password():
    made = credential_from_password(SCRAM_SHA_512, "pw", 4096, b"salt" * 8)
    salted = hashlib.pbkdf2_hmac("sha512", b"pw", b"salt" * 8, 4096)
    assert credential_from_salted_password(SCRAM_SHA_512, b"salt" * 8, salted, 4096) == made
    with pytest.raises(UnacceptableCredentialError):
        credential_from_password(SCRAM_SHA_512, "pw", 1000)
    with pytest.raises(UnsupportedSaslMechanismError):
        credential_from_password("SCRAM-SHA-1", "pw")


@settings(max_examples=20, deadline=None)
@given(st.text(min_size=1, max_size=20), st.text(max_size=20))
def test_plain_accepts_exactly_the_password(password, other):
    """Passwords are salted as their UTF-8 bytes, as Kafka does (no SASLprep): any text is a
    password, and only itself matches ("Ⅸ" is not "IX", a soft hyphen counts)."""
    credential = credential_from_password(SCRAM_SHA_256, password, 4096)
    assert password_matches(credential, password)
    assert password_matches(credential, other) == (other == password)


def test_a_credential_is_what_javas_scram_formatter_makes():
    """Kafka's ScramFormatter: Hi(UTF-8 bytes of the password, salt, i), then the RFC 5802 keys."""
    import hmac

    password, salt = "pa\u00adss Ⅸ", b"\x01" * 16
    salted = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, 4096)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    made = credential_from_password(SCRAM_SHA_256, password, 4096, salt)
    assert made.stored_key == hashlib.sha256(client_key).digest()
    assert made.server_key == hmac.digest(salted, b"Server Key", "sha256")
    assert credential_from_password(SCRAM_SHA_256, "x", 4096, b"").salt == b"", "an empty salt stays empty"


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=200))
def test_garbage_tokens_fail_as_authentication_failures(first, second):
    sasl = SaslAuthenticator((SCRAM_SHA_512,), lookup)
    sasl.handshake(SCRAM_SHA_512)

    async def run() -> None:
        await sasl.authenticate(first)
        await sasl.authenticate(second)

    try:
        asyncio.run(run())
    except SaslAuthenticationFailedError:
        pass
    assert sasl.principal is None
