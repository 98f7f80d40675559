"""The hand-written Produce and Fetch response frames are byte for byte what kio writes
for the same values, in every version the listener serves, and clients read them."""

from __future__ import annotations

import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

import rayk.errors
from rayk.net.api_versions import FETCH, PRODUCE, SUPPORTED_VERSIONS
from rayk.net.codec import RequestHead, encode_response, response_class
from rayk.net.data_responses import fetch_frame, produce_frame
from rayk.net.entities import build

ERROR_CODES = sorted({c.code for c in vars(rayk.errors).values() if isinstance(c, type) and issubclass(c, rayk.errors.KafkaError)})
int32 = st.integers(-(2**31), 2**31 - 1)
offsets = st.integers(-1, 2**62)
names = st.text(min_size=1, max_size=20)


def kio_frame(api_key: int, head: RequestHead, values: dict) -> bytes:
    return encode_response(head, build(response_class(api_key, head.api_version), values))


produce_partition = st.one_of(
    st.fixed_dictionaries({"index": int32, "base_offset": offsets, "log_start_offset": offsets,
                           "log_append_time": st.one_of(st.just(-1), st.integers(0, 2**43))}),
    st.fixed_dictionaries({"index": int32, "error_code": st.sampled_from(ERROR_CODES), "error_message": names,
                           "base_offset": st.just(-1), "log_append_time": st.just(-1), "log_start_offset": st.just(-1),
                           "record_errors": st.lists(st.fixed_dictionaries({  # KIP-467, an INVALID_RECORD's
                               "batch_index": st.integers(0, 2**31 - 1), "batch_index_error_message": names}),
                               max_size=4)}),
)
produce_values = st.fixed_dictionaries({"responses": st.lists(
    st.fixed_dictionaries({"name": names, "partition_responses": st.lists(produce_partition, max_size=4)}), max_size=3)})


@settings(max_examples=300, deadline=None)
@given(st.integers(*SUPPORTED_VERSIONS[PRODUCE]), int32, produce_values)
def test_produce_frames_equal_kios(version, correlation_id, values):
    head = RequestHead(PRODUCE, version, correlation_id)
    assert produce_frame(head, values) == kio_frame(PRODUCE, head, values)


def fetch_partition():
    return st.fixed_dictionaries({
        "partition_index": int32, "error_code": st.sampled_from([0, *ERROR_CODES]), "high_watermark": offsets,
        "last_stable_offset": offsets, "log_start_offset": offsets,
        "aborted_transactions": st.lists(st.fixed_dictionaries({"producer_id": offsets, "first_offset": offsets}), max_size=3),
        "preferred_read_replica": st.just(-1), "records": st.binary(max_size=3000),
    })


@settings(max_examples=300, deadline=None)
@given(st.integers(*SUPPORTED_VERSIONS[FETCH]), int32, st.data())
def test_fetch_frames_equal_kios(version, correlation_id, data):
    topic = {"topic_id": st.uuids()} if version >= 13 else {"topic": names}
    values = data.draw(st.fixed_dictionaries({
        "error_code": st.sampled_from([0, 70, 71]), "session_id": int32,
        "responses": st.lists(st.fixed_dictionaries({**topic, "partitions": st.lists(fetch_partition(), max_size=4)}),
                              max_size=3),
    }))
    head = RequestHead(FETCH, version, correlation_id)
    assert fetch_frame(head, values) == kio_frame(FETCH, head, values)


def test_a_fetch_frame_carries_the_records_unchanged():
    records = bytes(range(256)) * 4000  # ~1 MiB, as the log holds it
    values = {"error_code": 0, "session_id": 9, "responses": [{"topic_id": uuid.UUID(int=5), "partitions": [{
        "partition_index": 0, "error_code": 0, "high_watermark": 1, "last_stable_offset": 1, "log_start_offset": 0,
        "aborted_transactions": [], "preferred_read_replica": -1, "records": records}]}]}
    frame = fetch_frame(RequestHead(FETCH, 16, 3), values)
    assert frame.endswith(records + b"\x00\x00\x00") and len(frame) == int.from_bytes(frame[:4], "big") + 4
