"""What every decoder of a `__consumer_offsets` record shares (group_records.py dispatches
to them): the error for a record that is none of the coordinator's, and the checks of a
msgpack key's or value's fields and their types.

A decoder raises MalformedGroupRecordError (a ValueError) for anything its schema does not
allow, so that a record the coordinator did not write (a client's produce before internal
topics were refused, or a corrupt key or value) is skipped by the load instead of stopping
it. Pure functions.
"""

from __future__ import annotations

from typing import Any

import msgpack


class MalformedGroupRecordError(ValueError):
    """A `__consumer_offsets` record that is none of the coordinator's records."""


def unpack(data: bytes, what: str) -> Any:
    """A key's or value's msgpack; MalformedGroupRecordError if it is none."""
    try:
        return msgpack.unpackb(data)
    except (ValueError, msgpack.UnpackException) as e:  # (incomplete, extra bytes, bad UTF-8, ...)
        raise MalformedGroupRecordError(f"the {what} is not msgpack ({e}): {excerpt(data)}") from None


def has_type(value: Any, expected: Any) -> bool:
    """`expected`: a type, a tuple of alternatives (None for None), [item type], or a
    tuple of field types for a fixed-length list (a (topic, partition))."""
    if isinstance(expected, list):
        return isinstance(value, list) and all(has_type(v, expected[0]) for v in value)
    if isinstance(expected, tuple) and None in expected:
        return any(value is None if e is None else has_type(value, e) for e in expected)
    if isinstance(expected, tuple):
        return isinstance(value, list) and len(value) == len(expected) and all(map(has_type, value, expected))
    if expected is int:
        return is_int(value)
    return isinstance(value, expected)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def excerpt(value: Any, max_chars: int = 80) -> str:
    """The start of a value's repr, for an error message."""
    text = repr(value)
    return text if len(text) <= max_chars else text[:max_chars] + "..."
