"""A disk that fails on demand: a FUSE file system passing every call through to a
backing directory, except those a fault names, which fail with EIO (the errors of a
failing device, the disk faults of tests/faults/test_disk_faults.py).

    python -m tests.faults.failing_fs BACKING MOUNTPOINT CONTROL

mounts BACKING at MOUNTPOINT (in the foreground, until unmounted or killed) and reads
the fault from the CONTROL file, a JSON object written by `set_fault`:

    {"ops": ["read", "write", "fsync"], "paths": "<regex>"}

Each call of those operations (`write` also covers creating, truncating, renaming and
deleting files: a device failing writes fails them all) on a path that the regex
matches (`re.search`, on the path inside the file system, "/broker-1/t-0/...") fails
with EIO; `{}` or no file: no fault. The file is read again when its mtime changes.

Writes and fsyncs always reach this process; reads that the page cache holds do not,
as on a real device. The broker's probe file (rayk/server/log_dir_health.py) is opened
with `direct_io`, so its read always comes here; other files keep the page cache, as
rayk's mmaps of them need it (libfuse2 cannot allow an mmap of a `direct_io` file:
ENODEV).
"""

from __future__ import annotations

import errno
import json
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

import mfusepy

WRITE_OPS = ("write", "truncate", "create", "mkdir", "unlink", "rmdir", "rename", "utimens", "chmod", "link")
DIRECT_IO_SUFFIXES = (".probe",)
CONTROL_CHECK_INTERVAL_S = 0.05


def set_fault(control: str | Path, ops: list[str] | tuple[str, ...] = (), paths: str = "") -> None:
    """Writes the fault a running file system reads (atomically): `ops` among "read",
    "write", "fsync" fail with EIO on paths matching `paths`; no `ops`: none."""
    control = Path(control)
    temporary = control.with_suffix(".tmp")
    temporary.write_text(json.dumps({"ops": list(ops), "paths": paths} if ops else {}))
    os.replace(temporary, control)
    # mtime resolution is coarse on some file systems: move it on explicitly.
    now_ns = time.time_ns()
    os.utime(control, ns=(now_ns, now_ns))


class _Fault:
    """The fault the CONTROL file names, re-read when the file changes."""

    def __init__(self, control: str) -> None:
        self._control = control
        self._lock = threading.Lock()
        self._checked_s = 0.0
        self._mtime_ns = -1
        self._ops: frozenset[str] = frozenset()
        self._paths: re.Pattern | None = None

    def fails(self, op: str, path: str) -> bool:
        self._refresh()
        return op in self._ops and self._paths is not None and self._paths.search(path) is not None

    def _refresh(self) -> None:
        now_s = time.monotonic()
        with self._lock:
            if now_s - self._checked_s < CONTROL_CHECK_INTERVAL_S:
                return
            self._checked_s = now_s
            try:
                mtime_ns = os.stat(self._control).st_mtime_ns
            except FileNotFoundError:
                self._ops, self._paths, self._mtime_ns = frozenset(), None, -1
                return
            if mtime_ns == self._mtime_ns:
                return
            self._mtime_ns = mtime_ns
            spec = json.loads(Path(self._control).read_text() or "{}")
            self._ops = frozenset(spec.get("ops", ()))
            self._paths = re.compile(spec["paths"]) if spec.get("ops") else None


def _eio() -> mfusepy.FuseOSError:
    return mfusepy.FuseOSError(errno.EIO)


def _passing_errors(call: Any) -> Any:
    """The backing file system's OSError, as FUSE's error of the same errno."""

    def wrapper(*args: Any) -> Any:
        try:
            return call(*args)
        except OSError as e:
            if isinstance(e, mfusepy.FuseOSError):
                raise
            raise mfusepy.FuseOSError(e.errno or errno.EIO) from e

    return wrapper


