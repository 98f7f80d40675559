"""The consumer's Fetcher against a scripted leader: fetch answers are kept as they came
and handed out as ConsumerRecords (`drain`) or one Arrow RecordBatch per partition
(`drain_columns`), from the consumer's positions, each record once whichever form takes
it, and a handed-out answer moves the position past control batches at its tail. And the
consumer's answer to OFFSET_OUT_OF_RANGE, through a Consumer on the same scripted leader:
a fetch ahead of a buffered chunk is stale, one at the position resets it (to the LSO for
read_committed "latest", as its ListOffsets reset does)."""

from __future__ import annotations

import concurrent.futures
import time
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from rayk.replication.partition_replica import FetchResult
from rayk.client.arrow_batches import SCHEMA
import rayk.client.consumer as consumer_module
import rayk.client.fetcher as fetcher_module
from rayk.client.consumer import Consumer
from rayk.client.fetcher import Fetcher
from rayk.client.hand_out import hand_out_reference
from rayk.client.positions import EARLIEST, LATEST
from rayk.client.serializers import as_is
from rayk.client.types import ConsumerRecord, TopicPartition
from rayk.dataplane.frames import READ_COMMITTED, READ_UNCOMMITTED
from rayk.errors import InvalidRecordError, OffsetOutOfRangeError
from rayk.storage.records import SimpleRecord, build_batch

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


@pytest.fixture(autouse=True, params=["compiled", "reference"])
def hand_out_implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Every test runs with the compiled HandOut and with its Python reference."""
    if request.param == "reference":
        monkeypatch.setattr(fetcher_module, "HandOut", hand_out_reference)
    else:
        assert fetcher_module.HandOut is not hand_out_reference, "rayk.client._hand_out is not built"
    return fetcher_module.HandOut


def batch(base_offset: int, count: int, control: bool = False) -> bytes:
    records = [SimpleRecord(b"v%d" % (base_offset + i), key=b"k", timestamp_ms=1_000 + i) for i in range(count)]
    data = bytearray(build_batch(records, base_offset=base_offset))
    if control:
        data[21:23] = (0x30).to_bytes(2, "big")  # attributes: transactional + control (CRC not checked on read)
    return bytes(data)


def done(result: Any) -> concurrent.futures.Future:
    future = concurrent.futures.Future()
    future.set_result(result)
    return future


class ScriptedLeader:
    """A leader whose fetch answers are given per offset, with the aborted transactions a
    read_committed fetch is answered; a fetch at an offset of `out_of_range` is answered
    OFFSET_OUT_OF_RANGE with the log's (log start, LSO, high watermark) `bounds`, which its
    ListOffsets (`list_offset.remote`, as the consumer calls it) answers from too."""

    def __init__(self, answers: dict[int, bytes], aborted: dict[int, tuple] | None = None,
                 out_of_range: frozenset[int] = frozenset(), bounds: tuple[int, int, int] = (0, 0, 0),
                 ) -> None:  # fmt: skip
        self.answers = answers
        self.aborted = aborted or {}
        self.out_of_range = out_of_range
        self.bounds = bounds
        self.fetched_from: list[int] = []
        self.isolation_levels: list[int] = []
        self.list_offset = SimpleNamespace(remote=self._list_offset)
        self.list_offset_calls: list[tuple[int, int]] = []  # (timestamp, isolation level)

    def _list_offset(self, timestamp_ms: int, isolation_level: int = READ_UNCOMMITTED) -> concurrent.futures.Future:
        """PartitionReplica.list_offset for EARLIEST and LATEST, with its default isolation level."""
        self.list_offset_calls.append((timestamp_ms, isolation_level))
        log_start, lso, hw = self.bounds
        offset = log_start if timestamp_ms == EARLIEST else lso if isolation_level == READ_COMMITTED else hw
        return done((offset, -1))


class ScriptedDataPlane:
    """Answers each fetch at once with what its leader's script says (a done future)."""

    def fetch(self, leader: ScriptedLeader, request) -> concurrent.futures.Future:
        leader.fetched_from.append(request.offset)
        leader.isolation_levels.append(request.isolation_level)
        if request.offset in leader.out_of_range:
            log_start, lso, hw = leader.bounds
            return done(FetchResult(b"", hw, hw, log_start, OffsetOutOfRangeError(f"offset {request.offset}"),
                                    last_stable_offset=lso))
        data = leader.answers.get(request.offset, b"")
        # records as the consumer's data plane gives them: a view of the answer frame
        return done(FetchResult(records=memoryview(b"head" + data)[4:], high_watermark=0, log_end_offset=0,
                                log_start_offset=0, aborted_transactions=leader.aborted.get(request.offset, ())))

    def close(self) -> None:
        pass


