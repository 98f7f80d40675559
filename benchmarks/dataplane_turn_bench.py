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

    .venv/bin/python benchmarks/dataplane_turn_bench.py [--requests N] [--rates 100,300,1000,3000,0] [--uvloop] [--compare-native N]

Rate 0: back to back. `--uvloop` runs both processes on uvloop, as Ray runs actors (the
default is asyncio's own loop). `--compare-native N` runs N rounds each of the Python data
plane (RAYK_NATIVE=0) and the native one (rayk._native's endpoint and connection,
native_endpoint.py and native_connection.py), alternating. No Ray instance. It prints
figures and asserts nothing.

With a C compiler (`cc`) on the machine it then measures the same exchange in C: two
processes, a Unix socket pair, each side waiting in epoll_wait and the client sleeping
until each request is due, so the figures are what a turn costs the kernel and the VM
with no interpreter, the floor a compiled per-request path would stand on.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import pickle
import shutil
import subprocess
import tempfile
import time

import uvloop

from latency_cpu_bench import process_cpu_s as cpu_s  # (a script's own directory is on its path)
from rayk import native_paths
from rayk.dataplane import frames, native_endpoint
from rayk.dataplane.connection import Connection
from rayk.dataplane.endpoint import Endpoint

NODE = "this-node"


def serve(addresses: multiprocessing.Queue, on_uvloop: bool) -> None:
    async def answer(kind: int, body: memoryview) -> tuple[bytes, bytes]:
        return bytes(body[:8]), b""

    async def main() -> None:
        endpoint = Endpoint(answer, "bench")
        addresses.put(pickle.dumps(await endpoint.open(NODE, "127.0.0.1", tcp=False)))
        await asyncio.Event().wait()

    if on_uvloop:
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
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
    for rate in rates:
        count = requests if not rate else min(requests, int(rate * 10))  # at most 10 s per rate
        print(await measure(connection, server_pid, rate, max(count, 200)))
    connection.close()


# The C exchange: argv = requests, rate (0: back to back). The endpoint prints its CPU µs per
# request (getrusage), then the client its own and the median round trip in µs.
C_TURNS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static double now_s(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }
static double cpu_s(void) {
    struct rusage r; getrusage(RUSAGE_SELF, &r);
    return r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6 + r.ru_stime.tv_sec + r.ru_stime.tv_usec / 1e6;
}
static int poller(int fd) {
    int ep = epoll_create1(0); struct epoll_event e = {.events = EPOLLIN, .data.fd = fd};
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e); return ep;
}
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    int n = atoi(argv[1]); double rate = atof(argv[2]); int sv[2]; char buf[256] = {0}; struct epoll_event out;
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return 1;
    if (fork() == 0) {
        int ep = poller(sv[1]); double c0 = cpu_s();
        for (int i = 0; i < n; i++) {
            epoll_wait(ep, &out, 1, -1);
            if (read(sv[1], buf, 100) <= 0 || write(sv[1], buf, 8) != 8) return 1;
        }
        printf("%.1f\n", (cpu_s() - c0) / n * 1e6); return 0;
    }
    int ep = poller(sv[0]); double *trips = malloc(n * sizeof(double)), c0 = cpu_s(), t0 = now_s();
    for (int i = 0; i < n; i++) {
        double sent = now_s();
        if (write(sv[0], buf, 100) != 100) return 1;
        epoll_wait(ep, &out, 1, -1);
        if (read(sv[0], buf, 8) <= 0) return 1;
        trips[i] = now_s() - sent;
        double wait_s = t0 + (i + 1) / rate - now_s();
        if (rate > 0 && wait_s > 0) {
            struct timespec ts = {(time_t)wait_s, (long)((wait_s - (time_t)wait_s) * 1e9)};
            nanosleep(&ts, 0);
        }
    }
    double client_us = (cpu_s() - c0) / n * 1e6;
    int status; wait(&status);
    qsort(trips, n, sizeof(double), cmp);
    printf("%.1f %.1f\n", client_us, trips[n / 2] * 1e6); return 0;
}
"""


def c_turns(rates: list[float], requests: int) -> None:
    """The same exchange in C (see the module docstring), if a compiler is there."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        print("(no C compiler: the C floor is not measured)")
        return
    with tempfile.TemporaryDirectory(prefix="rayk-turns-") as work:
        source, binary = os.path.join(work, "turns.c"), os.path.join(work, "turns")
        with open(source, "w") as f:
            f.write(C_TURNS)
        subprocess.run([compiler, "-O2", "-o", binary, source], check=True)
        print()
        print("the same exchange in C (epoll, no interpreter):")
        print(f"{'requests':>14} {'client CPU µs/req':>16} {'endpoint CPU µs/req':>18} {'round trip p50 µs':>15}")
        for rate in rates:
            count = max(200, requests if not rate else min(requests, int(rate * 10)))
            server_us, client_us, trip_us = (float(x) for x in subprocess.run(
                [binary, str(count), str(rate)], check=True, capture_output=True, text=True).stdout.split())
            label = f"{rate:,.0f}/s" if rate else "back to back"
            print(f"{label:>14} {client_us:16.0f} {server_us:18.0f} {trip_us:15.0f}")


def python_turns(rates: list[float], requests: int, on_uvloop: bool) -> None:
    """The exchange between an Endpoint in a child process and a Connection in this one."""
    context = multiprocessing.get_context("spawn")  # the child takes RAYK_NATIVE from this one's environment
    addresses = context.Queue()
    server = context.Process(target=serve, args=(addresses, on_uvloop), daemon=True)
    server.start()
    try:
        if on_uvloop:
            asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        asyncio.run(run(server.pid, pickle.loads(addresses.get(timeout=30)), rates, requests))
    finally:
        asyncio.set_event_loop_policy(None)
        server.kill()
        server.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=3_000)
    parser.add_argument("--rates", default="100,300,1000,3000,0", help="requests/s, 0: back to back")
    parser.add_argument("--uvloop", action="store_true", help="both processes on uvloop, as Ray runs actors")
    parser.add_argument("--compare-native", type=int, default=0, metavar="N",
                        help="N rounds each of the Python data plane (RAYK_NATIVE=0) and the native one, alternating")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    print(f"machine: {os.cpu_count()} CPUs; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{'uvloop' if args.uvloop else 'asyncio'}")
    header = f"{'requests':>14} {'client CPU µs/req':>16} {'endpoint CPU µs/req':>18} {'round trip p50 µs':>15}"
    if not args.compare_native:
        print(header)
        python_turns(rates, args.requests, args.uvloop)
    elif not native_endpoint.available():
        raise SystemExit("--compare-native: rayk._native is not built here (or RAYK_NATIVE=0)")
    else:
        for i in range(args.compare_native):
            for enabled in ("0", "1"):
                os.environ[native_paths.ENV] = enabled
                print(f"round {i + 1}, {'native' if enabled == '1' else 'Python'} data plane (RAYK_NATIVE={enabled}):")
                print(header)
                python_turns(rates, args.requests, args.uvloop)
    c_turns(rates, args.requests)


if __name__ == "__main__":
    main()
