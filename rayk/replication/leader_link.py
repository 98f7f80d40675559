"""LeaderLink: a follower's way to its leader's replica: OffsetsForLeaderEpoch, once per
leader epoch, over Ray (control), and the fetches that carry records over the data plane
(rayk/dataplane/replica_link.py).

The link is the fetcher's alone, and a fetch that did not complete (a timeout, a
cancellation, an error) closes its connection: the next one starts on a fresh connection,
not behind an answer that may never come.
"""

from __future__ import annotations

from rayk.dataplane.frames import FetchRequest, FetchResult
from rayk.dataplane.replica_link import ReplicaLink


class LeaderLink(ReplicaLink):
    """A follower's ReplicaLink to its leader's replica, plus the OffsetsForLeaderEpoch Ray
    call. Owned by one ReplicaFetcher for one leader epoch and closed with it; a fetch that
    does not complete resets the connection."""

    async def offsets_for_leader_epoch(self, epoch: int) -> tuple[int, int]:
        return await self.replica.offsets_for_leader_epoch.remote(epoch)

    async def fetch(self, request: FetchRequest) -> FetchResult:
        try:
            return await super().fetch(request)
        except BaseException:
            self.reset()
            raise
