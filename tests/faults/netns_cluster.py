"""A multi-host Ray cluster on one machine: each Ray node in a network namespace of its
own, on a bridge, with a disk of its own, and the faults of the network between them
and of the disks (tests/faults/test_network_faults.py, test_disk_faults.py).

Layout (addresses exist only inside the namespaces this module makes):

    hub namespace (PID 1 of this module):  bridge rk-br
      rk-head    10.77.0.1   Ray's head (GCS) and rayk's Controller, 1 CPU
      rk-b1..b3  10.77.0.11- a broker node each: 1 CPU, one unit of BROKER_RESOURCE
      rk-client  10.77.0.21  the driver: the scenario, its producer and consumers

Outside, a test calls `run_scenario("module:function")` (or `run`, with arguments):
`python -m tests.faults.netns_cluster module:function args...` starts as the first
process of PID, mount and network namespaces of its own (tests/own_namespaces.py), so the bridge, the
veth pairs, the node namespaces, /tmp/ray and every process go with it when it ends,
whatever the test did. Inside, `main` makes the network, starts the Ray nodes, then runs
the scenario as the driver in rk-client (`ip netns exec`, a process of its own), which
calls `function(*args)` with every node's Ray already joined.

Each node runs in a mount namespace of its own (what `ip netns exec` makes), where
`DATA_DIR` is that node's own disk (NODE_ROOT/<node>, a tmpfs of NODE_DISK_BYTES that
`resize_disk` can shrink to fill it): as on real hosts, a broker's disk is seen only by
the processes on its node. With `failing_disk`, FAILING_DISK_NODE's disk is that tmpfs
seen through failing_fs.py (a FUSE file system in the hub namespace), which fails the
reads, writes or fsyncs `fail_disk` names with EIO, as a failing device does. rayk's Controller is pinned to the head
(`start_rayk` starts it from a task there), so a client is not where the Controller is.

Faults (`Network`), each in the namespace of the node it concerns, with nftables: a
node's packets to and from a set of addresses dropped, both ways or one (`cut`), healed
(`heal`); and latency (`delay`: the kernel here has no sch_netem, so `delay_link.py`, a
TUN device with a user-space delay line, carries the node's packets to a peer).
A node that Ray declared dead while it was cut off ends its raylet when it reaches the
GCS again; `restart_node` starts Ray on it again, as its supervisor (systemd, the
autoscaler) would.

Needs root, `ip` (iproute2), `nft` (nftables) and `mount`.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import own_namespaces
from tests.cluster_helpers import wait_until
from tests.faults.harness import CONFIG, PARTITIONS, TOPIC, Traffic, healthy, run_until_acked
from tests.own_namespaces import STEP_PREFIX

TOOLS = ("ip", "nft", "mount")  # besides unshare, and root
SUBNET = "10.77.0"
BRIDGE = "rk-br"
HEAD = "rk-head"
CLIENT = "rk-client"
ADDRESSES = {HEAD: f"{SUBNET}.1", "rk-b1": f"{SUBNET}.11", "rk-b2": f"{SUBNET}.12", "rk-b3": f"{SUBNET}.13",
             CLIENT: f"{SUBNET}.21"}  # fmt: skip
GCS_PORT = 6379
NODE_ROOT = Path("/tmp/rayk-netns")  # a tmpfs of the hub's mount namespace
DATA_DIR = NODE_ROOT / "data"  # in each node's mount namespace: NODE_ROOT/<node>
NODE_DISK_BYTES = 4 << 30  # each node's disk: a tmpfs of its own (pages taken as written), resizable (`resize_disk`)
FAILING_DISK_NODE = "rk-b1"  # with `failing_disk`: its disk through failing_fs.py
FAILING_DISK_VAR = "RAYK_NETNS_FAILING_DISK"  # set by `run`, read by `main`
DISK_FAULT_CONTROL = NODE_ROOT / "disk-fault.json"
# Every file of the broker's directory but its replica board (shared memory its replicas and
# broker map: a page of it that cannot be read would be a SIGBUS in the broker itself).
DISK_FAULT_PATHS = r"^/broker-\d+/(?!replica-board$)"
BROKER_RESOURCE = "rayk_broker"
# Ray's GCS declares a node dead once HEALTH_CHECK_FAILURES health checks in a row failed
# (Ray's defaults: 5 checks 3 s apart, each failing at a 10 s timeout or at once on a
# broken connection: 15-65 s after a node is cut off, depending on how its connection
# fails). Here each check fails within 3 s and 20 in a row are needed, so a node is
# declared dead ~60-120 s after it is cut off, every time: the scenarios of a cut shorter
# than that test rayk's own failure detection, which fences a silent broker after
# LATE_FENCE_SESSIONS session timeouts (32 s in the fault tests, 36 s with Kafka's 9 s
# sessions), and `node_declared_dead` the longer cut.
HEALTH_CHECK_FAILURES = 20
RAY_ENV = {
    "RAY_BACKEND_LOG_LEVEL": "warning",
    # `ray start --head` turns token authentication on unless told not to, and a node
    # joining without the token is refused: these clusters live inside namespaces nothing
    # else reaches.
    "RAY_AUTH_MODE": "disabled",
    "RAY_health_check_period_ms": "3000",
    "RAY_health_check_timeout_ms": "3000",
    "RAY_health_check_failure_threshold": str(HEALTH_CHECK_FAILURES),
}
# Extra environment of some nodes' Ray processes, {node: {name: value}} in JSON (`run`'s
# `node_env`): inherited by `main`, applied by `start_node` (fake_clock.py's libfaketime).
NODE_ENV_VAR = "RAYK_NETNS_NODE_ENV"
_started_s = time.monotonic()


def run(target: str, *args: str, timeout_s: float, node_env: dict[str, dict[str, str]] | None = None,
        failing_disk: bool = False) -> str:
    """Runs `target` ("module:function") with `args` as the driver of a netns cluster of
    its own (see the module docstring); its output. `node_env`: more environment for the
    Ray processes of some nodes ({node: {name: value}}); `failing_disk`: FAILING_DISK_NODE's
    disk through failing_fs.py (needs /dev/fuse and libfuse2). Needs root and TOOLS (tests
    skip without them: own_namespaces.skip_unless_root_with(*TOOLS))."""
    os.environ[NODE_ENV_VAR] = json.dumps(node_env or {})
    os.environ[FAILING_DISK_VAR] = "1" if failing_disk else ""
    try:
        return own_namespaces.run_module("tests.faults.netns_cluster", target, *args, timeout_s=timeout_s)
    finally:
        del os.environ[NODE_ENV_VAR], os.environ[FAILING_DISK_VAR]


def run_scenario(target: str, *args: str, timeout_s: float, node_env: dict[str, dict[str, str]] | None = None,
                 failing_disk: bool = False) -> str:
    """A test's call of `run`: skips without root or TOOLS (or /dev/fuse for `failing_disk`),
    prints the scenario's FAULT and MEASURED lines (its figures), returns its output."""
    own_namespaces.skip_unless_root_with(*TOOLS)
    if failing_disk and not os.path.exists("/dev/fuse"):
        import pytest

        pytest.skip("needs /dev/fuse for a disk that fails on demand (tests/faults/failing_fs.py)")
    output = run(target, *args, timeout_s=timeout_s, node_env=node_env, failing_disk=failing_disk)
    print("\n".join(line for line in output.splitlines() if line.startswith(("MEASURED", "FAULT"))))
    return output