class ScriptedMetadata:
    """The leaders, known at once: a MetadataCache with nothing to refresh."""

    def __init__(self, leaders: dict[TopicPartition, ScriptedLeader]) -> None:
        self.leaders = leaders

    def leader_nowait(self, topic: str, partition: int) -> ScriptedLeader:
        return self.leaders[TopicPartition(topic, partition)]

    def pending(self) -> list[Any]:
        return []

    def collect(self, ready: set[Any]) -> None:
        pass

    def wake_at_s(self) -> float | None:
        return None


def fetcher_for(leaders: dict[TopicPartition, ScriptedLeader], read_committed: bool = False) -> Fetcher:
    return Fetcher(
        ScriptedMetadata(leaders),
        fetch_min_bytes=1,
        fetch_max_wait_ms=0,
        max_partition_fetch_bytes=1 << 20,
        request_timeout_ms=30_000,
        retry_backoff_ms=100,
        key_deserializer=as_is,
        value_deserializer=as_is,
        data_plane=ScriptedDataPlane(),
        read_committed=read_committed,
    )


def fetch_round(fetcher: Fetcher, positions: dict[TopicPartition, int]) -> None:
    fetcher.start_fetches(sorted(positions), positions, time.monotonic())
    assert all(f.done() for f in fetcher.pending())
    assert fetcher.collect(set(fetcher.pending()), time.monotonic()) == []


def offsets_of(columns: pa.RecordBatch) -> list[int]:
    return columns.column("offset").to_pylist()


def test_records_and_columns_hand_out_each_record_once_in_order():
    leader = ScriptedLeader({0: batch(0, 4) + batch(4, 6)})
    fetcher, positions = fetcher_for({A: leader}), {A: 0}
    fetch_round(fetcher, positions)
    assert [r.offset for r in fetcher.drain(positions, 3)[A]] == [0, 1, 2]
    assert positions[A] == 3
    columns = fetcher.drain_columns(positions, None)[A]
    assert isinstance(columns, pa.RecordBatch) and columns.schema == SCHEMA
    assert offsets_of(columns) == list(range(3, 10))  # one RecordBatch across both stored batches
    assert columns.column("value").to_pylist() == [b"v%d" % i for i in range(3, 10)]
    assert positions[A] == 10
    assert fetcher.drain(positions, 100) == {} and fetcher.drain_columns(positions, None) == {}


def test_a_handed_out_answer_moves_the_position_past_its_control_batches():
    leader = ScriptedLeader({0: batch(0, 3) + batch(3, 1, control=True), 4: batch(4, 2) + batch(6, 1, control=True)})
    fetcher, positions = fetcher_for({A: leader}), {A: 0}
    fetch_round(fetcher, positions)
    assert [r.offset for r in fetcher.drain(positions, 100)[A]] == [0, 1, 2]
    assert positions[A] == 4  # what a commit now stores: past the marker
    fetch_round(fetcher, positions)
    assert leader.fetched_from == [0, 4]
    assert offsets_of(fetcher.drain_columns(positions, None)[A]) == [4, 5]
    assert positions[A] == 7


def test_an_answer_of_control_batches_only_still_moves_fetching_and_the_position_on():
    leader = ScriptedLeader({0: batch(0, 2, control=True), 2: batch(2, 1)})
    fetcher, positions = fetcher_for({A: leader}), {A: 0}
    fetch_round(fetcher, positions)
    assert fetcher.drain_columns(positions, None) == {}
    assert positions[A] == 2
    fetch_round(fetcher, positions)
    assert leader.fetched_from == [0, 2]
    assert [r.offset for r in fetcher.drain(positions, 100)[A]] == [2]


