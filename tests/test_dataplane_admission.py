"""Admission (rayk/dataplane/admission.py) as pure bookkeeping: which connections an endpoint
takes in and which stranger it lets go, against a model (hypothesis) and in the cases the
endpoint relies on."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rayk.dataplane.admission import Admission, Stage, Ticket


class Arrivals:
    """An Admission whose tickets record their eviction, in the order they were evicted."""

    def __init__(self, max_authenticated: int = 4, max_unauthenticated: int = 6, per_address: int = 2) -> None:
        self.admission = Admission(max_authenticated, max_unauthenticated, per_address)
        self.evicted: list[Ticket] = []

    def arrive(self, address: str | None) -> Ticket | None:
        holder: list[Ticket] = []
        ticket = self.admission.arrive(address, lambda: self.evicted.append(holder[0]))
        if ticket is not None:
            holder.append(ticket)
        return ticket


def test_past_its_bound_an_address_loses_its_own_oldest_stranger_and_no_other_addresss():
    a = Arrivals(per_address=2)
    x1, y1, x2 = a.arrive("x"), a.arrive("y"), a.arrive("x")
    x3 = a.arrive("x")
    assert a.evicted == [x1] and x1.evicted and x1.stage is Stage.GONE
    assert (a.admission.unauthenticated_from("x"), a.admission.unauthenticated_from("y")) == (2, 1)
    assert not (y1.evicted or x2.evicted or x3.evicted)


def test_past_the_overall_bound_the_oldest_stranger_of_all_goes():
    a = Arrivals(max_unauthenticated=3, per_address=2)
    tickets = [a.arrive(address) for address in ("x", "y", None, "z")]
    assert a.evicted == [tickets[0]] and a.admission.unauthenticated_count == 3


def test_connections_without_an_address_meet_the_overall_bound_only():
    a = Arrivals(max_unauthenticated=6, per_address=1)
    local = [a.arrive(None) for _ in range(6)]
    assert a.evicted == [] and all(ticket is not None for ticket in local)
    a.arrive(None)
    assert a.evicted == [local[0]]


def test_only_authenticated_connections_count_against_the_cap():
    a = Arrivals(max_authenticated=2, max_unauthenticated=3, per_address=3)
    for _ in range(10):  # strangers come and go: the cap is untouched
        a.arrive("x")
    first, second = a.arrive("y"), a.arrive("y")
    assert first is not None and second is not None
    assert a.admission.authenticate(first) and a.admission.authenticate(second)
    assert a.arrive("y") is None, "refused as it arrives once the cap is reached"
    a.admission.leave(first)
    third, fourth = a.arrive("y"), a.arrive("y")
    assert third is not None and fourth is not None
    assert a.admission.authenticate(third)
    assert not a.admission.authenticate(fourth), "two proved themselves at once: one place was free"
    assert fourth.stage is Stage.GONE and a.admission.authenticated_count == 2
    a.admission.leave(fourth)  # its connection closes: nothing to give back
    assert a.admission.authenticated_count == 2


def test_leaving_twice_or_after_an_eviction_gives_back_nothing():
    a = Arrivals(per_address=1)
    old = a.arrive("x")
    new = a.arrive("x")
    assert old is not None and new is not None and old.evicted
    a.admission.leave(old)
    assert a.admission.unauthenticated_count == 1
    assert a.admission.authenticate(new)
    a.admission.leave(new), a.admission.leave(new)
    assert (a.admission.authenticated_count, a.admission.unauthenticated_count) == (0, 0)


ADDRESSES = ["a", "b", "c", None]
operations = st.lists(st.one_of(
    st.tuples(st.just("arrive"), st.sampled_from(ADDRESSES)),
    st.tuples(st.sampled_from(["authenticate", "leave"]), st.integers(0, 50)),
), max_size=80)


@given(operations, st.integers(1, 4), st.integers(1, 6), st.integers(1, 3))
def test_admission_matches_a_model_and_keeps_its_bounds(ops, max_authenticated, max_unauthenticated, per_address):
    a = Arrivals(max_authenticated, max_unauthenticated, per_address)
    strangers: list[Ticket] = []  # the model: unauthenticated, oldest first
    authenticated: list[Ticket] = []
    tickets: list[Ticket] = []
    for op, arg in ops:
        if op == "arrive":
            address = arg
            evicted_before = len(a.evicted)
            expected: list[Ticket] = []
            if len(authenticated) >= max_authenticated:
                assert a.arrive(address) is None
                continue
            same = [t for t in strangers if address is not None and t.address == address]
            if len(same) >= per_address:
                expected.append(same[0])
                strangers.remove(same[0])
            if len(strangers) >= max_unauthenticated:
                expected.append(strangers.pop(0))
            ticket = a.arrive(address)
            assert ticket is not None
            assert a.evicted[evicted_before:] == expected
            strangers.append(ticket)
            tickets.append(ticket)
        elif tickets:
            ticket = tickets[arg % len(tickets)]
            if op == "authenticate":
                if ticket not in strangers:
                    continue  # only a stranger proves itself (the admission asserts as much)
                strangers.remove(ticket)
                admitted = a.admission.authenticate(ticket)
                assert admitted == (len(authenticated) < max_authenticated)
                if admitted:
                    authenticated.append(ticket)
            else:
                a.admission.leave(ticket)
                if ticket in strangers:
                    strangers.remove(ticket)
                if ticket in authenticated:
                    authenticated.remove(ticket)
        assert a.admission.authenticated_count == len(authenticated) <= max_authenticated
        assert a.admission.unauthenticated_count == len(strangers) <= max_unauthenticated
        for address in ("a", "b", "c"):
            assert a.admission.unauthenticated_from(address) == sum(t.address == address for t in strangers) <= per_address
