"""Fetcher: the consumer's fetch pipeline (Kafka's consumer Fetcher), without blocking.

Every assigned partition with a position has at most one fetch in flight to its leader,
over the data plane (rayk.client.data_plane; long-polled there: `fetch_min_bytes`,
`fetch_max_wait_ms`), and the next one goes out as soon as it returns, so the following
records arrive while the application still works on the current ones; at most one
fetched chunk per partition waits behind the one being handed out. The consumer's `poll`
waits for the fetches' futures (calls.ReadyWaiter) and hands the ready ones to `collect`, which keeps each answer as it came, a FetchedChunk of record
batches. A chunk is decoded (any codec the storage layer reads) as it is handed out, in
the form asked for: `drain` and the iteration hand out ConsumerRecords, `drain_columns` one
Arrow RecordBatch per partition (rayk.client.arrow_batches, no Python object per record).
The iteration decodes a few batches at a time (`decode_more`, DECODE_AHEAD_RECORDS), as
Kafka's consumer walks a fetch's batches: a 1 MiB answer is ~8,000 records, ~3 MB of Python
objects, which decoded at once left the cache before they were handed out, and a corrupt
batch is met after the records before it went out, not before any of them. All of them
start at the consumer's positions and advance them; a fully handed-out chunk moves its
partition's position to the chunk's end, past any control batches at its tail, as
Kafka's consumer does.

With `read_committed` the fetches read below the LSO and drop the records of aborted
transactions (storage.read_committed, Kafka's consumer with isolation.level
read_committed) before a chunk is kept; its end stays the fetch's, so the position moves
past what was dropped.

A fetch unanswered after `fetch_max_wait_ms + request_timeout_ms` is cancelled; after a
failed fetch (a dead or silent leader, NOT_LEADER_OR_FOLLOWER, ...) the partition's leader
is looked up again (in the background: MetadataCache.leader_nowait) and the partition
waits `retry_backoff_ms`. OFFSET_OUT_OF_RANGE answers go back to the consumer with the
offset they fetched (OutOfRange): one at the position resets it; one fetched ahead, past
a chunk still buffered, is stale (retention may have moved the log start past it while
the records before it wait in memory), and `hold_read_ahead` keeps the partition from
fetching again until its chunks are handed out, so that its next fetch is at the
position. Not thread-safe: the consumer's thread owns it.
"""

from __future__ import annotations

import contextlib
import gc
import sys
from collections import Counter, deque
from collections.abc import Generator, Iterator
from typing import Any, NamedTuple

import numpy as np

from rayk.client import calls
from rayk.client.data_plane import DataPlaneSession
from rayk.client.hand_out import HandOut
from rayk.client.metadata import STALE_LEADER_ERRORS, MetadataCache
from rayk.client.serializers import as_is
from rayk.client.types import ConsumerRecord, TopicPartition
from rayk.dataplane.frames import READ_COMMITTED, READ_UNCOMMITTED, FetchRequest
from rayk.errors import KafkaError, OffsetOutOfRangeError
from rayk.storage.read_committed import committed_batches
from rayk.storage.records import decode_consumer_records, decode_record_tuples, end_offset_of, iter_batches


_new_tuple = tuple.__new__

# Records a chunk decodes ahead of the iteration (whole batches: at least this many, or to
# the chunk's end). ~500 of 100 B are ~180 KB of objects: they stay in the cache until they
# are handed out, and a call into Python per ~500 records costs nothing against them.
DECODE_AHEAD_RECORDS = 500


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic GC waits while records are decoded. A fetch makes ~3 objects per record;
    with many records alive, the collections those allocations trigger took 3/4 of the
    consumer's time (0.22 vs 0.91 M rec/s decoded). None of them can form a cycle."""
    paused = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if paused:
            gc.enable()


class OutOfRange(NamedTuple):
    """A fetch answered OFFSET_OUT_OF_RANGE: its partition, the offset it fetched (the
    consumer's position, or further on for a fetch ahead of a buffered chunk) and the
    FetchResult, with the log start, high watermark and LSO a reset needs."""

    tp: TopicPartition
    fetch_offset: int
    result: Any


