"""Apache Kafka as the benchmarks' yardstick: a KRaft cluster of `brokers` combined
broker+controller nodes on 127.0.0.1, started from Kafka's own jars.

The jars come from Maven Central the first time (`mvn dependency:copy-dependencies` of
`org.apache.kafka:kafka_2.13` into ~/.cache/rayk-bench/apache-kafka-<version>, never into
git); later runs reuse them. Each node is a JVM with a small heap (`heap_mb`), its own
log directory in a temporary directory, formatted with Kafka's StorageTool, and the
defaults a user of a 3-node cluster sets: `default.replication.factor`, `min.insync.
replicas` and the offsets topic's replication as given.

    with ApacheKafka(brokers=3) as kafka:
        kafka.bootstrap_servers  # "127.0.0.1:p0,127.0.0.1:p1,127.0.0.1:p2"
        kafka.pids               # the JVMs, for CPU accounting
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

VERSION = "4.1.1"
CACHE_DIR = Path(os.environ.get("RAYK_BENCH_CACHE", Path.home() / ".cache" / "rayk-bench"))
POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>rayk.bench</groupId><artifactId>apache-kafka</artifactId><version>1</version><packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>{version}</version></dependency>
  </dependencies>
</project>
"""
START_TIMEOUT_S = 120
# What Kafka's own start scripts pass (bin/kafka-run-class.sh, KAFKA_JVM_PERFORMANCE_OPTS).
JVM_OPTIONS = ("-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
               "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true")


def kafka_jars(version: str = VERSION) -> Path:
    """The directory of Kafka's jars and their dependencies, fetched once with Maven."""
    home = CACHE_DIR / f"apache-kafka-{version}"
    lib = home / "lib"
    if (lib / f"kafka_2.13-{version}.jar").exists():
        return lib
    home.mkdir(parents=True, exist_ok=True)
    (home / "pom.xml").write_text(POM.format(version=version))
    partial = home / "lib.partial"
    shutil.rmtree(partial, ignore_errors=True)
    subprocess.run(["mvn", "-q", "-B", "dependency:copy-dependencies", f"-DoutputDirectory={partial}"],
                   cwd=home, check=True)
    shutil.rmtree(lib, ignore_errors=True)
    partial.rename(lib)  # only a complete download counts as fetched
    return lib


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class ApacheKafka:
    def __init__(self, brokers: int = 3, min_insync_replicas: int = 2, heap_mb: int = 512) -> None:
        self.brokers, self.min_insync_replicas, self.heap_mb = brokers, min_insync_replicas, heap_mb
        self.dir = Path(tempfile.mkdtemp(prefix="apache-kafka-"))
        self._processes: list[subprocess.Popen] = []
        ports = free_ports(2 * brokers)
        self.ports, self.controller_ports = ports[:brokers], ports[brokers:]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._processes]

    def __enter__(self) -> ApacheKafka:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def start(self) -> None:
        lib = kafka_jars()
        java = [shutil.which("java") or "java", f"-Xms{self.heap_mb}m", f"-Xmx{self.heap_mb}m", *JVM_OPTIONS,
                "-cp", f"{lib}/*"]
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")  # Kafka's Uuid text
        voters = ",".join(f"{n}@127.0.0.1:{p}" for n, p in enumerate(self.controller_ports))
        try:
            for node in range(self.brokers):
                config = self._write_config(node, voters)
                subprocess.run(java + ["kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config)],
                               check=True, stdout=subprocess.DEVNULL)
                log = open(self.dir / f"node-{node}.out", "wb")
                self._processes.append(subprocess.Popen(java + ["kafka.Kafka", str(config)], stdout=log, stderr=log))
            self._wait_until_serving()
        except BaseException:
            self.stop()
            raise

    def _write_config(self, node: int, voters: str) -> Path:
        config = self.dir / f"node-{node}.properties"
        replication = min(3, self.brokers)
        config.write_text("\n".join([
            "process.roles=broker,controller",
            f"node.id={node}",
            f"controller.quorum.voters={voters}",
            f"listeners=PLAINTEXT://127.0.0.1:{self.ports[node]},CONTROLLER://127.0.0.1:{self.controller_ports[node]}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.ports[node]}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            f"log.dirs={self.dir / f'data-{node}'}",
            f"default.replication.factor={replication}",
            f"min.insync.replicas={min(self.min_insync_replicas, replication)}",
            f"offsets.topic.replication.factor={replication}",
            f"transaction.state.log.replication.factor={replication}",
            f"transaction.state.log.min.isr={min(self.min_insync_replicas, replication)}",
            "offsets.topic.num.partitions=3",
            "group.initial.rebalance.delay.ms=0",
            "",
        ]))
        return config

    def _wait_until_serving(self) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + START_TIMEOUT_S
        self._wait_for_ports(deadline)
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        while True:
            self._check_alive()
            try:
                if len(admin.list_topics(timeout=2).brokers) == self.brokers:
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"Apache Kafka did not serve {self.brokers} brokers within {START_TIMEOUT_S} s")
            time.sleep(0.5)

    def _wait_for_ports(self, deadline: float) -> None:
        """Until every node's listener accepts (so the admin client does not log refusals)."""
        for node, port in enumerate(self.ports):
            while True:
                self._check_alive()
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"Apache Kafka node {node} did not listen within {START_TIMEOUT_S} s") from None
                    time.sleep(0.2)

    def _check_alive(self) -> None:
        for node, process in enumerate(self._processes):
            if process.poll() is not None:
                tail = (self.dir / f"node-{node}.out").read_bytes()[-2000:].decode(errors="replace")
                raise RuntimeError(f"Apache Kafka node {node} exited ({process.returncode}):\n{tail}")

    def stop(self) -> None:
        for process in self._processes:
            process.terminate()
        for process in self._processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._processes.clear()
        shutil.rmtree(self.dir, ignore_errors=True)