def test_records_before_the_position_in_a_returned_batch_are_skipped_in_both_forms():
    answer = batch(0, 5)  # the leader answers with the whole batch holding offset 3
    for drain in ("records", "columns"):
        fetcher, positions = fetcher_for({A: ScriptedLeader({3: answer})}), {A: 3}
        fetch_round(fetcher, positions)
        if drain == "records":
            assert [r.offset for r in fetcher.drain(positions, 100)[A]] == [3, 4]
        else:
            assert offsets_of(fetcher.drain_columns(positions, None)[A]) == [3, 4]
        assert positions[A] == 5


def test_max_records_caps_the_columns_of_all_partitions_together():
    leaders = {A: ScriptedLeader({0: batch(0, 5)}), B: ScriptedLeader({0: batch(0, 5)})}
    fetcher, positions = fetcher_for(leaders), {A: 0, B: 0}
    fetch_round(fetcher, positions)
    first = fetcher.drain_columns(positions, 7)
    assert sum(c.num_rows for c in first.values()) == 7
    second = fetcher.drain_columns(positions, 7)
    assert sum(c.num_rows for c in second.values()) == 3
    handed = sorted((tp.partition, o) for part in (first, second) for tp, c in part.items() for o in offsets_of(c))
    assert handed == [(p, o) for p in (0, 1) for o in range(5)]
    assert positions == {A: 5, B: 5}


def test_a_second_answer_of_a_partition_comes_in_the_next_columnar_poll():
    leader = ScriptedLeader({0: batch(0, 3), 3: batch(3, 3)})
    fetcher, positions = fetcher_for({A: leader}), {A: 0}
    fetch_round(fetcher, positions)
    fetch_round(fetcher, positions)  # the pipeline fetched ahead: two answers are buffered
    assert offsets_of(fetcher.drain_columns(positions, None)[A]) == [0, 1, 2]
    assert offsets_of(fetcher.drain_columns(positions, None)[A]) == [3, 4, 5]
    assert positions[A] == 6


class OneAtATime:
    """Records from `hand_out` as the consumer's iteration takes them: from the generator
    under way, or from a new one once that one stopped; None when a new one gives none."""

    def __init__(self, fetcher: Fetcher, positions: dict[TopicPartition, int]) -> None:
        self.fetcher, self.positions, self.handing = fetcher, positions, iter(())

    def __call__(self) -> ConsumerRecord | None:
        record = next(self.handing, None)
        if record is None:
            self.handing = self.fetcher.hand_out(self.positions)
            record = next(self.handing, None)
        return record


def test_hand_out_gives_what_drain_of_one_does_with_the_same_positions():
    # The consumer's iteration takes records one at a time from hand_out; it must give
    # each record, and leave each position, exactly as drain(positions, 1) does: across
    # partitions, past a tail of control batches, skipping records before the position,
    # and not for a partition that left the positions (unassigned).
    def scripted() -> tuple[Fetcher, dict[TopicPartition, int]]:
        leaders = {A: ScriptedLeader({2: batch(0, 4) + batch(4, 1, control=True)}),
                   B: ScriptedLeader({0: batch(0, 2), 2: batch(2, 3)})}
        fetcher, positions = fetcher_for(leaders), {A: 2, B: 0}
        fetch_round(fetcher, positions)
        fetch_round(fetcher, positions)  # B's second answer is buffered behind its first
        return fetcher, positions

    by_drain, by_hand_out = scripted(), scripted()
    steps = []
    for fetcher, positions in (by_drain, by_hand_out):
        handed, one_at_a_time = [], OneAtATime(fetcher, positions)
        while True:
            if len(handed) == 4:
                positions.pop(B, None)  # B unassigned: its second answer's records do not go out
            if fetcher is by_drain[0]:
                taken = fetcher.drain(positions, 1)
                record = next(iter(taken.values()))[0] if taken else None
            else:
                record = one_at_a_time()
            if record is None:
                break
            assert type(record) is ConsumerRecord and len(record) == len(ConsumerRecord._fields)
            handed.append(((record.topic, record.partition, record.offset, record.value), dict(positions)))
        steps.append(handed)
    assert steps[0] == steps[1]
    assert [step[0][2] for step in steps[1]] == [2, 3, 0, 1]  # A from its position, then B's first answer
    assert steps[1][1][1][A] == 5, "A's last record moves its position past the control batch"


