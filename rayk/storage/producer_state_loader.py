"""How a log's producer state is rebuilt from its snapshots and batches (Kafka's
UnifiedLog.rebuildProducerState / ProducerStateManager.truncateAndReload), on open and
after a truncation.

The state comes from the newest valid producer snapshot (`<offset:020d>.snapshot`, see
producer_snapshot.py) in [log start, min(LEO, HW)], plus the batch headers after it (from
the log start if there is none): each batch with a producer id is recorded, each
transaction marker ends its producer's transaction. Starting at or below the HW, the
replay sees every marker the HW has not passed, so the transactions not yet stable are
known. Snapshots above the LEO or below the log start, damaged ones, and strays below
the one loaded that are not a segment's base are deleted.

The replay can also write the transaction indexes (`.txnindex`) again: of every segment
from `txn_index_from` on (recovery found one damaged, or re-read a marker), each
aborted transaction goes into the index of the segment holding its marker
(`complete_txn`, which appends use too).

Plain functions: the Log calls them under its lock (or before it is open).
"""

from __future__ import annotations

import logging
from pathlib import Path

from rayk.errors import KafkaError, KafkaStorageError
from rayk.storage import producer_snapshot
from rayk.storage.control_records import EndTxnMarker, read_end_txn_marker
from rayk.storage.log_segments import LogSegments
from rayk.storage.producer_state import ProducerStateManager
from rayk.storage.records import BatchHeader
from rayk.storage.segment import LogSegment
from rayk.storage.transaction_index import AbortedTxn

logger = logging.getLogger(__name__)


def rebuild_producer_state(
    dir_path: Path, segments: LogSegments, log_start_offset: int, log_end_offset: int, high_watermark: int,
    txn_index_from: int | None = None,
) -> ProducerStateManager:
    """The producer state the log's snapshots and batches say (see the module docstring);
    with `txn_index_from`, the snapshot it starts from is at or below it and the
    transaction indexes from there on are written again."""
    start, leo = log_start_offset, log_end_offset
    limit = min(leo, high_watermark if txn_index_from is None else min(high_watermark, txn_index_from))
    offsets = producer_snapshot.snapshot_offsets(dir_path)
    doomed = [o for o in offsets if not start <= o <= leo]
    loaded, replay_from = _newest_valid_snapshot(dir_path, [o for o in offsets if start <= o <= limit], start)
    segment_bases = set(segments.base_offsets)
    doomed += [o for o in offsets if o < replay_from and o >= start and o not in segment_bases]
    producer_snapshot.delete(dir_path, doomed)
    loaded.remove_batches_below(start)
    if replay_from < leo:
        _replay(dir_path, loaded, segments.from_offset(replay_from), replay_from, txn_index_from)
    return loaded


def _newest_valid_snapshot(dir_path: Path, candidates: list[int], start: int) -> tuple[ProducerStateManager, int]:
    """The newest of the `candidates` snapshots that reads and holds only batches below its
    offset, and that offset; damaged ones are deleted. None valid: an empty state at `start`."""
    for offset in reversed(candidates):
        try:
            state = producer_snapshot.read(dir_path, offset)
            if any(b.last_offset >= offset for e in state.producers.values() for b in e.batches):
                raise KafkaStorageError(f"producer snapshot at {offset} holds batches at or above {offset}")
        except KafkaStorageError as e:
            logger.warning("%s: ignoring producer snapshot %d: %s", dir_path, offset, e)
            producer_snapshot.delete(dir_path, [offset])
            continue
        return state, offset
    return ProducerStateManager(), start


def _replay(dir_path: Path, state: ProducerStateManager, segments: list[LogSegment], replay_from: int,
            txn_index_from: int | None) -> None:  # fmt: skip
    """Records into `state` the producer batches and markers of `segments` from
    `replay_from` on, rewriting the transaction indexes of those from `txn_index_from`."""
    for segment in segments:
        indexed = txn_index_from is not None and segment.base_offset >= txn_index_from
        if indexed:
            segment.txn_index.reset()
        for location in segment.batch_locations(replay_from):
            header = location.header
            if header.producer_id < 0:
                continue
            if not header.is_control:
                state.record_batch(header)
                continue
            try:
                marker = read_end_txn_marker(segment.read_batch(location))
            except KafkaError as e:  # CRC-valid but not a control record: not a marker
                logger.warning("%s: control batch at %d: %s", dir_path, header.base_offset, e)
                continue
            if marker is not None:
                complete_txn(state, header, marker, segment if indexed else None)


def complete_txn(state: ProducerStateManager, header: BatchHeader, marker: EndTxnMarker, segment: LogSegment | None) -> None:
    """A marker ends its producer's transaction in `state`; an abort is indexed in `segment`."""
    txn = state.complete_txn(header, marker.commit, marker.coordinator_epoch)
    if txn.is_aborted and segment is not None:
        segment.txn_index.append(
            AbortedTxn(txn.producer_id, txn.first_offset, txn.last_offset, state.last_stable_offset_after(txn))
        )