def log(message: str) -> None:
    """A step of a scenario, with the seconds since its namespace started."""
    print(f"{STEP_PREFIX}{time.monotonic() - _started_s:6.1f} s] {message}", flush=True)


def sh(*argv: str, check: bool = True, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True, timeout=timeout_s)


def in_node(node: str, *argv: str, check: bool = True, **popen: Any) -> subprocess.CompletedProcess:
    return sh("ip", "netns", "exec", node, *argv, check=check, **popen)


# ---------------------------------------------------------------------- the network


def _make_network() -> None:
    """The bridge in the hub namespace and a node namespace per node, each with a veth to
    the bridge and its address; /run/netns and /tmp/ray on tmpfs of this mount namespace."""
    assert os.getpid() == 1, "makes namespaces and mounts: only as PID 1 of a namespace of its own (run)"
    for path in ("/run/netns", "/tmp/ray", str(NODE_ROOT)):
        Path(path).mkdir(parents=True, exist_ok=True)
        sh("mount", "-t", "tmpfs", "tmpfs", path)
    sh("ip", "link", "set", "lo", "up")
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "link", "set", BRIDGE, "up")
    for i, (node, address) in enumerate(ADDRESSES.items()):
        sh("ip", "netns", "add", node)
        sh("ip", "link", "add", f"rk-v{i}", "type", "veth", "peer", "name", "eth0", "netns", node)
        sh("ip", "link", "set", f"rk-v{i}", "master", BRIDGE, "up")
        sh("ip", "-n", node, "addr", "add", f"{address}/24", "dev", "eth0")
        sh("ip", "-n", node, "link", "set", "eth0", "up")
        sh("ip", "-n", node, "link", "set", "lo", "up")
        (NODE_ROOT / node).mkdir()
        sh("mount", "-t", "tmpfs", "-o", f"size={NODE_DISK_BYTES}", "tmpfs", str(NODE_ROOT / node))
    DATA_DIR.mkdir()
    log(f"network: {len(ADDRESSES)} namespaces on bridge {BRIDGE}")


