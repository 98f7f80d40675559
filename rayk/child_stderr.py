"""Start-up notices of child processes, kept off the user's terminal.

Spark's driver JVM (started by `rayk.spark.session`, through PySpark) writes to the
stderr it inherits. On every start it prints two notices that configuration cannot
silence: Spark's "Setting default log level to WARN" (a PySpark driver counts as Spark's
shell), and the INFO lines of Ray's native client, which the JVM loads for RayDP ("GcsClient
has no Cluster ID set", written before it reads RAY_BACKEND_LOG_LEVEL). A newcomer reads
them as trouble. `filtered_stderr` hands processes started inside it a pipe for stderr
instead, and a thread copies every line but those notices to the real stderr, for as long
as any of them writes there: a warning or an error the JVM prints later still shows.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

NOTICES = (
    b'Setting default log level to "',
    b"To adjust logging level use sc.setLogLevel(newLevel).",
    b"GcsClient has no Cluster ID set, and won't fetch from GCS.",
    b"Set ray log level from environment variable RAY_BACKEND_LOG_LEVEL",
)
STDERR_FD = 2


def is_notice(line: bytes) -> bool:
    return any(notice in line for notice in NOTICES)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _copy_lines(source_fd: int, target_fd: int) -> None:
    """Copies every line but the notices until the last writer closes the pipe. If the
    terminal stops taking writes, the rest is read and dropped, so no writer blocks."""
    try:
        with os.fdopen(source_fd, "rb", buffering=0) as source:
            pending = b""
            writable = True
            while chunk := source.read(65536):
                *lines, pending = (pending + chunk).split(b"\n")
                kept = b"".join(line + b"\n" for line in lines if not is_notice(line))
                if kept and writable:
                    try:
                        _write_all(target_fd, kept)
                    except OSError:
                        writable = False
            if pending and writable and not is_notice(pending):
                with contextlib.suppress(OSError):
                    _write_all(target_fd, pending)
    finally:
        os.close(target_fd)


def _flush_python_stderr() -> None:
    with contextlib.suppress(Exception):  # None (pythonw), closed, or a broken pipe
        sys.stderr.flush()


@contextlib.contextmanager
def filtered_stderr() -> Iterator[None]:
    """Processes started in this block write their stderr through the filter (this process
    writes to it too, while the block lasts). A no-op where stderr is not a file
    descriptor this process can replace."""
    _flush_python_stderr()
    try:
        terminal_fd = os.dup(STDERR_FD)
    except OSError:
        terminal_fd = None
    if terminal_fd is None:
        yield
        return
    try:
        read_fd, write_fd = os.pipe()
    except OSError:
        os.close(terminal_fd)
        yield
        return
    try:
        threading.Thread(target=_copy_lines, args=(read_fd, terminal_fd), name="child-stderr", daemon=True).start()
    except BaseException:
        for fd in (read_fd, write_fd, terminal_fd):
            os.close(fd)
        raise
    os.dup2(write_fd, STDERR_FD)
    os.close(write_fd)
    try:
        yield
    finally:
        _flush_python_stderr()
        # This process writes to its own stderr again; the children keep their end of the
        # pipe, and the thread ends (closing its copy of stderr) when the last one closes it.
        os.dup2(terminal_fd, STDERR_FD)
