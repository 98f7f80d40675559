"""Unknown tagged fields, skipped as the protocol says.

KIP-482 lets a newer client put tagged fields into a flexible-version message that an
older broker has no schema for; the receiver must skip them. kio's readers refuse them
instead (KeyError "Unknown tagged field tag"). `without_unknown_tags` rewrites a request
frame with every tag its schema does not name dropped, at every nesting level, so that
kio can read it. It runs only after kio refused a frame, so requests without unknown tags
pay nothing.

The walk follows kio's own schema dataclasses: kio reads each plain field (which gives its
size), and this module descends into structs and arrays of structs, whose trailing tag
sections are where unknown tags can hide.
"""

from __future__ import annotations

import io
from dataclasses import Field, fields
from typing import Any

from kio.serial._introspect import EntityField, EntityTupleField, classify_field, get_field_tag, is_optional
from kio.serial._parse import get_field_reader
from kio.serial.readers import read_compact_array_length, read_int8, read_legacy_array_length, read_unsigned_varint
from kio.serial.writers import write_unsigned_varint


def without_unknown_tags(request_class: type, frame: bytes) -> bytes:
    """The request frame (header and body) without the tags their schemas do not name."""
    header, header_size = _strip_entity(request_class.__header_schema__, frame, 0)
    body, _ = _strip_entity(request_class, frame, header_size)
    return header + body


def _strip_entity(entity_class: type, buf: bytes, offset: int) -> tuple[bytes, int]:
    """(the entity at `offset` without unknown tags, the bytes it takes in `buf`)."""
    out = io.BytesIO()
    pos = offset
    tagged: dict[int, Field[Any]] = {}
    for field in fields(entity_class):
        tag = get_field_tag(field)
        if tag is not None:
            tagged[tag] = field
            continue
        data, size = _strip_field(entity_class, field, buf, pos, is_tag=False)
        out.write(data)
        pos += size
    if not entity_class.__flexible__:
        return out.getvalue(), pos - offset

    count, size = read_unsigned_varint(buf, pos)
    pos += size
    kept = io.BytesIO()
    kept_count = 0
    for _ in range(count):
        tag, size = read_unsigned_varint(buf, pos)
        pos += size
        length, size = read_unsigned_varint(buf, pos)
        pos += size
        if pos + length > len(buf):
            raise ValueError(f"tag {tag} of {length} bytes runs past the frame's end")
        field = tagged.get(tag)
        if field is not None:
            value, _ = _strip_field(entity_class, field, buf[pos : pos + length], 0, is_tag=True)
            write_unsigned_varint(kept, tag)
            write_unsigned_varint(kept, len(value))
            kept.write(value)
            kept_count += 1
        pos += length
    write_unsigned_varint(out, kept_count)
    out.write(kept.getvalue())
    return out.getvalue(), pos - offset


def _strip_field(entity_class: type, field: Field[Any], buf: bytes, pos: int, *, is_tag: bool) -> tuple[bytes, int]:
    kind = classify_field(field)
    if isinstance(kind, EntityField):
        if is_tag or not is_optional(field):
            return _strip_entity(kind.type_, buf, pos)
        marker, size = read_int8(buf, pos)  # KIP-893 nullable struct: -1 null, 1 present
        if marker < 0:
            return buf[pos : pos + size], size
        data, data_size = _strip_entity(kind.type_, buf, pos + size)
        return buf[pos : pos + size] + data, size + data_size
    if isinstance(kind, EntityTupleField):
        read_length = read_compact_array_length if entity_class.__flexible__ else read_legacy_array_length
        count, size = read_length(buf, pos)
        count = count if count is not None and count > 0 else 0
        if count > len(buf) - pos:
            raise ValueError(f"an array of {count} structs in {len(buf) - pos} bytes")
        out = io.BytesIO(buf[pos : pos + size])
        out.seek(size)
        end = pos + size
        for _ in range(count):
            data, data_size = _strip_entity(kind.type_, buf, end)
            out.write(data)
            end += data_size
        return out.getvalue(), end - pos
    is_header = entity_class.__name__ == "RequestHeader"  # its client_id is a legacy string
    _, size = get_field_reader(entity_class, field, is_header, is_tag)(buf, pos)
    return buf[pos : pos + size], size
