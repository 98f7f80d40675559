"""The listener's codec and message builder, without a broker: frames decode into kio's
request classes at every served version, responses build from plain values at every
version, and no byte string makes the decoder fail with anything but a typed Kafka error."""

from __future__ import annotations

import dataclasses
import io
import struct
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.request_header.v1.header import RequestHeader as HeaderV1
from kio.schema.request_header.v2.header import RequestHeader as HeaderV2
from kio.serial import entity_writer

from rayk.errors import InvalidRequestError, UnsupportedVersionError
from rayk.net import api_versions as keys
from rayk.net.codec import decode_request, encode_response, request_class, response_class
from rayk.net.entities import build, error_response
from rayk.net.kafka_apis import HANDLERS
from tests.protocol_helpers import request_frame

SERVED = [(key, version) for key, (lo, hi) in keys.SUPPORTED_VERSIONS.items() for version in range(lo, hi + 1)]


@pytest.mark.parametrize("api_key,version", SERVED)
def test_every_served_version_decodes_and_its_response_encodes(api_key, version):
    request = decode_request(request_frame(api_key, version, {}, correlation_id=41))
    assert (request.head.api_key, request.head.api_version, request.head.correlation_id) == (api_key, version, 41)
    assert request.client_id == "test"
    assert type(request.body) is request_class(api_key, version)
    frame = encode_response(request.head, error_response(response_class(api_key, version), 6))
    size, correlation_id = struct.unpack_from(">ii", frame)
    assert size == len(frame) - 4 and correlation_id == 41


def test_every_served_api_has_a_handler_and_the_floor_is_kafka_4():
    assert set(HANDLERS) == set(keys.SUPPORTED_VERSIONS)
    assert keys.SUPPORTED_VERSIONS[keys.PRODUCE][0] == 3 and keys.SUPPORTED_VERSIONS[keys.FETCH][0] == 4


def test_header_versions_follow_flexible_versions():
    assert request_class(keys.METADATA, 8).__header_schema__ is HeaderV1
    assert request_class(keys.METADATA, 9).__header_schema__ is HeaderV2


def test_unsupported_versions_and_unknown_keys_are_typed_errors():
    frame = request_frame(keys.METADATA, 12, {})
    too_new = frame[:2] + struct.pack(">h", 13) + frame[4:]
    with pytest.raises(UnsupportedVersionError, match="versions 0..12"):
        decode_request(too_new)
    with pytest.raises(UnsupportedVersionError, match="API key 999"):
        decode_request(struct.pack(">hhi", 999, 0, 1) + b"\0\0")
    with pytest.raises(InvalidRequestError, match="no header"):
        decode_request(b"\0\3\0")


def test_trailing_bytes_are_ignored_and_truncation_is_an_invalid_request():
    frame = request_frame(keys.METADATA, 12, {"topics": [{"name": "t"}]})
    # As Kafka: librdkafka 2.x sends Metadata v12 with one byte more than the schema has.
    assert decode_request(frame + b"\0").body.topics[0].name == "t"
    for cut in range(9, len(frame)):
        with pytest.raises(InvalidRequestError):
            decode_request(frame[:cut])


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(SERVED), st.binary(max_size=200))
def test_random_bodies_never_escape_as_anything_but_kafka_errors(served, garbage):
    api_key, version = served
    try:
        decode_request(struct.pack(">hhi", api_key, version, 1) + garbage)
    except InvalidRequestError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(SERVED), st.data())
def test_mutated_frames_decode_or_fail_typed(served, data):
    api_key, version = served
    frame = bytearray(request_frame(api_key, version, {}))
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(8, max(8, len(frame) - 1)))
        if position < len(frame):
            frame[position] = data.draw(st.integers(0, 255))
    try:
        decode_request(bytes(frame))
    except InvalidRequestError:
        pass


