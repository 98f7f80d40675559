"""SendPath, send()'s common case compiled (rayk/client/_send.c), held to its Python
reference (rayk.client.send_path.send_path_reference) and to `Producer.send` without it.

Three producers are fed the same calls: one with the compiled path, one with the
reference, one with neither. After every step the three accumulators must hold the same
batches, records, callbacks, counts and sticky partitions, the calls must have returned
equal futures or raised the same errors, and the compiled path and the reference must have
taken (or declined) the same calls. No Ray, no sender thread: the producers are built
around a bare RecordAccumulator, and the sender's part (closing batches, finishing them)
is stepped by hand.
"""

from __future__ import annotations

import gc
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayk.client.accumulator import RecordAccumulator
from rayk.client.partitioner import StickyPartitioner, partition_for_key
from rayk.client.produce_future import BatchResult, FutureRecordMetadata
from rayk.client.producer import Producer
from rayk.client.send_path import SendPath, send_path_reference
from rayk.client.serializers import serializer
from rayk.errors import KafkaError, KafkaTimeoutError, RecordTooLargeError

pytestmark = pytest.mark.skipif(SendPath is None, reason="rayk.client._send is not built")

START_MS = time.time_ns() // 1_000_000  # timestamps at or after this were "now" at send()
TOPICS = {"t1": 1, "t3": 3}  # known topics and their partition counts ("gone" is unknown)


class FakeMetadata:
    """What send() reads of a MetadataCache: `_topics`, and a lookup that finds nothing."""

    def __init__(self) -> None:
        self._topics: dict[str, dict[int, Any]] = {t: dict.fromkeys(range(n)) for t, n in TOPICS.items()}

    def cached_partition_count(self, topic: str) -> int | None:
        known = self._topics.get(topic)
        return None if known is None else len(known)

    def partition_count(self, topic: str, timeout_ms: int) -> int:
        raise KafkaTimeoutError(f"{topic} not found")


def producer(kind: str, metadata: FakeMetadata, *, batch_size: int, buffer_memory: int, seed: int,
             plain: bool = True) -> Producer:  # fmt: skip
    """A Producer with no cluster and no sender thread: `kind` is "compiled", "reference" or
    "python" (no path)."""
    acc = RecordAccumulator(
        batch_size=batch_size, linger_ms=5, delivery_timeout_ms=120_000, buffer_memory=buffer_memory,
        max_block_ms=0, max_in_flight=5, max_request_size=max(batch_size, 4096),
    )  # fmt: skip
    acc._partitioner = StickyPartitioner(random.Random(seed))
    p = Producer.__new__(Producer)
    p._closed = False
    p._key_serializer = serializer(None if plain else "str")
    p._value_serializer = serializer(None if plain else "str")
    p._plain_keys = p._plain_values = plain
    p._max_request_size = max(batch_size, 4096)
    p._max_record_bytes = min(p._max_request_size, buffer_memory) - 61
    p._buffer_memory = buffer_memory
    p._max_block_ms = 0
    p._metadata = metadata
    p._transactions = None
    p._accumulator = acc
    args = (acc, metadata, p._plain_keys, p._plain_values, p._max_record_bytes)
    p._send_path = {"compiled": SendPath, "reference": send_path_reference, "python": lambda *a: None}[kind](*args)
    return p


def now_or(ts: Any) -> Any:
    """A timestamp, or "now" for one taken at send() (the three producers' clocks differ)."""
    if isinstance(ts, int) and ts >= START_MS:
        assert ts <= time.time_ns() // 1_000_000
        return "now"
    return ts


def state(p: Producer) -> Any:
    acc = p._accumulator

    def batch(b: Any) -> Any:
        return (
            tuple(b.tp), b.state, b.record_count, b.size_bytes,
            [(v, k, tuple(h), now_or(ts)) for v, k, h, ts in b.records],
            queued_callbacks(b.result),
        )  # fmt: skip

    return (
        sorted((tuple(tp), batch(b)) for tp, b in acc._open.items()),
        sorted((tuple(tp), [batch(b) for b in q]) for tp, q in acc._ready.items()),
        acc.unfinished, acc._buffered_bytes, dict(acc._partitioner._sticky_by_topic), acc.closed,
    )  # fmt: skip


