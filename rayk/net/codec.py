"""Frames <-> protocol messages: request headers and bodies in, responses out.

A frame is what follows the 4-byte size prefix. Its first 8 bytes are read by hand
(api key, api version, correlation id: the same in every header version) so that a
request this broker cannot parse still gets an answer addressed to its correlation id;
the rest goes through kio's readers and writers, generated from Kafka's message schemas,
for the request header version the API version implies (v2, with tagged fields, for
flexible versions); tagged fields no schema names are skipped (tagged_fields.py).
Responses carry header v0, or v1 for flexible versions, except ApiVersions, which always
answers with header v0 so that any client can read it.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError

from rayk.errors import InvalidRequestError, UnsupportedVersionError
from rayk.net.api_versions import API_VERSIONS, SUPPORTED_VERSIONS, is_supported
from rayk.net.request_context import PLAINTEXT_CONTEXT, RequestContext
from rayk.net.tagged_fields import without_unknown_tags

_HEAD = struct.Struct(">hhi")
_SIZE = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class RequestHead:
    """What every request header starts with."""

    api_key: int
    api_version: int
    correlation_id: int


@dataclass(frozen=True, slots=True)
class Request:
    """One decoded Kafka request: its header fields, its kio body of the request's API version,
    the connection's RequestContext, and the frame's size in bytes."""

    head: RequestHead
    client_id: str | None
    body: Any  # the kio request dataclass of (api_key, api_version)
    context: RequestContext = PLAINTEXT_CONTEXT  # the connection it came on
    size_bytes: int = 0  # of the frame, which is what producer_byte_rate counts


def read_head(frame: bytes) -> RequestHead:
    """The first 8 bytes; INVALID_REQUEST if the frame is shorter."""
    if len(frame) < _HEAD.size:
        raise InvalidRequestError(f"a request of {len(frame)} bytes has no header")
    return RequestHead(*_HEAD.unpack_from(frame))


@cache
def request_class(api_key: int, api_version: int) -> type:
    return load_request_schema(api_key, api_version)


@cache
def response_class(api_key: int, api_version: int) -> type:
    return load_response_schema(api_key, api_version)


@cache
def _reader(cls: type) -> Any:
    return entity_reader(cls)


@cache
def _writer(cls: type) -> Any:
    return entity_writer(cls)


def decode_request(frame: bytes, context: RequestContext = PLAINTEXT_CONTEXT) -> Request:
    """The whole request; UNSUPPORTED_VERSION for an API or version this broker does not
    serve, INVALID_REQUEST for bytes that do not parse as that request."""
    head = read_head(frame)
    if not is_supported(head.api_key, head.api_version):
        raise UnsupportedVersionError(_unsupported_message(head))
    cls = request_class(head.api_key, head.api_version)
    try:
        try:
            header, body = _parse(cls, frame)
        except KeyError:  # kio refuses tagged fields it has no schema for; skip them, as Kafka does
            header, body = _parse(cls, without_unknown_tags(cls, frame))
    except (SerialError, ValueError, TypeError, OverflowError, KeyError, IndexError, MemoryError) as e:
        raise InvalidRequestError(f"malformed {cls.__name__} v{head.api_version}: {e!r}") from None
    # Bytes after the body are ignored, as Kafka does: librdkafka 2.x sends one more byte
    # than Metadata v12 has (its v10 include_cluster_authorized_operations flag).
    return Request(head, header.client_id, body, context, len(frame))


def _parse(cls: type, frame: bytes) -> tuple[Any, Any]:
    header, header_size = _reader(cls.__header_schema__)(frame, 0)
    body, _ = _reader(cls)(frame, header_size)
    return header, body


def encode_response(head: RequestHead, body: Any) -> bytes:
    """The size-prefixed response frame for the request `head`."""
    header_cls = ResponseHeaderV0 if head.api_key == API_VERSIONS else type(body).__header_schema__
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    _writer(header_cls)(out, header_cls(correlation_id=head.correlation_id))
    _writer(type(body))(out, body)
    data = out.getbuffer()
    _SIZE.pack_into(data, 0, len(data) - _SIZE.size)
    del data
    return out.getvalue()


def has_response_schema(api_key: int, api_version: int) -> bool:
    try:
        response_class(api_key, api_version)
    except Exception:  # kio raises its index errors, or ImportError for a missing module
        return False
    return True


def _unsupported_message(head: RequestHead) -> str:
    span = SUPPORTED_VERSIONS.get(head.api_key)
    if span is None:
        return f"API key {head.api_key} is not served by this broker"
    return f"API key {head.api_key} version {head.api_version} is not served (versions {span[0]}..{span[1]} are)"
