"""Producer snapshot files: Kafka's format version 1, one entry per retained batch, and
damage that is always detected (never a wrong state)."""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rayk.errors import KafkaStorageError
from rayk.storage import producer_snapshot
from rayk.storage.producer_state import BATCHES_REMEMBERED, BatchMetadata, ProducerEntry, ProducerStateManager

INT16 = (-(1 << 15), (1 << 15) - 1)
INT32 = (-(1 << 31), (1 << 31) - 1)
INT64 = (-(1 << 63), (1 << 63) - 1)
ENTRY = struct.Struct(">qhiqiqiq")


def state_of(*batches: tuple[int, int, int, int, int, int]) -> ProducerStateManager:
    """(producer id, epoch, first sequence, first offset, record count, timestamp) each."""
    state = ProducerStateManager()
    for pid, epoch, seq, offset, count, ts in batches:
        state.record(pid, epoch, BatchMetadata(seq, seq + count - 1, offset, offset + count - 1, ts))
    return state


def file_bytes(entries: list[tuple], version: int = 1, count: int | None = None) -> bytes:
    """A snapshot built field by field, independently of the module under test."""
    body = struct.pack(">i", len(entries) if count is None else count) + b"".join(ENTRY.pack(*e) for e in entries)
    return struct.pack(">hI", version, crc32c.crc32c(body)) + body


@st.composite
def states(draw) -> ProducerStateManager:
    state = ProducerStateManager()
    offset = draw(st.integers(0, 1 << 40))
    producer_ids = draw(st.lists(st.integers(0, INT64[1]), max_size=6, unique=True))
    for pid in producer_ids:
        epoch = draw(st.integers(*INT16))
        sequence = draw(st.integers(INT32[0], INT32[1]))
        # Zero batches: a producer a marker gave a new epoch, or whose batches retention took.
        for _ in range(draw(st.integers(0, BATCHES_REMEMBERED + 2))):
            count = draw(st.integers(1, 1000))
            offset += draw(st.integers(0, 50))
            ts = draw(st.integers(*INT64))
            state.record(pid, epoch, BatchMetadata(sequence, sequence + count - 1, offset, offset + count - 1, ts))
            sequence = min(sequence + count, INT32[1])
            offset += count
        entry = state.producers.setdefault(pid, ProducerEntry(epoch))
        entry.coordinator_epoch = draw(st.integers(-1, INT32[1]))
        if draw(st.booleans()):  # an open transaction, from one of its batches (or from one retention took)
            if entry.batches:
                state.restore_open_txn(pid, draw(st.sampled_from([b.first_offset for b in entry.batches])))
            else:
                state.restore_open_txn(pid, offset)
                offset += 1
    return state


# ---------------------------------------------------------------------- format


def test_a_snapshot_is_kafkas_version_1_layout_with_one_entry_per_batch():
    state = state_of((7, 2, 0, 10, 3, 1_000), (7, 2, 3, 13, 2, 2_000), (5, 0, 0, 0, 1, 500))
    expected = file_bytes(
        [
            (5, 0, 0, 0, 0, 500, -1, -1),  # producers in id order ...
            (7, 2, 2, 12, 2, 1_000, -1, -1),  # ... each producer's batches oldest first
            (7, 2, 4, 14, 1, 2_000, -1, -1),
        ]
    )
    assert producer_snapshot.encode(state) == expected
    assert len(expected) == 10 + 3 * 46


def test_an_empty_state_is_ten_bytes_and_round_trips():
    data = producer_snapshot.encode(ProducerStateManager())
    assert data == file_bytes([])
    assert producer_snapshot.decode(data) == ProducerStateManager()


def test_kafkas_reader_keeps_the_newest_batch_of_each_producer():
    state = state_of(*[(9, 1, 2 * i, 100 + 2 * i, 2, i) for i in range(7)])
    data = producer_snapshot.encode(state)
    last_entry_per_producer = {}
    for fields in ENTRY.iter_unpack(data[10:]):  # Kafka: producers.put(producerId, entry) per entry
        last_entry_per_producer[fields[0]] = fields
    newest = state.producers[9].batches[-1]
    assert last_entry_per_producer[9][2:4] == (newest.last_sequence, newest.last_offset)


def test_a_sequence_past_int32_max_round_trips_and_is_stored_wrapped():
    state = state_of((1, 0, INT32[1] - 1, 50, 4, 0))
    data = producer_snapshot.encode(state)
    assert ENTRY.unpack_from(data, 10)[2] == INT32[0] + 1  # (2^31 - 1 - 1 + 3) mod 2^32 as int32
    assert producer_snapshot.decode(data) == state


@settings(max_examples=200, deadline=None)
@given(states())
def test_any_state_round_trips_exactly(state: ProducerStateManager):
    assert producer_snapshot.decode(producer_snapshot.encode(state)) == state


# ---------------------------------------------------------------------- damage