def test_hand_out_leaves_a_chunk_when_its_partition_is_forgotten_sought_or_the_fetcher_closes():
    def handing_out() -> tuple[Fetcher, dict[TopicPartition, int], Any]:
        fetcher, positions = fetcher_for({A: ScriptedLeader({0: batch(0, 5)})}), {A: 0}
        fetch_round(fetcher, positions)
        handing = fetcher.hand_out(positions)
        assert next(handing).offset == 0 and positions[A] == 1
        return fetcher, positions, handing

    fetcher, positions, handing = handing_out()
    fetcher.forget(A)  # a pause: the position stays, the records fetched ahead go
    assert list(handing) == [] and positions == {A: 1}
    assert list(fetcher.hand_out(positions)) == []
    fetcher, positions, handing = handing_out()
    positions[A] = 3  # a poll in between (or a seek, which forgets too) moved the position
    assert [r.offset for r in handing] == [3, 4], "the hand-out goes on from the position"
    assert positions == {A: 5}
    fetcher, positions, handing = handing_out()
    del positions[A]  # unassigned
    assert list(handing) == [] and positions == {}
    fetcher, positions, handing = handing_out()
    fetcher.close()
    assert list(handing) == [] and positions == {A: 1}


def test_a_poll_while_a_chunks_last_record_is_out_leaves_the_next_chunk_to_the_hand_out():
    # hand_out gave A's last record, then the program polled (drain) and took B's first:
    # B's chunk heads the buffer now, and what is left of it must still go out, once.
    leaders = {A: ScriptedLeader({0: batch(0, 2)}), B: ScriptedLeader({0: batch(0, 3)})}
    fetcher, positions = fetcher_for(leaders), {A: 0, B: 0}
    fetch_round(fetcher, positions)
    handing = fetcher.hand_out(positions)
    assert [next(handing).offset, next(handing).offset] == [0, 1]
    assert fetcher._chunks[A] == 0, "A's chunk is done as its last record goes out: its next fetch may go"
    taken = fetcher.drain(positions, 1)
    assert [r.offset for r in taken[B]] == [0]
    assert [(r.partition, r.offset) for r in handing] == [(B.partition, 1), (B.partition, 2)]
    assert positions == {A: 2, B: 3} and list(fetcher.hand_out(positions)) == []


def test_drains_of_any_size_hand_out_the_same_records_and_leave_the_same_positions():
    # Whatever the limit (poll's max_records), the records and the final positions are
    # those of one record at a time, and after each drain a partition's position is past
    # the last record it handed out of that partition.
    def handed_out(limit: int) -> tuple[list[tuple[int, int]], dict[TopicPartition, int]]:
        leaders = {A: ScriptedLeader({1: batch(0, 5) + batch(5, 1, control=True)}),
                   B: ScriptedLeader({0: batch(0, 3) + batch(3, 4), 7: batch(7, 2)})}
        fetcher, positions = fetcher_for(leaders), {A: 1, B: 0}
        fetch_round(fetcher, positions)
        fetch_round(fetcher, positions)
        out = []
        while taken := fetcher.drain(positions, limit):
            assert sum(map(len, taken.values())) <= limit
            for tp, records in taken.items():
                assert [r.offset for r in records] == list(range(records[0].offset, records[-1].offset + 1))
                assert positions[tp] >= records[-1].offset + 1
                out += [(tp.partition, r.offset) for r in records]
        return out, positions

    one_by_one = handed_out(1)
    assert one_by_one == ([(0, o) for o in range(1, 5)] + [(1, o) for o in range(9)], {A: 6, B: 9})
    for limit in (2, 3, 4, 7, 100):
        assert handed_out(limit) == one_by_one, limit


def corrupt_batch(base_offset: int, count: int) -> bytes:
    """A batch whose header counts more records than it holds: whole to iter_batches, its
    records section does not decode (INVALID_RECORD)."""
    data = bytearray(batch(base_offset, count))
    data[57:61] = (count + 5).to_bytes(4, "big")  # recordCount
    return bytes(data)


