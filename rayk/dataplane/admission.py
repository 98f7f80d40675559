"""Admission: which connections an Endpoint takes in, and which stranger it lets go to make room.

A connection is *unauthenticated* from the moment it is accepted until it has proven the
endpoint's secret (TLS, then handshake.py), and *authenticated* after. The two are
bounded apart, so that strangers can never take the places of the cluster's own processes:

- Authenticated: at most `max_authenticated` (the endpoint's MAX_CONNECTIONS). Only a
  process that holds the secret can hold one of these places. Past the cap a connection
  is refused, as it arrives and again once it has proven itself (several may be proving
  themselves at once).
- Unauthenticated: at most `max_unauthenticated_per_address` from one address and
  `max_unauthenticated` in all. A new one past either bound is taken in, and the *oldest*
  unauthenticated connection of that address (or of all) is let go. The oldest has had
  the longest to prove itself, and a real peer does so within a round trip of connecting;
  so a flood of idle sockets from an address, however long it goes on, cannot keep out a
  peer on that same address (a follower on the node an attacker shares), unless it opens
  more than the bound within that peer's round trip. Refusing the newest instead would
  lock the peer out for as long as the flood went on.

A connection with no address (`address` None: a Unix socket's, which has none to tell
local processes apart by) counts against `max_unauthenticated` only (endpoint.py says why).

Pure bookkeeping: `arrive` hands back a Ticket for the connection, and lets an older one
go by calling the `evict` callback its caller gave for it (the caller closes that
connection; its Ticket is already gone). Not thread-safe: one event loop's.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass


class Stage(enum.Enum):
    """Where a connection's Ticket stands in admission: still to prove the secret, proven, or
    holding no place any more."""

    UNAUTHENTICATED = "unauthenticated"
    AUTHENTICATED = "authenticated"
    GONE = "gone"  # left, refused or evicted: holds no place


@dataclass(eq=False, slots=True)  # eq=False: hashed by identity, one per connection
class Ticket:
    """One connection's place: `evict` closes it, if Admission lets it go to make room."""

    address: str | None
    evict: Callable[[], None]
    stage: Stage = Stage.UNAUTHENTICATED
    evicted: bool = False


class Admission:
    """One Endpoint's count of authenticated connections and its unauthenticated Tickets,
    oldest first, in all and per address; decides who is taken in and whom to evict. Lives
    as long as its Endpoint; not thread-safe (the endpoint's event loop)."""

    def __init__(self, max_authenticated: int, max_unauthenticated: int, max_unauthenticated_per_address: int) -> None:
        assert max_authenticated >= 1 and max_unauthenticated >= 1 and max_unauthenticated_per_address >= 1
        self.max_authenticated = max_authenticated
        self.max_unauthenticated = max_unauthenticated
        self.max_unauthenticated_per_address = max_unauthenticated_per_address
        self._authenticated = 0
        # Unauthenticated tickets, oldest first (dicts keep insertion order), in all and by address.
        self._unauthenticated: dict[Ticket, None] = {}
        self._by_address: dict[str, dict[Ticket, None]] = {}

    @property
    def authenticated_count(self) -> int:
        return self._authenticated

    @property
    def unauthenticated_count(self) -> int:
        return len(self._unauthenticated)

    def unauthenticated_from(self, address: str) -> int:
        return len(self._by_address.get(address, ()))

    def arrive(self, address: str | None, evict: Callable[[], None]) -> Ticket | None:
        """A Ticket for a connection just accepted from `address`, making room for it by
        evicting the oldest unauthenticated ones past a bound; None (refuse it) when the
        authenticated connections are at their cap already."""
        if self._authenticated >= self.max_authenticated:
            return None
        if address is not None:
            same = self._by_address.get(address)
            if same is not None and len(same) >= self.max_unauthenticated_per_address:
                self._evict(next(iter(same)))
        if len(self._unauthenticated) >= self.max_unauthenticated:
            self._evict(next(iter(self._unauthenticated)))
        ticket = Ticket(address, evict)
        self._unauthenticated[ticket] = None
        if address is not None:
            self._by_address.setdefault(address, {})[ticket] = None
        self._check(address)
        return ticket

    def authenticate(self, ticket: Ticket) -> bool:
        """The connection proved the secret: it moves to the authenticated places, if one is
        free (True); else it is gone (False: refuse it)."""
        assert ticket.stage is Stage.UNAUTHENTICATED, f"only an unauthenticated connection authenticates, not a {ticket.stage.value} one"
        self._forget_unauthenticated(ticket)
        if self._authenticated >= self.max_authenticated:
            ticket.stage = Stage.GONE
            return False
        ticket.stage = Stage.AUTHENTICATED
        self._authenticated += 1
        self._check(ticket.address)
        return True

    def leave(self, ticket: Ticket) -> None:
        """The connection closed (or was refused): its place is free. Again, or after an
        eviction, nothing."""
        if ticket.stage is Stage.UNAUTHENTICATED:
            self._forget_unauthenticated(ticket)
        elif ticket.stage is Stage.AUTHENTICATED:
            self._authenticated -= 1
        ticket.stage = Stage.GONE
        self._check(ticket.address)

    def _evict(self, ticket: Ticket) -> None:
        self._forget_unauthenticated(ticket)
        ticket.stage, ticket.evicted = Stage.GONE, True
        ticket.evict()

    def _forget_unauthenticated(self, ticket: Ticket) -> None:
        del self._unauthenticated[ticket]
        if ticket.address is not None:
            same = self._by_address[ticket.address]
            del same[ticket]
            if not same:
                del self._by_address[ticket.address]

    def _check(self, address: str | None) -> None:
        assert 0 <= self._authenticated <= self.max_authenticated, self._authenticated
        assert len(self._unauthenticated) <= self.max_unauthenticated, len(self._unauthenticated)
        if address is not None:
            count = len(self._by_address.get(address, ()))
            assert address not in self._by_address or count >= 1, "no empty address is kept"
            assert count <= self.max_unauthenticated_per_address, (address, count)
