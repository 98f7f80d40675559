"""Kafka's JVM side for the tests: the Java programs of tests/jvm (built by Maven once per
change of their sources, into ~/.cache/rayk-jvm, never into git) and Kafka's own tools from
the same classpath (kafka-clients, kafka-streams, kafka-tools and Kafka's core jar, 4.2.1).

    jvm = build()
    events = jvm.run("rayk.jvm.ProduceCheck", bootstrap, topic, "10")   # [{"event": ...}, ...]
    member = jvm.start("rayk.jvm.GroupMember", bootstrap, topic, group, "-")
    member.wait_for("assigned")
    text = jvm.tool("org.apache.kafka.tools.TopicCommand", "--bootstrap-server", bootstrap, "--list")

A program tells the test what happened with one JSON object per stdout line (Events.java;
Kafka's VerifiableProducer and VerifiableConsumer print theirs the same way).
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODULE = Path(__file__).parent / "jvm"
CACHE_DIR = Path(os.environ.get("RAYK_JVM_CACHE", Path.home() / ".cache" / "rayk-jvm"))
# Short-lived client JVMs: a small heap, C1 only. Kafka's classes log through Log4j 2,
# which prints errors only unless RAYK_JVM_LOG4J names a configuration file (to see a
# program's client logs while debugging a test).
LOG4J_CONFIG = os.environ.get("RAYK_JVM_LOG4J")
JAVA_OPTIONS = (
    *((f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",) if LOG4J_CONFIG else ()),
    "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
)


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted([MODULE / "pom.xml", *MODULE.rglob("*.java")]):
        digest.update(str(path.relative_to(MODULE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def build() -> Jvm:
    """Compiles tests/jvm and resolves its classpath with Maven, once per version of its
    sources; concurrent runs each build into a directory of their own and the first
    rename wins."""
    home = CACHE_DIR / _sources_digest()
    if not (home / "classpath.txt").exists():
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix="partial-", dir=CACHE_DIR))
        subprocess.run(
            ["mvn", "-q", "-B", "-f", str(MODULE / "pom.xml"), f"-Drayk.jvm.build={partial / 'build'}",
             "compile", "dependency:build-classpath", f"-Dmdep.outputFile={partial / 'classpath.txt'}"],
            check=True,
        )
        try:
            partial.rename(home)
        except OSError:  # another run built the same sources first
            shutil.rmtree(partial, ignore_errors=True)
    classes = home / "build" / "classes"
    return Jvm(f"{classes}{os.pathsep}{(home / 'classpath.txt').read_text().strip()}")


@dataclass(frozen=True)
class Jvm:
    classpath: str

    def command(self, main: str, *args: str) -> list[str]:
        return ["java", *JAVA_OPTIONS, "-cp", self.classpath, main, *map(str, args)]

    def run(self, main: str, *args: Any, timeout_s: float = 120) -> list[dict]:
        """Runs a program of tests/jvm to its end; its events, or AssertionError with its
        output if it failed."""
        done = subprocess.run(self.command(main, *args), capture_output=True, text=True, timeout=timeout_s)
        assert done.returncode == 0, f"{main} exited with {done.returncode}:\n{done.stdout}\n{done.stderr}"
        return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]

    def tool(self, main: str, *args: Any, timeout_s: float = 120, check: bool = True) -> str:
        """Runs one of Kafka's command-line tools by its main class; its stdout."""
        done = subprocess.run(self.command(main, *args), capture_output=True, text=True, timeout=timeout_s)
        if check:
            assert done.returncode == 0, f"{main} {args} exited with {done.returncode}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def start(self, main: str, *args: Any) -> JavaProcess:
        return JavaProcess(subprocess.Popen(self.command(main, *args), stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))


class JavaProcess:
    """A program of tests/jvm that runs beside the test: its events as they come, commands
    on its stdin. Always stopped by the test that started it (`stop`)."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.events: list[dict] = []  # every event so far, in order
        self._new: queue.Queue[dict] = queue.Queue()
        self._stderr: list[str] = []
        self._reader = threading.Thread(target=self._read_events, daemon=True)
        self._reader.start()
        threading.Thread(target=lambda: self._stderr.extend(process.stderr), daemon=True).start()

    def _read_events(self) -> None:
        for line in self.process.stdout:
            if line.startswith("{"):
                event = json.loads(line)
                event.setdefault("event", event.get("name"))  # Kafka's Verifiable* tools say "name"
                self.events.append(event)
                self._new.put(event)

    def wait_for(self, name: str, timeout_s: float = 60, where: Callable[[dict], bool] = lambda e: True) -> dict:
        """The next event called `name` that satisfies `where`, waiting up to timeout_s."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                event = self._new.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                assert self.process.poll() is None, f"exited with {self.process.returncode}: {''.join(self._stderr)}"
                assert time.monotonic() < deadline, f"no {name!r} event in {timeout_s} s; had {self.events[-5:]}"
                continue
            if event["event"] == name and where(event):
                return event

    def send(self, command: str) -> None:
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def stop(self, command: str | None = "close", timeout_s: float = 60) -> int:
        """Sends `command` (or SIGTERM, for Kafka's tools, which read no stdin) and waits
        for the exit; kills the process if it does not come."""
        if self.process.poll() is None:
            try:
                if command is None:
                    self.process.terminate()
                else:
                    self.send(command)
                self.process.wait(timeout_s)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        self._reader.join(10)  # every event it printed is in self.events
        return self.process.returncode
