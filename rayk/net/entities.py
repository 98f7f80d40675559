"""Building protocol messages (kio's frozen dataclasses) from plain values, whatever version.

Handlers describe a response once, as nested dicts and lists with every field any version
of the message has (`{"error_code": 6, "partitions": [...]}`, times in ms). `build` turns
that into the dataclass of the version being answered: fields that version lacks are
dropped, fields the handler left out get the protocol's zero value (0, "", empty array,
NONE error), and ms / error codes become the types kio writes. `error_response` is the
same with nothing but an error code: the reply to a request no handler could serve.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import uuid
from functools import cache
from typing import Any

from kio.schema.errors import ErrorCode
from kio.serial._introspect import EntityField, EntityTupleField, classify_field, is_optional

_UTC = datetime.timezone.utc
_ZERO_UUID = uuid.UUID(int=0)


def error_code(code: int) -> ErrorCode:
    try:
        return ErrorCode(code)
    except ValueError:
        return ErrorCode.unknown_server_error


def kafka_uuid(text: str) -> uuid.UUID:
    """A topic id as rayk stores it (Kafka's form: URL-safe base64 of 16 bytes, unpadded)."""
    return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))


def topic_id_text(value: uuid.UUID) -> str:
    """The inverse of `kafka_uuid`: a protocol topic id in the form rayk stores."""
    return base64.urlsafe_b64encode(value.bytes).decode().rstrip("=")


def ms(value: datetime.timedelta | None, default: int = 0) -> int:
    """A request's duration field in ms."""
    return default if value is None else round(value.total_seconds() * 1000)


def controller_timeout_ms(value: datetime.timedelta | None, default: int) -> int:
    """A request's timeout for a change the Controller makes. One <= 0 asks not to wait,
    but the change is made anyway: rayk answers once it is committed, within `default`,
    rather than REQUEST_TIMED_OUT for a change that happened."""
    timeout_ms = ms(value, default)
    return timeout_ms if timeout_ms > 0 else default


@cache
def _fields(cls: type) -> tuple[tuple[str, str, bool, Any], ...]:
    out = []
    for f in dataclasses.fields(cls):
        kind = classify_field(f)
        nested = kind.type_ if isinstance(kind, (EntityField, EntityTupleField)) else None
        out.append((f.name, f.metadata.get("kafka_type", ""), kind.is_array, (nested, is_optional(f), f)))
    return tuple(out)


def build(cls: type, values: dict[str, Any] | None = None) -> Any:
    """An instance of `cls` from `values` (see the module docstring)."""
    values = values or {}
    kwargs = {}
    for name, kafka_type, is_array, (nested, optional, f) in _fields(cls):
        if name in values:
            kwargs[name] = _convert(values[name], kafka_type, is_array, nested, optional)
        elif f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        else:
            kwargs[name] = _zero(kafka_type, is_array, nested, optional)
    return cls(**kwargs)


def error_response(cls: type, code: int, throttle_time_ms: int = 0) -> Any:
    """`cls` with every error_code field (at the top level) set to `code`."""
    values: dict[str, Any] = {name: code for name, kafka_type, *_ in _fields(cls) if kafka_type == "error_code"}
    return build(cls, {**values, "throttle_time": throttle_time_ms})


def _convert(value: Any, kafka_type: str, is_array: bool, nested: type | None, optional: bool) -> Any:
    if is_array:
        if value is None:
            return None
        if nested is not None:
            return tuple(build(nested, v) for v in value)
        return tuple(_scalar(v, kafka_type, False) for v in value)
    if nested is not None:
        return None if value is None else build(nested, value)
    return _scalar(value, kafka_type, optional)


def _scalar(value: Any, kafka_type: str, optional: bool) -> Any:
    if value is None:
        return None
    if kafka_type == "error_code":
        return value if isinstance(value, ErrorCode) else error_code(value)
    if kafka_type in ("timedelta_i32", "timedelta_i64") and isinstance(value, int):
        return datetime.timedelta(milliseconds=value)
    if kafka_type == "datetime_i64" and isinstance(value, int):
        if value < 0 and optional:
            return None
        return datetime.datetime.fromtimestamp(value / 1000, tz=_UTC)
    if kafka_type == "uuid" and isinstance(value, str):
        return kafka_uuid(value)
    return value


def _zero(kafka_type: str, is_array: bool, nested: type | None, optional: bool) -> Any:
    if is_array:
        return ()
    if nested is not None:
        return None if optional else build(nested)
    if optional:
        return None
    return {
        "error_code": ErrorCode.none,
        "string": "",
        "bool": False,
        "bytes": b"",
        "records": b"",
        "uuid": _ZERO_UUID,
        "float64": 0.0,
        "timedelta_i32": datetime.timedelta(0),
        "timedelta_i64": datetime.timedelta(0),
        "datetime_i64": datetime.datetime.fromtimestamp(0, tz=_UTC),
    }.get(kafka_type, 0)
