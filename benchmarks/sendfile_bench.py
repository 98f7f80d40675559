"""What a leader's event loop spends to send fetch answers: records read into the process
and written (before), against the same records sent from the log file by sendfile
(rayk/dataplane/answer_writer.py), in one run.

An Endpoint (rayk/dataplane) on uvloop, as in a replica actor, in a thread of its own,
answers fetches from a real Log of `--mb` MB of batches of `--batch-kib` KiB: with
`Log.read` into bytes (sendfile off) or as a FileSlice sent by sendfile (on). A
Connection in the main thread reads the whole log with fetches of each answer size, one
after another, over the Unix socket (as a follower or listener on the same node). It
prints, per answer size and way (sendfile at every size here, to show where it starts to
pay: rayk uses it from SENDFILE_MIN_BYTES), the endpoint thread's CPU time per MB (the leader's
cost of the copy) and the throughput, the better of `--rounds` alternating rounds, and
records the CPU figures in benchmarks/results/sendfile_bench.json.

    .venv/bin/python benchmarks/sendfile_bench.py [--mb 256] [--batch-kib 16] [--rounds 3]

In a temporary directory, removed at the end. No Ray. It prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import tempfile
import threading
import time
from pathlib import Path

import uvloop
from results import record  # (beside this script)

from rayk.dataplane import frames
from rayk.dataplane.connection import Connection
from rayk.dataplane.endpoint import SENDFILE_MIN_BYTES, Endpoint
from rayk.storage import Log
from rayk.storage.records import SimpleRecord, build_batch

NODE = "bench-node"
REQUEST = struct.Struct(">qi?")  # offset, max bytes, as a slice
ANSWER_HEAD = struct.Struct(">q")  # the offset after the answer's records
ANSWER_SIZES = (64 << 10, 256 << 10, 1 << 20, 8 << 20)


def fill(log: Log, mb: int, batch_kib: int) -> None:
    value = bytes(range(256)) * 4  # 1 KiB records
    batch = build_batch([SimpleRecord(value)] * batch_kib)
    for _ in range((mb << 20) // len(batch)):
        log.append_as_leader(batch, 0)


class EndpointThread:
    """The leader's side: an Endpoint on a uvloop loop in a thread, its thread CPU readable."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.loop = uvloop.new_event_loop()
        self.kept: list[Endpoint] = []
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.endpoints = {way: self.call(self._open(way == "sendfile")) for way in ("read", "sendfile")}

    def call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    async def _open(self, sendfile: bool):
        async def handler(kind: int, body: memoryview) -> tuple[bytes, object]:
            offset, max_bytes, as_slice = REQUEST.unpack(body)
            found = self.log.read(offset, max_bytes, slice_min_bytes=1 if as_slice else None)  # every size, to compare
            return ANSWER_HEAD.pack(found.next_offset), found.records

        endpoint = Endpoint(handler, "bench", sendfile=sendfile)
        self.kept.append(endpoint)
        return await endpoint.open(NODE, "127.0.0.1", tcp=False)

    async def _cpu_s(self) -> float:
        return time.thread_time()

    def cpu_s(self) -> float:
        return self.call(self._cpu_s())


async def read_all(address, log_end_offset: int, max_bytes: int, as_slice: bool) -> int:
    connection = await Connection.open(address, NODE)
    offset, received = 0, 0
    while offset < log_end_offset:
        answer = await connection.request(frames.FETCH, REQUEST.pack(offset, max_bytes, as_slice))
        offset = ANSWER_HEAD.unpack_from(answer)[0]
        received += len(answer) - ANSWER_HEAD.size
    connection.close()
    return received


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--batch-kib", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rayk-sendfile-bench-") as directory:
        log = Log(Path(directory))
        fill(log, args.mb, args.batch_kib)
        leader = EndpointThread(log)
        print(f"log: {log.log_end_offset} records, {args.mb} MB in batches of {args.batch_kib} KiB; "
              f"rayk sends answers of {SENDFILE_MIN_BYTES >> 10} KiB or more by sendfile")
        best: dict[tuple[int, str], tuple[float, float]] = {}
        for _ in range(args.rounds):
            for size in ANSWER_SIZES:
                for way in ("read", "sendfile"):
                    cpu_before, wall_before = leader.cpu_s(), time.perf_counter()
                    received = asyncio.run(read_all(leader.endpoints[way], log.log_end_offset, size, way == "sendfile"))
                    cpu_s, wall_s = leader.cpu_s() - cpu_before, time.perf_counter() - wall_before
                    mb = received / (1 << 20)
                    figures = (cpu_s / mb * 1e3, mb / wall_s)  # ms of CPU per MB, MB/s
                    if (size, way) not in best or figures[0] < best[size, way][0]:
                        best[size, way] = figures
        print(f"{'answer':>8}  {'way':<9} {'leader CPU ms/MB':>17} {'MB/s':>8}  {'CPU read/sendfile':>17}")
        for size in ANSWER_SIZES:
            for way in ("read", "sendfile"):
                cpu, rate = best[size, way]
                ratio = f"{best[size, 'read'][0] / cpu:.2f}x" if way == "sendfile" else ""
                print(f"{size >> 10:>6} K  {way:<9} {cpu:>17.3f} {rate:>8.0f}  {ratio:>17}")
        record("sendfile_bench", {
            f"leader_cpu_ms_per_mb_{way}": {f"{size >> 10} KiB answers": best[size, way][0] for size in ANSWER_SIZES}
            for way in ("read", "sendfile")
        })
        log.close()


if __name__ == "__main__":
    main()
