"""TLS on the Kafka listener: the server's ssl.SSLContext from Kafka's ssl.* settings, and
the principal a client's certificate names.

The keystore is one PEM file with the broker's private key (encrypted with
`ssl.key.password`, or not) and its certificate chain; the truststore is a PEM file of the
CAs a client certificate must chain to. `ssl.client.auth` is Kafka's: `none` asks for no
client certificate, `requested` asks for one and accepts a client without one, `required`
refuses a client without a valid one (mTLS). TLS 1.2 is the oldest version served, as
Kafka's `ssl.enabled.protocols` default (TLSv1.2,TLSv1.3) has it.

A client that presented a certificate is `User:<subject>`, its subject distinguished name
as RFC 4514 writes it (`CN=writer,O=Example`), which is what Kafka's default
`ssl.principal.mapping.rules` gives; any other TLS client is `User:ANONYMOUS`.
"""

from __future__ import annotations

import ssl

from rayk.config import BrokerConfig
from rayk.errors import InvalidConfigurationError
from rayk.net.request_context import ANONYMOUS

_VERIFY_MODES = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def server_context(config: BrokerConfig, listener_name: str) -> ssl.SSLContext:
    """The SSLContext of one TLS listener; InvalidConfigurationError if its files do not
    load (missing, unreadable, a wrong ssl.key.password, a key that does not match)."""
    setting = lambda name: config.listener_setting(listener_name, name)  # noqa: E731
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    keystore = setting("ssl.keystore.location")
    try:
        context.load_cert_chain(keystore, password=setting("ssl.key.password") or None)
    except (OSError, ssl.SSLError) as e:
        raise InvalidConfigurationError(
            f"listener {listener_name}: ssl.keystore.location {keystore!r} does not load as a PEM private key and "
            f"certificate chain (check the file and ssl.key.password): {e}"
        ) from None
    truststore = setting("ssl.truststore.location")
    if truststore:
        try:
            context.load_verify_locations(cafile=truststore)
        except (OSError, ssl.SSLError) as e:
            raise InvalidConfigurationError(
                f"listener {listener_name}: ssl.truststore.location {truststore!r} does not load as PEM certificates: {e}"
            ) from None
    context.verify_mode = _VERIFY_MODES[setting("ssl.client.auth")]
    return context


def certificate_principal(der_certificate: bytes | None) -> str:
    """`User:<subject DN>` of a client certificate (DER), or User:ANONYMOUS without one."""
    if not der_certificate:
        return ANONYMOUS
    from cryptography import x509  # only listeners that see client certificates load it

    return "User:" + x509.load_der_x509_certificate(der_certificate).subject.rfc4514_string()