def queued_callbacks(result: BatchResult) -> list[tuple[Any, int, Any]]:
    """A batch's queued record callbacks as (callable, index, timestamp) threes."""
    queued = list(result._record_callbacks)
    assert len(queued) % 3 == 0 and all(callable(fn) and type(i) is int for fn, i in zip(queued[::3], queued[1::3]))
    return [(fn, index, now_or(ts)) for fn, index, ts in zip(queued[::3], queued[1::3], queued[2::3])]


def outcome(call: Any) -> Any:
    try:
        future = call()
    except (KafkaError, RuntimeError, ValueError, TypeError) as e:
        return ("raised", type(e).__name__, str(e))
    assert type(future) is FutureRecordMetadata
    return ("future", future._batch.topic, future._batch.partition, future._index, now_or(future._timestamp_ms))


def callback_a(future: Any) -> None:
    pass


def callback_b(future: Any) -> None:
    pass


SEND_ARGUMENTS = ("topic", "value", "key", "headers", "partition", "timestamp_ms", "callback")  # the path's order
sends = st.fixed_dictionaries({
    "topic": st.sampled_from(["t1", "t3", "t3", "t3", "gone"]),
    "value": st.one_of(
        st.binary(max_size=60), st.binary(max_size=60), st.binary(min_size=200, max_size=260),
        st.sampled_from(["text", None, bytearray(b"ba")]),
    ),
    "key": st.one_of(st.none(), st.none(), st.binary(max_size=8), st.just("k")),
    "headers": st.sampled_from([None, None, None, [], [("h", b"v")]]),
    "partition": st.sampled_from([None, None, None, 0, 1, 2, 3, -1, True]),
    "timestamp_ms": st.sampled_from([None, None, 0, 5, 1_000, -3, 1.5]),
    "callback": st.sampled_from([None, callback_a, callback_b]),
})  # fmt: skip
# Calls the compiled path may take (bytes, no headers, a partition in range or none).
common_sends = st.fixed_dictionaries({
    "topic": st.sampled_from(["t1", "t3", "t3"]),
    "value": st.binary(max_size=60),
    "key": st.one_of(st.none(), st.none(), st.binary(max_size=8)),
    "headers": st.none(),
    "partition": st.sampled_from([None, None, None, 0, 1, 2]),
    "timestamp_ms": st.sampled_from([None, 0, 5, 1_000]),
    "callback": st.sampled_from([None, callback_a, callback_b]),
})  # fmt: skip
STEP_KINDS = (  # (share in 100, strategy)
    (66, common_sends.map(lambda s: ("send", s))),
    (20, sends.map(lambda s: ("send", s))),
    (4, st.just(("linger", None))),  # the sender closes every open batch
    (4, st.just(("finish", None))),  # and finishes every ready one
    # A metadata refresh: a topic grows, goes, or was made again with fewer partitions.
    (4, st.sampled_from([("grow", "t3"), ("grow", "t1"), ("forget", "t3"), ("remade", "t3")])),
    # The end of sending (rare: nothing is appended after it).
    (2, st.sampled_from([("close", None), ("fail", None), ("close accumulator", None)])),
)


def _step_kind(i: int) -> st.SearchStrategy:
    for share, strategy in STEP_KINDS:
        if i < share:
            return strategy
        i -= share
    raise AssertionError(i)


steps = st.integers(0, 99).flatmap(_step_kind)


