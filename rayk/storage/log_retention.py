"""Which of a log's oldest segments retention deletes (Kafka's UnifiedLog.deleteOldSegments
with its three reasons: deleteLogStartOffsetBreachedSegments,
deleteRetentionMsBreachedSegments, deleteRetentionSizeBreachedSegments).

Whole segments only, oldest first, and never one holding an offset at or above the high
watermark (only committed records go), nor the active segment while it is empty. A
segment wholly below the log start offset (moved up by DeleteRecords) goes whatever the
policy. With cleanup.policy delete, a segment goes too if its newest record is older than
`retention.ms` (its largest timestamp; the file's modification time if it has none), or
while the log without it is still at least `retention.bytes`. A compact-only log keeps
every key's latest record above its log start, so retention stops at the first segment
the log start does not pass.

A pure function of the segments' figures: the Log calls it under its lock and deletes
what it says.
"""

from __future__ import annotations

from rayk.storage.log_config import LogConfig
from rayk.storage.log_segments import LogSegments


def deletable_segment_count(
    segments: LogSegments, config: LogConfig, log_start_offset: int, high_watermark: int, log_end_offset: int,
    now_ms: int,
) -> int:
    """How many of the oldest segments retention deletes now (see the module docstring)."""
    retention_ms, retention_bytes = config.retention_ms, config.retention_bytes
    excess_bytes = segments.size_bytes - retention_bytes
    last = len(segments) - 1
    doomed = 0
    for i, segment in enumerate(segments):
        upper = segments.end_offset(i, log_end_offset)
        if (segment.is_empty and i == last) or upper > high_watermark:
            break
        if upper <= log_start_offset and i < last:
            excess_bytes -= segment.size_bytes
            doomed += 1
            continue
        if not config.deletes:
            break
        newest_ms = segment.max_timestamp_ms if segment.max_timestamp_ms >= 0 else segment.last_modified_ms
        expired = retention_ms >= 0 and now_ms - newest_ms > retention_ms
        oversize = retention_bytes >= 0 and excess_bytes - segment.size_bytes >= 0
        if not (expired or oversize):
            break
        excess_bytes -= segment.size_bytes
        doomed += 1
    return doomed
