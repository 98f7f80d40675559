"""AlterPartitionReassignments and ListPartitionReassignments as the listener answers them,
without Ray: requests encoded by kio go through KafkaApis to a BrokerView whose Controller
is a stand-in, and the responses are encoded and decoded again. Pins the per-partition
answers, the top-level errors of a request that fails as a whole, and what reaches the
Controller."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader
from ray.exceptions import ActorUnavailableError

from rayk.config import BrokerConfig
from rayk.errors import (
    InvalidReplicaAssignmentError,
    NoReassignmentInProgressError,
    UnknownTopicOrPartitionError,
)
from rayk.net import api_versions as keys
from rayk.net.admin_apis import api_versions_body
from rayk.net.broker_view import BrokerView
from rayk.net.codec import decode_request, encode_response, response_class
from rayk.net.kafka_apis import KafkaApis
from tests.protocol_helpers import request_frame

ALTER, LIST = keys.ALTER_PARTITION_REASSIGNMENTS, keys.LIST_PARTITION_REASSIGNMENTS
# After a reassignment the listener takes the Controller's metadata image before it answers
# (kafka_apis._then_refresh_metadata); this stand-in holds none, so it asks from scratch.
REFRESH = ("client_metadata_image", (None, 0))


class _Method:
    def __init__(self, controller: StandInController, name: str) -> None:
        self.controller, self.name = controller, name

    def remote(self, *args: Any) -> Any:
        self.controller.calls.append((self.name, args))
        return self.controller.answer(self.name, *args)


class StandInController:
    """Answers like the Controller actor's methods: `answer(name, *args)` is a coroutine."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, name: str) -> _Method:
        return _Method(self, name)


def serve(controller: StandInController, api_key: int, version: int, body: dict) -> Any:
    """The decoded response to one request."""
    view = BrokerView(0, controller, BrokerConfig())
    request = decode_request(request_frame(api_key, version, body, correlation_id=5))
    message = asyncio.run(KafkaApis(view).handle(request))
    frame = encode_response(request.head, message)
    cls = response_class(api_key, version)
    _, header_size = entity_reader(cls.__header_schema__)(frame, 4)
    return entity_reader(cls)(frame, 4 + header_size)[0]


def per_partition(response: Any) -> list[tuple[str, int, ErrorCode]]:
    return [(t.name, p.partition_index, p.error_code) for t in response.responses for p in t.partitions]


def test_api_versions_advertises_kafka_4_0s_reassignment_versions():
    advertised = {k["api_key"]: (k["min_version"], k["max_version"]) for k in api_versions_body()["api_keys"]}
    assert advertised[ALTER] == (0, 0) and advertised[LIST] == (0, 0)


def test_alter_answers_each_partition_with_its_own_error_in_request_order():
    async def answer(name, targets):
        return {
            ("t", 0): None,
            ("t", 1): InvalidReplicaAssignmentError("t-1: target [] must name distinct brokers"),
            ("t", 2): NoReassignmentInProgressError("t-2 has no reassignment to cancel"),
            ("gone", 0): UnknownTopicOrPartitionError("gone-0 does not exist"),
        }

    controller = StandInController(answer)
    response = serve(controller, ALTER, 0, {"timeout": 5000, "topics": [
        {"name": "t", "partitions": [{"partition_index": 2, "replicas": None},
                                     {"partition_index": 0, "replicas": [3, 1, 2]},
                                     {"partition_index": 1, "replicas": []}]},
        {"name": "gone", "partitions": [{"partition_index": 0, "replicas": [1]}]},
    ]})  # fmt: skip
    assert controller.calls == [
        ("alter_partition_reassignments", ({("t", 2): None, ("t", 0): [3, 1, 2], ("t", 1): [], ("gone", 0): [1]},)),
        REFRESH,
    ], "null replicas cancel; an empty list is a target (refused by the Controller)"
    assert response.error_code == ErrorCode.none and response.error_message is None
    assert per_partition(response) == [
        ("t", 2, ErrorCode.no_reassignment_in_progress),
        ("t", 0, ErrorCode.none),
        ("t", 1, ErrorCode.invalid_replica_assignment),
        ("gone", 0, ErrorCode.unknown_topic_or_partition),
    ]
    messages = {p.partition_index: p.error_message for t in response.responses for p in t.partitions if t.name == "t"}
    assert messages[0] is None and "distinct brokers" in messages[1]


