"""TLS on the Kafka listener: the server's ssl.SSLContext from Kafka's ssl.* settings, and
the principal a client's certificate names.

The keystore is one PEM file with the broker's private key (encrypted with
`ssl.key.password`, or not) and its certificate chain; the truststore is a PEM file of the
CAs a client certificate must chain to. `ssl.client.auth` is Kafka's: `none` asks for no
client certificate, `requested` asks for one and accepts a client without one, `required`
refuses a client without a valid one (mTLS). TLS 1.2 is the oldest version served, as
Kafka's `ssl.enabled.protocols` default (TLSv1.2,TLSv1.3) has it.

A client that presented a certificate is `User:<subject>`, its subject distinguished name
as Java's X500Principal.getName() writes it (RFC 2253: `CN=writer,O=Example`, the most
specific name first), which is what Kafka's default `ssl.principal.mapping.rules` gives:
attributes without an RFC 2253 keyword (emailAddress, serialNumber, ...) are written as
`<OID>=#<hex of the DER value>`. Any other TLS client is `User:ANONYMOUS`.
"""

from __future__ import annotations

import ssl

from rayk.config import BrokerConfig
from rayk.dataplane.tls import listener_keystore, load_cert_chain
from rayk.errors import InvalidConfigurationError
from rayk.net.request_context import ANONYMOUS

_VERIFY_MODES = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def server_context(config: BrokerConfig, listener_name: str) -> ssl.SSLContext:
    """The SSLContext of one TLS listener; InvalidConfigurationError if its files do not
    load (missing, unreadable, a wrong ssl.key.password, a key that does not match)."""
    setting = lambda name: config.listener_setting(listener_name, name)  # noqa: E731
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    load_cert_chain(context, listener_keystore(config, listener_name), f"listener {listener_name}")
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

    subject = x509.load_der_x509_certificate(der_certificate).subject
    rdns = ["+".join(_rfc2253(attribute) for attribute in rdn) for rdn in reversed(subject.rdns)]
    return "User:" + ",".join(rdns)


_RFC2253_KEYWORDS = {"2.5.4.3", "2.5.4.7", "2.5.4.8", "2.5.4.10", "2.5.4.11", "2.5.4.6", "2.5.4.9",
                     "0.9.2342.19200300.100.1.25", "0.9.2342.19200300.100.1.1"}  # CN L ST O OU C STREET DC UID
_UTF8_STRING = 0x0C


def _rfc2253(attribute) -> str:
    if attribute.oid.dotted_string in _RFC2253_KEYWORDS:
        return attribute.rfc4514_string()
    value = attribute.value.encode() if isinstance(attribute.value, str) else bytes(attribute.value)
    kind = getattr(attribute, "_type", None)  # the value's ASN.1 string type, as the certificate has it
    tag = int(getattr(kind, "value", kind) or _UTF8_STRING)
    return f"{attribute.oid.dotted_string}=#{(bytes([tag]) + _der_length(len(value)) + value).hex()}"


def _der_length(length: int) -> bytes:
    if length < 0x80:
        return bytes([length])
    encoded = length.to_bytes((length.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(encoded)]) + encoded
