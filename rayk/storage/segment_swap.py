"""The log cleaner's crash-safe swap of a cleaned segment for the segments it replaces
(Kafka's LocalLog.replaceSegments and the swap recovery of its LogLoader), both halves of
one file protocol:

1. The cleaner writes the cleaned segment as `<base>.log.cleaned` (and `.index.cleaned`,
   `.timeindex.cleaned`, `.txnindex.cleaned`): `new_cleaned_segment`.
2. `swap_in` renames those files to `.swap` and fsyncs the directory: the commit point.
3. It deletes the replaced segments' files, renames the `.swap` files to the segment
   names and fsyncs the directory again.

A crash before step 2 leaves `.cleaned` files, which `finish_interrupted_swaps` deletes:
the old segments stand. A crash after it leaves a `<base>.log.swap`, which
`finish_interrupted_swaps` completes: the segments whose base offsets it covers go and it
takes the segment names. `.swap` indexes without their `.log.swap` are garbage.

Plain functions over a partition directory: the Log calls them under its lock, the
loader before the log is open.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from rayk.storage.log_config import LogConfig
from rayk.storage.log_segments import SEGMENT_FILE
from rayk.storage.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, LogSegment

logger = logging.getLogger(__name__)

CLEANED_SUFFIX = ".cleaned"  # a segment the cleaner is writing
SWAP_SUFFIX = ".swap"  # a cleaned segment committed to replace the segments it covers
_TEMPORARY_FILE = re.compile(r"^(\d{20})\.(log|index|timeindex|txnindex)\.(cleaned|swap)$")


def new_cleaned_segment(dir_path: Path, base_offset: int, config: LogConfig) -> LogSegment:
    """An empty `.cleaned` segment for the cleaner to write (a leftover one is replaced)."""
    for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
        (dir_path / f"{base_offset:020d}{suffix}{CLEANED_SUFFIX}").unlink(missing_ok=True)
    return LogSegment(dir_path, base_offset, config, active=True, file_suffix=CLEANED_SUFFIX)


def swap_in(dir_path: Path, cleaned: LogSegment, old: list[LogSegment]) -> None:
    """Steps 2 and 3: `cleaned` (written and sealed) takes the place of the segments `old`
    on disk, with the aborted transactions their indexes hold."""
    assert cleaned.file_suffix == CLEANED_SUFFIX, "only a .cleaned segment is swapped in"
    for segment in old:  # the cleaner keeps transactional batches and markers whole
        for txn in segment.txn_index.entries:
            cleaned.txn_index.append(txn)
    cleaned.flush()
    cleaned.rename_files(SWAP_SUFFIX)
    fsync_dir(dir_path)
    for segment in old:
        segment.delete()
    cleaned.rename_files("")
    fsync_dir(dir_path)


def finish_interrupted_swaps(dir_path: Path, config: LogConfig) -> None:
    """Completes every swap that passed its commit point, and deletes the files of
    those that did not (see the module docstring). Run before the segments are opened."""
    swaps = []
    for path in dir_path.iterdir():
        match = _TEMPORARY_FILE.match(path.name)
        if match is None:
            continue
        if match.group(3) == "swap" and match.group(2) == "log":
            swaps.append(int(match.group(1)))
        elif match.group(3) == "cleaned" or not (dir_path / f"{match.group(1)}{LOG_SUFFIX}{SWAP_SUFFIX}").exists():
            path.unlink()
    for base in sorted(swaps):
        swap = LogSegment(dir_path, base, config, active=False, file_suffix=SWAP_SUFFIX)
        if swap.load() is not None:
            swap.recover()
            swap.on_roll()
        end = swap.next_offset()
        for path in dir_path.iterdir():
            match = SEGMENT_FILE.match(path.name)
            if match is not None and base <= int(match.group(1)) < max(end, base + 1):
                path.unlink()
        swap.rename_files("")
        swap.close()
        logger.warning("%s: finished an interrupted clean: segment %d swapped in", dir_path, base)


def fsync_dir(path: Path) -> None:
    """Makes the directory's entries (renames, deletions) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
