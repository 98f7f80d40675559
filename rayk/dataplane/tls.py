"""TLS on the data plane's TCP connections, for a cluster whose Kafka listeners use TLS.

The endpoint presents the brokers' own certificate (the first TLS listener's
`ssl.keystore.location`: one PEM file with the private key and its chain, as the listener
loads it). A peer does not check it against a CA and a host name: it pins it. The
endpoint hands its leaf certificate out through Ray with its address and secret
(`EndpointAddress.tls_certificate`), and the peer's context trusts that certificate alone
(OpenSSL's partial-chain flag makes a CA-signed leaf a trust anchor). Trust therefore comes
from where the secret comes from, Ray, and holds whatever name the node's address has.

Unix sockets stay plain: their bytes never leave the node, and the HMAC handshake
(handshake.py) already keeps other processes out of them.
"""

from __future__ import annotations

import functools
import re
import ssl
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rayk.errors import InvalidConfigurationError

if TYPE_CHECKING:
    from rayk.config import BrokerConfig

HANDSHAKE_TIMEOUT_S = 5.0  # a peer's wait for its TLS handshake; the endpoint bounds its side (endpoint.py)
# A PEM block; OpenSSL takes the first one labelled as a certificate as the leaf it serves.
_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----.+?-----END \1-----\s*", re.DOTALL)
LOAD_ATTEMPTS = 3


@dataclass(frozen=True, slots=True)
class KeyStore:
    """Where an endpoint's key and certificate chain are (Kafka's ssl.keystore.location and
    ssl.key.password of the listener it follows)."""

    location: str
    password: str = field(default="", repr=False)


def listener_keystore(config: BrokerConfig, listener_name: str) -> KeyStore:
    """The key and certificate chain that the TLS listener `listener_name` serves."""
    setting = lambda name: config.listener_setting(listener_name, name)  # noqa: E731
    return KeyStore(setting("ssl.keystore.location"), setting("ssl.key.password"))


def data_plane_keystore(config: BrokerConfig) -> KeyStore | None:
    """What the data plane's TCP endpoints serve: the first TLS listener's keystore, or
    None (plain TCP) when no listener uses TLS."""
    listener = next((listener for listener in config.kafka_listeners() if listener.uses_tls), None)
    return listener_keystore(config, listener.name) if listener is not None else None


def load_cert_chain(context: ssl.SSLContext, keystore: KeyStore, owner: str) -> None:
    """`context` serves `keystore`'s key and chain; InvalidConfigurationError, naming
    `owner` (a listener, say), if it does not load."""
    try:
        context.load_cert_chain(keystore.location, password=keystore.password or None)
    except (OSError, ssl.SSLError) as e:
        raise InvalidConfigurationError(
            f"{owner}: ssl.keystore.location {keystore.location!r} does not load as a PEM private key and "
            f"certificate chain (check the file and ssl.key.password): {e}"
        ) from None


def server_context(keystore: KeyStore) -> tuple[ssl.SSLContext, str]:
    """(The endpoint's server context, its leaf certificate as PEM for its peers to pin).
    The file is read before and after OpenSSL loads it, and loaded again if it changed in
    between (a certificate rotated then), so the certificate given out is the one served."""
    for _ in range(LOAD_ATTEMPTS):
        before = _read(keystore)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        load_cert_chain(context, keystore, "the data plane")
        if _read(keystore) == before:
            return context, _leaf_certificate(before, keystore)
    raise InvalidConfigurationError(f"ssl.keystore.location {keystore.location!r} kept changing while it was loaded")


def _read(keystore: KeyStore) -> bytes:
    try:
        with open(keystore.location, "rb") as f:
            return f.read()
    except OSError as e:
        raise InvalidConfigurationError(f"ssl.keystore.location {keystore.location!r} cannot be read: {e}") from None


def _leaf_certificate(pem: bytes, keystore: KeyStore) -> str:
    """The certificate OpenSSL serves from `pem`: its first certificate block."""
    for block in _PEM_BLOCK.finditer(pem):
        label = block.group(1)
        if label.endswith(b"CERTIFICATE"):
            if label != b"CERTIFICATE":  # TRUSTED / X509 CERTIFICATE: not one a peer's context can pin
                break
            return block.group(0).decode("ascii")
    raise InvalidConfigurationError(
        f"ssl.keystore.location {keystore.location!r}: its first certificate is not a PEM 'CERTIFICATE' block"
    )


@functools.lru_cache(maxsize=64)
def client_context(certificate_pem: str) -> ssl.SSLContext:
    """A context that accepts exactly the endpoint whose certificate is `certificate_pem`."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False  # the certificate itself is pinned: the node's name is not what is trusted
    context.verify_mode = ssl.CERT_REQUIRED
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    context.load_verify_locations(cadata=certificate_pem)
    return context