def step(p: Producer, action: str, arg: Any) -> Any:
    acc = p._accumulator
    if action == "send":
        return outcome(lambda: p.send(**arg))
    if action == "linger":
        with acc.lock:
            acc._flushing += 1
            acc.close_lingering(time.monotonic())
            acc._flushing -= 1
    elif action == "finish":
        for queue in list(acc._ready.values()):
            while queue:
                acc.finished(queue.popleft())
    elif action == "close":
        p._closed = True
    elif action == "fail":
        with acc.lock:
            acc._failure = "the sender failed"
    elif action == "close accumulator":  # Producer.close's end, or a close while send() runs
        acc.close()
    return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    calls=st.lists(steps, min_size=20, max_size=80),
    batch_size=st.sampled_from([64, 200, 1_000, 100_000, 100_000]),
    buffer_memory=st.sampled_from([300, 2_000, 1_000_000, 1_000_000]),
    plain=st.sampled_from([True, True, True, False]),  # False: serializers of their own, the Python way
    seed=st.integers(0, 10),
)
def test_the_compiled_path_appends_what_send_appends(calls, batch_size, buffer_memory, plain, seed):
    metadata = FakeMetadata()
    kinds = ("compiled", "reference", "python")
    producers = {k: producer(k, metadata, batch_size=batch_size, buffer_memory=buffer_memory, seed=seed, plain=plain)
                 for k in kinds}  # fmt: skip
    taken = {"compiled": [], "reference": []}  # the futures each path returned itself
    for kind, found in taken.items():
        producers[kind]._send_path = counted(producers[kind]._send_path, found)
    for action, arg in calls:
        if action in ("grow", "forget", "remade"):  # one metadata for the three: a refresh replaces a topic's dict
            if action == "grow" and arg in metadata._topics:
                metadata._topics[arg] = dict.fromkeys(range(len(metadata._topics[arg]) + 1))
            elif action == "remade":
                metadata._topics[arg] = dict.fromkeys(range(2))
            else:
                metadata._topics.pop(arg, None)
            continue
        results = {kind: step(p, action, arg) for kind, p in producers.items()}
        assert results["compiled"] == results["reference"] == results["python"], (action, arg, results)
        states = {k: state(p) for k, p in producers.items()}
        assert states["compiled"] == states["reference"] == states["python"], (action, arg)
        assert len(taken["compiled"]) == len(taken["reference"]), (action, arg)
    TAKEN.append(len(taken["compiled"]))


TAKEN: list[int] = []  # per example of the model test, the calls the compiled path took


def counted(path: Any, found: list[Any]) -> Any:
    def call(*args: Any) -> Any:
        future = path(*args)
        if future is not None:
            found.append(future)
        return future

    return call


def test_the_model_test_made_the_compiled_path_take_calls():
    """So that a path declining everything cannot pass the model test (run after it)."""
    if not TAKEN:
        pytest.skip("the model test did not run in this session")
    assert sum(TAKEN) > 2 * len(TAKEN), (sum(TAKEN), len(TAKEN))  # ~5 a run of 300 examples


@settings(max_examples=300, deadline=None)
@given(calls=st.lists(sends, min_size=10, max_size=40), batch_size=st.sampled_from([64, 1_000, 100_000]), seed=st.integers(0, 5))
def test_the_compiled_path_declines_what_the_reference_declines(calls, batch_size, seed):
    """The same calls straight to the two paths: the same futures, the same Nones, the same
    state, each None leaving the accumulator as it was."""
    metadata = FakeMetadata()
    paths = {k: producer(k, metadata, batch_size=batch_size, buffer_memory=1_000_000, seed=seed)
             for k in ("compiled", "reference")}  # fmt: skip
    for p in paths.values():  # an open batch on each partition of t3 and on t1, and t3's sticky partition
        p.send("t1", b"first", partition=0)
        for partition in range(3):
            p.send("t3", b"first", partition=partition)
        p.send("t3", b"sticky")
    for arg in calls:
        got = {}
        for kind, p in paths.items():
            before = state(p)
            future = p._send_path(p, *(arg[name] for name in SEND_ARGUMENTS))
            if future is None:
                assert state(p) == before, "a declined call changed nothing"
            got[kind] = None if future is None else outcome(lambda: future)
        assert got["compiled"] == got["reference"], arg
        assert state(paths["compiled"]) == state(paths["reference"])


def test_a_keyed_record_goes_to_the_partition_of_its_key():
    metadata = FakeMetadata()
    p = producer("compiled", metadata, batch_size=100_000, buffer_memory=1_000_000, seed=0)
    for partition in range(3):
        p._send_path = None
        p.send("t3", b"open", partition=partition)
    p._send_path = SendPath(p._accumulator, metadata, True, True, p._max_record_bytes)
    for i in range(200):
        key = f"key-{i}".encode()
        future = p._send_path(p, "t3", b"v", key, None, None, 7, None)
        assert future is not None and future._batch.partition == partition_for_key(key, 3)


