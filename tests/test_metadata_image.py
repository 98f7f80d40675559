"""The listeners' metadata image: Metadata answered in the listener's process from the
Controller's `client_metadata`, kept current by a long poll, exact where a client could
not retry past it (metadata_image.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import confluent_kafka
import pytest
import ray

import rayk
from rayk.config import BrokerConfig
from rayk.net.api_versions import ALTER_PARTITION_REASSIGNMENTS, CREATE_PARTITIONS, DELETE_TOPICS, ELECT_LEADERS, METADATA
from rayk.net.broker_view import BrokerView
from rayk.net.kafka_apis import HANDLERS, _then_refresh_metadata
from rayk.net.metadata_image import MetadataImage
from tests.cluster_helpers import FAST_CONFIG, assert_lookup_is_a_long_poll, pid_of, shared_local_ray, wait_until
from tests.protocol_helpers import RawConnection

UNKNOWN_TOPIC_OR_PARTITION = 3


def described(topics: dict[str, list[int]]) -> dict[str, Any]:
    """A `client_metadata` answer: per topic its partitions' leaders (-1: none)."""
    return {
        "cluster_id": "c",
        "brokers": {0: {"PLAINTEXT": ("127.0.0.1", 9092)}},
        "topics": {
            name: {"topic_id": f"id-{name}", "partitions": {
                p: {"leader": leader, "leader_epoch": 0, "replicas": [0], "isr": [0]} for p, leader in enumerate(leaders)}}
            for name, leaders in topics.items()
        },
    }


def test_the_image_answers_only_for_topics_it_holds_with_every_partition_led():
    image = MetadataImage()
    assert image.answer(["orders"]) is None and image.answer([]) is None, "nothing taken yet"
    image.take(("incarnation", 1), described({"orders": [0, 0], "clicks": [0], "new": [0, -1]}))
    answer = image.answer(["orders", "clicks", "orders"])
    assert list(answer["topics"]) == ["orders", "clicks"] and answer["cluster_id"] == "c"
    assert answer["topics"]["orders"]["partitions"][1]["leader"] == 0
    assert image.answer(["orders", "absent"]) is None, "a topic not held is the Controller's to answer"
    assert image.answer(["new"]) is None, "a partition without a leader is the Controller's to answer"
    assert image.answer([]) == {"cluster_id": "c", "brokers": {0: {"PLAINTEXT": ("127.0.0.1", 9092)}}, "topics": {}}


def test_an_image_older_than_the_one_held_is_not_taken():
    """The long poll and a refresh after a change made through the listener can answer out
    of order: the later-arriving older one must not replace the newer image (the long
    poll would then wait on the newer version while the image stays behind)."""
    image = MetadataImage()
    assert image.take(("a", 2), described({"new": [0]}))
    assert not image.take(("a", 1), described({"old": [0]})), "an older answer that arrived late"
    assert not image.take(("a", 2), described({"old": [0]}))
    assert image.version == ("a", 2) and image.answer(["new"]) is not None and image.answer(["old"]) is None
    assert image.take(("b", 0), described({"old": [0]})), "a restarted Controller counts again"
    assert image.answer(["old"]) is not None


class FakeController:
    """Answers `client_metadata` and `client_metadata_image` as the Controller, counting calls."""

    def __init__(self, topics: dict[str, list[int]]) -> None:
        self.topics, self.calls, self.version = topics, {"client_metadata": 0, "client_metadata_image": 0}, 1
        self.image_fails = False
        outer = self

        class Method:
            def __init__(self, name: str) -> None:
                self.name = name

            def remote(self, *args: Any) -> Any:
                outer.calls[self.name] += 1
                return getattr(outer, "_" + self.name)(*args)

        self.client_metadata = Method("client_metadata")
        self.client_metadata_image = Method("client_metadata_image")

    async def _client_metadata(self, names: list[str] | None) -> dict:
        everything = described(self.topics)
        return everything | {"topics": {n: t for n, t in everything["topics"].items() if names is None or n in names}}

    async def _client_metadata_image(self, known: Any, wait_ms: int) -> Any:
        if self.image_fails:
            raise RuntimeError("the Controller is away")
        return None if known == ("i", self.version) else (("i", self.version), described(self.topics))


