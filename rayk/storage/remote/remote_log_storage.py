"""RemoteLogStorage: copied segments' objects on a pyarrow filesystem (Kafka's
RemoteStorageManager and, see remote_segment.py, its RemoteLogMetadataManager).

Any URI pyarrow opens: `s3://bucket/prefix` (AWS or any S3 API: `endpoint_override`,
`access_key`, `secret_key`, `region`, `scheme` from the broker's remote.log.storage.s3.*
settings), `gs://...`, `file:///path`. Every failure of the store (unreachable, slow past
its timeouts, refused) is a KafkaStorageError, retriable: the caller's copy waits for the
next pass, a read of remote data fails that one fetch; nothing local depends on it.

A copy writes the data objects, then the metadata object (the commit). A delete removes
the metadata object, then the data objects. Listing reads the metadata objects of a
partition; one that does not parse (a torn write on a filesystem without atomic puts) is
skipped, its copy is not remote. Credentials are never part of what this logs or prints.

Thread-safe (pyarrow filesystems are), and blocking: the replica calls it from a worker
thread, never on its event loop.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rayk.errors import KafkaStorageError
from rayk.storage.remote.remote_segment import METADATA_SUFFIX, RemoteSegmentMetadata, newest_per_offset

logger = logging.getLogger(__name__)

# remote.log.storage.s3.<name> -> pyarrow.fs.S3FileSystem keyword.
S3_OPTIONS = {
    "endpoint": "endpoint_override",
    "region": "region",
    "access.key": "access_key",
    "secret.key": "secret_key",
    "scheme": "scheme",
    "connect.timeout.ms": "connect_timeout",
    "request.timeout.ms": "request_timeout",
}
SECRET_OPTIONS = frozenset({"secret.key", "access.key"})
COPY_CHUNK_BYTES = 8 << 20
LOG_START_OBJECT = "log-start-offset"  # a DeleteRecords' offset, when it is below the local log


@dataclass(frozen=True)
class RemoteStorageSettings:
    """Where the brokers' remote log storage is: a pyarrow filesystem URI and, for s3://,
    the remote.log.storage.s3.* options. Picklable (Ray Data's read tasks get it); its
    repr never shows the options' values."""

    uri: str
    s3_options: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        shown = {k: ("***" if k in SECRET_OPTIONS else v) for k, v in self.s3_options.items()}
        return f"RemoteStorageSettings({self.uri!r}, s3_options={shown})"

    def open(self) -> RemoteLogStorage:
        return RemoteLogStorage(self)


class RemoteLogStorage:
    """One store's objects (see the module docstring)."""

    def __init__(self, settings: RemoteStorageSettings) -> None:
        import pyarrow.fs as pafs

        self.settings = settings
        try:
            if settings.uri.startswith("s3://"):
                # The AWS SDK's default since 2025 sends every upload with a trailing CRC in
                # aws-chunked encoding, without a Content-Length, which S3-compatible stores
                # that predate it refuse (411 MissingContentLength); checksums only where the
                # operation requires one is what AWS documents for them, and AWS takes it too.
                os.environ.setdefault("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
                kwargs: dict[str, Any] = {}
                for name, value in settings.s3_options.items():
                    if name not in S3_OPTIONS:
                        raise KafkaStorageError(f"unknown remote.log.storage.s3 option {name!r}; known: {sorted(S3_OPTIONS)}")
                    key = S3_OPTIONS[name]
                    kwargs[key] = float(value) / 1000 if name.endswith("timeout.ms") else value
                bucket_path = settings.uri[len("s3://"):]
                self._fs: Any = pafs.S3FileSystem(**kwargs)
                self._root = bucket_path.rstrip("/")
            else:
                self._fs, self._root = pafs.FileSystem.from_uri(settings.uri)
                self._root = self._root.rstrip("/")
        except KafkaStorageError:
            raise
        except Exception as e:
            raise KafkaStorageError(f"cannot open remote log storage {settings.uri}: {type(e).__name__}: {e}") from None
        self._local = isinstance(self._fs, pafs.LocalFileSystem)

    def _path(self, prefix: str, name: str = "") -> str:
        return f"{self._root}/{prefix}/{name}" if name else f"{self._root}/{prefix}"

    def _failed(self, what: str, e: BaseException) -> KafkaStorageError:
        return KafkaStorageError(f"remote log storage {self.settings.uri}: {what}: {type(e).__name__}: {e}")

    # ------------------------------------------------------------------ write

    def copy_segment(self, prefix: str, metadata: RemoteSegmentMetadata, files: Mapping[str, Path | bytes],
                     before_commit: Callable[[], bool] = lambda: True) -> RemoteSegmentMetadata | None:  # fmt: skip
        """Writes one segment's objects (`files`: kind -> a local file, or the bytes) and
        then its metadata, which makes it remote, if `before_commit()` still says so then.
        Returns the metadata with the objects' sizes, or None if not committed. A failure
        leaves it not remote (its data objects are garbage; FileNotFoundError if a local
        file went meanwhile)."""
        sizes: dict[str, int] = {}
        try:
            if self._local:
                self._fs.create_dir(self._path(prefix), recursive=True)
            for kind, source in files.items():
                if (len(source) if isinstance(source, bytes) else os.path.getsize(source)) == 0:
                    sizes[kind] = 0  # no object: an empty upload is refused by some S3 APIs; it reads as b""
                    continue
                with self._fs.open_output_stream(self._path(prefix, metadata.object_name(kind))) as out:
                    if isinstance(source, bytes):
                        out.write(source)
                        sizes[kind] = len(source)
                        continue
                    written = 0
                    with open(source, "rb") as f:
                        while chunk := f.read(COPY_CHUNK_BYTES):
                            out.write(chunk)
                            written += len(chunk)
                    sizes[kind] = written
            done = RemoteSegmentMetadata(**{**_fields(metadata), "object_bytes": sizes})
            if not before_commit():
                return None
            self._put(self._path(prefix, done.metadata_name), done.to_json())
            return done
        except (KafkaStorageError, FileNotFoundError):
            raise
        except Exception as e:
            raise self._failed(f"copying {prefix}/{metadata.name}", e) from None

    def _put(self, path: str, data: bytes) -> None:
        """One object written whole: a PUT on an object store; a rename over the target on
        a local filesystem, so a reader never sees it half written."""
        if not self._local:
            with self._fs.open_output_stream(path) as out:
                out.write(data)
            return
        tmp = path + ".tmp"
        with self._fs.open_output_stream(tmp) as out:
            out.write(data)
        self._fs.move(tmp, path)

    def delete_segment(self, prefix: str, metadata: RemoteSegmentMetadata) -> None:
        """Un-lists the segment (its metadata goes first), then deletes its objects."""
        try:
            self._fs.delete_file(self._path(prefix, metadata.metadata_name))
            for kind, size in metadata.object_bytes.items():
                if size == 0:
                    continue  # never written
                try:
                    self._fs.delete_file(self._path(prefix, metadata.object_name(kind)))
                except FileNotFoundError:
                    pass
        except FileNotFoundError:
            return  # deleted already (another leader's retention)
        except Exception as e:
            raise self._failed(f"deleting {prefix}/{metadata.name}", e) from None

    def write_log_start(self, prefix: str, offset: int) -> None:
        """Records the partition's log start offset (a DeleteRecords below what is local):
        remote records below it are no longer read, whoever leads or plans a read."""
        try:
            if self._local:
                self._fs.create_dir(self._path(prefix), recursive=True)
            self._put(self._path(prefix, LOG_START_OBJECT), str(offset).encode())
        except Exception as e:
            raise self._failed(f"writing {prefix}/{LOG_START_OBJECT}", e) from None

    def read_log_start(self, prefix: str) -> int:
        """The log start offset `write_log_start` recorded, or 0."""
        try:
            return int(self._read_all(self._path(prefix, LOG_START_OBJECT)))
        except FileNotFoundError:
            return 0
        except ValueError as e:
            raise KafkaStorageError(f"remote log storage {self.settings.uri}: {prefix}/{LOG_START_OBJECT}: {e}") from None
        except Exception as e:
            raise self._failed(f"reading {prefix}/{LOG_START_OBJECT}", e) from None

    def delete_partition(self, prefix: str) -> None:
        """Everything of a partition (its topic was deleted)."""
        try:
            self._fs.delete_dir(self._path(prefix))
        except FileNotFoundError:
            return
        except Exception as e:
            raise self._failed(f"deleting {prefix}", e) from None

    # ------------------------------------------------------------------ read

    def list_segments(self, prefix: str) -> list[RemoteSegmentMetadata]:
        """The partition's remote segments, one copy per stretch of offsets, oldest first."""
        import pyarrow.fs as pafs

        try:
            infos = self._fs.get_file_info(pafs.FileSelector(self._path(prefix), allow_not_found=True))
        except Exception as e:
            raise self._failed(f"listing {prefix}", e) from None
        found = []
        for info in infos:
            if info.type != pafs.FileType.File or not info.path.endswith(METADATA_SUFFIX):
                continue
            try:
                found.append(RemoteSegmentMetadata.from_json(self._read_all(info.path)))
            except FileNotFoundError:
                continue  # deleted since the listing
            except (ValueError, KeyError, TypeError) as e:
                logger.warning("remote log storage: skipping unreadable segment metadata %s: %s", info.path, e)
        return newest_per_offset(found)

    def read(self, prefix: str, metadata: RemoteSegmentMetadata, kind: str, position: int = 0,
             max_bytes: int | None = None) -> bytes:  # fmt: skip
        """Bytes of one of the segment's objects from `position`: up to `max_bytes`, or to its end."""
        size = metadata.object_bytes.get(kind)
        if size is None:
            return b""
        end = size if max_bytes is None else min(size, position + max_bytes)
        if position >= end:
            return b""
        try:
            with self._fs.open_input_file(self._path(prefix, metadata.object_name(kind))) as f:
                return bytes(f.read_at(end - position, position))
        except Exception as e:
            raise self._failed(f"reading {prefix}/{metadata.object_name(kind)}", e) from None

    def _read_all(self, path: str) -> bytes:
        with self._fs.open_input_stream(path) as f:
            return bytes(f.read())


def delete_remote_partitions(settings: RemoteStorageSettings, prefixes: list[str]) -> None:
    """Deletes every object of the partitions under `prefixes` (their topic was deleted)."""
    storage = settings.open()
    for prefix in prefixes:
        storage.delete_partition(prefix)


def _fields(metadata: RemoteSegmentMetadata) -> dict[str, Any]:
    return {name: getattr(metadata, name) for name in RemoteSegmentMetadata.__dataclass_fields__}
