"""Key and value (de)serializers: how Python objects become record bytes and back.

A serializer option is None (bytes pass through untouched, `str` is encoded as UTF-8),
"msgpack" (the built-in format for Python objects), "str" (UTF-8), "bytes", or any
callable. Deserializers take the same names: None and "bytes" hand back the stored bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack

Serializer = Callable[[Any], bytes | None]
Deserializer = Callable[[bytes | None], Any]


def to_bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise TypeError(
        f"cannot send a {type(value).__name__} as record bytes: pass bytes or str, "
        "or set value_serializer / key_serializer (e.g. 'msgpack')"
    )


def _msgpack_dumps(value: Any) -> bytes | None:
    return None if value is None else msgpack.packb(value)


def _msgpack_loads(data: bytes | None) -> Any:
    return None if data is None else msgpack.unpackb(data)


def _utf8(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8")


def serializer(option: str | Serializer | None) -> Serializer:
    if option is None or option == "bytes" or option == "str":
        return to_bytes
    if option == "msgpack":
        return _msgpack_dumps
    if callable(option):
        return lambda value: to_bytes(option(value))
    raise ValueError(f"unknown serializer {option!r}: use None, 'bytes', 'str', 'msgpack' or a callable")


def as_is(data: bytes | None) -> bytes | None:
    """The bytes deserializer: the record's bytes as they are (consumers skip the call)."""
    return data


def deserializer(option: str | Deserializer | None) -> Deserializer:
    if option is None or option == "bytes":
        return as_is
    if option == "str":
        return _utf8
    if option == "msgpack":
        return _msgpack_loads
    if callable(option):
        return option
    raise ValueError(f"unknown deserializer {option!r}: use None, 'bytes', 'str', 'msgpack' or a callable")
