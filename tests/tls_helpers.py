"""Certificates made for a test run with trustme (never checked in): a CA, the broker's
PEM keystore (private key + chain) and truststore, and a client certificate for mTLS."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme

CLIENT_SUBJECT = "CN=writer,OU=kafka clients,O=rayk tests"  # the client certificate's subject, RFC 4514


@dataclass(frozen=True)
class TlsFiles:
    ca: trustme.CA
    keystore: str  # the broker's key and certificate chain (ssl.keystore.location)
    truststore: str  # the CA (ssl.truststore.location; a client's ssl.ca.location)
    client_cert: str  # a client certificate signed by the CA, subject CLIENT_SUBJECT
    client_key: str


def write_tls_files(directory: Path) -> TlsFiles:
    ca = trustme.CA()
    keystore, truststore = directory / "server.pem", directory / "ca.pem"
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(str(keystore))
    ca.cert_pem.write_to_path(str(truststore))
    client = ca.issue_cert("writer@rayk.test", common_name="writer", organization_unit_name="kafka clients",
                           organization_name="rayk tests")
    client_cert, client_key = directory / "client.pem", directory / "client.key"
    client.cert_chain_pems[0].write_to_path(str(client_cert))
    client.private_key_pem.write_to_path(str(client_key))
    return TlsFiles(ca, str(keystore), str(truststore), str(client_cert), str(client_key))