def test_it_declines_while_another_thread_holds_the_accumulator_lock():
    metadata = FakeMetadata()
    p = producer("compiled", metadata, batch_size=100_000, buffer_memory=1_000_000, seed=0)
    p.send("t1", b"open", partition=0)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with p._accumulator.lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        before = state(p)
        assert p._send_path(p, "t1", b"v", None, None, 0, 1, None) is None
        assert state(p) == before
    finally:
        release.set()
        holder.join()
    assert p._send_path(p, "t1", b"v", None, None, 0, 1, None) is not None
    # The thread that holds the lock (an RLock) may append, as RecordAccumulator.append may.
    with p._accumulator.lock:
        assert p._send_path(p, "t1", b"v", None, None, 0, 1, None) is not None


def test_futures_of_the_compiled_path_resolve_and_call_back():
    metadata = FakeMetadata()
    p = producer("compiled", metadata, batch_size=100_000, buffer_memory=1_000_000, seed=0)
    p.send("t3", b"open", partition=1)
    called: list[Any] = []
    futures = [p._send_path(p, "t3", b"v", None, None, 1, 10 + i, called.append) for i in range(3)]
    batch = p._accumulator._open[("t3", 1)]
    assert [f._index for f in futures] == [1, 2, 3]
    batch.result.complete(100, -1)
    assert [f.get(0).offset for f in futures] == [101, 102, 103]
    assert [f.get(0).timestamp for f in futures] == [10, 11, 12]
    assert called == futures  # a future equal to each record's, in the order they were sent


def test_the_compiled_future_is_a_record_place_with_read_only_slots():
    result = BatchResult("t", 0)
    future = FutureRecordMetadata(result, 3, 9)
    assert (future._batch, future._index, future._timestamp_ms) == (result, 3, 9)
    assert future == FutureRecordMetadata(result, 3, 9) and hash(future) == hash(FutureRecordMetadata(result, 3, 9))
    with pytest.raises(AttributeError):
        future._index = 4
    with pytest.raises(TypeError):
        FutureRecordMetadata(result, 3)


@pytest.mark.parametrize("kind", ["compiled", "reference"])
def test_a_record_that_fills_its_batch_exactly_goes_the_python_way_and_closes_it(kind):
    """RecordAccumulator.append closes a batch that reaches batch_size with the record in
    it: the path appends only to a batch that stays under it."""
    metadata = FakeMetadata()
    record_bytes = 21 + 10
    p = producer(kind, metadata, batch_size=61 + 3 * record_bytes, buffer_memory=1_000_000, seed=0)
    futures = [p.send("t1", b"0123456789", partition=0, timestamp_ms=1) for _ in range(3)]
    assert [f._index for f in futures] == [0, 1, 2]
    acc = p._accumulator
    assert not acc._open and [b.record_count for b in acc._ready[("t1", 0)]] == [3]
    path_calls = p._send_path(p, "t1", b"0123456789", None, None, 0, 1, None)
    assert path_calls is None, "no open batch: the Python way opens one"


@pytest.mark.parametrize("kind", ["compiled", "reference"])
def test_a_record_over_max_record_bytes_goes_the_python_way_and_is_refused(kind):
    metadata = FakeMetadata()
    p = producer(kind, metadata, batch_size=1_000_000, buffer_memory=10_000, seed=0)
    p.send("t1", b"open", partition=0)
    largest = p._max_record_bytes - 21
    assert p._send_path(p, "t1", b"x" * (largest + 1), None, None, 0, 1, None) is None
    assert p._send_path(p, "t1", b"x" * largest, None, None, 0, 1, None) is not None
    with pytest.raises(RecordTooLargeError):
        p.send("t1", b"x" * (largest + 1), partition=0)