def test_a_listener_answers_held_topics_from_its_image_and_asks_the_controller_otherwise():
    controller = FakeController({"orders": [0], "new": [-1]})
    view = BrokerView(0, controller, BrokerConfig())

    async def run() -> list[Any]:
        before = await view.client_metadata(["orders"])  # no image yet: the Controller answers
        took = [await view.refresh_metadata_image(), await view.refresh_metadata_image()]
        held = [await view.client_metadata(["orders"]) for _ in range(3)]
        return [before, took, held, await view.client_metadata(["absent"]), await view.client_metadata(["new"]),
                await view.client_metadata(None)]

    before, took, held, absent, new, everything = asyncio.run(run())
    assert took == [True, False], "the same version is not taken twice"
    assert before == held[0] == held[2] and held[0]["topics"]["orders"]["partitions"][0]["leader"] == 0
    assert absent["topics"] == {} and new["topics"]["new"]["partitions"][0]["leader"] == -1
    assert set(everything["topics"]) == {"orders", "new"}
    assert controller.calls == {"client_metadata": 4, "client_metadata_image": 2}, (
        "before the image, then a topic not held, one not led, and every topic; the three held answers asked nothing")


def test_a_change_made_through_a_listener_is_answered_once_its_image_holds_it():
    """DeleteTopics, CreatePartitions, ElectLeaders and AlterPartitionReassignments are
    answered once the listener took the image with their change, so the client's next
    Metadata from it shows the change; a failed refresh does not fail the request."""
    assert all(HANDLERS[key].__qualname__.startswith("_then_refresh_metadata")
               for key in (DELETE_TOPICS, CREATE_PARTITIONS, ELECT_LEADERS, ALTER_PARTITION_REASSIGNMENTS))
    controller = FakeController({"goes": [0], "stays": [0]})
    view = BrokerView(0, controller, BrokerConfig())

    async def delete(view: BrokerView, request: Any) -> dict:
        del controller.topics["goes"]
        controller.version += 1
        return {"responses": []}

    async def run() -> list[Any]:
        await view.refresh_metadata_image()
        held = view.metadata_image.answer(["goes"])
        answer = await _then_refresh_metadata(delete)(view, None)
        gone = view.metadata_image.answer(["goes"])
        controller.image_fails = True
        answer_without_refresh = await _then_refresh_metadata(delete_nothing)(view, None)
        return [held, answer, gone, answer_without_refresh]

    async def delete_nothing(view: BrokerView, request: Any) -> dict:
        return {"responses": ["kept"]}

    held, answer, gone, answer_without_refresh = asyncio.run(run())
    assert held is not None and answer == {"responses": []} and gone is None
    assert answer_without_refresh == {"responses": ["kept"]}

    async def cancelled(view: BrokerView, request: Any) -> dict:
        raise asyncio.CancelledError  # the client's connection went while it ran

    lookups = controller.calls["client_metadata_image"]
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(_then_refresh_metadata(cancelled)(view, None))
    assert controller.calls["client_metadata_image"] == lookups, "a cancelled request refreshes nothing"


# ---------------------------------------------------------------------------- on a cluster


@pytest.fixture(scope="module", autouse=True)
def ray_local():
    shared_local_ray()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = rayk.start(brokers=3, data_dir=tmp_path_factory.mktemp("metadata-image"), config=FAST_CONFIG,
                   namespace="metadata-image")
    yield c
    c.shutdown()


def metadata_of(connection: RawConnection, names: list[str]) -> Any:
    return connection.call(METADATA, 12, {"topics": [{"name": n, "topic_id": None} for n in names],
                                          "allow_auto_topic_creation": False,
                                          "include_topic_authorized_operations": False})


def partition_counts(connection: RawConnection, names: list[str]) -> dict[str, tuple[int, int]]:
    """Per topic (error code, partitions) as the connection's listener answers Metadata."""
    return {t.name: (t.error_code.value, len(t.partitions)) for t in metadata_of(connection, names).topics}