def test_a_partition_named_twice_is_reassigned_once_to_the_last_target():
    async def answer(name, targets):
        return {tp: None for tp in targets}

    controller = StandInController(answer)
    response = serve(controller, ALTER, 0, {"topics": [
        {"name": "t", "partitions": [{"partition_index": 0, "replicas": [1]}, {"partition_index": 0, "replicas": [2]}]},
    ]})  # fmt: skip
    assert controller.calls == [("alter_partition_reassignments", ({("t", 0): [2]},)), REFRESH]
    assert per_partition(response) == [("t", 0, ErrorCode.none), ("t", 0, ErrorCode.none)]


def test_a_controller_that_does_not_answer_in_timeout_ms_is_request_timed_out_everywhere():
    async def answer(name, targets):
        await asyncio.sleep(10)

    response = serve(StandInController(answer), ALTER, 0, {"timeout": 100, "topics": [
        {"name": "t", "partitions": [{"partition_index": 0, "replicas": [1]}, {"partition_index": 1, "replicas": None}]},
    ]})  # fmt: skip
    assert response.error_code == ErrorCode.request_timed_out and "100 ms" in response.error_message
    assert per_partition(response) == [("t", 0, ErrorCode.request_timed_out), ("t", 1, ErrorCode.request_timed_out)]


def test_a_controller_being_restarted_is_not_controller_so_clients_retry():
    async def answer(name, *args):
        raise ActorUnavailableError("the actor is restarting", None)

    alter = serve(StandInController(answer), ALTER, 0, {"topics": [
        {"name": "t", "partitions": [{"partition_index": 0, "replicas": [1]}]},
    ]})  # fmt: skip
    assert alter.error_code == ErrorCode.not_controller
    assert per_partition(alter) == [("t", 0, ErrorCode.not_controller)]
    listed = serve(StandInController(answer), LIST, 0, {"topics": None})
    assert listed.error_code == ErrorCode.not_controller and listed.topics == ()


def test_list_of_everything_groups_the_ongoing_reassignments_by_topic():
    async def answer(name, partitions):
        return {
            ("a", 1): {"replicas": [3, 1, 2, 0], "adding": [3], "removing": [0]},
            ("a", 0): {"replicas": [1, 2], "adding": [], "removing": [2]},
            ("b", 4): {"replicas": [2, 0], "adding": [0], "removing": []},
        }

    controller = StandInController(answer)
    response = serve(controller, LIST, 0, {"timeout": 5000, "topics": None})
    assert controller.calls == [("list_partition_reassignments", (None,))], "null topics: every partition"
    assert response.error_code == ErrorCode.none
    got = {(t.name, p.partition_index): (p.replicas, p.adding_replicas, p.removing_replicas)
           for t in response.topics for p in t.partitions}  # fmt: skip
    assert got == {("a", 0): ((1, 2), (), (2,)), ("a", 1): ((3, 1, 2, 0), (3,), (0,)), ("b", 4): ((2, 0), (0,), ())}
    assert [t.name for t in response.topics] == ["a", "b"]
    assert [p.partition_index for p in response.topics[0].partitions] == [0, 1]


@pytest.mark.parametrize(
    "topics,asked",
    [([{"name": "a", "partition_indexes": [0, 2]}, {"name": "b", "partition_indexes": [1]}], [("a", 0), ("a", 2), ("b", 1)]),
     ([], [])],
)  # fmt: skip
def test_list_of_named_partitions_asks_for_exactly_those(topics, asked):
    async def answer(name, partitions):
        return {}

    controller = StandInController(answer)
    response = serve(controller, LIST, 0, {"topics": topics})
    assert controller.calls == [("list_partition_reassignments", (asked,))]
    assert response.error_code == ErrorCode.none and response.topics == ()
