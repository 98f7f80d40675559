"""ReplicaEvents: what a replica's waiting operations wait on (Kafka keys its delayed
operations the same way).

Two Wakeups (rayk/actors/wakeup.py), each made when a waiter first asks for it and dropped
when fired:
- the append event wakes what waits for new records: a follower's fetch, a batch
  waiting for its producer's earlier sequence;
- the change event wakes every waiter: the role or a config moved; an HW move alone
  (`notify_high_watermark`) wakes every waiter but those for records.
A consumer's fetch reads only up to the HW and an acks=all produce waits for it, so an
append that leaves the HW where it was wakes only the first: at RF=3 that is most appends.

A waiter takes its event before it checks its condition, so a change between the check and
the wait is not missed. Waiters without a task are called instead, before the events fire:
`on_append` at every append and change (a leader's parked follower fetches, leader_fetch.py;
an append of a leader's own passes what it wrote, which they can answer with unread),
`on_change_produce` at every change and HW move (its parked acks=-1 produce calls,
delayed_produce.py), `on_change_fetch` likewise (a leader's parked consumer fetches, which
read up to the HW or the LSO: leader_fetch.py), and `on_change` (while set) likewise (the
replica's share-partitions, which wake or close with it: see PartitionReplica).

Not thread-safe: used on the replica actor's event loop only.
"""

from __future__ import annotations

from collections.abc import Callable

from rayk.actors.wakeup import Wakeup

Appended = tuple[int, bytes | bytearray]  # (first offset, the batches as written) of a leader's append


class ReplicaEvents:
    """The append and change events of one replica (see the module docstring)."""

    __slots__ = ("_appended", "_changed", "on_change", "on_append", "on_change_produce", "on_change_fetch")

    def __init__(self) -> None:
        self._appended: Wakeup | None = None
        self._changed: Wakeup | None = None
        self.on_change: Callable[[], None] | None = None
        self.on_append: Callable[[Appended | None], None] | None = None
        self.on_change_produce: Callable[[], None] | None = None
        self.on_change_fetch: Callable[[], None] | None = None

    def change_event(self, appends: bool = False) -> Wakeup:
        """The event a waiter waits on, taken before it checks its condition; with
        `appends`, one that new records fire too."""
        if appends:
            if self._appended is None:
                self._appended = Wakeup()
            return self._appended
        if self._changed is None:
            self._changed = Wakeup()
        return self._changed

    def notify_append(self, appended: Appended | None = None) -> None:
        """Records were appended and the HW did not move: wakes the waiters for records.
        `appended`: the leader's own append that this is for, (first offset, the batches as
        written), if one segment holds them."""
        if self.on_append is not None:
            self.on_append(appended)
        if self._appended is not None:
            event, self._appended = self._appended, None
            event.fire()

    def notify_change(self) -> None:
        """Wakes every waiting fetch and produce: the role or a config moved (or the HW
        with something else)."""
        self.notify_append()
        self.notify_high_watermark()

    def notify_high_watermark(self) -> None:
        """The HW moved and nothing else did: wakes what waits for it (parked acks=-1
        produce calls, consumers' fetches, the share partitions, the change event), not
        what waits only for records (a follower's fetch, a batch waiting for its producer's
        earlier sequence), to which an HW move brings none. At RF=3 every record moves it
        once, by a follower's fetch, while the other follower's fetch is parked."""
        if self.on_change_produce is not None:
            self.on_change_produce()
        if self.on_change_fetch is not None:
            self.on_change_fetch()
        if self.on_change is not None:
            self.on_change()
        if self._changed is not None:
            event, self._changed = self._changed, None
            event.fire()