class FetchedChunk:
    """One fetch answer of one partition, kept as the record batches it came as: the
    records in [start, end) are handed out from it, decoded as they are needed into
    ConsumerRecords or at once into one Arrow RecordBatch. `records` is a deque of the
    decoded records not yet handed out (the drain pops it, Fetcher.decode_more extends it
    in place); `more` is true while batches of `data` past `decoded_bytes` are not decoded."""

    __slots__ = ("tp", "data", "start", "end", "records", "more", "decoded_bytes", "_columns")

    def __init__(self, tp: TopicPartition, data: bytes | memoryview, start: int, end: int) -> None:
        assert start < end, (start, end)
        self.tp, self.data, self.start, self.end = tp, data, start, end
        self.records: deque[ConsumerRecord] = deque()
        self.more = True
        self.decoded_bytes = 0
        self._columns: Any = None

    def columns(self) -> Any:
        """The chunk's records as one pyarrow RecordBatch of arrow_batches.SCHEMA."""
        if self._columns is None:
            from rayk.client.arrow_batches import records_batch  # pyarrow: only for the columnar API

            self._columns = records_batch(self.data, self.tp.topic, self.tp.partition, self.start, self.end)
        return self._columns


class Fetcher:
    """A consumer's fetches: owns the next offset to fetch and the fetch in flight of each
    partition, the chunks fetched and not yet handed out, and the retry times. Made by its
    Consumer; not thread-safe (the consumer's thread)."""

    def __init__(
        self,
        metadata: MetadataCache,
        *,
        fetch_min_bytes: int,
        fetch_max_wait_ms: int,
        max_partition_fetch_bytes: int,
        request_timeout_ms: int,
        retry_backoff_ms: int,
        key_deserializer: Any,
        value_deserializer: Any,
        data_plane: Any = None,
        read_committed: bool = False,
    ) -> None:
        """`data_plane` sends the fetches (a DataPlaneSession of its own unless given)."""
        self._metadata = metadata
        self._isolation_level = READ_COMMITTED if read_committed else READ_UNCOMMITTED
        self._min_bytes = fetch_min_bytes
        self._max_wait_ms = fetch_max_wait_ms
        self._max_bytes = max_partition_fetch_bytes
        self._call_timeout_s = (fetch_max_wait_ms + request_timeout_ms) / 1000
        self._retry_backoff_s = retry_backoff_ms / 1000
        self._key_deserializer = key_deserializer
        self._data_plane = data_plane or DataPlaneSession("consumer")
        self._value_deserializer = value_deserializer
        self._fetch_offsets: dict[TopicPartition, int] = {}  # next offset to fetch
        # fetch future -> (partition, offset fetched, deadline)
        self._in_flight: dict[Any, tuple[TopicPartition, int, float]] = {}
        self._fetching: set[TopicPartition] = set()  # the partitions of _in_flight
        self._buffer: deque[FetchedChunk] = deque()
        self._chunks: Counter[TopicPartition] = Counter()  # chunks in _buffer per partition
        self._retry_at_s: dict[TopicPartition, float] = {}
        # Partitions whose fetch ahead of a buffered chunk was refused OFFSET_OUT_OF_RANGE:
        # no fetch until that chunk is handed out (else the same refusal comes back at
        # every poll while it waits), then one at the position.
        self._read_ahead_held: set[TopicPartition] = set()
        self._changes = 0  # forgets and the close: HandOut's sign to leave the chunk it hands out
        self._closed = False

    def forget(self, tp: TopicPartition) -> None:
        """Drops what was fetched or is being fetched for `tp` (a seek, a revocation)."""
        self._changes += 1  # HandOut leaves a chunk it took before
        self._fetch_offsets.pop(tp, None)
        self._retry_at_s.pop(tp, None)
        self._read_ahead_held.discard(tp)
        self._buffer = deque(chunk for chunk in self._buffer if chunk.tp != tp)
        self._chunks.pop(tp, None)
        self._fetching.discard(tp)
        for ref, (p, _offset, _deadline) in list(self._in_flight.items()):
            if p == tp:
                del self._in_flight[ref]

    def close(self) -> None:
        self._changes += 1
        self._closed = True
        for ref in self._in_flight:
            calls.cancel(ref)
        self._in_flight.clear()
        self._fetching.clear()
        self._data_plane.close()

    def start_fetches(self, assignment: list[TopicPartition], positions: dict[TopicPartition, int], now: float) -> None:
        for tp in assignment:
            if tp in self._fetching or self._chunks[tp] > 1 or tp not in positions or self._retry_at_s.get(tp, 0) > now:
                continue
            leader = self._metadata.leader_nowait(tp.topic, tp.partition)
            if leader is None:
                continue  # looked up in the background; poll wakes up for it
            if tp in self._read_ahead_held:
                if self._chunks[tp]:
                    continue  # its chunk goes out first
                self._read_ahead_held.discard(tp)
                self._fetch_offsets[tp] = positions[tp]  # the refused offset, now that all before it went out
            offset = self._fetch_offsets.setdefault(tp, positions[tp])
            ref = self._data_plane.fetch(leader, FetchRequest(
                offset, self._max_bytes, self._min_bytes, self._max_wait_ms, isolation_level=self._isolation_level
            ))
            self._in_flight[ref] = (tp, offset, now + self._call_timeout_s)
            self._fetching.add(tp)

    def hold_read_ahead(self, tp: TopicPartition) -> None:
        """Fetches nothing more for `tp` until its buffered chunks are handed out, then
        fetches at its position: a fetch ahead of them was refused OFFSET_OUT_OF_RANGE
        (Kafka's consumer discards such a stale answer). A forget lifts it."""
        self._read_ahead_held.add(tp)

    def collect(self, ready: set[Any], now: float) -> list[OutOfRange]:
        """Takes in the fetches that are ready or past their deadline; returns the
        answers that were OFFSET_OUT_OF_RANGE, with the offsets they fetched."""
        out_of_range = []
        for ref, (tp, offset, deadline) in list(self._in_flight.items()):
            if ref not in ready and now < deadline:
                continue
            del self._in_flight[ref]
            self._fetching.discard(tp)
            result: Any = None
            try:
                result = calls.get(ref, deadline, f"fetch {tp.topic}-{tp.partition}")
                error = result.error
            except KafkaError as e:  # a dead or silent leader
                error = e
            if isinstance(error, OffsetOutOfRangeError):
                out_of_range.append(OutOfRange(tp, offset, result))
            elif error is not None:
                if isinstance(error, STALE_LEADER_ERRORS):
                    self._metadata.invalidate(tp.topic, tp.partition)
                self._retry_at_s[tp] = now + self._retry_backoff_s
            else:
                start = self._fetch_offsets.get(tp, 0)
                records = result.records
                end = end_offset_of(records)
                if result.aborted_transactions:
                    records = b"".join(bytes(b.data) for b in committed_batches(records, result.aborted_transactions))
                if end > start:
                    self._fetch_offsets[tp] = end
                    self._buffer.append(FetchedChunk(tp, records, start, end))
                    self._chunks[tp] += 1
        return out_of_range

    def pending(self) -> list[Any]:
        return list(self._in_flight)

    def wake_at_s(self, assignment: list[TopicPartition]) -> float | None:
        """The earliest fetch deadline or retry backoff end."""
        times = [deadline for _tp, _offset, deadline in self._in_flight.values()]
        times += [t for tp, t in self._retry_at_s.items() if tp in assignment]
        return min(times) if times else None

    def decode_more(self, chunk: FetchedChunk, records: int | None = None) -> None:
        """Decodes the chunk's next whole batches, at least `records` records of them
        (None: DECODE_AHEAD_RECORDS) or to the chunk's end, onto the end of
        `chunk.records`; `chunk.more` turns false at its end. A batch that does not decode
        raises, with nothing of it taken; the batches decoded before it in the same call
        are kept, and the next call meets it again (the consumer stays at it, as Kafka's
        does at a corrupt record)."""
        at_least = DECODE_AHEAD_RECORDS if records is None else records
        decoded: list[ConsumerRecord] = []
        position = chunk.decoded_bytes
        try:
            with gc_paused():
                for batch in iter_batches(memoryview(chunk.data)[position:]):
                    decoded += self._batch_records(chunk, batch)
                    position += len(batch.data)
                    if len(decoded) >= at_least:
                        break
                else:
                    chunk.more = False  # past the last whole batch: an incomplete tail is not data
        except Exception:
            if not decoded:
                raise
        chunk.decoded_bytes = position
        chunk.records.extend(decoded)

    def _batch_records(self, chunk: FetchedChunk, batch: Any) -> list[ConsumerRecord]:
        """The ConsumerRecords of one batch of the chunk at or after its start."""
        if batch.header.is_control:
            return []  # transaction markers: no records for the application
        topic, partition = chunk.tp
        if self._key_deserializer is as_is and self._value_deserializer is as_is:
            # the records as they are: built by compiled code, no step per record here
            return decode_consumer_records(batch.data, ConsumerRecord, topic, partition, chunk.start)
        plain_keys, plain_values = self._key_deserializer is as_is, self._value_deserializer is as_is
        header, decoded = decode_record_tuples(batch.data)
        timestamp_type = int(header.timestamp_type)
        # tuple.__new__ as ConsumerRecord's own __new__ calls it, without that function's
        # Python frame per record.
        return [
            _new_tuple(ConsumerRecord, (
                topic,
                partition,
                offset,
                timestamp,
                timestamp_type,
                key if plain_keys else self._key_deserializer(key),
                value if plain_values else self._value_deserializer(value),
                headers,
                -1 if key is None else len(key),
                -1 if value is None else len(value),
            ))
            for offset, timestamp, key, value, headers in decoded
            if offset >= chunk.start  # a batch that starts before the requested offset
        ]  # fmt: skip

    def drain(self, positions: dict[TopicPartition, int], limit: int) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Up to `limit` buffered records at the positions, which move past them. A batch
        that does not decode raises once the records before it went out: here if none did,
        else at the next drain (Kafka's consumer: the records before a corrupt one, then
        its error), so no record a position moved past is lost with the exception."""
        out: dict[TopicPartition, list[ConsumerRecord]] = {}
        taken = 0
        while self._buffer and taken < limit:
            chunk = self._buffer[0]
            tp = chunk.tp
            if positions.get(tp) is None:
                self._pop_chunk()
                continue
            try:
                while chunk.more:  # poll hands out lists: what is left of the chunk at once
                    self.decode_more(chunk, records=sys.maxsize)
            except Exception:
                if not (out or chunk.records):
                    raise
            records, taken_here = chunk.records, []
            while records and taken < limit:
                record = records.popleft()
                if record.offset >= positions[tp]:
                    taken_here.append(record)
                    taken += 1
            if taken_here:
                out.setdefault(tp, []).extend(taken_here)
                positions[tp] = taken_here[-1].offset + 1
            if not records:
                if chunk.more:
                    break  # at a batch that does not decode: the next drain raises its error
                positions[tp] = max(positions[tp], chunk.end)
                self._pop_chunk()
        return out

    def hand_out(self, positions: dict[TopicPartition, int],
                 chunks: Generator[FetchedChunk, int | None, None] | None = None) -> Iterator[ConsumerRecord]:
        """The buffered records at the positions, one at a time, as `drain(positions, 1)`
        over and over would give them, each moving its partition's position past itself as
        it goes out (rayk.client.hand_out: a chunk's records go out with no Python step per
        record). A position moved or a partition forgotten while a record was out (a seek,
        a pause, a new assignment, a poll in between) is seen before the next record, which
        then comes from the position as it is. The chunks come from `chunks` (HandOut's
        source: the consumer's, which polls for more); by default, the buffered ones,
        stopping when nothing is buffered at a position or once the fetcher is closed."""
        return HandOut(self._chunks_at_positions(positions) if chunks is None else chunks, positions, self)

    def _chunks_at_positions(self, positions: dict[TopicPartition, int]) -> Generator[FetchedChunk, int | None, None]:
        while not self._closed and (chunk := self.chunk_at_position(positions)) is not None:
            yield chunk

    def _drop_if_first(self, chunk: FetchedChunk) -> None:
        """Pops `chunk` if it still heads the buffer: a poll while one of its records was
        out may have taken the rest and moved on to the next chunk, which stays."""
        if self._buffer and self._buffer[0] is chunk:
            self._pop_chunk()

    def chunk_at_position(self, positions: dict[TopicPartition, int]) -> FetchedChunk | None:
        """The first buffered chunk of a partition with a position (HandOut decodes it as
        it goes, `decode_more`); the chunks of partitions without one are dropped."""
        buffer = self._buffer
        while buffer:
            chunk = buffer[0]
            if positions.get(chunk.tp) is None:
                self._pop_chunk()
                continue
            return chunk
        return None

    def drain_columns(self, positions: dict[TopicPartition, int], limit: int | None) -> dict[TopicPartition, Any]:
        """One Arrow RecordBatch (arrow_batches.SCHEMA) per partition with buffered
        records at its position, up to `limit` records in all (None: every buffered
        record, one chunk per partition); the positions move past them. Keys and values
        are the stored bytes: the deserializers apply to `drain` only."""
        from rayk.client.arrow_batches import numpy_view  # pyarrow: only for the columnar API

        out: dict[TopicPartition, Any] = {}
        taken = 0
        kept: deque[FetchedChunk] = deque()
        while self._buffer:
            chunk = self._buffer.popleft()
            tp = chunk.tp
            position = positions.get(tp)
            if position is None:
                self._chunks[tp] -= 1
                continue
            if tp in out or (limit is not None and taken >= limit):
                kept.append(chunk)  # one RecordBatch per partition and poll: the next poll takes it
                continue
            columns = chunk.columns()
            first = int(np.searchsorted(numpy_view(columns.column(4), np.int64), position))
            count = columns.num_rows - first if limit is None else min(columns.num_rows - first, limit - taken)
            taken_here = columns.slice(first, count)
            if count > 0:
                out[tp] = taken_here
                taken += count
                positions[tp] = int(taken_here.column(4)[-1].as_py()) + 1
            if first + count >= columns.num_rows:
                positions[tp] = max(positions[tp], chunk.end)
                self._chunks[tp] -= 1
            else:
                kept.append(chunk)
        self._buffer = kept
        return out

    def _pop_chunk(self) -> None:
        self._chunks[self._buffer.popleft().tp] -= 1
