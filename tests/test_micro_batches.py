"""rayk.client.micro_batches: the budget shared among partitions, the stream's state in a
commit's metadata, and MicroBatches against a fake cluster at every point a driver can
die (streams on a real cluster: tests/test_data.py and tests/test_spark.py)."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayk.client.micro_batches import IDLE_POLL_MS, MicroBatches, _metadata, _parse_metadata, _share
from rayk.client.types import OffsetAndMetadata, TopicPartition
from rayk.errors import FencedInstanceIdError, InvalidConfigurationError, OffsetOutOfRangeError


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.integers(0, 20), st.integers(0, 1_000), min_size=1, max_size=8), st.integers(1, 2_000))
def test_a_budget_is_spent_whole_and_shared_by_backlog_with_none_starved(lags, max_records):
    budget = _share(lags, max_records)
    assert set(budget) == set(lags)
    assert all(0 <= budget[p] <= lags[p] for p in lags), "never past a partition's backlog"
    assert sum(budget.values()) == min(max_records, sum(lags.values())), "the whole budget, or the whole backlog"
    for p in lags:
        for q in lags:
            if lags[p] > lags[q]:
                assert budget[p] >= budget[q], "a larger backlog never gets less"
    if max_records >= sum(1 for lag in lags.values() if lag):
        assert all(budget[p] >= 1 for p in lags if lags[p]), "every partition with a backlog gets a record"


def test_a_budget_follows_the_backlogs():
    assert _share({0: 1, 1: 1000, 2: 1000}, 100) == {0: 1, 1: 50, 2: 49}
    assert _share({0: 300, 1: 100, 2: 0}, 40) == {0: 30, 1: 10, 2: 0}
    assert _share({0: 5, 1: 5}, 100) == {0: 5, 1: 5}


def test_the_stream_state_round_trips_through_commit_metadata_and_foreign_metadata_is_ignored():
    assert _parse_metadata(_metadata(7)) == {"next": 7}
    assert _parse_metadata(_metadata(7, 1234)) == {"next": 7, "end": 1234}
    for foreign in ("", "hello", "[1, 2]", '{"other": 1}', '{"rayk.stream": "x"}', '{"rayk.stream": {"next": -1}}'):
        assert _parse_metadata(foreign) == {}, foreign
    assert len(_metadata(2**31, 2**62)) < 100, "well inside offset.metadata.max.bytes (4096)"


# ---------------------------------------------------------------------------- MicroBatches against a fake cluster


class FakeTopic:
    """One topic's log bounds and one group's commits: what MicroBatches asks a cluster."""

    def __init__(self, partitions: int) -> None:
        self.log_start, self.hw = [0] * partitions, [0] * partitions
        self.commits: dict[str, dict[TopicPartition, OffsetAndMetadata]] = {}  # by group
        self.offset_lookups = 0

    def describe_topic(self, topic):
        return [{"partition": p, "leader": 1} for p in range(len(self.hw))]

    def consumer(self, group_id, **settings):
        return FakeConsumer(self, self.commits.setdefault(group_id, {}))


class FakeConsumer:
    def __init__(self, topic: FakeTopic, commits: dict) -> None:
        self.topic, self.commits, self.closed = topic, commits, False

    def assign(self, partitions):
        pass

    def committed_offsets(self, partitions):
        return {tp: self.commits[tp] for tp in partitions if tp in self.commits}

    def beginning_offsets(self, partitions):
        self.topic.offset_lookups += 1
        return {tp: self.topic.log_start[tp.partition] for tp in partitions}

    def end_offsets(self, partitions):
        self.topic.offset_lookups += 1
        return {tp: self.topic.hw[tp.partition] for tp in partitions}

    def commit(self, offsets):
        self.commits.update(offsets)

    def close(self, autocommit=True):
        self.closed = True


def spans(ranges) -> list[tuple[int, int, int]]:
    return [(r.partition, r.start, r.end) for r in ranges]


def stream(topic: FakeTopic, **settings) -> MicroBatches:
    return MicroBatches(topic, "t", "g", trigger_ms=0, **settings)


def test_a_new_stream_saves_its_start_so_records_sent_before_its_first_batch_are_not_skipped():
    log = FakeTopic(2)
    log.hw = [5, 5]
    stream(log).close()  # "latest" resolved to 5, 5; the driver dies before any record comes
    log.hw = [7, 6]
    batches = stream(log)
    assert spans(batches.next_batch()) == [(0, 5, 7), (1, 5, 6)]


def test_an_unprocessed_batch_comes_again_whole_under_its_id_and_a_processed_one_does_not():
    log = FakeTopic(2)
    log.hw = [10, 4]
    first = stream(log, starting_offsets="earliest", max_records_per_batch=7)
    planned = first.next_batch()
    assert (first.batch_id, spans(planned)) == (0, [(0, 0, 5), (1, 0, 2)])
    first.close()  # crashed while processing batch 0
    log.hw = [20, 20]  # more records came since: the batch is still the one planned
    second = stream(log, max_records_per_batch=7)
    assert (second.batch_id, spans(second.next_batch())) == (0, [(0, 0, 5), (1, 0, 2)])
    second.commit(planned)
    assert second.batch_id == 1
    second.close()
    third = stream(log, max_records_per_batch=7)
    assert third.batch_id == 1 and spans(third.next_batch())[0][1] == 5, "processed: not again"


def test_partitions_the_topic_gained_are_read_whole_even_after_a_restart():
    log = FakeTopic(1)
    log.hw = [3]
    batches = stream(log, starting_offsets="earliest")
    batches.commit(batches.next_batch())
    batches.close()
    log.hw.append(8)
    log.log_start.append(0)  # partition 1 is new, and already holds 8 records
    log.hw[0] = 4
    restarted = stream(log)  # "latest" applies only to a group with no commits at all
    assert spans(restarted.next_batch()) == [(0, 3, 4), (1, 0, 8)]


@pytest.mark.parametrize("replaying", [False, True])
def test_records_deleted_before_they_were_read_fail_the_stream_or_are_skipped_when_allowed(replaying):
    log = FakeTopic(1)
    log.hw = [10]
    first = stream(log, starting_offsets="earliest")
    if replaying:
        first.next_batch()  # planned [0, 10), never processed
    first.close()
    log.log_start, log.hw = [6], [12]
    with pytest.raises(OffsetOutOfRangeError, match=r"records \[0, 6\) were deleted"):
        stream(log).next_batch()
    lenient = stream(log, fail_on_data_loss=False)
    assert spans(lenient.next_batch()) == ([(0, 6, 10)] if replaying else [(0, 6, 12)])


def test_a_log_cut_below_the_stream_position_fails_the_stream_or_goes_on_from_its_end():
    log = FakeTopic(1)
    log.hw = [10]
    first = stream(log, starting_offsets="earliest")
    first.commit(first.next_batch())
    first.close()
    log.hw = [4]  # an unclean election, or the topic made anew
    with pytest.raises(OffsetOutOfRangeError, match="ends at 4, before this stream's position 10"):
        stream(log).next_batch()
    lenient = stream(log, fail_on_data_loss=False)
    threading.Timer(0.3, log.hw.__setitem__, (0, 6)).start()  # two records come after the cut
    assert spans(lenient.next_batch()) == [(0, 4, 6)], "on from the end of the cut log"


def test_a_second_stream_of_the_group_fences_the_first_at_its_next_commit():
    log = FakeTopic(1)
    log.hw = [10]
    old = stream(log, starting_offsets="earliest")
    old_batch = old.next_batch()
    new = stream(log)
    new.commit(new.next_batch())
    with pytest.raises(FencedInstanceIdError, match="one stream per group"):
        old.commit(old_batch)
    assert log.commits["g"][TopicPartition("t", 0)].offset == 10 and new.batch_id == 1


def test_stop_ends_a_wait_at_once_and_no_batch_comes_after_it_and_an_idle_stream_does_not_spin():
    log = FakeTopic(1)
    log.hw = [3]
    first = stream(log, starting_offsets="earliest")
    first.next_batch()
    first.close()
    replaying = stream(log)
    replaying.stop()
    assert replaying.next_batch() is None, "not even the batch to replay"
    idle = MicroBatches(log, "t", "idle", trigger_ms=0, starting_offsets="latest")
    lookups = log.offset_lookups
    threading.Timer(0.5, idle.stop).start()
    started = time.monotonic()
    assert idle.next_batch() is None
    assert time.monotonic() - started < 1.5
    assert log.offset_lookups - lookups <= 2 * (500 // IDLE_POLL_MS + 2), "a look every IDLE_POLL_MS, not a spin"


def test_json_starting_offsets_may_say_latest_in_a_stream():
    log = FakeTopic(2)
    log.hw = [5, 9]
    batches = MicroBatches(log, "t", "json", trigger_ms=0, starting_offsets='{"t": {"0": 2, "1": -1}}')
    log.hw = [6, 10]
    assert spans(batches.next_batch()) == [(0, 2, 6), (1, 9, 10)]


def test_a_stream_that_cannot_start_closes_its_consumer():
    log = FakeTopic(2)
    consumers = []
    log.consumer = lambda group_id, **settings: consumers.append(FakeConsumer(log, {})) or consumers[-1]
    with pytest.raises(InvalidConfigurationError, match="each of the 2 partitions"):
        MicroBatches(log, "t", "g", starting_offsets='{"t": {"0": 0}}')
    assert consumers[0].closed