@pytest.mark.parametrize("kind", ["compiled", "reference"])
def test_a_sticky_partition_past_a_shrunk_topic_goes_the_python_way(kind):
    """A topic made again with fewer partitions: its sticky partition (and that partition's
    open batch) is past the new count, and the partitioner picks another one."""
    metadata = FakeMetadata()
    p = producer(kind, metadata, batch_size=100_000, buffer_memory=1_000_000, seed=0)
    acc = p._accumulator
    acc._partitioner._sticky_by_topic["t3"] = 2
    p.send("t3", b"open", partition=2)
    assert p._send_path(p, "t3", b"v", None, None, None, 1, None)._batch.partition == 2
    metadata._topics["t3"] = dict.fromkeys(range(2))
    assert p._send_path(p, "t3", b"v", None, None, None, 1, None) is None
    assert p._send_path(p, "t3", b"v", None, None, 2, 1, None) is None
    assert p.send("t3", b"v")._batch.partition in (0, 1)


def test_without_the_compiled_module_send_runs_in_python(tmp_path):
    """Where no C compiler was found at install: no SendPath, futures on the Python base,
    and send() appends, resolves and calls back as before."""
    script = tmp_path / "no_compiler.py"
    script.write_text(f"""
import sys
sys.modules["rayk.client._send"] = None  # as if it had not been built
sys.path[:0] = [{str(Path(__file__).parent.parent)!r}, {str(Path(__file__).parent)!r}]  # this tree's rayk and tests
import rayk
assert rayk.__file__.startswith({str(Path(__file__).parent.parent)!r}), rayk.__file__
from rayk.client import produce_future, send_path
assert send_path.SendPath is None
assert produce_future._RecordPlace is produce_future._RecordPlaceReference
from test_send_path import FakeMetadata, producer
p = producer("python", FakeMetadata(), batch_size=100_000, buffer_memory=1_000_000, seed=0)
p._send_path = None
called = []
futures = [p.send("t3", b"v", partition=1, timestamp_ms=5 + i, callback=called.append) for i in range(3)]
p._accumulator._open[("t3", 1)].result.complete(40, -1)
assert [(f.get(0).offset, f.get(0).timestamp) for f in futures] == [(40, 5), (41, 6), (42, 7)]
assert called == futures
print("ok")
""")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parent.parent)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


@pytest.mark.parametrize("callback", [None, print])
def test_a_send_from_a_collection_does_not_nest_inside_another(callback):
    """A collection runs finalizers and gc.callbacks on the thread that allocated: were it
    to run inside the compiled append, with the accumulator's lock (an RLock) held, a send()
    from one (a logging handler that produces, say) would append in the middle of it, and
    the outer append would then write back stale counts."""
    p = producer("compiled", FakeMetadata(), batch_size=1_000_000, buffer_memory=10_000_000, seed=0)
    p.send("t1", b"open", partition=0, timestamp_ms=1)
    acc = p._accumulator
    inside_the_lock, busy = [], [False]

    def on_collection(phase: str, info: dict) -> None:
        if phase == "start" and not busy[0]:
            busy[0] = True
            try:
                inside_the_lock.append(acc._mutex._is_owned())
                p.send("t1", b"from a collection", partition=0, timestamp_ms=2)
            finally:
                busy[0] = False

    kept = [(i, object()) for i in range(3000)]  # empties the tuple free lists: tuples come from the collector's allocator
    threshold = gc.get_threshold()
    gc.callbacks.append(on_collection)
    gc.set_threshold(1)
    try:
        for i in range(200):
            kept.append([object()])
            assert p._send_path(p, "t1", b"v%d" % i, None, None, 0, 3, callback) is not None
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(on_collection)
    batch = acc._open[("t1", 0)]
    assert inside_the_lock and not any(inside_the_lock)
    assert len(batch.records) == batch.record_count == acc.unfinished > 201
    if callback is not None:
        indexes = [index for _, index, _ in queued_callbacks(batch.result)]
        assert len(indexes) == 200 and len(set(indexes)) == 200


