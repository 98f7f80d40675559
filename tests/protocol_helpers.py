"""Raw Kafka protocol frames for tests: requests built with kio, sent over a plain socket."""

from __future__ import annotations

import io
import socket
import ssl
import struct
from typing import Any

from kio.serial import entity_writer

from rayk.net.codec import request_class, response_class
from rayk.net.entities import build


def request_frame(api_key: int, version: int, body_values: dict, correlation_id: int = 7, client_id: str = "test") -> bytes:
    """Header and body, without the size prefix."""
    cls = request_class(api_key, version)
    header_cls = cls.__header_schema__
    out = io.BytesIO()
    entity_writer(header_cls)(out, header_cls(request_api_key=api_key, request_api_version=version,
                                             correlation_id=correlation_id, client_id=client_id))
    entity_writer(cls)(out, build(cls, body_values))
    return out.getvalue()


def sized(frame: bytes) -> bytes:
    return struct.pack(">i", len(frame)) + frame


class RawConnection:
    """One TCP connection to a listener; `None` from `receive` means the broker closed it."""

    def __init__(self, address: str, timeout_s: float = 10, tls: ssl.SSLContext | None = None) -> None:
        host, port = address.split(",")[0].rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        if tls is not None:  # the handshake happens here: ssl.SSLError if the broker refuses it
            self.sock = tls.wrap_socket(self.sock, server_hostname=host)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def receive(self) -> bytes | None:
        """One response frame (without its size), or None at EOF / reset."""
        try:
            head = self._exactly(4)
            if head is None:
                return None
            return self._exactly(struct.unpack(">i", head)[0])
        except (ConnectionError, TimeoutError, ssl.SSLEOFError):
            return None

    def _exactly(self, n: int) -> bytes | None:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                return None
            out += chunk
        return out

    def call(self, api_key: int, version: int, body_values: dict, correlation_id: int = 7, client_id: str = "test") -> Any:
        """Sends a request and decodes its response (header v0/v1 skipped by the reader)."""
        self.send(sized(request_frame(api_key, version, body_values, correlation_id, client_id)))
        frame = self.receive()
        assert frame is not None, "the broker closed the connection"
        return decode_response(api_key, version, frame, correlation_id)

    def close(self) -> None:
        self.sock.close()


def decode_response(api_key: int, version: int, frame: bytes, correlation_id: int = 7) -> Any:
    """A response frame's body (the header checked for `correlation_id`, then skipped)."""
    from kio.serial import entity_reader

    assert struct.unpack_from(">i", frame)[0] == correlation_id
    cls = response_class(api_key, version)
    header_cls = cls.__header_schema__
    _, header_size = entity_reader(header_cls)(frame, 0) if api_key != 18 else (None, 4)
    body, _ = entity_reader(cls)(frame, header_size)
    return body


def scram_login(connection: RawConnection, user: str, password: str, mechanism: str = "SCRAM-SHA-512") -> None:
    """Authenticates a connection to a SASL listener (SaslHandshake v1, SaslAuthenticate v2)."""
    import scramp

    client = scramp.ScramClient([mechanism], user, password)
    assert connection.call(17, 1, {"mechanism": mechanism}).error_code.value == 0
    first = connection.call(36, 2, {"auth_bytes": client.get_client_first().encode()})
    client.set_server_first(first.auth_bytes.decode())
    final = connection.call(36, 2, {"auth_bytes": client.get_client_final().encode()})
    assert final.error_code.value == 0, final.error_message
    client.set_server_final(final.auth_bytes.decode())