def _ray_start_argv(node: str) -> list[str]:
    ray_command = str(Path(sys.executable).parent / "ray")
    common = [f"--node-ip-address={ADDRESSES[node]}", "--disable-usage-stats"]
    if node == HEAD:
        return [ray_command, "start", "--head", f"--port={GCS_PORT}", "--num-cpus=1", "--include-dashboard=false",
                *common]  # fmt: skip
    address = f"--address={ADDRESSES[HEAD]}:{GCS_PORT}"
    if node == CLIENT:
        return [ray_command, "start", address, "--num-cpus=0", *common]
    return [ray_command, "start", address, "--num-cpus=1", f"--resources={json.dumps({BROKER_RESOURCE: 1})}", *common]


def _failing_disk_of(node: str) -> Path:
    return NODE_ROOT / f"{node}-failing"


def _mount_failing_disk(node: str, timeout_s: float = 30) -> None:
    """`node`'s disk seen through failing_fs.py, at _failing_disk_of(node), served by a
    process of the hub namespace (it goes with the namespace)."""
    mountpoint = _failing_disk_of(node)
    mountpoint.mkdir()
    with Path(f"/tmp/ray/failing-fs-{node}.log").open("a") as out:
        subprocess.Popen([sys.executable, "-m", "tests.faults.failing_fs", str(NODE_ROOT / node), str(mountpoint),
                          str(DISK_FAULT_CONTROL)], stdout=out, stderr=subprocess.STDOUT, cwd=own_namespaces.REPO)  # fmt: skip
    wait_until(lambda: os.path.ismount(mountpoint), timeout_s, f"the failing disk of {node} mounted")


def fail_disk(ops: tuple[str, ...] = ("read", "write", "fsync")) -> None:
    """FAILING_DISK_NODE's disk fails `ops` ("read", "write", "fsync") with EIO from now on,
    on every file of the broker's directory (DISK_FAULT_PATHS); none: it works again."""
    from tests.faults.failing_fs import CONTROL_CHECK_INTERVAL_S, set_fault

    set_fault(DISK_FAULT_CONTROL, ops, DISK_FAULT_PATHS)
    time.sleep(2 * CONTROL_CHECK_INTERVAL_S)  # "from now on": the file system has read it by then


