"""Reservations under sustained load (docs/spec.md §4): a team that keeps more than its
reservation in flight holds its reservation within share at every step once warm.

Each finish is replaced by a new request of the same team, as a busy client does; the
order in which requests finish is oldest first, random, or chosen by hypothesis.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from fairshare import Grant, Pool

SHARES = {"a": 0.4, "b": 0.6}  # C = 10: reservations 4 and 6


def _within(grants: list[Grant]) -> int:
    return sum(1 for g in grants if not g.borrowing)


def _churn(pool: Pool, team: str, in_flight: int, pick: random.Random | None, steps: int) -> None:
    """Keeps ``in_flight`` requests of ``team``; at each step one finishes (the oldest, or
    one chosen by ``pick``) and the next is sent. Checks the within-share count after
    every replacement."""
    reserved = pool.reserved()[team]
    grants = [pool.acquire(team) for _ in range(in_flight)]
    expected = min(reserved, in_flight)
    assert _within(grants) == expected
    for _ in range(steps):
        index = 0 if pick is None else pick.randrange(len(grants))
        grants.pop(index).release(1.0)
        grants.append(pool.acquire(team))
        assert _within(grants) == expected
        assert pool.within()[team] == expected


def test_oldest_first_churn_keeps_the_reservation() -> None:
    # The defect this rule fixes: counting every request in flight, a's within-share
    # grants went 3, 2, 1, 0 over the first four finishes and stayed at 0.
    pool = Pool("p", 10, SHARES, clock=lambda: 0.0)
    _churn(pool, "a", 6, None, steps=40)


def test_random_order_churn_keeps_the_reservation() -> None:
    pool = Pool("p", 10, SHARES, clock=lambda: 0.0)
    _churn(pool, "a", 12, random.Random(7), steps=200)


def test_a_team_below_its_reservation_is_wholly_within_share() -> None:
    pool = Pool("p", 10, SHARES, clock=lambda: 0.0)
    _churn(pool, "b", 4, random.Random(3), steps=50)


def test_borrowers_of_other_teams_leave_a_reservation_alone() -> None:
    pool = Pool("p", 10, SHARES, clock=lambda: 0.0)
    flood = [pool.acquire("b") for _ in range(20)]  # 6 within share, 14 borrowing
    assert _within(flood) == 6
    _churn(pool, "a", 8, random.Random(11), steps=60)


def test_phantoms_of_unknown_standing_count_as_within_share() -> None:
    pool = Pool("p", 10, SHARES, clock=lambda: 0.0)
    pool.add_phantoms("a", 3, float("inf"))
    assert pool.within()["a"] == 3
    assert not pool.acquire("a").borrowing  # 3 < 4
    assert pool.acquire("a").borrowing  # 4: the reservation is used
    assert pool.drop_phantom("a")
    assert not pool.acquire("a").borrowing


def test_borrowing_phantoms_do_not_use_up_the_reservation() -> None:
    pool = Pool("p", 10, SHARES, clock=lambda: 0.0)
    pool.add_phantoms("a", 5, float("inf"), borrowing=True)
    assert pool.within()["a"] == 0
    assert [pool.acquire("a").borrowing for _ in range(5)] == [False] * 4 + [True]
    assert not pool.drop_phantom("a")  # none of the within kind
    assert pool.drop_phantom("a", borrowing=True)
    stat = {s.team: s for s in pool.snapshot()}["a"]
    assert (stat.in_flight, stat.borrowing, stat.phantoms) == (5, 1, 4)


def test_a_lowered_reservation_demotes_nothing_and_new_requests_borrow() -> None:
    pool = Pool("p", 10, SHARES, clock=lambda: 0.0)
    grants = [pool.acquire("a") for _ in range(4)]
    assert pool.set_capacity(5) == 10  # a's reservation: 2
    assert pool.reserved()["a"] == 2
    assert not any(g.borrowing for g in grants)  # grants keep their standing
    assert pool.acquire("a").borrowing  # within-share count 4 >= 2
    grants.pop().release()
    grants.pop().release()
    assert pool.acquire("a").borrowing  # 2: still not below 2
    grants.pop().release()
    assert not pool.acquire("a").borrowing  # 1 < 2


def test_an_adopted_grant_counts_with_the_standing_it_is_given() -> None:
    pool = Pool("p", 10, SHARES, clock=lambda: 0.0)
    pool.adopt("a", 0, False)
    pool.adopt("a", 20, True)
    assert pool.within()["a"] == 1
    assert [pool.acquire("a").borrowing for _ in range(4)] == [False, False, False, True]


@settings(max_examples=200, deadline=None)
@given(
    reservation_share=st.sampled_from([0.1, 0.3, 0.5, 0.7]),
    in_flight=st.integers(1, 15),
    events=st.lists(st.tuples(st.booleans(), st.integers(0, 1 << 16)), max_size=120),
)
def test_the_within_share_count_stays_at_its_bound(
    reservation_share: float, in_flight: int, events: list[tuple[bool, int]]
) -> None:
    """Random arrivals and finishes: the within-share count never exceeds the reservation,
    and a finish that is replaced never leaves it below min(reservation, in flight) when it
    was at that bound before.

    (A finish that is not replaced may leave the count below the bound while borrowers run:
    they keep the standing they were admitted with, since vLLM fixes a request's priority
    when it is sent. The next arrivals are within share until the count is back.)
    """
    pool = Pool("p", 10, {"a": reservation_share, "b": 1 - reservation_share})
    reserved = pool.reserved()["a"]
    grants = [pool.acquire("a") for _ in range(in_flight)]
    assert pool.within()["a"] == min(reserved, in_flight)
    for replace, choice in events:
        warm = pool.within()["a"] == min(reserved, len(grants))
        if grants:
            grants.pop(choice % len(grants)).release(1.0)
        if replace or not grants:
            before = pool.within()["a"]
            grants.append(pool.acquire("a"))
            # An arrival is within share exactly when the count was below the reservation.
            assert pool.within()["a"] == min(reserved, before + 1)
        within = pool.within()["a"]
        assert within == _within(grants) <= reserved
        if replace and warm:
            assert within == min(reserved, len(grants))
