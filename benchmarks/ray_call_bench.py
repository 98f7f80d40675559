"""What one Ray actor call costs on this machine: round trip and CPU on each side.

The listener's design rests on this figure (rayk/net/produce_coalescer.py): an async
actor (a stand-in for the SocketServer) calls another async actor (a stand-in for a
PartitionReplica) with a 100-byte argument and a 3-tuple answer, as a produce call does.
It prints, for one call at a time and for 8 in flight:
- calls/s and the median round trip;
- the CPU time (user + system, from os.times in each process) per call of the caller
  and of the callee.

    .venv/bin/python benchmarks/ray_call_bench.py [--calls N]

A local Ray instance, shut down at the end. It prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import ray


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


@ray.remote(num_cpus=0)
class Callee:
    async def produce(self, records: bytes, acks: int, timeout_ms: int) -> tuple[int, int, int]:
        return 0, 0, 0

    async def cpu_s(self) -> float:
        return cpu_s()


@ray.remote(num_cpus=0)
class Caller:
    def __init__(self, callee) -> None:
        self.callee = callee

    async def run(self, calls: int, in_flight: int) -> dict:
        records = bytes(100)
        slots = asyncio.Semaphore(in_flight)
        round_trips: list[float] = []

        async def one() -> None:
            async with slots:
                start = time.perf_counter()
                await self.callee.produce.remote(records, -1, 1000)
                round_trips.append(time.perf_counter() - start)

        caller_cpu, callee_cpu, wall = cpu_s(), await self.callee.cpu_s.remote(), time.perf_counter()
        await asyncio.gather(*(one() for _ in range(calls)))
        wall = time.perf_counter() - wall
        caller_cpu, callee_cpu = cpu_s() - caller_cpu, await self.callee.cpu_s.remote() - callee_cpu
        return {"calls_per_s": calls / wall, "round_trip_ms_p50": sorted(round_trips)[calls // 2] * 1000,
                "caller_cpu_ms": caller_cpu / calls * 1000, "callee_cpu_ms": callee_cpu / calls * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    caller = Caller.remote(Callee.remote())
    ray.get(caller.run.remote(300, 1))  # warm both workers
    print(f"Ray {ray.__version__}, {os.cpu_count()} CPUs; {args.calls:,} calls of an async actor by an async actor")
    print(f"{'in flight':>9} {'calls/s':>9} {'round trip p50 ms':>18} {'caller CPU ms/call':>19} {'callee CPU ms/call':>19}")
    for in_flight in (1, 8):
        r = ray.get(caller.run.remote(args.calls, in_flight))
        print(f"{in_flight:>9} {r['calls_per_s']:>9,.0f} {r['round_trip_ms_p50']:>18.2f} {r['caller_cpu_ms']:>19.2f} "
              f"{r['callee_cpu_ms']:>19.2f}")
    ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