def test_build_keeps_only_the_fields_of_the_version_and_zero_fills_the_rest():
    values = {"responses": [{"name": "t", "partition_responses": [{"index": 0, "error_code": 6, "base_offset": -1,
                                                                   "log_append_time": -1, "error_message": "moved"}]}]}
    v3 = build(response_class(keys.PRODUCE, 3), values)
    v8 = build(response_class(keys.PRODUCE, 8), values)
    assert not hasattr(v3.responses[0].partition_responses[0], "error_message")
    assert v8.responses[0].partition_responses[0].error_message == "moved"
    assert v8.responses[0].partition_responses[0].error_code.value == 6
    metadata = build(response_class(keys.METADATA, 12), {})
    assert metadata.brokers == () and metadata.topics == ()


def newer_schema(cls: type, tag: int, **element_classes: type) -> type:
    """A copy of kio entity class `cls` with one more int32 tagged field, `future`, as a
    newer Kafka schema would have; `element_classes` swaps the element class of array
    fields, to put such a tag at a deeper level too."""
    specs = []
    for f in dataclasses.fields(cls):
        field_type = tuple[element_classes[f.name], ...] if f.name in element_classes else f.type
        specs.append((f.name, field_type, dataclasses.field(default=f.default, metadata=f.metadata)))
    specs.append(("future", int, dataclasses.field(default=0, metadata={"kafka_type": "int32", "tag": tag})))
    namespace = {name: getattr(cls, name) for name in
                 ("__type__", "__version__", "__flexible__", "__api_key__", "__header_schema__") if hasattr(cls, name)}
    return dataclasses.make_dataclass(cls.__name__, specs, namespace=namespace, frozen=True, slots=True,
                                      kw_only=True)


def frame_from_newer_client(cls: type, tag: int, header_tag: int, body: Any) -> bytes:
    header_cls = newer_schema(cls.__header_schema__, header_tag)
    out = io.BytesIO()
    entity_writer(header_cls)(out, header_cls(request_api_key=cls.__api_key__, request_api_version=cls.__version__,
                                             correlation_id=5, client_id="newer", future=1))
    entity_writer(type(body))(out, body)
    return out.getvalue()


@settings(max_examples=100, deadline=None)
@given(tags=st.lists(st.integers(1, 2**20), min_size=4, max_size=4), value=st.integers(1, 2**31 - 1),
       names=st.lists(st.text(min_size=1, max_size=20), max_size=4))
def test_tagged_fields_no_schema_names_are_skipped_at_every_level(tags, value, names):
    cls = request_class(keys.METADATA, 12)
    topic_cls = newer_schema(typing.get_args(typing.get_args(dataclasses.fields(cls)[0].type)[0])[0], tags[0])
    body = newer_schema(cls, tags[1], topics=topic_cls)(
        topics=tuple(topic_cls(topic_id=None, name=name, future=value) for name in names),
        allow_auto_topic_creation=True, include_topic_authorized_operations=False, future=value)
    request = decode_request(frame_from_newer_client(cls, tags[2], tags[3], body))
    assert request.client_id == "newer" and request.head.correlation_id == 5
    assert request.body == build(cls, {"topics": [{"name": name} for name in names], "allow_auto_topic_creation": True})


def test_known_tags_survive_when_unknown_ones_are_skipped():
    cls = request_class(keys.FETCH, 12)
    values = {"replica_id": -1, "max_wait": 500, "max_bytes": 1 << 20, "cluster_id": "c-1", "rack_id": "r",
              "topics": [{"topic": "t", "partitions": [{"partition": 2, "fetch_offset": 9, "partition_max_bytes": 100}]}]}
    original = build(cls, values)
    newer = newer_schema(cls, 7)
    body = newer(**{f.name: getattr(original, f.name) for f in dataclasses.fields(cls)}, future=3)
    request = decode_request(frame_from_newer_client(cls, 7, 9, body))
    assert request.body == original and request.body.cluster_id == "c-1"


def test_an_unknown_tag_longer_than_the_frame_is_an_invalid_request():
    frame = request_frame(keys.API_VERSIONS, 3, {"client_software_name": "x", "client_software_version": "1"})
    with pytest.raises(InvalidRequestError):
        decode_request(frame[:-1] + bytes([1, 7, 100, 0xAB]))
    assert decode_request(frame[:-1] + bytes([1, 7, 1, 0xAB])).body.client_software_name == "x"