def start_node(node: str, timeout_s: float = 180) -> None:
    """Starts Ray on `node`, in its namespace, with its own directory as DATA_DIR. Its output
    goes to a file, not a pipe: the processes `ray start` leaves running would hold a pipe
    open, and reading it to its end would wait for them."""
    disk = _failing_disk_of(node) if os.path.ismount(_failing_disk_of(node)) else NODE_ROOT / node
    script = f'mount --bind "{disk}" "{DATA_DIR}" && exec "$@"'
    output = Path(f"/tmp/ray/start-{node}.log")
    env = {**os.environ, **json.loads(os.environ.get(NODE_ENV_VAR, "{}")).get(node, {})}
    with output.open("a") as out:
        try:
            started = subprocess.run(["ip", "netns", "exec", node, "sh", "-c", script, "sh", *_ray_start_argv(node)],
                                     stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s, env=env)  # fmt: skip
            failure = "" if started.returncode == 0 else f"exit status {started.returncode}"
        except subprocess.TimeoutExpired:
            failure = f"timed out after {timeout_s} s"
    if failure:
        raise AssertionError(f"ray start on {node} failed ({failure}):\n{output.read_text()[-4000:]}")


def main(argv: list[str]) -> None:
    """`python -m tests.faults.netns_cluster module:function [args...]`, as `run` starts it:
    the network, the Ray nodes, then the scenario as a driver in rk-client."""
    os.environ.update(RAY_ENV)  # the nodes', and the driver's
    _make_network()
    if os.environ.get(FAILING_DISK_VAR):
        _mount_failing_disk(FAILING_DISK_NODE)
        log(f"{FAILING_DISK_NODE}'s disk through failing_fs.py")
    for node in ADDRESSES:
        start_node(node)
        log(f"Ray started on {node} ({ADDRESSES[node]})")
    driver = subprocess.run(["ip", "netns", "exec", CLIENT, sys.executable, "-m", "tests.faults.netns_cluster",
                             "--drive", *argv], cwd=own_namespaces.REPO)  # fmt: skip
    sys.exit(driver.returncode)


def drive(argv: list[str]) -> None:
    """The driver, in rk-client: joins Ray through the client node's raylet and calls the scenario."""
    import ray

    module, function = argv[0].split(":")
    ray.init(address=f"{ADDRESSES[HEAD]}:{GCS_PORT}", _node_ip_address=ADDRESSES[CLIENT], namespace="rayk",
             logging_level="ERROR", log_to_driver=False)  # fmt: skip
    getattr(importlib.import_module(module), function)(*argv[1:])


# ---------------------------------------------------------------------- for scenarios


def node_ids() -> dict[str, str]:
    """Namespace name -> Ray node id of the alive nodes."""
    import ray

    by_ip = {address: node for node, address in ADDRESSES.items()}
    return {by_ip[n["NodeManagerAddress"]]: n["NodeID"] for n in ray.nodes() if n["Alive"]}


def start_rayk(namespace: str, brokers: int = 3, config: dict | None = None) -> Any:
    """rayk on the broker nodes, its Controller on the head (started by a task there, which
    `rayk.start` pins it to); the driver connects to it."""
    import ray

    import rayk
    from rayk.server.broker_placement import pinned

    @ray.remote(num_cpus=0)
    def start_on_head(data_dir: str, namespace: str, brokers: int, config: dict) -> None:
        rayk.start(brokers=brokers, data_dir=data_dir, config=config, namespace=namespace,
                   node_resource=BROKER_RESOURCE)  # fmt: skip

    head = node_ids()[HEAD]
    ray.get(start_on_head.options(scheduling_strategy=pinned(head)).remote(str(DATA_DIR), namespace, brokers,
                                                                           config or {}))  # fmt: skip
    return rayk.connect(namespace)


