"""Tiered storage's storage side (rayk/storage/remote/ and the Log's part): segments copied
to a pyarrow filesystem store with their indexes, snapshot and epochs, listed back from the
store alone, read at any offset as the local log reads them, local retention held back to
what is copied, and a follower's log started from a remote copy's state."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayk.config import BrokerConfig, validate_topic_configs
from rayk.errors import InvalidConfigurationError, KafkaStorageError, OutOfOrderSequenceError
from rayk.storage import Log, LogConfig
from rayk.storage.records import SimpleRecord, build_batch, iter_batches
from rayk.storage.remote import RemoteSegmentMetadata, RemoteStorageSettings
from rayk.storage.remote.remote_read import offset_for_timestamp as remote_offset_for_timestamp
from rayk.storage.remote.remote_read import read_batches
from rayk.storage.remote.remote_segment import newest_per_offset, partition_prefix

PREFIX = partition_prefix("t", 0, "id0")
NOW_MS = 10_000_000


def tiered(**props: str) -> LogConfig:
    return LogConfig.from_properties({"segment.bytes": "600", "index.interval.bytes": "100",
                                      "remote.storage.enable": "true", "retention.ms": "-1", **props})  # fmt: skip


def producer_batch(seq: int, n: int = 3, pid: int = 7) -> bytes:
    records = [SimpleRecord(f"v{seq + i}".encode().ljust(40, b"."), key=b"k", timestamp_ms=1_000 + seq + i) for i in range(n)]
    return build_batch(records, producer_id=pid, producer_epoch=0, base_sequence=seq)


def filled_log(path, batches: int = 20, config: LogConfig | None = None) -> Log:
    log = Log(path, config or tiered(), clock_ms=lambda: NOW_MS)
    for i in range(batches):
        log.append_as_leader(producer_batch(3 * i), leader_epoch=i // 7)
    log.high_watermark = log.log_end_offset
    return log


def copy_all(log: Log, store, below: int | None = None) -> list[RemoteSegmentMetadata]:
    done = []
    for seg in log.segments_to_copy(log.high_watermark if below is None else below, 0):
        meta = RemoteSegmentMetadata("t", 0, "id0", seg.base_offset, seg.end_offset, seg.max_timestamp_ms, seg.size_bytes,
                                     f"s{seg.base_offset}", seg.leader_epochs, 1, 0, 1)  # fmt: skip
        files = {**seg.files, "leader-epoch-checkpoint": b""}
        done.append(store.copy_segment(PREFIX, meta, files))
    return done


@pytest.fixture
def store(tmp_path):
    return RemoteStorageSettings(f"file://{tmp_path}/store").open()


def test_copied_segments_list_back_from_the_store_alone_and_read_as_the_local_log(tmp_path, store):
    log = filled_log(tmp_path / "log")
    copied = copy_all(log, store)
    assert len(copied) >= 3 and copied[-1].end_offset == log.segment_base_offsets[-1]
    listed = RemoteLogStorageReopened(tmp_path).list_segments(PREFIX)
    assert [(s.base_offset, s.end_offset) for s in listed] == [(s.base_offset, s.end_offset) for s in copied]
    assert all(s.object_bytes["log"] == s.size_bytes and "snapshot" in s.object_bytes for s in listed)
    # Every offset reads the same batches from the store as from the local log.
    for segment in listed:
        for offset in range(segment.base_offset, segment.end_offset):
            remote, next_offset = read_batches(store, PREFIX, segment, offset, 10_000)
            local = log.read(offset, len(remote), max_offset=segment.end_offset).records
            assert remote == local and next_offset == list(iter_batches(remote))[-1].header.next_offset
    # max_bytes: the first batch whatever its size, then only whole batches that fit.
    first, _ = read_batches(store, PREFIX, listed[0], 0, 1)
    assert len(list(iter_batches(first))) == 1
    # The epochs each copy holds are those of its batches.
    assert listed[0].leader_epochs[0] == (0, 0)
    log.close()


def test_a_timestamp_finds_the_same_record_in_the_remote_copy_as_in_the_local_log(tmp_path, store):
    log = filled_log(tmp_path / "log")
    copied = copy_all(log, store)
    for timestamp_ms in range(990, 1000 + copied[-1].end_offset + 5, 7):
        local = log.offset_for_timestamp(timestamp_ms)
        segment = next((s for s in copied if s.max_timestamp_ms >= timestamp_ms), None)
        remote = None if segment is None else remote_offset_for_timestamp(store, PREFIX, segment, timestamp_ms)
        if local is not None and local.offset < copied[-1].end_offset:
            assert remote == (local.timestamp_ms, local.offset)
        else:
            assert remote is None
    log.close()


class RemoteLogStorageReopened:
    """The store as another process opens it: nothing but its URI."""

    def __init__(self, tmp_path) -> None:
        self._store = RemoteStorageSettings(f"file://{tmp_path}/store").open()

    def list_segments(self, prefix: str) -> list[RemoteSegmentMetadata]:
        return self._store.list_segments(prefix)


def test_a_copy_not_committed_or_torn_is_not_listed_and_a_deleted_one_goes(tmp_path, store):
    log = filled_log(tmp_path / "log")
    [seg, *_] = log.segments_to_copy(log.high_watermark, 0)
    meta = RemoteSegmentMetadata("t", 0, "id0", seg.base_offset, seg.end_offset, 0, seg.size_bytes, "a", (), 1, 0, 1)
    assert store.copy_segment(PREFIX, meta, seg.files, before_commit=lambda: False) is None  # deposed mid-copy
    assert store.list_segments(PREFIX) == []
    (tmp_path / "store" / PREFIX / "00000000000000000000-b.json").write_bytes(b'{"version": 1, "topic"')  # torn
    assert store.list_segments(PREFIX) == []
    done = store.copy_segment(PREFIX, meta, seg.files)
    assert store.list_segments(PREFIX) == [done]
    store.delete_segment(PREFIX, done)
    store.delete_segment(PREFIX, done)  # twice: another leader's retention got there first
    assert store.list_segments(PREFIX) == []
    log.close()


def test_an_unreachable_store_is_a_retriable_storage_error(tmp_path):
    store = RemoteStorageSettings("s3://bucket/p", {"endpoint": "127.0.0.1:1", "scheme": "http", "access.key": "a",
                                                    "secret.key": "hunter2-value", "connect.timeout.ms": "200",
                                                    "request.timeout.ms": "200", "region": "us-east-1"}).open()
    with pytest.raises(KafkaStorageError) as e:
        store.list_segments(PREFIX)
    assert e.value.retriable and "s3://bucket/p" in str(e.value) and "hunter2" not in repr(store.settings) + str(e.value)


def test_local_retention_deletes_only_what_is_copied_and_the_whole_log_s_retention_bounds_it(tmp_path, store):
    log = filled_log(tmp_path / "log", config=tiered(**{"local.retention.bytes": "0", "retention.bytes": "-1"}))
    segments = len(log.segment_base_offsets)
    assert log.delete_expired_segments() == 0  # nothing copied: local retention waits
    copied = copy_all(log, store, below=log.segment_base_offsets[2])
    assert log.delete_expired_segments(copied_end_offset=copied[-1].end_offset) == 2
    assert log.log_start_offset == copied[-1].end_offset and len(log.segment_base_offsets) == segments - 2
    copied += copy_all(log, store)
    assert log.delete_expired_segments(copied_end_offset=copied[-1].end_offset) > 0
    assert log.log_start_offset == copied[-1].end_offset == log.segment_base_offsets[0]
    log.close()


def test_a_follower_starts_its_log_from_a_remote_copy_s_producer_snapshot_and_epochs(tmp_path, store):
    leader = filled_log(tmp_path / "leader")
    copied = copy_all(leader, store)
    start = copied[-1].end_offset
    snapshot = store.read(PREFIX, copied[-1], "snapshot")
    epochs = tuple(e for s in copied for e in s.leader_epochs)
    follower = Log(tmp_path / "follower", tiered())
    follower.truncate_fully_and_start_at(start, snapshot, epochs)
    assert (follower.log_start_offset, follower.log_end_offset) == (start, start)
    assert follower.latest_epoch == epochs[-1][0]
    # The producer's sequence goes on there (its sequence numbers are the offsets here), and
    # its last batches before `start` are remembered for duplicates.
    entry = follower.producer_state.producers[7]
    assert entry.next_sequence == start and entry.batches[-1].last_offset == start - 1
    with pytest.raises(OutOfOrderSequenceError):
        follower.append_as_leader(producer_batch(start + 3), leader_epoch=epochs[-1][0])
    follower.append_as_leader(producer_batch(start), leader_epoch=epochs[-1][0])
    follower.close()
    leader.close()


def test_a_damaged_remote_producer_snapshot_starts_the_follower_without_it_not_as_a_disk_failure(tmp_path):
    follower = Log(tmp_path / "follower", tiered())
    follower.truncate_fully_and_start_at(100, b"not a producer snapshot", ((3, 40),))
    assert (follower.log_start_offset, follower.latest_epoch, follower.producer_state.producers) == (100, 3, {})
    follower.append_as_leader(producer_batch(0), leader_epoch=3)  # an unknown producer starts anywhere
    follower.close()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(1, 30), st.integers(0, 5)), max_size=12))
def test_one_copy_per_stretch_of_offsets_covers_every_offset_copied(spans):
    copies = [RemoteSegmentMetadata("t", 0, None, b, b + n, 0, n, f"{i}", (), 0, 0, created)
              for i, (b, n, created) in enumerate(spans)]  # fmt: skip
    chosen = newest_per_offset(copies)
    covered = {o for c in copies for o in range(c.base_offset, c.end_offset)}
    assert {o for c in chosen for o in range(c.base_offset, c.end_offset)} == covered
    assert [c.base_offset for c in chosen] == sorted(c.base_offset for c in chosen)
    assert all(a.end_offset < b.end_offset for a, b in zip(chosen, chosen[1:]))


def test_tiered_topic_configs_follow_kafka_s_rules():
    with pytest.raises(InvalidConfigurationError, match="cleanup.policy=delete"):
        LogConfig.from_properties({"remote.storage.enable": "true", "cleanup.policy": "compact"})
    with pytest.raises(InvalidConfigurationError, match="local.retention.bytes"):
        LogConfig.from_properties({"remote.storage.enable": "true", "retention.bytes": "10", "local.retention.bytes": "20"})
    with pytest.raises(InvalidConfigurationError, match="remote.storage.enable"):
        LogConfig.from_properties({"remote.storage.enable": "maybe"})
    with pytest.raises(InvalidConfigurationError, match="no remote log storage"):
        validate_topic_configs({"remote.storage.enable": "true"}, BrokerConfig())
    with pytest.raises(InvalidConfigurationError, match="remote.log.storage.uri"):
        BrokerConfig(remote_log_storage_system_enable=True)
    broker = BrokerConfig(remote_log_storage_system_enable=True, remote_log_storage_uri="file:///tmp/x")
    assert validate_topic_configs({"remote.storage.enable": "true"}, broker) == {"remote.storage.enable": "true"}
    assert LogConfig.from_properties({"local.retention.ms": "5"}).local_retention().retention_ms == 5
