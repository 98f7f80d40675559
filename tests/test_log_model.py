"""The Log against a simple in-memory model, under random operation sequences.

The model is the list of acknowledged batches (offsets and values). Operations: leader
appends, rolls, flushes, truncation to a batch boundary, a clean close + reopen, and a
crash: the Log object is abandoned without closing and the active segment is cut at a
random byte at or after what was last fsynced. After each step the log must hold exactly
the model's records at the model's offsets; after a crash, exactly the batches that lie
wholly before the cut, and never less than what had been flushed.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import pytest

from rayk.errors import RecordBatchTooLargeError
from rayk.storage import Log, LogConfig, segment
from rayk.storage.file_slice import FileSlice
from rayk.storage.records import SimpleRecord, build_batch, iter_batches


@dataclass
class ModelBatch:
    base_offset: int
    values: list[bytes]
    size_bytes: int

    @property
    def next_offset(self) -> int:
        return self.base_offset + len(self.values)


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="rayk-model-"))
        self.batches: list[ModelBatch] = []
        self.flushed_offset = 0
        self.epoch = 0
        self.counter = 0

    @initialize(
        segment_bytes=st.integers(200, 3000),
        index_interval_bytes=st.integers(0, 400),
        segment_index_bytes=st.sampled_from([24, 96, 10 * 1024 * 1024]),
    )
    def open_log(self, segment_bytes: int, index_interval_bytes: int, segment_index_bytes: int) -> None:
        self.config = LogConfig(
            segment_bytes=segment_bytes,
            index_interval_bytes=index_interval_bytes,
            segment_index_bytes=segment_index_bytes,
        )
        self.log = Log(self.dir, self.config)

    def teardown(self) -> None:
        try:
            self.log.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def leo(self) -> int:
        return self.batches[-1].next_offset if self.batches else 0

    # ------------------------------------------------------------------ operations

    @rule(count=st.integers(1, 5), value_bytes=st.integers(0, 60), codec=st.sampled_from(["none", "gzip"]))
    def append(self, count: int, value_bytes: int, codec: str) -> None:
        values = []
        for _ in range(count):
            self.counter += 1
            values.append(f"{self.counter}:".encode().ljust(value_bytes, b"#"))
        data = build_batch([SimpleRecord(v) for v in values], compression=codec)
        if len(data) > self.config.segment_bytes:
            with pytest.raises(RecordBatchTooLargeError):
                self.log.append_as_leader(data, leader_epoch=self.epoch)
            return
        info = self.log.append_as_leader(data, leader_epoch=self.epoch)
        assert info.first_offset == self.leo
        self.batches.append(ModelBatch(self.leo, values, len(data)))

    @rule()
    def new_leader_epoch(self) -> None:
        self.epoch += 1

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule()
    def flush(self) -> None:
        self.log.flush()
        self.flushed_offset = self.leo

    @precondition(lambda self: self.batches)
    @rule(data=st.data())
    def truncate_to_batch_boundary(self, data: st.DataObject) -> None:
        keep = data.draw(st.integers(0, len(self.batches)))
        self.batches = self.batches[:keep]
        self.log.truncate_to(self.leo)
        self.flushed_offset = min(self.flushed_offset, self.leo)

    @rule()
    def reopen_cleanly(self) -> None:
        self.log.close()
        self.log = Log(self.dir, self.config)
        self.flushed_offset = self.leo

    @rule(fraction=st.floats(0.0, 1.0))
    def crash_and_tear_active_segment(self, fraction: float) -> None:
        active_base = self.log.segment_base_offsets[-1]
        # Abandon the Log without close(): nothing more is written, indexes stay preallocated.
        self.log = None  # type: ignore[assignment]
        active = [b for b in self.batches if b.base_offset >= active_base]
        flushed_bytes = sum(b.size_bytes for b in active if b.next_offset <= self.flushed_offset)
        total_bytes = sum(b.size_bytes for b in active)
        cut = flushed_bytes + int((total_bytes - flushed_bytes) * fraction)
        with open(self.dir / f"{active_base:020d}.log", "r+b") as f:
            f.truncate(cut)
        survivors, position = [], 0
        for b in active:
            position += b.size_bytes
            if position <= cut:
                survivors.append(b)
        self.batches = [b for b in self.batches if b.base_offset < active_base] + survivors
        self.log = Log(self.dir, self.config)
        assert self.log.log_end_offset >= self.flushed_offset, "a flushed record was lost"
        self.flushed_offset = self.leo

    # ------------------------------------------------------------------ invariants

    @invariant()
    def log_matches_model(self) -> None:
        log = self.log
        assert log.log_end_offset == self.leo
        assert log.log_start_offset == 0
        expected = [(b.base_offset + i, v) for b in self.batches for i, v in enumerate(b.values)]
        seen, offset = [], 0
        while offset < log.log_end_offset:
            result = log.read(offset, 500)
            assert result.next_offset > offset, "a read must make progress"
            seen += [(r.offset, r.value) for batch in iter_batches(result.records) for r in batch.records()]
            offset = result.next_offset
        assert seen == expected

    @invariant()
    def every_batch_is_found_from_any_of_its_offsets(self) -> None:
        for b in self.batches[-4:]:
            for offset in {b.base_offset, b.next_offset - 1}:
                first = next(iter_batches(self.log.read(offset, 1).records)).header
                assert first.base_offset == b.base_offset

    @invariant()
    def a_sliced_read_names_the_bytes_a_read_returns(self) -> None:
        """Log.read with slice_min_bytes (what a data plane answer sends by sendfile) finds
        the same batches as a read, from the index and the headers alone."""
        log = self.log
        offsets = {b.base_offset for b in self.batches[-6:]} | {b.next_offset - 1 for b in self.batches[:3]}
        for offset in sorted(offsets):
            for max_bytes in (1, 70, 333, 1500):
                for max_offset in (None, self.leo - 1, offset + 2):
                    read = log.read(offset, max_bytes, max_offset=max_offset)
                    sliced = log.read(offset, max_bytes, max_offset=max_offset, slice_min_bytes=1)
                    assert sliced.next_offset == read.next_offset
                    if isinstance(sliced.records, FileSlice):
                        assert sliced.records.read() == read.records and sliced.records.unchanged()
                        sliced.records.close()
                    else:
                        assert sliced.records == read.records == b""

    @invariant()
    def reads_return_the_batches_the_model_says(self) -> None:
        """Log.read, plain and sliced, against the model itself: whole batches from the one
        holding the offset, within `max_bytes` (the first whatever its size), each ending
        below `max_offset`. The tail's reads come from the segment's kept locations, the
        rest from its index and headers: both are held to this."""
        log = self.log
        offsets = {b.base_offset for b in self.batches[-5:]} | {b.next_offset - 1 for b in self.batches[:3]}
        offsets |= {self.batches[len(self.batches) // 2].base_offset + 1} if self.batches else set()
        for offset in sorted(o for o in offsets | {self.leo} if o <= self.leo):
            for max_bytes in (1, 70, 333, 1500):
                for max_offset in (None, self.leo - 1, offset + 2):
                    expected_values, expected_next, expected_bytes = self.model_read(offset, max_bytes, max_offset)
                    for slice_min_bytes in (None, 1):
                        result = log.read(offset, max_bytes, max_offset=max_offset, slice_min_bytes=slice_min_bytes)
                        records = result.records
                        data = records.read() if isinstance(records, FileSlice) else records
                        if isinstance(records, FileSlice):
                            records.close()
                        values = [r.value for batch in iter_batches(data) for r in batch.records()]
                        assert (values, result.next_offset, len(data)) == (
                            expected_values, expected_next, expected_bytes), (offset, max_bytes, max_offset, slice_min_bytes)

    def model_read(self, offset: int, max_bytes: int, max_offset: int | None) -> tuple[list[bytes], int, int]:
        """What Log.read(offset, max_bytes, max_offset) returns by the model: values, next
        offset, size in bytes. A read ends with the segment that holds its first batch, as Kafka's does."""
        following = [b for b in self.batches if b.next_offset > offset]
        if following:
            later_segments = [base for base in self.log.segment_base_offsets if base > following[0].base_offset]
            if later_segments:
                following = [b for b in following if b.base_offset < later_segments[0]]
        values: list[bytes] = []
        next_offset, total_bytes = offset, 0
        for i, b in enumerate(following):
            if max_offset is not None and b.next_offset - 1 >= max_offset:
                break
            if i > 0 and total_bytes + b.size_bytes > max_bytes:
                break
            values += b.values
            next_offset, total_bytes = b.next_offset, total_bytes + b.size_bytes
            if total_bytes >= max_bytes:
                break
        return values, next_offset, total_bytes

    @invariant()
    def segments_start_where_the_previous_ended(self) -> None:
        bases = self.log.segment_base_offsets
        assert bases == sorted(set(bases))
        batch_starts = {b.base_offset for b in self.batches} | {self.leo}
        assert set(bases) <= batch_starts


LogMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_log_against_model = LogMachine.TestCase


class ShortMemoryLogMachine(LogMachine):
    """The same, with an active segment that keeps the locations of its last one or two
    batches (RECENT_BATCHES 1), so reads start in the kept tail, before it and across it."""

    def __init__(self) -> None:
        super().__init__()
        self._kept = segment.RECENT_BATCHES
        segment.RECENT_BATCHES = 1

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            segment.RECENT_BATCHES = self._kept


ShortMemoryLogMachine.TestCase.settings = LogMachine.TestCase.settings
test_log_against_model_with_a_short_memory = ShortMemoryLogMachine.TestCase