def test_a_chunk_is_decoded_a_few_batches_at_a_time_as_it_is_handed_out(monkeypatch):
    monkeypatch.setattr(fetcher_module, "DECODE_AHEAD_RECORDS", 2)
    data = batch(0, 2) + batch(2, 2) + batch(4, 2, control=True) + batch(5, 3) + batch(8, 1, control=True)
    fetcher, positions = fetcher_for({A: ScriptedLeader({0: data})}), {A: 0}
    fetch_round(fetcher, positions)
    chunk = fetcher._buffer[0]
    assert not chunk.records and chunk.more, "nothing is decoded before it is handed out"
    handing = fetcher.hand_out(positions)
    assert next(handing).offset == 0
    assert [r.offset for r in chunk.records] == [1], "one batch decoded ahead, not the chunk"
    assert next(handing).offset == 1 and chunk.more and positions[A] == 2
    assert [r.offset for r in handing] == [2, 3, 5, 6, 7]
    assert positions[A] == 9 and not chunk.more and chunk.decoded_bytes == len(data)
    assert fetcher._chunks[A] == 0


def test_a_batch_that_does_not_decode_raises_after_the_records_before_it_went_out(monkeypatch):
    monkeypatch.setattr(fetcher_module, "DECODE_AHEAD_RECORDS", 1)
    data = batch(0, 3) + corrupt_batch(3, 3) + batch(6, 2)
    fetcher, positions = fetcher_for({A: ScriptedLeader({0: data})}), {A: 0}
    fetch_round(fetcher, positions)
    handing = fetcher.hand_out(positions)
    assert [next(handing).offset for _ in range(3)] == [0, 1, 2], "every record before the batch goes out"
    with pytest.raises(InvalidRecordError, match="batch at offset 3"):
        next(handing)
    assert positions == {A: 3}, "past the records handed out, at the batch"
    for _ in range(2):  # and then meets it, every time: the consumer stays there, as Kafka's does
        with pytest.raises(InvalidRecordError):
            fetcher.drain(positions, 10)
        with pytest.raises(InvalidRecordError):
            list(fetcher.hand_out(positions))
    assert positions == {A: 3}
    # poll alike, from a fresh fetch: the records before the batch, then its error
    fetcher, positions = fetcher_for({A: ScriptedLeader({0: data})}), {A: 0}
    fetch_round(fetcher, positions)
    assert [r.offset for r in fetcher.drain(positions, 10)[A]] == [0, 1, 2]
    with pytest.raises(InvalidRecordError, match="batch at offset 3"):
        fetcher.drain(positions, 10)
    assert positions == {A: 3}


@pytest.mark.parametrize("ahead", [1, 2, 4, 500])
def test_hand_out_and_drain_of_one_meet_a_batch_that_does_not_decode_alike(monkeypatch, ahead):
    # Whatever is decoded ahead: every record before the batch, once, in order, then its
    # error, with the position at the batch, one record at a time as drain(positions, 1).
    monkeypatch.setattr(fetcher_module, "DECODE_AHEAD_RECORDS", ahead)
    data = batch(0, 2) + batch(2, 3) + batch(5, 1, control=True) + corrupt_batch(6, 2) + batch(8, 1)
    seen = []
    for way in ("drain", "hand_out"):
        fetcher, positions = fetcher_for({A: ScriptedLeader({0: data})}), {A: 0}
        fetch_round(fetcher, positions)
        handing, offsets = fetcher.hand_out(positions), []
        with pytest.raises(InvalidRecordError, match="batch at offset 6"):
            while True:
                if way == "drain":
                    offsets += [r.offset for r in fetcher.drain(positions, 1)[A]]
                else:
                    offsets.append(next(handing).offset)
        seen.append((offsets, dict(positions)))
    assert seen[0] == seen[1] == ([0, 1, 2, 3, 4], {A: 5})


def test_a_poll_returns_what_it_took_before_a_batch_that_does_not_decode():
    # A's records go out; B's chunk does not decode: the poll that took A's records
    # returns them (their position moved past them), and the next one raises B's error.
    leaders = {A: ScriptedLeader({0: batch(0, 2)}), B: ScriptedLeader({0: corrupt_batch(0, 2)})}
    fetcher, positions = fetcher_for(leaders), {A: 0, B: 0}
    fetch_round(fetcher, positions)
    taken = fetcher.drain(positions, 100)
    assert {tp: [r.offset for r in records] for tp, records in taken.items()} == {A: [0, 1]}
    assert positions == {A: 2, B: 0}
    with pytest.raises(InvalidRecordError, match="batch at offset 0"):
        fetcher.drain(positions, 100)
    assert positions == {A: 2, B: 0}


