"""Produce and Fetch response frames written straight to bytes: the listener's hot path.

Every other response is built as kio's message (entities.build) and written by kio
(codec.encode_response). These two are answered thousands of times a second, and a Fetch
response carries up to megabytes of records, so they skip the per-field Python of
building dataclasses and the two copies of kio's BytesIO: the handler's dicts
(data_apis) go to `struct` packs, and the records, as the log holds them, are copied
once, into the frame.

The layouts are Kafka's ProduceResponse.json (v3-v12) and FetchResponse.json (v4-v17);
flexible versions (Produce v9+, Fetch v12+) use compact arrays, strings and bytes, a
response header v1 and tagged-field sections. rayk sets none of the tagged fields (the
leader hints of KIP-951, a follower's diverging epoch or snapshot id), so every section
is empty. Aborted transactions are the read_committed fetch's (an empty array, never
null, for a read_uncommitted one: clients read both the same way).
tests/test_data_responses.py proves the bytes equal kio's for every served version.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from rayk.net.api_versions import FETCH, PRODUCE
from rayk.net.codec import RequestHead

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_HEADER = struct.Struct(">ii")  # frame size, correlation id
_FETCH_TOP = struct.Struct(">ihi")  # throttle_time_ms, error_code, session_id
_PARTITION_HEAD = struct.Struct(">ihqqq")  # index, error, hw, last stable offset, log start offset
_ABORTED_TXN = struct.Struct(">qq")  # producer id, first offset
_PRODUCE_PARTITION = struct.Struct(">ihqqq")  # index, error, base offset, log append time, log start offset
NO_TAGS = b"\x00"


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _array_length(n: int, flexible: bool) -> bytes:
    return _uvarint(n + 1) if flexible else _I32.pack(n)


def _string(text: str | None, flexible: bool) -> bytes:
    if text is None:
        return b"\x00" if flexible else _I16.pack(-1)
    data = text.encode()
    return (_uvarint(len(data) + 1) if flexible else _I16.pack(len(data))) + data


def _frame(head: RequestHead, flexible: bool, parts: list[Any]) -> bytes:
    """Size, response header and body; one join, the records' only copy."""
    tags = NO_TAGS if flexible else b""
    size = 4 + len(tags) + sum(map(len, parts))
    return b"".join([_HEADER.pack(size, head.correlation_id), tags, *parts])


def produce_frame(head: RequestHead, values: dict) -> bytes:
    """The frame answering a Produce request (v3-v12) with data_apis.produce's values."""
    version = head.api_version
    assert 3 <= version <= 12, f"Produce v{version} has no hand-written layout"
    flexible = version >= 9
    parts: list[Any] = [_array_length(len(values["responses"]), flexible)]
    for topic in values["responses"]:
        parts.append(_string(topic["name"], flexible))
        parts.append(_array_length(len(topic["partition_responses"]), flexible))
        for p in topic["partition_responses"]:
            fields = _PRODUCE_PARTITION.pack(p["index"], p.get("error_code", 0), p["base_offset"],
                                             p["log_append_time"], p["log_start_offset"])
            parts.append(fields if version >= 5 else fields[:-8])
            if version >= 8:  # KIP-467: the records an INVALID_RECORD names, and the partition's message
                record_errors = p.get("record_errors", ())
                parts.append(_array_length(len(record_errors), flexible))
                for e in record_errors:
                    parts += (_I32.pack(e["batch_index"]), _string(e["batch_index_error_message"], flexible))
                    if flexible:
                        parts.append(NO_TAGS)
                parts.append(_string(p.get("error_message"), flexible))
            if flexible:
                parts.append(NO_TAGS)
        if flexible:
            parts.append(NO_TAGS)
    parts.append(_I32.pack(values.get("throttle_time", 0)))
    if flexible:
        parts.append(NO_TAGS)
    return _frame(head, flexible, parts)


def fetch_frame(head: RequestHead, values: dict) -> bytes:
    """The frame answering a Fetch request (v4-v17) with data_apis.fetch's values; the
    records are copied once, into the frame."""
    version = head.api_version
    assert 4 <= version <= 17, f"Fetch v{version} has no hand-written layout"
    flexible = version >= 12
    top = _FETCH_TOP.pack(values.get("throttle_time", 0), values.get("error_code", 0), values.get("session_id", 0))
    parts: list[Any] = [top if version >= 7 else top[:4], _array_length(len(values["responses"]), flexible)]
    for topic in values["responses"]:
        parts.append(topic["topic_id"].bytes if version >= 13 else _string(topic["topic"], flexible))
        parts.append(_array_length(len(topic["partitions"]), flexible))
        for p in topic["partitions"]:
            fields = _PARTITION_HEAD.pack(p["partition_index"], p["error_code"], p["high_watermark"],
                                          p["last_stable_offset"], p["log_start_offset"])
            parts.append(fields if version >= 5 else fields[:-8])
            aborted = p["aborted_transactions"]
            parts.append(_array_length(len(aborted), flexible))
            for txn in aborted:
                parts.append(_ABORTED_TXN.pack(txn["producer_id"], txn["first_offset"]))
                if flexible:
                    parts.append(NO_TAGS)
            if version >= 11:
                parts.append(_I32.pack(p["preferred_read_replica"]))
            records = p["records"]
            parts.append(_uvarint(len(records) + 1) if flexible else _I32.pack(len(records)))
            parts.append(records)
            if flexible:
                parts.append(NO_TAGS)
        if flexible:
            parts.append(NO_TAGS)
    if flexible:
        parts.append(NO_TAGS)
    return _frame(head, flexible, parts)


FRAME_WRITERS: dict[int, Callable[[RequestHead, dict], bytes]] = {PRODUCE: produce_frame, FETCH: fetch_frame}
