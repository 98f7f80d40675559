"""The listener's Produce and Fetch responses: kio's message path against the hand-written
frames of rayk/net/data_responses.py, in one run, on the same values.

kio's path is what every other response takes: entities.build (the handler's dicts to
kio's dataclasses) and codec.encode_response (kio's writer into a BytesIO). The shapes
are what kafka_protocol_bench's clients cause:
- a Produce answer for 1 partition (librdkafka with linger.ms 0: one per record);
- a full Fetch answer for 3 partitions of ~340 KiB each (1 MiB per fetch);
- an incremental Fetch answer with one partition of 16 KiB (a fetch session, KIP-227).
It prints µs per response for both and the ratio; it asserts nothing.

    .venv/bin/python benchmarks/response_encoding_bench.py [--seconds S]
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable

from rayk.net.api_versions import FETCH, PRODUCE
from rayk.net.codec import RequestHead, encode_response, response_class
from rayk.net.data_responses import fetch_frame, produce_frame
from rayk.net.entities import build


def per_call_us(fn: Callable[[], bytes], seconds: float) -> float:
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(50):
            fn()
        calls += 50
    return elapsed / calls * 1e6


def fetch_values(partitions: int, records_bytes: int, version: int) -> dict:
    records = bytes(records_bytes)
    topic = {"topic_id": uuid.uuid4()} if version >= 13 else {"topic": "bench"}
    return {"error_code": 0, "session_id": 1234, "responses": [{**topic, "partitions": [
        {"partition_index": p, "error_code": 0, "high_watermark": 10**6, "last_stable_offset": 10**6,
         "log_start_offset": 0, "aborted_transactions": [], "preferred_read_replica": -1, "records": records}
        for p in range(partitions)]}]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="per case and path")
    args = parser.parse_args()
    produce = {"responses": [{"name": "bench", "partition_responses": [
        {"index": 0, "base_offset": 123456, "log_append_time": -1, "log_start_offset": 0}]}]}
    cases = [
        ("Produce v11, 1 partition", PRODUCE, 11, produce, produce_frame),
        ("Fetch v12, 3 x 340 KiB", FETCH, 12, fetch_values(3, 340 << 10, 12), fetch_frame),
        ("Fetch v16, 3 x 340 KiB", FETCH, 16, fetch_values(3, 340 << 10, 16), fetch_frame),
        ("Fetch v12 incremental, 1 x 16 KiB", FETCH, 12, fetch_values(1, 16 << 10, 12), fetch_frame),
    ]
    print(f"{'response':36} {'kio µs':>9} {'hand µs':>9} {'kio / hand':>11}")
    for label, api_key, version, values, write in cases:
        head = RequestHead(api_key, version, 7)
        cls = response_class(api_key, version)
        assert write(head, values) == encode_response(head, build(cls, values))
        kio_us = per_call_us(lambda: encode_response(head, build(cls, values)), args.seconds)
        hand_us = per_call_us(lambda: write(head, values), args.seconds)
        print(f"{label:36} {kio_us:9.1f} {hand_us:9.1f} {kio_us / hand_us:10.1f}x")


if __name__ == "__main__":
    main()
