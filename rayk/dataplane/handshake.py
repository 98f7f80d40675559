"""The data plane's handshake: both ends prove they hold the endpoint's secret (HMAC-SHA256
challenge-response) before a single frame is read.

The secret is made by the endpoint when it opens and handed to its peers through Ray (the
endpoint's owner returns it with its address from an actor call), so only processes that
can call rayk's actors, the cluster's own, can learn it. It never crosses the data plane.

  endpoint -> peer:  MAGIC, nonce_e (32 random bytes)
  peer -> endpoint:  nonce_p (32 random bytes), HMAC(secret, "peer" nonce_e nonce_p)
  endpoint -> peer:  HMAC(secret, "endpoint" nonce_e nonce_p)

The endpoint reads exactly the peer's 64 bytes, and closes the connection if they are not
the right proof; the peer in turn refuses an endpoint that cannot prove the secret (a
process that took over a dead replica's port). Fresh nonces on both sides make a recorded
exchange useless.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets

from rayk.dataplane.frame_reader import FrameReader

MAGIC = b"rayk-dataplane-2"  # 2: answers carry their outcome (frames.py)
NONCE_BYTES = 32
PROOF_BYTES = hashlib.sha256().digest_size
SECRET_BYTES = 32
HANDSHAKE_TIMEOUT_MS = 5_000  # how long a connecting peer waits for the endpoint's greeting and proof


class HandshakeError(ConnectionError):
    """The other end did not prove it holds the secret, or does not speak the data plane."""


def new_secret() -> bytes:
    return secrets.token_bytes(SECRET_BYTES)


def _proof(secret: bytes, role: bytes, endpoint_nonce: bytes, peer_nonce: bytes) -> bytes:
    return hmac.new(secret, role + endpoint_nonce + peer_nonce, hashlib.sha256).digest()


async def accept(reader: asyncio.StreamReader | FrameReader, writer: asyncio.StreamWriter, secret: bytes) -> None:
    """The endpoint's side; raises HandshakeError (or a connection error). Unbounded: the
    endpoint bounds it (its HANDSHAKE_TIMEOUT_S, and sooner if it lets the stranger go)."""
    endpoint_nonce = secrets.token_bytes(NONCE_BYTES)
    writer.write(MAGIC + endpoint_nonce)
    answer = bytes(await reader.readexactly(NONCE_BYTES + PROOF_BYTES))
    peer_nonce, proof = answer[:NONCE_BYTES], answer[NONCE_BYTES:]
    if not hmac.compare_digest(proof, _proof(secret, b"peer", endpoint_nonce, peer_nonce)):
        raise HandshakeError("the peer's proof of the data plane secret is wrong")
    writer.write(_proof(secret, b"endpoint", endpoint_nonce, peer_nonce))


async def connect(reader: asyncio.StreamReader | FrameReader, writer: asyncio.StreamWriter, secret: bytes) -> None:
    """The connecting peer's side; raises HandshakeError (or a timeout / connection error)."""
    async with asyncio.timeout(HANDSHAKE_TIMEOUT_MS / 1000):
        greeting = bytes(await reader.readexactly(len(MAGIC) + NONCE_BYTES))
        if greeting[: len(MAGIC)] != MAGIC:
            raise HandshakeError("the endpoint does not speak rayk's data plane")
        endpoint_nonce = greeting[len(MAGIC):]
        peer_nonce = secrets.token_bytes(NONCE_BYTES)
        writer.write(peer_nonce + _proof(secret, b"peer", endpoint_nonce, peer_nonce))
        proof = bytes(await reader.readexactly(PROOF_BYTES))
    if not hmac.compare_digest(proof, _proof(secret, b"endpoint", endpoint_nonce, peer_nonce)):
        raise HandshakeError("the endpoint's proof of the data plane secret is wrong")
