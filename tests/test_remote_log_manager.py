"""RemoteLogManager on one leader's event loop (rayk/replication/remote_log_manager.py):
what it knows of the store never loses a segment it copied, whatever listing of the store
runs beside its pass (a `remote_segments` call, a new leader's first fetch below its local
start, a Ray Data plan's transaction list), and a reader of the remote transaction indexes
finds every aborted transaction while a pass copies and deletes local segments."""

from __future__ import annotations

import asyncio
import threading
import time

from rayk.replication.remote_log_manager import RemoteLogManager
from rayk.replication.replica_context import ReplicaConfig, ReplicaContext
from rayk.storage import Log, LogConfig
from rayk.storage.records import SimpleRecord, build_batch
from rayk.storage.remote import RemoteStorageSettings
from rayk.storage.remote.remote_log_storage import RemoteLogStorage


def tiered_leader(tmp_path, batches: int = 20) -> tuple[ReplicaContext, RemoteLogManager]:
    """Broker 1 leading a tiered log of several rolled segments, all below the HW, none copied."""
    config = LogConfig.from_properties({"segment.bytes": "600", "index.interval.bytes": "100", "retention.ms": "-1",
                                        "remote.storage.enable": "true", "local.retention.bytes": "0"})  # fmt: skip
    log = Log(tmp_path / "t-0", config)
    for i in range(batches):
        records = [SimpleRecord(f"v{3 * i + j}".encode().ljust(40, b"."), timestamp_ms=1_000 + i) for j in range(3)]
        log.append_as_leader(build_batch(records), leader_epoch=0)
    log.high_watermark = log.log_end_offset
    settings = RemoteStorageSettings(f"file://{tmp_path}/store")
    ctx = ReplicaContext("t", 0, 1, "id0", log, ReplicaConfig(remote_storage=settings))
    ctx.lead(0)
    return ctx, RemoteLogManager(ctx)


def test_a_listing_that_overlaps_a_copy_does_not_forget_the_copied_segment(tmp_path, monkeypatch):
    """The listing of a `refresh` started before the pass's copy committed and ended after the
    pass had deleted the copied segment locally: it set the stale listing, and until the next
    pass a consumer's fetch of those offsets (below the local start, in no known remote
    segment) was answered OFFSET_OUT_OF_RANGE, which a consumer with auto.offset.reset
    latest takes as a reason to skip to the end (a CI run lost 1,000 records so)."""
    real_list, real_copy = RemoteLogStorage.list_segments, RemoteLogStorage.copy_segment
    copied = threading.Event()
    listings = 0

    def list_segments(self, prefix):
        nonlocal listings
        listings += 1
        found = real_list(self, prefix)
        if listings == 2:  # the refresh's: it ends only after the copy committed (or 1 s)
            copied.wait(1)
        return found

    def copy_segment(self, *args, **kwargs):
        done = real_copy(self, *args, **kwargs)
        copied.set()
        return done

    monkeypatch.setattr(RemoteLogStorage, "list_segments", list_segments)
    monkeypatch.setattr(RemoteLogStorage, "copy_segment", copy_segment)

    async def main() -> None:
        ctx, remote = tiered_leader(tmp_path)
        await asyncio.gather(remote.run_once(), remote.refresh())
        log = ctx.log
        assert log.log_start_offset > 0, "the pass copied and deleted local segments"
        assert remote.log_start_offset() == 0
        missing = [o for o in range(log.log_start_offset) if not remote.holds(o)]
        assert not missing, f"offsets below the local start {log.log_start_offset} in no known remote segment: {missing}"
        log.close()

    asyncio.run(main())


def aborted_transaction(log: Log, producer_id: int) -> tuple[int, int]:
    """A transaction of `producer_id` in a segment of its own, its abort marker opening the
    next one (where its transaction index entry goes), that one rolled too: (first, last) offset."""
    now_ms = int(time.time() * 1000)  # markers take the wall clock
    records = build_batch([SimpleRecord(b"aborted", timestamp_ms=now_ms)], producer_id=producer_id, producer_epoch=0,
                          base_sequence=0, is_transactional=True)  # fmt: skip
    first = log.log_end_offset
    log.append_as_leader(records, 0, allow_transactional=True, verification_guard=log.verification_guard(producer_id))
    log.roll()
    log.append_txn_marker(producer_id, 0, commit=False, coordinator_epoch=0, leader_epoch=0)
    last = log.log_end_offset - 1
    log.roll()
    log.high_watermark = log.log_end_offset
    return first, last


def test_a_pass_copying_while_the_transaction_indexes_are_read_leaves_no_abort_out(tmp_path, monkeypatch):
    """The reader walked the remote segments it knew, awaiting each transaction index, and
    read the local part at the end: a pass meanwhile copied the segment holding an abort and
    deleted it locally, so the abort was in neither part and a read_committed reader (Ray
    Data, a consumer served from the store) took the aborted records as committed."""
    real_read = RemoteLogStorage.read
    pass_done = threading.Event()

    def read(self, prefix, segment, kind):
        if kind == "txnindex":
            pass_done.wait(1)  # the reader is still in the remote part when the pass ends
        return real_read(self, prefix, segment, kind)

    monkeypatch.setattr(RemoteLogStorage, "read", read)

    async def main() -> None:
        ctx, remote = tiered_leader(tmp_path, batches=0)
        log = ctx.log
        early = aborted_transaction(log, producer_id=5)  # copied first: a remote index to read
        assert await remote.run_once() > 0 and log.log_start_offset > early[1]
        late = aborted_transaction(log, producer_id=7)  # copied by the pass beside the reader

        async def pass_beside() -> None:
            await remote.run_once()
            pass_done.set()

        spans, _ = await asyncio.gather(remote.aborted_transaction_spans(0, log.log_end_offset), pass_beside())
        assert log.log_start_offset > late[1], "the pass copied the late abort and deleted it locally"
        assert sorted(spans) == [(5, *early), (7, *late)]
        log.close()

    asyncio.run(main())
