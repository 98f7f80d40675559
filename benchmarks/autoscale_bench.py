"""Time from a CreateTopics that needs a new node to the topic's first produce, with Ray's
fake multi-node autoscaler, side by side with a CreateTopics that fits the brokers there are.

    .venv/bin/python benchmarks/autoscale_bench.py [--rounds 3]      # as root: namespaces of its own

A cluster of one broker (rayk.start(brokers=1, autoscale=True)) on Ray's fake autoscaler
(tests/fake_autoscaler.py: a head offering no broker resource, broker nodes offering one
`rayk_broker` each, started as raylets on this machine), in PID and network namespaces
of its own. Each round, in turn:
- fits: a topic of 1 partition at RF=1 is created (Admin.create_topic) and a record sent
  to it with acks=all; the time until it is acknowledged;
- needs a node: a topic of 1 partition at RF=2 asks Ray's autoscaler for a second broker
  node, waits for it and its broker, is created, and a record is acknowledged by both
  replicas. Sampled meanwhile: when the node joined Ray, and when its broker registered.
The topic is then deleted; the broker, idle, is decommissioned (broker.idle.removal.ms is
2 s here) and its node goes (idle_timeout_minutes 0.1) before the next round.

The fake provider starts a node in-process (no VM, no image, no rayk install): on a cloud
the node's own start (minutes) comes on top; what is measured is rayk's and Ray's share.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests import fake_autoscaler  # noqa: E402
from tests.cluster_helpers import FAST_CONFIG, wait_until  # noqa: E402

ROUND_TIMEOUT_S = 240


class Joins:
    """When the first broker node beyond the first, and its broker, appeared (sampled every 0.1 s)."""

    def __init__(self, cluster: object, started_s: float) -> None:
        self.node_s: float | None = None
        self.broker_s: float | None = None
        self._cluster, self._started_s, self._stop = cluster, started_s, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1) and self.broker_s is None:
            now_s = time.monotonic() - self._started_s
            if self.node_s is None and len(fake_autoscaler.broker_nodes()) > 1:
                self.node_s = now_s
            if self.node_s is not None and len(self._cluster.brokers()) > 1:  # type: ignore[attr-defined]
                self.broker_s = now_s

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def created_to_first_produce_s(cluster: object, topic: str, replication_factor: int) -> tuple[float, float]:
    """(seconds to the topic's creation, seconds to its first record acknowledged by every replica)."""
    started_s = time.monotonic()
    cluster.create_topic(topic, num_partitions=1, replication_factor=replication_factor)  # type: ignore[attr-defined]
    created_s = time.monotonic() - started_s
    with cluster.producer(acks="all") as producer:  # type: ignore[attr-defined]
        producer.send(topic, b"first").result(timeout=ROUND_TIMEOUT_S)
    return created_s, time.monotonic() - started_s


def measure(data_dir: str, rounds: str) -> None:
    """Inside the namespace (tests/fake_autoscaler.py main): the rounds, then the table."""
    import dataclasses

    import rayk

    config = {**FAST_CONFIG, "broker.idle.removal.ms": 2_000}
    cluster = rayk.start(brokers=1, data_dir=data_dir, config=config, autoscale=True,
                         node_resource=fake_autoscaler.BROKER_RESOURCE)  # fmt: skip
    cluster = dataclasses.replace(cluster, default_api_timeout_ms=ROUND_TIMEOUT_S * 1000)
    fits, scaled, created, node, broker = [], [], [], [], []
    for r in range(int(rounds)):
        fits.append(created_to_first_produce_s(cluster, f"fits-{r}", 1)[1])
        cluster.delete_topic(f"fits-{r}")
        joins = Joins(cluster, time.monotonic())
        created_s, produced_s = created_to_first_produce_s(cluster, f"needs-a-node-{r}", 2)
        joins.stop()
        scaled.append(produced_s), created.append(created_s), node.append(joins.node_s), broker.append(joins.broker_s)
        fake_autoscaler.log(f"round {r}: fits {fits[-1]:.1f} s, needs a node {produced_s:.1f} s")
        cluster.delete_topic(f"needs-a-node-{r}")
        wait_until(lambda: len(cluster.brokers()) == 1, ROUND_TIMEOUT_S, "the idle broker to be decommissioned")
        wait_until(lambda: len(fake_autoscaler.broker_nodes()) == 1, ROUND_TIMEOUT_S, "its node to go")
    cluster.shutdown()
    _print_table(fits, scaled, created, node, broker)


def _print_table(fits: list, scaled: list, created: list, node: list, broker: list) -> None:
    def row(name: str, values: list) -> str:
        cells = "".join(f"{v:>10.1f}" if v is not None else f"{'-':>10}" for v in values)
        known = [v for v in values if v is not None]
        return f"{name:<44}{cells}{statistics.median(known) if known else float('nan'):>10.1f}"

    print("\nCreateTopics -> first produce acknowledged (acks=all), seconds; Ray's fake autoscaler on this machine")
    print(f"{'':<44}" + "".join(f"{f'round {i}':>10}" for i in range(len(fits))) + f"{'median':>10}")
    print(row("fits the brokers there are (RF=1)", fits))
    print(row("needs a new broker node (RF=2)", scaled))
    print(row("  of which: the node joined Ray", node))
    print(row("            its broker registered", broker))
    print(row("            the topic was created", created))
    ratio = statistics.median(scaled) / statistics.median(fits)
    print(f"a topic that needs a node reaches its first produce {ratio:.1f}x later than one that fits")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0 or any(shutil.which(t) is None for t in ("unshare", *fake_autoscaler.TOOLS)):
        sys.exit("needs root, unshare, ip and mount: Ray's fake autoscaler runs in namespaces of its own")
    with tempfile.TemporaryDirectory() as data_dir:
        output = fake_autoscaler.run("benchmarks.autoscale_bench:measure", data_dir, str(args.rounds),
                                     timeout_s=ROUND_TIMEOUT_S * 2 * args.rounds + 120)  # fmt: skip
    print(output[output.find("\nCreateTopics"):] if "\nCreateTopics" in output else output)


if __name__ == "__main__":
    main()