@settings(max_examples=300, deadline=None)
@given(states(), st.data())
def test_any_single_byte_flip_is_detected(state: ProducerStateManager, data):
    raw = bytearray(producer_snapshot.encode(state))
    position = data.draw(st.integers(0, len(raw) - 1))
    raw[position] ^= data.draw(st.integers(1, 255))
    with pytest.raises(KafkaStorageError):
        producer_snapshot.decode(raw)


@settings(max_examples=300, deadline=None)
@given(states(), st.data())
def test_any_truncation_or_appended_bytes_are_detected(state: ProducerStateManager, data):
    raw = producer_snapshot.encode(state)
    if data.draw(st.booleans()):
        damaged = raw[: data.draw(st.integers(0, len(raw) - 1))]
    else:
        damaged = raw + data.draw(st.binary(min_size=1, max_size=100))
    with pytest.raises(KafkaStorageError):
        producer_snapshot.decode(damaged)


@settings(max_examples=300, deadline=None)
@given(states(), st.data())
def test_random_damage_gives_the_exact_state_or_a_storage_error(state: ProducerStateManager, data):
    raw = bytearray(producer_snapshot.encode(state))
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(raw) - 1))
        raw[position] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw)))]
    try:
        decoded = producer_snapshot.decode(raw)
    except KafkaStorageError:
        return
    assert decoded == state


def test_an_unknown_version_is_rejected_although_the_crc_matches():
    with pytest.raises(KafkaStorageError, match="version"):
        producer_snapshot.decode(file_bytes([(1, 0, 0, 0, 0, 0, -1, -1)], version=2))


@pytest.mark.parametrize("count", [0, 2, -1])
def test_a_count_that_disagrees_with_the_length_is_rejected_although_the_crc_matches(count):
    with pytest.raises(KafkaStorageError):
        producer_snapshot.decode(file_bytes([(1, 0, 0, 0, 0, 0, -1, -1)], count=count))


@pytest.mark.parametrize(
    "entries",
    [
        [(-1, 0, 0, 0, 0, 0, -1, -1)],  # no producer id
        [(1, 0, 0, -1, 0, 0, -1, -1)],  # no offset (Kafka: a producer known only by a txn marker)
        [(1, 0, 5, 3, 5, 0, -1, -1)],  # first offset below 0
        [(1, 0, 0, 3, -1, 0, -1, -1)],  # negative offset delta
        [(1, 0, 0, 0, 0, 0, -1, -1), (1, 1, 1, 1, 0, 0, -1, -1)],  # one producer, two epochs
        [(1, 0, 1, 5, 0, 0, -1, -1), (1, 0, 2, 5, 0, 0, -1, -1)],  # offsets not increasing
        [(1, 0, i, i, 0, 0, -1, -1) for i in range(BATCHES_REMEMBERED + 1)],  # too many batches
    ],
)
def test_contents_rayks_writer_cannot_produce_are_rejected_although_the_crc_matches(entries):
    with pytest.raises(KafkaStorageError):
        producer_snapshot.decode(file_bytes(entries))


def test_a_kafka_written_snapshot_with_one_entry_per_producer_is_read():
    data = file_bytes([(3, 1, 9, 40, 4, 77, 5, -1), (4, 0, 0, 45, 0, 78, -1, -1)])
    expected = state_of((3, 1, 5, 36, 5, 77), (4, 0, 0, 45, 1, 78))
    expected.producers[3].coordinator_epoch = 5
    assert producer_snapshot.decode(data) == expected


# ---------------------------------------------------------------------- files


def test_write_then_read_by_offset(tmp_path: Path):
    state = state_of((1, 0, 0, 0, 3, 10))
    path = producer_snapshot.write(tmp_path, 3, state)
    assert path.name == "00000000000000000003.snapshot"
    assert producer_snapshot.read(tmp_path, 3) == state
    assert not (tmp_path / "00000000000000000003.snapshot.tmp").exists()


def test_snapshot_offsets_lists_only_snapshot_files_ascending(tmp_path: Path):
    for offset in (30, 4, 100):
        producer_snapshot.write(tmp_path, offset, ProducerStateManager())
    for name in ("00000000000000000004.log", "00000000000000000009.snapshot.tmp", "00000000000000000005.snapshot.deleted"):
        (tmp_path / name).write_bytes(b"")
    assert producer_snapshot.snapshot_offsets(tmp_path) == [4, 30, 100]


def test_delete_removes_the_given_snapshots_and_leftover_temp_files(tmp_path: Path):
    for offset in (1, 2, 3):
        producer_snapshot.write(tmp_path, offset, ProducerStateManager())
    (tmp_path / "00000000000000000009.snapshot.tmp").write_bytes(b"half")
    producer_snapshot.delete(tmp_path, [1, 3, 77])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["00000000000000000002.snapshot"]


def test_reading_a_missing_snapshot_is_a_storage_error(tmp_path: Path):
    with pytest.raises(KafkaStorageError):
        producer_snapshot.read(tmp_path, 0)
