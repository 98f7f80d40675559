"""What one data plane request costs in CPU when each one wakes both processes on its own,
against the same requests when they come close together.

An Endpoint (rayk/dataplane) in a child process answers every request at once with 8
bytes (no replica behind it); a Connection in this process sends requests of a fetch's
size over the Unix socket, one at a time, at each of several rates. It prints per rate the
CPU time (user + system, from /proc) per request on each side and the median round trip.

A record on its way through rayk at RF=3 (the listener, the leader, two followers, the
consumer's listener) takes ~10 such turns, and at a low rate each of them starts cold:
this is the floor under rayk's CPU per record at 100-1,000 records/s with linger.ms 0
(README, "Where the CPU of a record goes").

    .venv/bin/python benchmarks/dataplane_turn_bench.py [--requests N] [--rates 100,300,1000,3000,0]

Rate 0: back to back. No Ray instance. It prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import pickle
import time

from latency_cpu_bench import process_cpu_s as cpu_s  # (a script's own directory is on its path)
from rayk.dataplane import frames
from rayk.dataplane.connection import Connection
from rayk.dataplane.endpoint import Endpoint

NODE = "this-node"


def serve(addresses: multiprocessing.Queue) -> None:
    async def answer(kind: int, body: memoryview) -> tuple[bytes, bytes]:
        return bytes(body[:8]), b""

    async def main() -> None:
        endpoint = Endpoint(answer, "bench")
        addresses.put(pickle.dumps(await endpoint.open(NODE, "127.0.0.1", tcp=False)))
        await asyncio.Event().wait()

    asyncio.run(main())


async def measure(connection: Connection, server_pid: int, rate: float, requests: int) -> str:
    body = frames.encode_fetch_request(frames.FetchRequest(0, 1 << 20, replica_id=1, leader_epoch=3))
    for _ in range(100):  # warm-up
        await connection.request(frames.FETCH, body)
    client_before, server_before, start = cpu_s(os.getpid()), cpu_s(server_pid), time.perf_counter()
    round_trips = []
    for i in range(requests):
        sent = time.perf_counter()
        await connection.request(frames.FETCH, body)
        round_trips.append(time.perf_counter() - sent)
        if rate:
            await asyncio.sleep(max(0.0, start + (i + 1) / rate - time.perf_counter()))
    client_us = (cpu_s(os.getpid()) - client_before) / requests * 1e6
    server_us = (cpu_s(server_pid) - server_before) / requests * 1e6
    round_trips.sort()
    label = f"{rate:,.0f}/s" if rate else "back to back"
    return f"{label:>14} {client_us:16.0f} {server_us:18.0f} {round_trips[len(round_trips) // 2] * 1e6:15.0f}"


async def run(server_pid: int, address: object, rates: list[float], requests: int) -> None:
    connection = await Connection.open(address, NODE, "bench")
    print(f"{'requests':>14} {'client CPU µs/req':>16} {'endpoint CPU µs/req':>18} {'round trip p50 µs':>15}")
    for rate in rates:
        count = requests if not rate else min(requests, int(rate * 10))  # at most 10 s per rate
        print(await measure(connection, server_pid, rate, max(count, 200)))
    connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=3_000)
    parser.add_argument("--rates", default="100,300,1000,3000,0", help="requests/s, 0: back to back")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    context = multiprocessing.get_context("spawn")
    addresses = context.Queue()
    server = context.Process(target=serve, args=(addresses,), daemon=True)
    server.start()
    try:
        asyncio.run(run(server.pid, pickle.loads(addresses.get(timeout=30)), [float(r) for r in args.rates.split(",")],
                        args.requests))  # fmt: skip
    finally:
        server.kill()
        server.join()


if __name__ == "__main__":
    main()