@pytest.mark.parametrize("kind", ["python", "compiled"])
@pytest.mark.parametrize("callback", [None, print])
def test_a_send_nested_in_an_append_by_a_collection_keeps_the_counts(kind, callback):
    """The Python append cannot turn the collector off (it is global), so a collection
    while it allocates under the lock (opening or closing a batch, a callback's place) can
    run a send() nested in it, Python or compiled. Small batches make it open and close
    them all the time; every count must still add up, every record's place be its own and
    in order, and no batch be lost between the open ones and the queues."""
    p = producer(kind, FakeMetadata(), batch_size=300, buffer_memory=10_000_000, seed=0)
    acc = p._accumulator
    busy, nested, inside_the_lock = [False], [0], [0]

    def on_collection(phase: str, info: dict) -> None:
        if phase == "start" and not busy[0]:
            busy[0] = True
            try:
                inside_the_lock[0] += acc._mutex._is_owned()
                p.send("t1", "nested %d" % nested[0] if kind == "python" else b"nested", partition=0,
                       timestamp_ms=2, callback=callback)  # fmt: skip
                nested[0] += 1
            finally:
                busy[0] = False

    kept = [(i, object()) for i in range(3000)]  # empties the tuple free lists (see above)
    threshold = gc.get_threshold()
    gc.callbacks.append(on_collection)
    gc.set_threshold(1)
    try:
        for i in range(400):
            kept.append([object()])
            p._accumulator.append("t1", 0, 2, ("v%d" % i, None, (), 3), 40, callback)
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(on_collection)
    assert nested[0] > 50 and inside_the_lock[0] > (0 if kind == "python" else -1), "sends nested under the lock"
    batches = list(acc._open.values()) + [b for queue in acc._ready.values() for b in queue]
    assert sorted(map(id, batches)) == sorted(map(id, acc._by_age)), "a batch left out of the queues"
    assert all(len(b.records) == b.record_count and b.size_bytes <= 300 + 61 for b in batches)
    assert sum(b.record_count for b in batches) == acc.unfinished == 400 + nested[0]
    if callback is not None:
        for b in batches:
            assert [index for _, index, _ in queued_callbacks(b.result)] == list(range(b.record_count))


def test_a_future_of_the_compiled_path_copies():
    import copy

    future = FutureRecordMetadata(BatchResult("t", 0), 3, 9)
    assert copy.copy(future) == future and copy.copy(future)._timestamp_ms == 9


# ------------------------------------------------------------------ SendMethod: send() itself

PYTHON_SEND = getattr(Producer.send, "__wrapped__", Producer.send)  # the documented function; SendMethod binds as it does

CALL_FORMS = [  # (args after self, kwargs): a plain binding, and what Python refuses
    (("t3", b"v"), {}),
    (("t3", b"v", b"k"), {}),
    (("t3", b"v", None, None, 1, 5, callback_a), {}),
    (("t3",), {"value": b"v", "callback": callback_a}),
    ((), {"topic": "t1", "value": b"v", "partition": 0}),
    (("t3", b"v"), {"key": b"k", "timestamp_ms": 9}),
    (("t3", b"v"), {"value": b"again"}),  # given twice
    (("t3", b"v"), {"colour": "red"}),  # no such argument
    (("t3", b"v", None, None, 1, 5, callback_a, "extra"), {}),  # too many
    ((), {"value": b"v"}),  # no topic
    ((), {}),
    (("t3", b"v"), {"self": None}),
]


@pytest.mark.parametrize(("args", "kwargs"), CALL_FORMS)
def test_send_binds_its_arguments_as_the_python_function_does(args, kwargs):
    """The compiled send and the Python one, on producers in the same state: the same
    future, or the same error, and the same accumulator after; and the path is offered the
    same eight arguments, by the compiled send itself (not by the Python one it falls back
    to) where they bind."""
    metadata = FakeMetadata()
    compiled, python = (producer("compiled", metadata, batch_size=100_000, buffer_memory=1_000_000, seed=3)
                        for _ in range(2))  # fmt: skip
    offered: dict[str, list[tuple[str, tuple]]] = {"compiled": [], "python": []}
    for kind, p in (("compiled", compiled), ("python", python)):
        p.send("t3", b"open", partition=1)
        p.send("t1", b"open")
        p._send_path = spied(p._send_path, offered[kind])
    got = outcome(lambda: compiled.send(*args, **kwargs)), outcome(lambda: PYTHON_SEND(python, *args, **kwargs))
    assert got[0] == got[1]
    assert state(compiled) == state(python)
    assert [a for _, a in offered["compiled"][:1]] == [a for _, a in offered["python"]]
    assert all(caller == "send" for caller, _ in offered["python"])
    if offered["python"] and SendPath is not None:
        assert offered["compiled"][0][0] != "send", "bound and offered in C, not by the Python send"


