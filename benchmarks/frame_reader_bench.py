"""What reading the data plane's frames costs: asyncio's StreamReader, which the data plane
read with before, against rayk's FrameReader (rayk/dataplane/frame_reader.py), in one run.

A writer process sends length-prefixed frames of each `--sizes` over a Unix socket pair as
fast as it can; the reader, on uvloop as in Ray's actors, reads each frame's size and then
its body with `readexactly`, as the data plane's Connection and Endpoint do, and touches
nothing else. Printed: the reader process's CPU per MB (user + system, so the kernel's
copy out of the socket is in both), each reader's turn alternating, and StreamReader's over
FrameReader's; recorded in benchmarks/results/frame_reader_bench.json.

    .venv/bin/python benchmarks/frame_reader_bench.py [--sizes 16384,262144,1048576] [--mb 1024] [--rounds 2]

It prints and records figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import socket
import struct

import uvloop
from results import record  # (beside this script)

from rayk.dataplane.frame_reader import new_protocol

SIZE = struct.Struct(">i")


def write_frames(sock: socket.socket, frame_bytes: int, count: int) -> None:
    frame = SIZE.pack(frame_bytes) + b"r" * frame_bytes
    for _ in range(count):
        sock.sendall(frame)
    sock.close()


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def read_all(reader: object, count: int) -> None:
    readexactly = reader.readexactly  # type: ignore[attr-defined]
    for _ in range(count):
        size = SIZE.unpack(await readexactly(SIZE.size))[0]
        await readexactly(size)


async def one_pass(kind: str, frame_bytes: int, count: int) -> float:
    """The reader's CPU seconds for `count` frames."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    writer = multiprocessing.get_context("fork").Process(target=write_frames, args=(theirs, frame_bytes, count))
    writer.start()
    theirs.close()
    loop = asyncio.get_running_loop()
    if kind == "StreamReader":
        reader, stream_writer = await asyncio.open_unix_connection(sock=ours, limit=1 << 16)  # the data plane's limit
        transport = stream_writer.transport
    else:
        transport, protocol = await loop.create_unix_connection(new_protocol, sock=ours)
        reader = protocol.reader
    started = cpu_s()
    await read_all(reader, count)
    spent = cpu_s() - started
    transport.close()
    writer.join()
    return spent


async def main(sizes: list[int], megabytes: int, rounds: int) -> None:
    print(f"{'frame':>10} {'StreamReader µs/MB':>19} {'FrameReader µs/MB':>18} {'ratio':>6}")
    figures: dict[str, dict[str, float]] = {"StreamReader": {}, "FrameReader": {}}
    for frame_bytes in sizes:
        count = max(50, megabytes * (1 << 20) // frame_bytes)
        spent = {"StreamReader": 0.0, "FrameReader": 0.0}
        for round_ in range(rounds):
            for kind in (["StreamReader", "FrameReader"] if round_ % 2 == 0 else ["FrameReader", "StreamReader"]):
                spent[kind] += await one_pass(kind, frame_bytes, count)
        mb = rounds * count * frame_bytes / (1 << 20)
        stream_us, frame_us = spent["StreamReader"] / mb * 1e6, spent["FrameReader"] / mb * 1e6
        print(f"{frame_bytes // 1024:>7} KiB {stream_us:19.0f} {frame_us:18.0f} {stream_us / frame_us:5.2f}x")
        figures["StreamReader"][f"{frame_bytes // 1024} KiB frames"] = stream_us
        figures["FrameReader"][f"{frame_bytes // 1024} KiB frames"] = frame_us
    record("frame_reader_bench", {f"reader_cpu_us_per_mb_{kind}": points for kind, points in figures.items()})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1024,16384,131072,262144,1048576,4194304", help="frame body sizes in bytes")
    parser.add_argument("--mb", type=int, default=1024, help="MB read per reader, round and size")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    uvloop.run(main([int(s) for s in args.sizes.split(",")], args.mb, args.rounds))