class FailingFs(mfusepy.Operations):
    """Passes every call to BACKING, failing those the fault names with EIO."""

    use_ns = True

    def __init__(self, backing: str, fault: _Fault) -> None:
        self._backing = backing
        self._fault = fault
        for name in ("access", "chmod", "chown", "getattr", "mkdir", "readdir", "readlink", "rename", "rmdir",
                     "statfs", "symlink", "truncate", "unlink", "utimens", "link", "create", "open", "read",
                     "write", "fsync", "release", "flush"):  # fmt: skip
            setattr(self, name, _passing_errors(getattr(self, name)))

    def _real(self, path: str) -> str:
        return self._backing + path

    def _check(self, op: str, path: str) -> None:
        if self._fault.fails("write" if op in WRITE_OPS else op, path):
            raise _eio()

    # ---- metadata
    def access(self, path: str, amode: int) -> int:
        if not os.access(self._real(path), amode):
            raise mfusepy.FuseOSError(errno.EACCES)
        return 0

    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        st = os.lstat(self._real(path))
        keys = ("st_atime_ns", "st_ctime_ns", "st_gid", "st_mode", "st_mtime_ns", "st_nlink", "st_size", "st_uid",
                "st_blocks", "st_blksize")  # fmt: skip
        attrs = {key: getattr(st, key) for key in keys}
        for name in ("atime", "ctime", "mtime"):
            attrs[f"st_{name}"] = attrs.pop(f"st_{name}_ns")
        return attrs

    def readdir(self, path: str, fh: Any) -> list[str]:
        return [".", "..", *os.listdir(self._real(path))]

    def readlink(self, path: str) -> str:
        return os.readlink(self._real(path))

    def statfs(self, path: str) -> dict[str, Any]:
        stv = os.statvfs(self._real(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize",
                "f_namemax")  # fmt: skip
        return {key: getattr(stv, key) for key in keys}

    # ---- changes to the tree
    def chmod(self, path: str, mode: int) -> int:
        self._check("chmod", path)
        os.chmod(self._real(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._real(path), uid, gid)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        self._check("mkdir", path)
        os.mkdir(self._real(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        self._check("rmdir", path)
        os.rmdir(self._real(path))
        return 0

    def unlink(self, path: str) -> int:
        self._check("unlink", path)
        os.unlink(self._real(path))
        return 0

    def rename(self, old: str, new: str) -> int:
        self._check("rename", old)
        self._check("rename", new)
        os.rename(self._real(old), self._real(new))
        return 0

    def link(self, target: str, source: str) -> int:
        self._check("link", target)
        os.link(self._real(source), self._real(target))
        return 0

    def symlink(self, target: str, source: str) -> int:
        os.symlink(source, self._real(target))
        return 0

    def truncate(self, path: str, length: int, fh: Any = None) -> int:
        self._check("truncate", path)
        if fh is not None:
            os.ftruncate(fh.fh, length)
        else:
            os.truncate(self._real(path), length)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        self._check("utimens", path)
        os.utime(self._real(path), ns=times) if times else os.utime(self._real(path))
        return 0

    # ---- files
    def _opened(self, path: str, fi: Any, fd: int) -> int:
        fi.fh = fd
        fi.direct_io = path.endswith(DIRECT_IO_SUFFIXES)
        return 0

    def create(self, path: str, mode: int, fi: Any) -> int:
        self._check("create", path)
        return self._opened(path, fi, os.open(self._real(path), fi.flags | os.O_CREAT, mode))

    def open(self, path: str, fi: Any) -> int:
        if fi.flags & os.O_TRUNC:
            self._check("truncate", path)
        return self._opened(path, fi, os.open(self._real(path), fi.flags))

    def read(self, path: str, size: int, offset: int, fh: Any) -> bytes:
        self._check("read", path)
        return os.pread(fh.fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: Any) -> int:
        self._check("write", path)
        return os.pwrite(fh.fh, data, offset)

    def fsync(self, path: str, datasync: int, fh: Any) -> int:
        self._check("fsync", path)
        (os.fdatasync if datasync else os.fsync)(fh.fh)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: Any) -> int:
        self._check("fsync", path)
        return 0  # the backing directory's entries are as durable as its file system makes them

    def flush(self, path: str, fh: Any) -> int:
        return 0

    def release(self, path: str, fh: Any) -> int:
        os.close(fh.fh)
        return 0


def main(backing: str, mountpoint: str, control: str) -> None:
    mfusepy.FUSE(FailingFs(os.path.abspath(backing), _Fault(control)), mountpoint, raw_fi=True, foreground=True,
                 allow_other=True, nothreads=False, fsname="rayk-failing-fs")  # fmt: skip


if __name__ == "__main__":
    main(*sys.argv[1:4])
