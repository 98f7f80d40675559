"""A delay line for one node's packets to one peer, in user space: what `tc qdisc add dev
eth0 root netem delay 200ms` does, on a kernel built without sch_netem (this machine's).

`python -m tests.faults.delay_link SELF PEER DELAY_MS`, run in the node's network
namespace (netns_cluster.Network.delay), as root:
- a TUN device `rk-delay` carries the node's packets to PEER (a /32 route through it,
  from SELF), so the kernel hands them to this process instead of the wire;
- each one waits DELAY_MS, in arrival order, then goes out through a raw socket whose
  packets bear a firewall mark that a policy rule routes through the node's own eth0
  (table 77), past the TUN route;
- it prints "ready" once the route is in place, and on SIGTERM takes the route, the rule
  and the device away, so the link is as it was.
Packets keep their order and nothing is dropped; the other direction is untouched (run a
second one in PEER's namespace for both).
"""

from __future__ import annotations

import fcntl
import heapq
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
DEVICE = "rk-delay"
MARK = 0x77
TABLE = "77"
SO_MARK = 36  # socket.SO_MARK, which Python 3.11 lacks on some builds


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True)


def main(self_ip: str, peer_ip: str, delay_ms: int) -> None:
    tun = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(tun, TUNSETIFF, struct.pack("16sH", DEVICE.encode(), IFF_TUN | IFF_NO_PI))
    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    raw.setsockopt(socket.SOL_SOCKET, SO_MARK, MARK)
    _ip("link", "set", DEVICE, "up")
    _ip("rule", "add", "fwmark", str(MARK), "lookup", TABLE)
    _ip("route", "add", f"{peer_ip}/32", "dev", "eth0", "table", TABLE)
    _ip("route", "add", f"{peer_ip}/32", "dev", DEVICE, "src", self_ip)
    line: list[tuple[float, int, bytes]] = []  # (due, arrival number, packet)
    ready = threading.Condition()
    stopping = threading.Event()

    def receive() -> None:
        for n in iter(int, 1):
            packet = os.read(tun, 65_535)
            with ready:
                heapq.heappush(line, (time.monotonic() + delay_ms / 1000, n, packet))
                ready.notify()

    def send() -> None:
        while not stopping.is_set():
            with ready:
                while not line:
                    ready.wait(0.1)
                    if stopping.is_set():
                        return
                due, _, packet = line[0]
                wait_s = due - time.monotonic()
                if wait_s > 0:
                    ready.wait(wait_s)
                    continue
                heapq.heappop(line)
            try:
                raw.sendto(packet, (peer_ip, 0))
            except OSError:
                pass  # a packet the kernel will not send (the link cut meanwhile): a lost packet

    def stop(*_: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    threading.Thread(target=receive, daemon=True).start()
    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    print("ready", flush=True)
    while not stopping.wait(0.2):
        pass
    subprocess.run(["ip", "route", "del", f"{peer_ip}/32", "dev", DEVICE], check=False)
    subprocess.run(["ip", "rule", "del", "fwmark", str(MARK), "lookup", TABLE], check=False)
    sender.join(5)
    os.close(tun)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