def settled(controller: Any) -> bool:
    """Whether what Metadata answers stayed the same for a second (leaders taking up their
    epochs after the cluster started move it too)."""
    version, _ = ray.get(controller.client_metadata_image.remote())
    return ray.get(controller.client_metadata_image.remote(version, 1_000)) is None


def test_the_image_lookup_is_a_long_poll_woken_by_commits_and_by_a_broker_s_listeners(cluster):
    controller = cluster.controller
    wait_until(lambda: settled(controller), 60, "the cluster's metadata to settle")
    image = assert_lookup_is_a_long_poll(controller, "client_metadata_image",
                                         lambda: cluster.create_topic("long-poll", num_partitions=1, replication_factor=3))
    assert "long-poll" in image["topics"]
    # A broker's listeners moving is no commit (update_endpoints), and still wakes it.
    wait_until(lambda: settled(controller), 60, "the new topic's leader to take up its epoch")
    version, _ = ray.get(controller.client_metadata_image.remote())
    held = controller.client_metadata_image.remote(version, 60_000)
    assert ray.wait([held], timeout=0.5)[0] == []
    broker = next(b for b in cluster.brokers() if b["broker_id"] == 0)
    moved = {name: (host, port + 1) for name, (host, port) in broker["endpoints"].items()}
    try:
        ray.get(controller.update_endpoints.remote(0, broker["epoch"], moved))
        new_version, image = ray.get(held, timeout=30)
        assert new_version > version and image["brokers"][0] == moved
    finally:
        ray.get(controller.update_endpoints.remote(0, broker["epoch"], broker["endpoints"]))


def test_a_change_made_through_a_listener_is_in_its_next_metadata_answer(cluster):
    """The listener refreshes its image before answering DeleteTopics or CreatePartitions
    (kafka_apis._then_refresh_metadata): its next Metadata answer shows the change."""
    for name in ("grows", "goes"):
        cluster.create_topic(name, num_partitions=1, replication_factor=3)
    connection = RawConnection(cluster.bootstrap_servers.split(",")[0])
    try:
        wait_until(lambda: partition_counts(connection, ["grows", "goes"]) == {"grows": (0, 1), "goes": (0, 1)}, 30,
                   "both topics led")
        grown = connection.call(CREATE_PARTITIONS, 3, {"topics": [{"name": "grows", "count": 3, "assignments": None}],
                                                       "timeout": 30_000, "validate_only": False})
        assert [r.error_code.value for r in grown.results] == [0]
        deleted = connection.call(DELETE_TOPICS, 5, {"topic_names": ["goes"], "timeout": 30_000})
        assert [r.error_code.value for r in deleted.responses] == [0]
        assert partition_counts(connection, ["grows", "goes"]) == {"grows": (0, 3), "goes": (UNKNOWN_TOPIC_OR_PARTITION, 0)}
    finally:
        connection.close()


def test_with_the_controller_stopped_a_new_producer_starts_and_its_records_are_acknowledged(cluster):
    """Kafka's brokers answer Metadata from their own cache: a producer that starts while
    the Controller's process is stopped (SIGSTOP) still learns the leaders and writes."""
    cluster.create_topic("no-controller", num_partitions=3, replication_factor=3)
    config = {"bootstrap.servers": cluster.bootstrap_servers, "acks": "all", "linger.ms": 0}
    first = confluent_kafka.Producer(config)  # the listeners' links to the leaders, made while it runs
    for p in range(3):
        first.produce("no-controller", b"before", partition=p)
    assert first.flush(30) == 0
    pid = pid_of(cluster.controller)
    os.kill(pid, signal.SIGSTOP)
    try:
        acknowledged: list[Any] = []
        producer = confluent_kafka.Producer(config)
        started = time.monotonic()
        for p in range(3):
            producer.produce("no-controller", b"while stopped", partition=p,
                             on_delivery=lambda err, message: acknowledged.append(err))
        assert producer.flush(10) == 0 and acknowledged == [None] * 3
        assert time.monotonic() - started < 10
    finally:
        os.kill(pid, signal.SIGCONT)
    assert sum(p["high_watermark"] for p in cluster.describe_topic("no-controller")) == 6