def spied(path: Any, offered: list[tuple[str, tuple]]) -> Any:
    """`path`, noting the function that called it and the arguments it was offered."""

    def call(*args: Any) -> Any:
        offered.append((sys._getframe(1).f_code.co_name, args[1:]))
        return path(*args)

    return call


def test_send_reads_as_the_python_function():
    """help(), inspect and the API docs see the documented send; bound or not, it calls the same."""
    import inspect

    assert type(Producer.__dict__["send"]).__name__ == "SendMethod"
    assert inspect.signature(Producer.send) == inspect.signature(PYTHON_SEND)
    assert Producer.send.__doc__ == PYTHON_SEND.__doc__ and Producer.send.__name__ == "send"
    assert Producer.send.__qualname__ == "Producer.send"
    p = producer("compiled", FakeMetadata(), batch_size=100_000, buffer_memory=1_000_000, seed=0)
    p.send("t1", b"open")
    bound = p.send
    assert inspect.signature(bound) == inspect.signature(PYTHON_SEND.__get__(p))
    futures = [bound("t1", b"a"), Producer.send(p, "t1", b"b"), p.send(topic="t1", value=b"c")]
    assert [f._index for f in futures] == [1, 2, 3]


def test_an_error_of_the_path_reaches_the_caller():
    p = producer("compiled", FakeMetadata(), batch_size=100_000, buffer_memory=1_000_000, seed=0)

    def broken(*args: Any) -> Any:
        raise RuntimeError("the path broke")

    p._send_path = broken
    with pytest.raises(RuntimeError, match="the path broke"):
        p.send("t1", b"v")


def test_sendpath_refuses_an_accumulator_it_cannot_read_in_place():
    """An accumulator whose class shadows a counter, or whose lock cannot be taken: a
    TypeError or AttributeError at SendPath(), nothing leaked or freed twice."""
    from rayk.client import produce_future

    metadata = FakeMetadata()

    class Shadowing(RecordAccumulator):
        unfinished = 0  # over the slot: Python would read the instance's __dict__, the path the slot

    def accumulator(cls: type = RecordAccumulator) -> RecordAccumulator:
        return cls(batch_size=1_000, linger_ms=5, delivery_timeout_ms=1_000, buffer_memory=10_000, max_block_ms=0,
                   max_in_flight=5, max_request_size=4_096)  # fmt: skip

    lockless = accumulator()
    lockless._mutex = object()  # no acquire
    references = sys.getrefcount(produce_future)
    for _ in range(20):
        with pytest.raises(TypeError, match="unfinished"):
            SendPath(accumulator(Shadowing), metadata, True, True, 1_000)
        with pytest.raises(AttributeError):
            SendPath(lockless, metadata, True, True, 1_000)
    assert sys.getrefcount(produce_future) == references


def test_the_path_declines_a_batch_or_a_queue_of_another_kind():
    """A batch of another class (a subclass included), or a result whose callback queue is
    not a deque: the path takes nothing, and send() appends as Python does."""
    from rayk.client.accumulator import ProducerBatch

    class OtherBatch(ProducerBatch):
        __slots__ = ()

    p = producer("compiled", FakeMetadata(), batch_size=100_000, buffer_memory=1_000_000, seed=0)
    p.send("t1", b"open", partition=0)
    batch = p._accumulator._open[("t1", 0)]
    batch.__class__ = OtherBatch
    before = state(p)
    assert p._send_path(p, "t1", b"v", None, None, 0, 1, None) is None and state(p) == before
    batch.__class__ = ProducerBatch
    batch.result._record_callbacks = list(batch.result._record_callbacks)
    assert p._send_path(p, "t1", b"v", None, None, 0, 1, callback_a) is None and state(p) == before
    assert p._send_path(p, "t1", b"v", None, None, 0, 1, None) is not None, "with no callback, the queue is not read"
    assert p.send("t1", b"w", partition=0, callback=callback_a)._index == 2
    assert batch.result._record_callbacks[-3:] == [callback_a, 2, p._accumulator._open[("t1", 0)].records[2][3]]
