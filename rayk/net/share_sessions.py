"""ShareSessions: a listener's share sessions (KIP-932), Kafka's ShareSessionCache.

A share consumer keeps one share session per broker it fetches from. Its ShareFetch with
epoch 0 opens one, naming the partitions to fetch (a member's existing session there is
replaced); each later request carries the session's next epoch (1, 2, ...) and may add
partitions or forget some; epoch -1 closes it. A request in another epoch is
INVALID_SHARE_SESSION_EPOCH, one continuing no session here SHARE_SESSION_NOT_FOUND: the
client opens a new session. Every ShareFetch fetches all the session's partitions. A
ShareAcknowledge moves the same epoch on (or closes with -1), but cannot open a session.

When a session ends (closed, replaced or evicted), the member's records acquired on its
partitions are released, which the caller does with what `close`, `open` and eviction
return. At most `max_sessions` live at once; past that the least recently used is evicted.

Pure state; the listener's event loop calls it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rayk.errors import InvalidShareSessionEpochError, ShareSessionNotFoundError

OPEN_EPOCH, CLOSE_EPOCH = 0, -1
DEFAULT_MAX_SESSIONS = 1_000  # Kafka's group.share.max.share.sessions' default is larger; each here costs little
Partition = tuple[str, int]  # (topic name, partition)
SessionKey = tuple[str, str]  # (group id, member id)


@dataclass(slots=True)
class ShareSession:
    """One share consumer member's session with this broker: the epoch its next request must
    carry, the partitions it fetches in the order added, and their topics' ids."""

    group_id: str
    member_id: str
    next_epoch: int = 1
    partitions: dict[Partition, None] = field(default_factory=dict)  # in the order they were added
    topic_ids: dict[str, Any] = field(default_factory=dict)  # of the partitions' topics (a request names them by id)


@dataclass(frozen=True, slots=True)
class Ended:
    """A session that ended: its member's records on these partitions go back."""

    group_id: str
    member_id: str
    partitions: tuple[Partition, ...]


class ShareSessions:
    """A listener's share sessions by (group, member), least recently used first, at most
    `max_sessions`. Held by the BrokerView; pure, not thread-safe (the listener's event loop)."""

    def __init__(self, max_sessions: int = DEFAULT_MAX_SESSIONS) -> None:
        assert max_sessions >= 1
        self._max_sessions = max_sessions
        self._sessions: OrderedDict[SessionKey, ShareSession] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def request(self, group_id: str, member_id: str, epoch: int, added: Iterable[Partition] = (),
                forgotten: Iterable[Partition] = (), topic_ids: Mapping[str, Any] | None = None,
                ) -> tuple[ShareSession | None, list[Ended]]:  # fmt: skip
        """Applies a request's epoch: (the session to serve, or None for a close; the
        sessions that ended). Raises SHARE_SESSION_NOT_FOUND / INVALID_SHARE_SESSION_EPOCH."""
        key = (group_id, member_id)
        ended: list[Ended] = []
        if epoch == OPEN_EPOCH:
            old = self._sessions.pop(key, None)
            if old is not None:
                ended.append(_ended(old))
            session = self._sessions[key] = ShareSession(group_id, member_id)
            while len(self._sessions) > self._max_sessions:
                ended.append(_ended(self._sessions.popitem(last=False)[1]))
        else:
            session = self._sessions.get(key)
            if session is None:
                raise ShareSessionNotFoundError(f"no share session of member {member_id!r} of group {group_id!r} here")
            if epoch == CLOSE_EPOCH:
                del self._sessions[key]
                return None, [_ended(session)]
            if epoch != session.next_epoch:
                raise InvalidShareSessionEpochError(f"share session of member {member_id!r} is at epoch "
                                                    f"{session.next_epoch}, not {epoch}")  # fmt: skip
            session.next_epoch = session.next_epoch + 1 if session.next_epoch < 2**31 - 1 else 1
            self._sessions.move_to_end(key)
        for p in forgotten:
            session.partitions.pop(p, None)
        for p in added:
            session.partitions.setdefault(p, None)
        session.topic_ids.update(topic_ids or {})
        return session, ended


def _ended(session: ShareSession) -> Ended:
    return Ended(session.group_id, session.member_id, tuple(session.partitions))