def test_a_forgotten_partition_hands_out_nothing_more():
    fetcher, positions = fetcher_for({A: ScriptedLeader({0: batch(0, 3)})}), {A: 0}
    fetch_round(fetcher, positions)
    fetcher.forget(A)
    assert fetcher.drain_columns(positions, None) == {} and fetcher.drain(positions, 10) == {}
    assert list(fetcher.hand_out(positions)) == []


def test_read_committed_drops_aborted_transactions_and_the_position_moves_past_them():
    from rayk.storage.control_records import build_end_txn_marker

    def txn(pid: int, offset: int) -> bytes:
        return build_batch([SimpleRecord(b"t%d" % offset, timestamp_ms=1_000)], base_offset=offset, producer_id=pid,
                           producer_epoch=0, base_sequence=offset, is_transactional=True)

    answer = b"".join([batch(0, 1), txn(7, 1), txn(8, 2), build_end_txn_marker(7, 0, False, 0, 1_000, base_offset=3),
                       build_end_txn_marker(8, 0, True, 0, 1_000, base_offset=4)])  # fmt: skip
    leader = ScriptedLeader({0: answer, 5: txn(7, 5)}, aborted={0: ((7, 1),)})
    fetcher, positions = fetcher_for({A: leader}, read_committed=True), {A: 0}
    fetch_round(fetcher, positions)
    assert [r.value for r in fetcher.drain(positions, 100)[A]] == [b"v0", b"t2"]
    assert positions[A] == 5, "past the aborted records and both markers"
    fetch_round(fetcher, positions)
    assert offsets_of(fetcher.drain_columns(positions, None)[A]) == [5], "the next transaction is not the aborted one"
    assert leader.isolation_levels == [1, 1]


def test_a_consumer_takes_kafkas_two_isolation_levels_only():
    import pytest

    from rayk.client.consumer import Consumer

    with pytest.raises(ValueError, match="isolation_level"):
        Consumer(None, isolation_level="read_committed_please")


def test_a_fetch_ahead_refused_out_of_range_is_held_until_the_buffered_chunk_went_out():
    leader = ScriptedLeader({0: batch(0, 3)}, out_of_range=frozenset({3}))
    fetcher, positions = fetcher_for({A: leader}), {A: 0}
    fetch_round(fetcher, positions)
    fetcher.start_fetches([A], positions, time.monotonic())  # ahead, at the buffered chunk's end
    answers = fetcher.collect(set(fetcher.pending()), time.monotonic())
    assert [(a.tp, a.fetch_offset) for a in answers] == [(A, 3)], "the answer says which offset it fetched"
    fetcher.hold_read_ahead(A)  # the consumer's answer to a stale one
    for _ in range(3):
        fetcher.start_fetches([A], positions, time.monotonic())
        assert fetcher.pending() == [], "no fetch while the chunk waits (not the same refusal at every poll)"
    assert [r.offset for r in fetcher.drain(positions, 100)[A]] == [0, 1, 2]
    fetcher.start_fetches([A], positions, time.monotonic())
    assert leader.fetched_from == [0, 3, 3], "once the chunk went out: a fetch at the position"
    fetcher.collect(set(fetcher.pending()), time.monotonic())
    fetcher.hold_read_ahead(A)
    fetcher.forget(A)  # a seek
    positions[A] = 0
    fetch_round(fetcher, positions)
    fetcher.start_fetches([A], positions, time.monotonic())
    assert leader.fetched_from == [0, 3, 3, 0, 3], "a forget lifts the hold: it fetches ahead again"


def scripted_consumer(monkeypatch: pytest.MonkeyPatch, leader: ScriptedLeader, **settings: Any) -> Consumer:
    """A Consumer assigned A, whose leader is `leader`, with no cluster and no Ray."""
    metadata = ScriptedMetadata({A: leader})
    monkeypatch.setattr(consumer_module, "MetadataCache", lambda *args: metadata)
    monkeypatch.setattr(consumer_module, "Fetcher",
                        lambda *args, **kwargs: Fetcher(*args, data_plane=ScriptedDataPlane(), **kwargs))
    consumer = Consumer(SimpleNamespace(controller=None), enable_auto_commit=False, **settings)
    consumer.assign([A])
    return consumer


