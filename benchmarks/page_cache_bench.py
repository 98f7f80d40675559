"""What writing a byte into memory costs on this machine: into page-cache pages the kernel
allocates for the write (a log's tail), into pages already cached (an overwrite), and
into anonymous memory touched for the first time or again.

Why it matters: in a long run at produce throughput early in the session of 2026-12-06,
`perf record -a` of a 3-broker RF=3 cluster (latency_cpu_bench.py --throughput) put ~a
quarter of the whole machine's samples in the kernel's `copy_folio_from_iter_atomic`, the
copy of a pwrite into the page cache: the replicas' three copies of each record. On a
machine whose memory is backed, that copy runs at several GB/s a core. On this VM, free
pages are reported to the host (Firecracker's free page reporting, under nested
virtualization), which takes them back over time, so the first write of such a page
faults in the host, invisible to the guest and billed to whatever instruction touched it
(inferred: the guest cannot see the host's faults). Memory freed shortly before is still
backed: all of it if freed seconds before, ~300-400 MiB of it 30 s later. So how much a
run meets depends on what the machine freed before it, and when.

This bench prints the rates of each part separately, so both kinds show (on 2026-12-06:
~4-5 GiB/s a core into recently freed memory, ~200-330 MiB/s a core, ~12-20 µs a 4 KiB
page, past it, and ~1.3-1.7 GiB/s for an anonymous page's first touch, which the kernel
zeroes). It also prints what the median rate makes of a record of `--record-bytes`
written by 3 replicas and by 1.

    .venv/bin/python benchmarks/page_cache_bench.py [--mb MB] [--part-mb MB] [--record-bytes B]

Writes `--mb` MiB into a scratch directory, removed at the end. It asserts nothing.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scratch import scratch_dir  # noqa: E402  (beside this script)

MIB = 1 << 20
PAGE_BYTES = mmap.PAGESIZE


def timed_parts(parts: int, write_part) -> list[float]:
    """CPU seconds of this process per part, for `parts` calls of write_part(part)."""
    cpu_s = []
    for part in range(parts):
        start_s = time.process_time()
        write_part(part)
        cpu_s.append(time.process_time() - start_s)
    return cpu_s


def page_cache(path: str, mb: int, part_mb: int) -> tuple[list[float], list[float]]:
    """(CPU s per part writing new pages, CPU s per part overwriting them), 1 MiB pwrites."""
    chunk = os.urandom(MIB)
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    try:
        def write(part: int) -> None:
            for i in range(part * part_mb, (part + 1) * part_mb):
                os.pwrite(fd, chunk, i * MIB)

        new = timed_parts(mb // part_mb, write)
        cached = timed_parts(mb // part_mb, write)
    finally:
        os.close(fd)
        os.unlink(path)
    return new, cached


def anonymous(mb: int, part_mb: int) -> tuple[list[float], list[float]]:
    """(CPU s per part of a new anonymous mapping's first touch, of touching it again)."""
    parts = mb // part_mb
    maps = [mmap.mmap(-1, part_mb * MIB) for _ in range(parts)]
    chunk = os.urandom(MIB)
    try:
        def write(part: int) -> None:
            view = maps[part]
            for i in range(part_mb):
                view[i * MIB : (i + 1) * MIB] = chunk

        return timed_parts(parts, write), timed_parts(parts, write)
    finally:
        for m in maps:
            m.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=2048, help="MiB written by each part of the bench")
    parser.add_argument("--part-mb", type=int, default=256)
    parser.add_argument("--record-bytes", type=int, default=110,
                        help="a record's bytes in the log (kafka_protocol_bench's 100-byte value: ~110)")
    args = parser.parse_args()
    reporting = "/sys/module/page_reporting/parameters/page_reporting_order"
    print(f"free page reporting: {'on, order ' + open(reporting).read().strip() if os.path.exists(reporting) else 'not in this kernel'}")
    rows = {}
    # Each part starts on the memory the part before it freed (the anonymous part's 2 GiB
    # for the page cache's first parts): the per-part rates show that warm start apart.
    rows["anonymous, first touch"], rows["anonymous, touched again"] = anonymous(args.mb, args.part_mb)
    rows["page cache, new pages"], rows["page cache, pages cached"] = page_cache(
        os.path.join(scratch_dir("rayk-page-cache-"), "segment"), args.mb, args.part_mb)
    print(f"{'written into':<28} {'MiB/s a core, each ' + str(args.part_mb) + ' MiB part':<56} {'median':>8} "
          f"{'µs / page':>10} {'µs / record x3':>15} {'x1':>6}")
    for label, cpu_s in rows.items():
        rates = [args.part_mb / max(s, 1e-9) for s in cpu_s]
        median_rate = statistics.median(rates)
        s_per_byte = 1 / (median_rate * MIB)  # at the median rate, which the columns after it use
        print(f"{label:<28} {' '.join(f'{r:>6,.0f}' for r in rates):<56} {median_rate:>8,.0f} "
              f"{s_per_byte * PAGE_BYTES * 1e6:>10.2f} {3 * args.record_bytes * s_per_byte * 1e6:>15.2f} "
              f"{args.record_bytes * s_per_byte * 1e6:>6.2f}")


if __name__ == "__main__":
    main()
