"""Kafka's listener settings (rayk/listeners.py) and the TLS settings of a listener
(rayk/config.py, rayk/net/tls.py), without a cluster."""

from __future__ import annotations

import ssl

import pytest
import trustme
from hypothesis import given
from hypothesis import strategies as st

from rayk.config import BrokerConfig
from rayk.errors import InvalidConfigurationError
from rayk.listeners import Listener, broker_port, parse_listeners
from rayk.net.tls import certificate_principal, server_context


def test_one_listener_per_entry_in_order_with_kafkas_default_protocol_map():
    assert parse_listeners("PLAINTEXT://:9092") == (Listener("PLAINTEXT", "PLAINTEXT", "", 9092),)
    assert parse_listeners("ssl://10.0.0.1:0,PLAINTEXT://[::1]:9092") == (
        Listener("SSL", "SSL", "10.0.0.1", 0),
        Listener("PLAINTEXT", "PLAINTEXT", "::1", 9092),
    )
    assert parse_listeners("") == ()
    assert broker_port(9092, 2) == 9094 and broker_port(0, 2) == 0


def test_named_listeners_take_their_protocol_from_the_map_and_their_advertised_address():
    listeners = parse_listeners(
        "INTERNAL://127.0.0.1:9092,EXTERNAL://0.0.0.0:9192",
        "EXTERNAL://kafka.example.com:19192",
        "INTERNAL:PLAINTEXT,external:sasl_ssl",
    )
    assert listeners == (
        Listener("INTERNAL", "PLAINTEXT", "127.0.0.1", 9092),
        Listener("EXTERNAL", "SASL_SSL", "0.0.0.0", 9192, "kafka.example.com", 19192),
    )
    assert not listeners[0].uses_tls and listeners[1].uses_tls and listeners[1].uses_sasl


@pytest.mark.parametrize("listeners, advertised, protocol_map, complaint", [
    ("PLAINTEXT://h", "", None, "NAME://host:port"),
    ("PLAINTEXT://h:70000", "", None, "0..65535"),
    ("PLAINTEXT://a:1,plaintext://b:2", "", None, "twice"),
    ("A://:9092,B://:9092", "", "A:PLAINTEXT,B:SSL", "one port"),
    ("INTERNAL://:9092", "", None, "no security protocol"),
    ("INTERNAL://:9092", "", "INTERNAL:TLS", "NAME:PROTOCOL"),
    ("INTERNAL://:9092", "", "INTERNAL:SSL,INTERNAL:PLAINTEXT", "twice"),
    ("PLAINTEXT://:9092", "SSL://h:1", None, "which listeners does not"),
])
def test_bad_listener_settings_are_refused_naming_the_setting(listeners, advertised, protocol_map, complaint):
    with pytest.raises(InvalidConfigurationError, match=complaint):
        parse_listeners(listeners, advertised, *([protocol_map] if protocol_map else []))


names = st.text("ABCDEFGHIJKLMNOPQRSTUVWXYZ_", min_size=1, max_size=10)


