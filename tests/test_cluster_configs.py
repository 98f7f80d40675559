"""The `ray up` configs in clusters/: both validate, and local.yaml launches rayk for real.

The real launch runs `ray up -y` against an sshd on 127.0.0.1 with a throwaway key, produces
and consumes through `ray exec`, then `ray down -y`. `ray down` runs a bare `ray stop` on the
head, which stops every Ray process it can see; so the sshd, and everything started through
it, runs in a PID namespace of its own (`unshare --pid --mount-proc`): that `ray stop` sees
only the test cluster's processes. Ending the namespace's first process ends them all.

The node's Python comes with rayk's dependencies already, as a cluster's machine image
would: its ~/rayk-venv sees this environment's site-packages (as tests/test_packaging.py's
fresh venv does), so `setup_commands` run as written but their `pip install -e ~/rayk` finds
Ray, pyarrow and the rest installed and builds only rayk. Installing them all into an empty
venv took ~30 s of the test, and test_packaging already checks what pip would install.

Needs root (for the namespace), sshd, rsync and nc; `.ci/run` installs the last three.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import kafka
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from tests import own_namespaces

REPO = Path(__file__).resolve().parent.parent
CLUSTERS = REPO / "clusters"
VENV_BIN = Path(sys.executable).parent
RAY = str(VENV_BIN / "ray")
GCS_PORT = 6390  # as clusters/local.yaml starts Ray


@pytest.mark.parametrize("name", ["local.yaml", "aws.yaml", "aws-autoscaling.yaml"])
def test_cluster_config_passes_rays_validation(name):
    config = yaml.safe_load((CLUSTERS / name).read_text())
    validate_config(prepare_config(config))
    assert ".gitignore" in config["rsync_filter"], "the checkout's .venv must not be copied to nodes"
    assert not any(
        "ray stop" in command
        for key in ("setup_commands", "head_start_ray_commands", "worker_start_ray_commands")
        for command in config.get(key, [])
    )
    starts = [shlex.split(c) for key in ("head_start_ray_commands", "worker_start_ray_commands") for c in config[key]
              if "ray start" in c]  # fmt: skip
    assert len(starts) == 2, starts
    for words in starts:  # the brokers at a server's CPU priority (rayk/ray_settings.py): in `ray start`'s environment
        ray = next(i for i, word in enumerate(words) if word.endswith("/bin/ray"))
        assert words[ray + 1] == "start" and "RAY_worker_niceness=0" in words[:ray], words
        assert all("=" in word and not word.startswith("-") for word in words[:ray]), words


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.2)


def _pip_cache_dir() -> str:
    out = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""


def _node_venv_with_this_environment(home: Path, python_dir: Path) -> None:
    """~/rayk-venv on the node: a venv of the node's Python 3.11 whose site-packages also
    hold this environment's (a .pth line), with Ray's `ray` command, which
    clusters/local.yaml's start commands run from it. `setup_commands` keep it (`test -x`)."""
    venv = home / "rayk-venv"
    subprocess.run([str(python_dir / "python3.11"), "-m", "venv", str(venv)], check=True, timeout=120)
    (site_packages,) = (venv / "lib").glob("python3.*/site-packages")
    (site_packages / "this_environment.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    ray_command = venv / "bin" / "ray"
    ray_command.write_text(
        f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom ray.scripts.scripts import main\nsys.exit(main())\n"
    )
    ray_command.chmod(0o755)


@pytest.fixture
def sshd_in_own_pid_namespace(tmp_path):
    """An sshd on 127.0.0.1:<free port> accepting a throwaway key for this user, whose
    sessions get HOME=<tmp>/home (a node's home) and a PATH with this Python 3.11."""
    own_namespaces.skip_unless_root_with("rsync", "nc", "ssh", "ssh-keygen")
    if not Path("/usr/sbin/sshd").exists():
        pytest.skip("needs sshd (`.ci/run` installs it)")
    if _port_open(GCS_PORT):
        pytest.fail(f"port {GCS_PORT} is taken; clusters/local.yaml starts Ray's GCS there")
    home = tmp_path / "home"
    home.mkdir()
    python_dir = Path(os.path.realpath(sys.executable)).parent
    (home / ".bashrc").write_text(f"export PATH={python_dir}:$PATH\n")  # the node's Python 3.11
    _node_venv_with_this_environment(home, python_dir)
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / key)], check=True)
    shutil.copy(tmp_path / "client_key.pub", tmp_path / "authorized_keys")
    port = _free_port()
    environment = [f"HOME={home}"]
    if cache := _pip_cache_dir():
        environment.append(f"PIP_CACHE_DIR={cache}")  # setup_commands install from the warm cache
    (tmp_path / "sshd_config").write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {tmp_path / 'host_key'}",
                f"PidFile {tmp_path / 'sshd.pid'}",
                f"AuthorizedKeysFile {tmp_path / 'authorized_keys'}",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "MaxStartups 100",
                f"SetEnv {' '.join(environment)}",
                "",
            ]
        )
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    sshd = own_namespaces.start(
        ["/usr/sbin/sshd", "-D", "-e", "-f", str(tmp_path / "sshd_config")],
        net=False, stdout=subprocess.DEVNULL, stderr=open(tmp_path / "sshd.log", "wb"),
    )
    try:
        _wait_for(lambda: _port_open(port), 10, "sshd to listen")
        yield {"port": port, "key": tmp_path / "client_key", "home": home, "dir": tmp_path}
    finally:
        # sshd is the namespace's first process: when it ends, the kernel ends the rest
        # (Ray's GCS, raylet, brokers) too, whatever `ray down` left.
        own_namespaces.end(sshd)


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def _ray_cli(*args: str, cwd: Path, timeout_s: float) -> str:
    result = subprocess.run(
        [RAY, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
        env={**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"},
    )
    assert result.returncode == 0, f"ray {args[0]} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return ANSI_ESCAPE.sub("", result.stdout)  # Ray's CLI colours its own lines, and may leave a reset before ours


@pytest.mark.slow
def test_ray_up_local_yaml_runs_rayk_and_ray_down_stops_it(sshd_in_own_pid_namespace, tmp_path):
    sshd = sshd_in_own_pid_namespace
    config = yaml.safe_load((CLUSTERS / "local.yaml").read_text())
    config["cluster_name"] = f"rayk-ci-{os.getpid()}"
    config["auth"] = {
        "ssh_user": "root",
        "ssh_private_key": str(sshd["key"]),
        "ssh_proxy_command": f"nc 127.0.0.1 {sshd['port']}",
    }
    # The brokers' Kafka listeners on loopback, on free ports (tests bind to 127.0.0.1 only).
    config["head_start_ray_commands"] = [
        c.replace("--data-dir ~/rayk-data", "--data-dir ~/rayk-data --config listeners=PLAINTEXT://127.0.0.1:0")
        for c in config["head_start_ray_commands"]
    ]
    assert any("127.0.0.1:0" in c for c in config["head_start_ray_commands"])
    config_path = tmp_path / "cluster.yaml"
    config_path.write_text(yaml.safe_dump(config))
    up = ["up", "-y", "--no-config-cache", str(config_path)]
    try:
        _ray_cli(*up, cwd=REPO, timeout_s=600)
        home = sshd["home"]
        assert (home / "rayk" / "pyproject.toml").exists(), "the checkout was not copied"
        assert not (home / "rayk" / ".venv").exists(), "the checkout's .venv was copied"

        def rayk(command: str) -> str:
            return _ray_cli("exec", str(config_path), command, cwd=REPO, timeout_s=180)

        # `rayk start` runs in the background on the head; wait until the broker serves.
        _wait_for(lambda: _live_brokers(_status_or_empty(config_path)) >= 1, 180, "rayk start on the head")
        # One `ray exec` for the commands: each exec is an ssh session and a Python start.
        out = rayk(
            "rayk topics create clicks --partitions 2 --replication-factor 1 --address 127.0.0.1:6390"
            " && printf 'a\\nb\\nc\\n' | rayk produce clicks --address 127.0.0.1:6390"
            " && rayk consume clicks --from-beginning --max-messages 3 --timeout-ms 30000 --address 127.0.0.1:6390"
            " && cat /proc/[0-9]*/stat | awk '$2 ~ /^[(]ray::/ {print $19, $2}'"  # nice value, (process name)
            " && rayk status --address 127.0.0.1:6390"
        )
        assert {"a", "b", "c"} <= set(out.splitlines()), out
        # Ray's workers (the brokers, their replicas) at the priority of the processes that
        # started them (sshd's: this test's), as the config's `ray start` asks, not 15 above.
        workers = [m.groups() for line in out.splitlines() if (m := re.fullmatch(r"(-?\d+) [(](ray::[^)]*)[)]", line))]
        assert any(name.startswith("ray::ReplicaMan") for _, name in workers), out
        assert {int(niceness) for niceness, _ in workers} == {os.getpriority(os.PRIO_PROCESS, 0)}, out
        # A Kafka client on this machine reads them through the broker's listener.
        bootstrap = next(line.split("=", 1)[1] for line in out.splitlines() if line.startswith("bootstrap.servers="))
        consumer = kafka.KafkaConsumer("clicks", bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                       consumer_timeout_ms=20000)
        assert sorted(r.value for _, r in zip(range(3), consumer)) == [b"a", b"b", b"c"]
        consumer.close()
        assert list((home / "rayk-data").iterdir()), "the broker's log directory is not on the node's disk"
    finally:
        _ray_cli("down", "-y", str(config_path), cwd=REPO, timeout_s=300)
    _wait_for(lambda: not _port_open(GCS_PORT), 60, "ray down to stop the head's Ray")


def _live_brokers(status: str) -> int:
    """The brokers `rayk status` lists as not fenced: its brokers table's rows (broker,
    node, address, kafka listeners, fenced, connected, leaving) until the first blank line."""
    lines = status.splitlines()
    header = next((i for i, line in enumerate(lines) if line.split()[:2] == ["broker", "node"]), None)
    if header is None:
        return 0
    rows = [row.split() for row in itertools.takewhile(str.strip, lines[header + 1:])]
    return sum(1 for row in rows if len(row) == 7 and row[-3] == "no")  # ("kafka listeners" is one column)


def _status_or_empty(config_path: Path) -> str:
    result = subprocess.run(
        [RAY, "exec", str(config_path), "rayk status --address 127.0.0.1:6390"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}"},
    )
    return result.stdout if result.returncode == 0 else ""
