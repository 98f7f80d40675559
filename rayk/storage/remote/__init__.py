"""Tiered storage (KIP-405): a log's rolled segments copied to object storage.

- remote_segment.py      RemoteSegmentMetadata: what one copied segment is and where its
                         objects are, and how their names are made;
- remote_log_storage.py  RemoteLogStorage: the objects themselves on any pyarrow
                         filesystem (s3://, gs://, file://): copy, list, read, delete;
- remote_read.py         reading whole batches at an offset out of a remote segment.

Which segments to copy and when, remote retention and serving fetches are the replica's
(rayk/replication/remote_log_manager.py); the Log only refuses to drop a local segment
that is not copied yet (`Log.delete_expired_segments`).
"""

from rayk.storage.remote.remote_log_storage import RemoteLogStorage, RemoteStorageSettings
from rayk.storage.remote.remote_segment import RemoteSegmentMetadata

__all__ = ["RemoteLogStorage", "RemoteSegmentMetadata", "RemoteStorageSettings"]
