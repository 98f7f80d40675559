"""The aborted-transaction index (`.txnindex`), transaction markers, and the read_committed
filter: their bytes as Kafka writes them, and their rules."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rayk.errors import CorruptRecordError
from rayk.storage.control_records import ABORT, COMMIT, EndTxnMarker, build_end_txn_marker, read_end_txn_marker
from rayk.storage.read_committed import committed_batches
from rayk.storage.records import BatchHeader, SimpleRecord, build_batch
from rayk.storage.transaction_index import ENTRY_SIZE_BYTES, AbortedTxn, TransactionIndex, decode_entries

KAFKA_ENTRY = struct.Struct(">hqqqq")  # version, producerId, firstOffset, lastOffset, lastStableOffset


def entries_strategy():
    """Aborted transactions as an index holds them: markers (last offsets) strictly growing."""
    def build(raw):
        out, last = [], -1
        for pid, span, gap, lso_delta in raw:
            last += gap
            out.append(AbortedTxn(pid, max(0, last - span), last, max(0, last + 1 - lso_delta)))
        return out

    return st.lists(
        st.tuples(st.integers(0, 2**63 - 1), st.integers(0, 50), st.integers(1, 1000), st.integers(0, 30)), max_size=30
    ).map(build)


@given(entries_strategy())
def test_entries_round_trip_through_the_file_byte_for_byte(entries):
    data = b"".join(t.encode() for t in entries)
    assert data == b"".join(KAFKA_ENTRY.pack(0, *(t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset))
                            for t in entries)  # fmt: skip
    assert decode_entries(data) == (entries, None)


@given(entries_strategy(), st.integers(1, ENTRY_SIZE_BYTES - 1))
def test_a_torn_last_entry_is_a_problem_and_the_whole_ones_before_it_are_read(entries, torn_bytes):
    data = b"".join(t.encode() for t in entries) + b"\x00" * torn_bytes
    found, problem = decode_entries(data)
    assert found == entries and "whole number" in problem


@pytest.mark.parametrize(
    "raw, why",
    [
        (KAFKA_ENTRY.pack(1, 5, 0, 3, 4), "version"),
        (KAFKA_ENTRY.pack(0, -1, 0, 3, 4), "not an aborted transaction"),
        (KAFKA_ENTRY.pack(0, 5, 4, 3, 4), "not an aborted transaction"),
        (KAFKA_ENTRY.pack(0, 5, 0, 3, 4) + KAFKA_ENTRY.pack(0, 6, 0, 3, 4), "not after"),
    ],
)
def test_entries_no_writer_produces_are_a_problem(raw, why):
    assert why in decode_entries(raw)[1]


def test_the_file_is_created_by_the_first_entry_and_reloads(tmp_path):
    path = tmp_path / "00000000000000000000.txnindex"
    index = TransactionIndex(path)
    assert index.entries == [] and not path.exists(), "Kafka creates the file lazily"
    index.append(AbortedTxn(7, 0, 4, 5))
    index.append(AbortedTxn(8, 2, 9, 10))
    with pytest.raises(ValueError, match="does not follow"):
        index.append(AbortedTxn(9, 9, 9, 10))
    index.flush()
    index.close()
    assert path.stat().st_size == 2 * ENTRY_SIZE_BYTES
    again = TransactionIndex(path)
    assert again.entries == [AbortedTxn(7, 0, 4, 5), AbortedTxn(8, 2, 9, 10)] and again.problem is None
    again.truncate_to(9)
    assert TransactionIndex(path).entries == [AbortedTxn(7, 0, 4, 5)]
    again.reset()
    assert path.stat().st_size == 0


def test_collect_returns_overlapping_transactions_and_stops_once_the_lso_passes_the_bound(tmp_path):
    index = TransactionIndex(tmp_path / "x.txnindex")
    for txn in (AbortedTxn(1, 0, 4, 5), AbortedTxn(2, 3, 10, 11), AbortedTxn(3, 12, 15, 16), AbortedTxn(4, 20, 30, 31)):
        index.append(txn)
    assert index.collect(5, 12) == ([AbortedTxn(2, 3, 10, 11)], True), "the third starts at the bound; its LSO ends it"
    assert index.collect(5, 13) == ([AbortedTxn(2, 3, 10, 11), AbortedTxn(3, 12, 15, 16)], True)
    assert index.collect(0, 100) == (index.entries, False), "no entry's LSO reached 100: a later segment may hold more"
    assert index.collect(31, 40) == ([], False)


# ---------------------------------------------------------------------- markers


@given(st.integers(0, 2**63 - 1), st.integers(0, 2**15 - 1), st.booleans(), st.integers(0, 2**31 - 1))
def test_a_marker_is_a_transactional_control_batch_that_reads_back(producer_id, epoch, commit, coordinator_epoch):
    batch = build_end_txn_marker(producer_id, epoch, commit, coordinator_epoch, 1_000, base_offset=7)
    header = BatchHeader.parse(batch)
    assert header.is_control and header.is_transactional and header.record_count == 1
    assert (header.producer_id, header.producer_epoch, header.base_sequence, header.base_offset) == (producer_id, epoch, -1, 7)
    assert read_end_txn_marker(batch) == EndTxnMarker(commit, coordinator_epoch)


def test_the_marker_record_is_kafkas_control_key_and_value():
    from rayk.storage.records import decode_records

    (record,) = decode_records(build_end_txn_marker(5, 1, False, 9, 1_000))
    assert record.key == struct.pack(">hh", 0, ABORT) and record.value == struct.pack(">hi", 0, 9)
    (record,) = decode_records(build_end_txn_marker(5, 1, True, 9, 1_000))
    assert record.key == struct.pack(">hh", 0, COMMIT)


def test_other_control_types_are_not_markers_and_junk_is_corrupt():
    leader_change = build_batch([SimpleRecord(b"v", struct.pack(">hh", 0, 2))], producer_id=1, is_control=True)
    assert read_end_txn_marker(leader_change) is None
    with pytest.raises(CorruptRecordError):
        read_end_txn_marker(build_batch([SimpleRecord(b"v", b"k")], producer_id=1, is_control=True))
    with pytest.raises(ValueError):
        read_end_txn_marker(build_batch([SimpleRecord(b"v")]))


# ---------------------------------------------------------------------- the consumer's filter


def txn_batch(pid: int, offset: int, value: bytes) -> bytes:
    return build_batch([SimpleRecord(value)], base_offset=offset, producer_id=pid, producer_epoch=0,
                       base_sequence=offset, is_transactional=True)  # fmt: skip


def test_read_committed_drops_aborted_transactions_and_markers_and_keeps_the_rest():
    records = b"".join([
        txn_batch(1, 0, b"a1"), txn_batch(2, 1, b"b1"), build_batch([SimpleRecord(b"plain")], base_offset=2),
        build_end_txn_marker(1, 0, False, 0, 5, base_offset=3), txn_batch(2, 4, b"b2"),
        build_end_txn_marker(2, 0, True, 0, 5, base_offset=5), txn_batch(1, 6, b"a2"),
    ])  # fmt: skip
    kept = [r.value for b in committed_batches(records, [(1, 0)]) for r in b.records()]
    assert kept == [b"b1", b"plain", b"b2", b"a2"], "producer 1's next transaction (offset 6) is not the aborted one"
