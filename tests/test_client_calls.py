"""The client's promise about its calls (rayk/client/calls.py): every call goes through
that one module, is bounded by default_api_timeout_ms and raises only rayk's errors;
admin calls that are not idempotent come out right when retried after a lost answer.
Against fake Controller actors (no cluster); tests/test_controller_restart.py has the
same promise against a real Controller that Ray restarts."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import re
import threading
import time
from pathlib import Path

import pytest
import ray

from rayk.client.admin import Admin
from rayk.client.cluster import Cluster
from rayk.errors import KafkaTimeoutError, TopicAlreadyExistsError, UnknownTopicOrPartitionError
from tests.cluster_helpers import shared_local_ray

ROOT = Path(__file__).resolve().parent.parent / "rayk"
# Modules that call actors besides the client package itself.
CALLERS_OUTSIDE_CLIENT = ("data.py", "spark.py", "cli.py")
# path (relative to rayk/) -> why it may call Ray directly. Keep it empty.
ALLOWED_DIRECT_CALLS: dict[str, str] = {}
DIRECT_CALL = re.compile(r"\bray\s*\.\s*(get|wait)\s*\(|\bfrom\s+ray\s+import\s+[^\n]*\b(get|wait)\b")


def test_no_client_module_calls_ray_get_or_wait_but_calls_py():
    """Every blocking wait on an actor goes through rayk/client/calls.py, which bounds it
    and translates Ray's exceptions; a `ray.get` anywhere else would bypass both."""
    paths = [p for p in (ROOT / "client").glob("*.py") if p.name != "calls.py"]
    paths += [ROOT / name for name in CALLERS_OUTSIDE_CLIENT]
    bypassing = []
    for path in sorted(paths):
        relative = str(path.relative_to(ROOT))
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if DIRECT_CALL.search(line.split("#", 1)[0]) and relative not in ALLOWED_DIRECT_CALLS:
                bypassing.append(f"rayk/{relative}:{number}: {line.strip()}")
    assert not bypassing, "calls that bypass rayk.client.calls:\n" + "\n".join(bypassing)


def test_the_bypass_check_sees_the_ways_of_calling_ray():
    for line in ("x = ray.get(ref)", "ray.wait(refs, timeout=1)", "from ray import get", "ray .get( ref)"):
        assert DIRECT_CALL.search(line), line
    for line in ("ray.get_actor(name)", "ray.get_runtime_context()", "calls.get(ref, deadline)"):
        assert not DIRECT_CALL.search(line), line


# ---------------------------------------------------------------------- against fake Controllers


@pytest.fixture(scope="module")
def ray_local():
    shared_local_ray()  # the actors a test starts go when their handles do


@ray.remote(num_cpus=0)
class SilentController:
    """A Controller that never answers (a hung process)."""

    async def describe_topic(self, name):
        await asyncio.sleep(3600)

    async def list_topics(self):
        await asyncio.sleep(3600)


@ray.remote(num_cpus=0, max_restarts=-1)
class ForgetfulController:
    """A Controller whose topics live in a file, and that dies before answering the next
    call of each kind in `lose` ("create", "delete"), after doing what it was asked (the
    answer is lost; Ray restarts it)."""

    def __init__(self, state_path, topics=None, lose=()):
        self.path = Path(state_path)
        if not self.path.exists():
            self._save({"topics": topics or {}, "lose": list(lose), "calls": []})

    def _load(self):
        return json.loads(self.path.read_text())

    def _save(self, state):
        self.path.write_text(json.dumps(state))

    def _called(self, kind, name):
        state = self._load()
        state["calls"].append(f"{kind} {name}")
        lose = kind in state["lose"]
        if lose:
            state["lose"].remove(kind)
        self._save(state)
        return state, lose

    async def create_topic(self, name, num_partitions, replication_factor, config, validate_only=False, timeout_ms=None,
                           scale_out_timeout_ms=None):  # (the Controller's signature)
        state, lose = self._called("create", name)
        if name not in state["topics"]:
            state["topics"][name] = [num_partitions, replication_factor]
            self._save(state)
            self._die_if(lose)
            return await self.describe_topic(name)
        self._die_if(lose)
        raise TopicAlreadyExistsError(f"topic {name!r} already exists")

    async def delete_topic(self, name):
        state, lose = self._called("delete", name)
        if name not in state["topics"]:
            self._die_if(lose)
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        del state["topics"][name]
        self._save(state)
        self._die_if(lose)

    async def describe_topic(self, name):
        topics = self._load()["topics"]
        if name not in topics:
            raise UnknownTopicOrPartitionError(f"topic {name!r} does not exist")
        partitions, replication_factor = topics[name]
        replicas = list(range(replication_factor))
        return [
            {"topic": name, "topic_id": "id", "partition": p, "leader": 0, "replicas": replicas, "isr": replicas,
             "leader_epoch": 0, "partition_epoch": 0, "recovering": [], "adding_replicas": [], "removing_replicas": [],
             "eligible_leader_replicas": [], "high_watermark": 0, "log_end_offset": 0, "log_start_offset": 0}
            for p in range(partitions)
        ]  # fmt: skip

    async def calls(self):
        return self._load()["calls"]

    def _die_if(self, lose):
        if lose:
            os._exit(1)


def bounded(call, limit_s: float):
    """What `call()` returned or raised, failing the test if it took longer than
    `limit_s` (it runs in a thread, so a call that hangs cannot hang the test)."""
    outcome: dict = {}

    def run():
        try:
            outcome["returned"] = call()
        except BaseException as e:
            outcome["raised"] = e

    thread = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), f"the call did not end within {limit_s} s"
    return outcome, time.monotonic() - started


