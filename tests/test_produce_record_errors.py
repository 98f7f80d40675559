"""A Produce refused for particular records (KIP-467): data_apis.produce answers the
leader's record errors and message, and the Produce response carries them from v8 on
(older versions only the error code)."""

from __future__ import annotations

import asyncio

from rayk.dataplane.frames import ProduceResult
from rayk.errors import InvalidRecordError, RecordError
from rayk.net import data_apis
from rayk.net.api_versions import PRODUCE
from rayk.net.codec import Request, RequestHead, request_class
from rayk.net.data_responses import produce_frame
from rayk.net.entities import build
from rayk.storage.records import SimpleRecord, build_batch
from tests.protocol_helpers import decode_response

KEYLESS = (3, 13)
REFUSAL = InvalidRecordError("2 of the 20 records have no key", record_errors=[RecordError(i, "no key") for i in KEYLESS])


class RefusingView:
    """A BrokerView whose leaders refuse every batch for its keyless records."""

    def authorized(self, *_: object) -> bool:
        return True

    def native_produce(self) -> None:
        return None  # the Python path (tests/test_native_produce.py holds the native one to it)

    def produce(self, *_: object) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        future.set_result(ProduceResult(-1, -1, 0, REFUSAL))
        return future


def produce_request(version: int) -> Request:
    records = build_batch([SimpleRecord(b"v", None if i in KEYLESS else b"k") for i in range(20)])
    body = build(request_class(PRODUCE, version), {"acks": -1, "timeout": 5000, "transactional_id": None, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": records}]}]})
    return Request(RequestHead(PRODUCE, version, 1), "test", body)


def answer(version: int):
    values = asyncio.run(data_apis.produce(RefusingView(), produce_request(version)))
    frame = produce_frame(RequestHead(PRODUCE, version, 1), values)
    return decode_response(PRODUCE, version, frame[4:], correlation_id=1).responses[0].partition_responses[0]


def test_a_produce_answer_names_the_records_at_fault_and_the_partitions_message_from_v8_on():
    for version in (8, 9, 12):
        partition = answer(version)
        assert partition.error_code.value == InvalidRecordError.code
        assert [(e.batch_index, e.batch_index_error_message) for e in partition.record_errors] == [
            (3, "no key"), (13, "no key")]
        assert partition.error_message == str(REFUSAL)
    before_v8 = answer(7)
    assert before_v8.error_code.value == InvalidRecordError.code and not hasattr(before_v8, "record_errors")