@given(st.dictionaries(names, st.tuples(st.sampled_from(["", "127.0.0.1", "h.example"]), st.integers(1, 65535)),
                       min_size=1, max_size=4),
       st.sampled_from(["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]))
def test_listeners_written_out_parse_back(addresses, protocol):
    ports = [port for _, port in addresses.values()]
    text = ",".join(f"{name}://{host}:{port}" for name, (host, port) in addresses.items())
    protocol_map = ",".join(f"{name.lower()}:{protocol}" for name in addresses)
    if len(set(ports)) < len(ports):
        with pytest.raises(InvalidConfigurationError):
            parse_listeners(text, "", protocol_map)
        return
    parsed = parse_listeners(text, "", protocol_map)
    assert [(l.name, l.host, l.base_port, l.security_protocol) for l in parsed] == [
        (name, host, port, protocol) for name, (host, port) in addresses.items()
    ]


# ---------------------------------------------------------------------------- TLS settings


@pytest.fixture(scope="module")
def ca(tls) -> trustme.CA:
    return tls.ca


@pytest.fixture(scope="module")
def keystore(tls) -> str:
    return tls.keystore


@pytest.fixture(scope="module")
def truststore(tls) -> str:
    return tls.truststore


def test_a_tls_listener_needs_a_pem_keystore_and_client_auth_needs_a_truststore(keystore, truststore):
    with pytest.raises(InvalidConfigurationError, match="ssl.keystore.location"):
        BrokerConfig.from_properties({"listeners": "SSL://:0"})
    with pytest.raises(InvalidConfigurationError, match="PEM files only"):
        BrokerConfig.from_properties({"listeners": "SSL://:0", "ssl.keystore.location": keystore, "ssl.keystore.type": "JKS"})
    with pytest.raises(InvalidConfigurationError, match="ssl.truststore.location"):
        BrokerConfig.from_properties({"listeners": "SSL://:0", "ssl.keystore.location": keystore, "ssl.client.auth": "required"})
    with pytest.raises(InvalidConfigurationError, match="ssl.client.auth"):
        BrokerConfig.from_properties({"listeners": "SSL://:0", "ssl.keystore.location": keystore, "ssl.client.auth": "maybe"})
    BrokerConfig.from_properties({"listeners": "PLAINTEXT://:0", "ssl.client.auth": "required"})  # no TLS listener: unused
    sasl = {"listeners": "SASL_SSL://:0", "ssl.keystore.location": keystore}
    assert BrokerConfig.from_properties(sasl).sasl_mechanisms("SASL_SSL") == ("SCRAM-SHA-256", "SCRAM-SHA-512")
    for mechanisms in ("GSSAPI", "", "PLAIN,OAUTHBEARER"):
        with pytest.raises(InvalidConfigurationError, match="sasl.enabled.mechanisms"):
            BrokerConfig.from_properties({**sasl, "sasl.enabled.mechanisms": mechanisms})
    with pytest.raises(InvalidConfigurationError, match="ssl.keystore.location"):
        BrokerConfig.from_properties({"listeners": "SASL_SSL://:0"})  # SASL_SSL is TLS too


def test_per_listener_settings_override_the_brokers_own(keystore, truststore):
    config = BrokerConfig.from_properties({
        "listeners": "PUBLIC://:0,MTLS://:0",
        "listener.security.protocol.map": "PUBLIC:SSL,MTLS:SSL",
        "ssl.keystore.location": keystore,
        "listener.name.MTLS.ssl.client.auth": "required",
        "listener.name.mtls.ssl.truststore.location": truststore,
    })
    assert config.listener_setting("PUBLIC", "ssl.client.auth") == "none"
    assert config.listener_setting("MTLS", "ssl.client.auth") == "required"
    assert server_context(config, "PUBLIC").verify_mode == ssl.CERT_NONE
    assert server_context(config, "MTLS").verify_mode == ssl.CERT_REQUIRED
    with pytest.raises(InvalidConfigurationError, match="per-listener settings"):
        BrokerConfig.from_properties({"listener.name.mtls.num.partitions": "3"})


def test_passwords_stay_out_of_the_configs_repr(keystore):
    config = BrokerConfig.from_properties({"ssl.key.password": "s3cret", "listener.name.x.ssl.key.password": "s3cret"})
    assert "s3cret" not in repr(config)


def test_an_encrypted_key_loads_with_its_password_and_a_wrong_one_is_a_config_error(ca, tmp_path):
    from cryptography.hazmat.primitives import serialization

    cert = ca.issue_cert("127.0.0.1")
    key = serialization.load_pem_private_key(cert.private_key_pem.bytes(), password=None)
    encrypted = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.BestAvailableEncryption(b"key-pass"))
    path = tmp_path / "server.pem"
    path.write_bytes(encrypted + b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    props = {"listeners": "SSL://:0", "ssl.keystore.location": str(path)}
    server_context(BrokerConfig.from_properties({**props, "ssl.key.password": "key-pass"}), "SSL")
    with pytest.raises(InvalidConfigurationError, match="ssl.key.password"):
        server_context(BrokerConfig.from_properties({**props, "ssl.key.password": "wrong"}), "SSL")
    with pytest.raises(InvalidConfigurationError, match="does not load"):
        server_context(BrokerConfig.from_properties({**props, "ssl.keystore.location": str(tmp_path / "missing.pem")}), "SSL")


def test_a_client_certificate_names_its_subject_as_kafka_writes_it(ca):
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    cert = ca.issue_cert("client.example", organization_name="Analytics, Inc", common_name="writer")
    der = x509.load_pem_x509_certificate(cert.cert_chain_pems[0].bytes()).public_bytes(Encoding.DER)
    principal = certificate_principal(der)
    assert principal.startswith("User:CN=writer,")
    assert "O=Analytics\\, Inc" in principal  # RFC 4514 escapes, most specific name first
    assert certificate_principal(None) == certificate_principal(b"") == "User:ANONYMOUS"


def test_attributes_without_an_rfc2253_keyword_are_written_as_java_writes_them(ca):
    """X500Principal.getName(): `<OID>=#<hex of the DER value>` for emailAddress and the like."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import Encoding
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Example"),
                      x509.NameAttribute(NameOID.EMAIL_ADDRESS, "w@example.com"),
                      x509.NameAttribute(NameOID.COMMON_NAME, "writer")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    email = b"w@example.com"
    expected = f"User:CN=writer,1.2.840.113549.1.9.1=#16{len(email):02x}{email.hex()},O=Example"  # IA5String
    assert certificate_principal(cert.public_bytes(Encoding.DER)) == expected


def test_describe_configs_names_passwords_but_never_shows_them():
    from types import SimpleNamespace

    from rayk.net.admin_apis import _broker_configs

    config = BrokerConfig.from_properties({"ssl.key.password": "s3cret", "listener.name.x.ssl.key.password": "p4ss"})
    described = {c["name"]: c for c in _broker_configs(SimpleNamespace(config=config))}
    for name in ("ssl.key.password", "listener.name.x.ssl.key.password"):
        assert described[name]["is_sensitive"] and described[name]["value"] is None
    assert described["ssl.client.auth"]["value"] == "none" and not described["ssl.client.auth"]["is_sensitive"]
    assert "listener.overrides" not in described
