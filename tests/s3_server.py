"""A real S3 API server on 127.0.0.1 for the tiered storage tests: gofakes3 (an S3-compatible
server in Go) with its bolt backend, so its objects outlive a restart.

Built from its Go module by `go install` into ~/.cache/rayk-s3 (RAYK_S3_CACHE), never into
git, the first time a test asks (about 90 s here); without a Go toolchain the tests that
need it are skipped, saying so. SeaweedFS, the usual choice, cannot be built this way: its
module's go.mod has replace directives, which `go install module@version` refuses.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

GOFAKES3_MODULE = "github.com/johannesboyne/gofakes3/cmd/gofakes3"
GOFAKES3_VERSION = "v1.2.0"
CACHE_DIR = Path(os.environ.get("RAYK_S3_CACHE", Path.home() / ".cache" / "rayk-s3"))
BUCKET = "rayk"
START_TIMEOUT_S = 30


def gofakes3_binary() -> Path:
    """The server's binary, built once per version into the cache."""
    binary = CACHE_DIR / "bin" / f"gofakes3-{GOFAKES3_VERSION}"
    if binary.exists():
        return binary
    go = shutil.which("go")
    if go is None:
        pytest.skip("the S3 server is built from its Go module: this machine has no Go toolchain")
    build_dir = CACHE_DIR / "build"
    build_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([go, "install", f"{GOFAKES3_MODULE}@{GOFAKES3_VERSION}"], check=True,
                   env={**os.environ, "GOBIN": str(build_dir)}, timeout=900)  # fmt: skip
    binary.parent.mkdir(parents=True, exist_ok=True)  # a fresh machine has no cache yet
    (build_dir / "gofakes3").rename(binary)
    return binary


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """One gofakes3 process serving bucket BUCKET on 127.0.0.1:`port`, its objects in `data_dir`."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self._binary = gofakes3_binary()
        self._process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        assert self._process is None, "started already"
        self._process = subprocess.Popen(
            [str(self._binary), "-host", self.endpoint, "-backend", "bolt", "-bolt.db", str(self.data_dir / "s3.db"),
             "-initialbucket", BUCKET, "-quiet"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline or self._process.poll() is not None:
                    raise RuntimeError(f"the S3 server did not start on {self.endpoint}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def settings(self, prefix: str) -> dict[str, object]:
        """The broker settings of a store at s3://BUCKET/`prefix` on this server."""
        return {
            "remote.log.storage.system.enable": True,
            "remote.log.storage.uri": f"s3://{BUCKET}/{prefix}",
            "remote.log.storage.s3.endpoint": self.endpoint,
            "remote.log.storage.s3.scheme": "http",
            "remote.log.storage.s3.region": "us-east-1",
            "remote.log.storage.s3.access.key": "rayk",
            "remote.log.storage.s3.secret.key": "rayk-secret",
        }