def test_a_call_never_answered_raises_kafka_timeout_within_default_api_timeout_ms(ray_local):
    silent = SilentController.remote()
    cluster = Cluster(silent, "silent", default_api_timeout_ms=1500)
    for call in (lambda: cluster.describe_topic("t"), lambda: cluster.admin().list_topics(),
                 lambda: Admin(cluster, default_api_timeout_ms=1500).describe_topics(["t"])):  # fmt: skip
        outcome, took_s = bounded(call, 60)
        assert isinstance(outcome.get("raised"), KafkaTimeoutError), outcome
        assert took_s >= 1.4, "the whole timeout is waited for"
        assert took_s < 30, "far less than Kafka's 60 s default: the setting bounds the call"


def test_an_error_the_controller_answers_is_raised_at_once_not_retried(ray_local, tmp_path):
    controller = ForgetfulController.remote(str(tmp_path / "state.json"))
    admin = Admin(Cluster(controller, "answers"), default_api_timeout_ms=60_000)
    outcome, took_s = bounded(lambda: admin.describe_topics(["missing"]), 50)
    assert isinstance(outcome.get("raised"), UnknownTopicOrPartitionError), outcome
    assert took_s < 30, "UNKNOWN_TOPIC_OR_PARTITION is retriable for a producer, but an admin call's answer"


def test_a_create_or_delete_whose_answer_was_lost_is_retried_and_answers_what_it_did(ray_local, tmp_path):
    controller = ForgetfulController.remote(str(tmp_path / "state.json"), lose=["create", "delete"])
    admin = Admin(Cluster(controller, "lost-answers"), default_api_timeout_ms=60_000)

    created = admin.create_topic("t", 2, 3)  # created, then the Controller died before answering
    assert [(p["partition"], len(p["replicas"])) for p in created] == [(0, 3), (1, 3)]
    admin.delete_topics(["t"])  # deleted, then the Controller died before answering
    assert ray.get(controller.calls.remote()) == ["create t", "create t", "delete t", "delete t"], "one retry each"

    with pytest.raises(UnknownTopicOrPartitionError):
        admin.delete_topics(["t"])  # answered: there is no such topic
    admin.create_topic("t", 2, 3)
    with pytest.raises(TopicAlreadyExistsError):
        admin.create_topic("t", 2, 3)  # answered at once: it exists (whoever made it)


def test_a_retried_create_that_finds_a_topic_unlike_the_one_asked_for_raises_topic_already_exists(ray_local, tmp_path):
    # another client's "t" has 4 partitions; the first attempt's answer (TOPIC_ALREADY_EXISTS) is lost
    controller = ForgetfulController.remote(str(tmp_path / "state.json"), topics={"t": [4, 1]}, lose=["create"])
    with pytest.raises(TopicAlreadyExistsError):
        Admin(Cluster(controller, "other-topic")).create_topic("t", 2, 3)
    assert ray.get(controller.calls.remote()) == ["create t", "create t"]


@ray.remote(num_cpus=0)
class Refusing:
    def refuse(self, delay_s: float) -> None:
        time.sleep(delay_s)
        raise UnknownTopicOrPartitionError(f"refused after {delay_s} s")


def test_calls_made_together_raise_the_first_failure_and_leave_no_unhandled_error_behind(ray_local, monkeypatch):
    """get_all raises the first failure it meets; the calls still running when it raises
    fail later, and Ray would log each as an "Unhandled error" once its ref went (the
    Ray Data reads of a topic whose leader moved printed one per partition)."""
    from rayk.client import calls

    unhandled: list[Exception] = []
    monkeypatch.setattr(ray._private.worker, "_unhandled_error_handler", unhandled.append)
    refusing = Refusing.remote()
    refs = [refusing.refuse.remote(delay_s) for delay_s in (0, 0.3, 0.3)]
    with pytest.raises(UnknownTopicOrPartitionError, match="after 0 s"):
        calls.get_all(refs, time.monotonic() + 10, "refusals")
    del refs
    done = ray.get(refusing.__ray_call__.remote(lambda actor: "the earlier calls ran"))  # the actor runs in order
    assert done == "the earlier calls ran"
    for _ in range(20):
        gc.collect()
        time.sleep(0.05)
    assert unhandled == []
    # The check sees them where nothing takes them (Ray's own behaviour, which _leave undoes).
    refs = [refusing.refuse.remote(delay_s) for delay_s in (0, 0.3)]
    with pytest.raises(Exception):
        ray.get(refs)
    del refs
    ray.get(refusing.__ray_call__.remote(lambda actor: None))
    for _ in range(40):
        gc.collect()
        time.sleep(0.05)
        if unhandled:
            break
    assert len(unhandled) == 1 and "after 0.3 s" in str(unhandled[0])


def test_a_call_that_timed_out_and_failed_later_leaves_no_unhandled_error_behind(ray_local, monkeypatch):
    """A call we stopped waiting for may still run and fail (a sync actor's call cannot be
    cancelled once it runs): nothing is logged for it."""
    from rayk.client import calls
    from rayk.errors import RequestTimedOutError

    unhandled: list[Exception] = []
    monkeypatch.setattr(ray._private.worker, "_unhandled_error_handler", unhandled.append)
    refusing = Refusing.remote()
    ray.get(refusing.__ray_call__.remote(lambda actor: None))  # started
    ref = refusing.refuse.remote(0.3)
    with pytest.raises(RequestTimedOutError):
        calls.get(ref, time.monotonic() + 0.05, "a refusal")
    del ref
    ray.get(refusing.__ray_call__.remote(lambda actor: None))  # the refusal ran
    for _ in range(20):
        gc.collect()
        time.sleep(0.05)
    assert unhandled == []