def broker_node_of(cluster: Any, broker_id: int) -> str:
    """The namespace of the node running broker `broker_id`."""
    node_id = next(b["node_id"] for b in cluster.brokers() if b["broker_id"] == broker_id)
    return next(name for name, nid in node_ids().items() if nid == node_id)


def rayk_under_traffic(namespace: str) -> tuple[Any, Any]:
    """rayk (start_rayk), the fault tests' topic (RF=3, min.insync.replicas=2) and their
    producer (harness.Traffic) with 1,000 records acknowledged."""
    c = start_rayk(namespace, config=CONFIG)
    c.create_topic(TOPIC, num_partitions=PARTITIONS, replication_factor=3, config={"min.insync.replicas": "2"})
    log("rayk started, topic created")
    traffic = Traffic(c)
    run_until_acked(traffic, 1_000)
    log("1,000 records acknowledged")
    return c, traffic


class Timeline:
    """Every second, while it runs, a line of what the Controller says of each partition
    (leader, epoch, ISR) and of what the producer got acknowledged: the record of a
    scenario, printed as its steps."""

    def __init__(self, c: Any, traffic: Any) -> None:
        self._c, self._traffic = c, traffic
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            try:
                parts = self._c.describe_topic(TOPIC)
                state = " ".join(f"p{p['partition']}:L{p['leader']}e{p['leader_epoch']}isr{p['isr']}" for p in parts)
            except Exception as e:
                state = f"describe_topic failed: {type(e).__name__}"
            try:
                brokers = " ".join(f"b{b['broker_id']}:{'fenced' if b['fenced'] else 'up'}e{b['epoch']}"
                                   for b in self._c.brokers())  # fmt: skip
            except Exception as e:
                brokers = f"brokers failed: {type(e).__name__}"
            log(f"{state}; {brokers}; acknowledged {self._traffic.acked_count()}, failed {dict(self._traffic.failed)}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def leader_node(c: Any) -> tuple[int, str]:
    """The leader of partition 0 of the fault tests' topic, and its node."""
    leader = c.describe_topic(TOPIC)[0]["leader"]
    return leader, broker_node_of(c, leader)


def wait_whole(c: Any, bound_s: float, since: str) -> float:
    """Waits until every partition is led with its full ISR (harness.healthy); the seconds
    it took. On a timeout, prints the Controller's and the brokers' logs, then fails."""
    started = time.monotonic()
    try:
        wait_until(lambda: healthy(c), bound_s, f"every partition led, with its full ISR, {since}")
    except AssertionError:
        print(actor_logs(), flush=True)
        raise
    return time.monotonic() - started


def longest_ack_gap_s(traffic: Traffic, since: float, until: float) -> float:
    """The longest time, on any partition, between acknowledgements in [since, until]."""
    with traffic._lock:
        times = {p: [since, until] for p in range(traffic.partitions)}
        for value, at in traffic.acked_at.items():
            if since <= at <= until:
                times[traffic.acked[value][0]].append(at)
    return max(max(b - a for a, b in zip(sorted(ts), sorted(ts)[1:])) for ts in times.values())


def fenced(c: Any, broker_id: int) -> bool:
    return next(b for b in c.brokers() if b["broker_id"] == broker_id)["fenced"]


@dataclass
class Network:
    """The faults of the network, by node: nftables rules in a node's namespace (table
    `inet rayk_fault`), latency through delay_link.py."""

    delays: dict[str, subprocess.Popen] = field(default_factory=dict)  # "node->peer": its delay_link process

    def cut(self, node: str, peers: list[str], *, inbound: bool = True, outbound: bool = True) -> None:
        """Drops `node`'s packets from (inbound) and to (outbound) `peers`, silently, as a
        failed link does; replaces any cut of `node` in place."""
        addresses = ", ".join(ADDRESSES[p] for p in peers)
        drop_in = f"ip saddr {{ {addresses} }} drop" if inbound else ""
        drop_out = f"ip daddr {{ {addresses} }} drop" if outbound else ""
        rules = f"""table inet rayk_fault {{
          chain input {{
            type filter hook input priority 0; policy accept;
            {drop_in}
          }}
          chain output {{
            type filter hook output priority 0; policy accept;
            {drop_out}
          }}
        }}"""
        self.heal(node)
        subprocess.run(["ip", "netns", "exec", node, "nft", "-f", "-"], input=rules, text=True, check=True)

    def isolate(self, node: str) -> None:
        """`node` cut from every other node, Ray's head included."""
        self.cut(node, [other for other in ADDRESSES if other != node])

    def heal(self, node: str) -> None:
        in_node(node, "nft", "delete", "table", "inet", "rayk_fault", check=False)

    def heal_all(self) -> None:
        for node in ADDRESSES:
            self.heal(node)
        for process in self.delays.values():
            process.terminate()
            process.wait(10)
        self.delays.clear()

    def delay(self, node: str, peer: str, delay_ms: int) -> None:
        """`node`'s packets to `peer` arrive `delay_ms` later (delay_link.py in `node`'s namespace)."""
        process = subprocess.Popen(
            ["ip", "netns", "exec", node, sys.executable, "-m", "tests.faults.delay_link", ADDRESSES[node],
             ADDRESSES[peer], str(delay_ms)], cwd=own_namespaces.REPO, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("ready"), f"delay_link did not start: {line!r}"
        self.delays[f"{node}->{peer}"] = process


def actor_logs(class_names: tuple[str, ...] = ("Controller", "ReplicaManager"), tail_chars: int = 6000) -> str:
    """The end of the stderr log of each actor of `class_names` (for a scenario's failure
    message): where the Controller and the brokers say what they decided."""
    from ray._private.state import actors as actor_table

    out = []
    for info in actor_table().values():
        if info["ActorClassName"] in class_names and info["Pid"]:
            for path in Path("/tmp/ray/session_latest/logs").glob(f"worker-*-{info['Pid']}.err"):
                out.append(f"== {info['ActorClassName']} pid {info['Pid']} ({info['State']})\n{path.read_text()[-tail_chars:]}")
    return "\n".join(out)


def disk_used_bytes(node: str) -> int:
    stat = os.statvfs(NODE_ROOT / node)
    return (stat.f_blocks - stat.f_bfree) * stat.f_frsize


def resize_disk(node: str, size_bytes: int) -> None:
    """Sets the size of `node`'s disk (its tmpfs): below what it holds, every write that
    needs a new page fails with ENOSPC until it is made larger again."""
    sh("mount", "-o", f"remount,size={size_bytes}", str(NODE_ROOT / node))


def _raylet_running(node: str) -> bool:
    """Whether a raylet of `node` (by its --node_ip_address) is still running (read from /proc)."""
    needle = f"--node_ip_address={ADDRESSES[node]}".encode()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes()
        except OSError:
            continue  # it ended meanwhile
        if b"raylet" in argv.split(b"\0", 1)[0] and needle in argv:
            return True
    return False


def restart_node(node: str, timeout_s: float = 120) -> None:
    """Starts Ray on `node` again once its raylet ended (Ray declared the node dead while it
    was cut off: the raylet exits on reaching the GCS again), as its supervisor would;
    returns when the new node is alive."""
    wait_until(lambda: not _raylet_running(node), timeout_s, f"the raylet of {node}, declared dead, to end")
    start_node(node)
    wait_until(lambda: node in node_ids(), timeout_s, f"{node} alive again")


if __name__ == "__main__":
    from tests.faults.netns_cluster import drive as imported_drive, main as imported_main  # one module, one clock

    if sys.argv[1] == "--drive":
        imported_drive(sys.argv[2:])
    else:
        imported_main(sys.argv[1:])