SLOW_APPLICATION = {"fetch_max_wait_ms": 0, "request_timeout_ms": 1}  # with slowly_polled_offsets


def polled_offsets(consumer: Consumer, max_records: int) -> list[int]:
    return [r.offset for r in consumer.poll(timeout_ms=2_000, max_records=max_records).get(A, [])]


def slowly_polled_offsets(consumer: Consumer) -> list[int]:
    """One record, after longer than a fetch's deadline (fetch_max_wait_ms +
    request_timeout_ms, 1 ms here): a poll that has records buffered waits for nothing, so
    the read-ahead's answer is taken in at its deadline, while the chunk before it is
    still being handed out (an application slower over a chunk than that time)."""
    time.sleep(0.02)
    return polled_offsets(consumer, max_records=1)


def test_a_consumer_hands_out_its_buffered_records_before_an_out_of_range_read_ahead_resets_it(monkeypatch):
    # Retention moved the log start to 5 after [0, 3) was fetched: the fetch ahead at 3 is
    # refused while 1 and 2 wait in memory. They go out, then the fetch at the position (3)
    # is refused too, and that answer resets the position to the log start.
    leader = ScriptedLeader({0: batch(0, 3), 5: batch(5, 3)}, out_of_range=frozenset({3}), bounds=(5, 8, 8))
    consumer = scripted_consumer(monkeypatch, leader, auto_offset_reset="earliest", **SLOW_APPLICATION)
    consumer.seek(A, 0)
    handed = []
    while len(handed) < 6:
        taken = slowly_polled_offsets(consumer)
        assert taken, f"nothing more after {handed}"
        handed += taken
    assert handed == [0, 1, 2, 5, 6, 7]
    assert leader.fetched_from[:4] == [0, 3, 3, 5], "the refused read-ahead is not sent again while 1 and 2 wait"
    consumer.close()


def test_under_none_an_out_of_range_read_ahead_raises_only_once_the_position_is_out_of_range(monkeypatch):
    leader = ScriptedLeader({0: batch(0, 3)}, out_of_range=frozenset({3}), bounds=(5, 8, 8))
    consumer = scripted_consumer(monkeypatch, leader, auto_offset_reset="none", **SLOW_APPLICATION)
    consumer.seek(A, 0)
    assert [slowly_polled_offsets(consumer) for _ in range(3)] == [[0], [1], [2]]
    with pytest.raises(OffsetOutOfRangeError):
        consumer.poll(timeout_ms=2_000)
    assert consumer.position(A) == 3
    consumer.close()


def test_a_read_committed_consumer_resets_to_latest_at_the_last_stable_offset(monkeypatch):
    # A transaction is open from 100 to the high watermark 150: "latest" is its start, so
    # the whole transaction is read once it commits, not its records from 150 on.
    leader = ScriptedLeader({100: batch(100, 2)}, bounds=(0, 100, 150))
    consumer = scripted_consumer(monkeypatch, leader, auto_offset_reset="latest", isolation_level="read_committed")
    assert polled_offsets(consumer, max_records=10) == [100, 101]
    assert leader.list_offset_calls == [(LATEST, READ_COMMITTED)]
    consumer.close()


@pytest.mark.parametrize(("isolation_level", "reset_to"), [("read_committed", 100), ("read_uncommitted", 150)])
def test_an_out_of_range_position_resets_to_latest_at_the_lso_for_read_committed(monkeypatch, isolation_level,
                                                                                 reset_to):
    answers = {100: batch(100, 2), 150: batch(150, 1)}
    leader = ScriptedLeader(answers, out_of_range=frozenset({10}), bounds=(50, 100, 150))
    consumer = scripted_consumer(monkeypatch, leader, auto_offset_reset="latest", isolation_level=isolation_level)
    consumer.seek(A, 10)
    assert polled_offsets(consumer, max_records=10)[0] == reset_to
    assert leader.fetched_from[:2] == [10, reset_to] and leader.list_offset_calls == []
    consumer.close()
