"""The lending limit (docs/spec.md §17): what each team keeps back, the room it leaves
borrowers, and ``acquire_lent``, which lets a borrower in only into that room."""

from __future__ import annotations

import math

import pytest

from fairshare import Class, Grant, Pool, ShareError, check_lend
from fairshare.apportion import kept_back


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def pool(
    capacity: int = 10, lend: dict[str, float] | None = None, clock: Clock | None = None
) -> Pool:
    return Pool("p", capacity, {"a": 0.5, "b": 0.5}, lend=lend, clock=clock or Clock())


def decided(grant: Grant) -> tuple[int, bool, bool]:
    return grant.priority, grant.borrowing, grant.saturated


def fill(p: Pool, team: str, n: int) -> list[Grant]:
    return [p.acquire(team) for _ in range(n)]


@pytest.mark.parametrize(
    ("reserved", "within", "lend", "kept"),
    [
        pytest.param(10, 0, 1.0, 0, id="lend-1-keeps-nothing"),
        pytest.param(10, 0, 0.0, 10, id="lend-0-keeps-the-gap"),
        pytest.param(10, 0, 0.5, 5, id="half"),
        pytest.param(3, 0, 0.5, 2, id="lent-rounds-down"),
        pytest.param(10, 0, 0.7, 3, id="0.7x10-is-7-lent"),
        pytest.param(100, 0, 0.29, 71, id="0.29x100-is-29-lent-not-28"),
        pytest.param(5, 2, 0.0, 3, id="gap-is-reserved-minus-within"),
        pytest.param(4, 6, 0.0, 0, id="over-reservation-no-gap"),
        pytest.param(0, 0, 0.0, 0, id="no-reservation"),
        pytest.param(7, 0, 1e-9, 7, id="tiny-fraction-lends-nothing"),
    ],
)
def test_kept_back_rounds_what_is_lent_down(
    reserved: int, within: int, lend: float, kept: int
) -> None:
    assert kept_back(reserved, within, lend) == kept


def test_lend_one_everywhere_decides_as_today() -> None:
    """With every lend at 1.0 nothing is kept back and acquire is unchanged."""
    plain = pool()
    lent = pool(lend={"a": 1.0, "b": 1.0})
    assert lent.kept_back() == 0
    plain_grants: list[Grant] = []
    lent_grants: list[Grant] = []
    for i, team in enumerate("aababbbabaaaabbbx"):
        cls = Class(i % 2)
        g1, g2 = plain.acquire(team, cls), lent.acquire(team, cls)
        assert (g1.priority, g1.borrowing, g1.saturated) == (
            g2.priority,
            g2.borrowing,
            g2.saturated,
        )
        plain_grants.append(g1)
        lent_grants.append(g2)
        if i % 3 == 2:
            plain_grants.pop(0).release(1.0)
            lent_grants.pop(0).release(1.0)
        assert lent.kept_back() == 0
    assert plain.snapshot() == lent.snapshot()


def test_acquire_lent_with_lend_one_refuses_a_borrower_exactly_when_saturated() -> None:
    p = pool(capacity=4)
    fill(p, "a", 2)  # a's reservation
    grants = [p.acquire_lent("a"), p.acquire_lent("a")]
    assert all(g is not None and g.borrowing for g in grants)
    assert p.lend_room() == 0
    assert p.acquire_lent("a") is None  # would borrow into a full pool
    assert p.acquire_lent("x") is None
    assert not p.knows("x")  # a refusal learns no team
    within = p.acquire_lent("b")  # b is within share: never refused
    assert within is not None and not within.borrowing and within.saturated
    assert p.usage()[1] == {"a": 4, "b": 1}  # the refusals counted nothing
    first = grants[0]
    assert first is not None
    first.release()
    assert p.acquire_lent("a") is None  # b's grant took the slot: 4 in flight
    within.release()
    assert p.acquire_lent("x") is not None


def test_lend_zero_keeps_the_gap_back_from_borrowers() -> None:
    """b at its reservation cannot borrow a's idle slots; a finds them free."""
    p = pool(lend={"a": 0.0})
    assert p.kept_back() == 5
    fill(p, "b", 5)
    assert p.lend_room() == 0
    assert p.acquire_lent("b") is None
    assert p.acquire_lent("x") is None
    a_grants = [p.acquire_lent("a") for _ in range(5)]
    assert all(g is not None and not g.borrowing for g in a_grants)
    assert p.kept_back() == 0
    assert p.lend_room() == 0
    assert p.acquire_lent("a") is None  # a would borrow now: the pool is full


def test_a_fraction_lends_part_of_the_gap() -> None:
    p = pool(lend={"a": 0.5})  # a's gap 5: lends 2, keeps 3
    assert p.kept_back() == 3
    fill(p, "b", 5)
    assert p.lend_room() == 2
    assert p.acquire_lent("b") is not None
    assert p.acquire_lent("b") is not None
    assert p.acquire_lent("b") is None
    a = p.acquire_lent("a")  # a's gap 4: lends 2, keeps 2
    assert a is not None and not a.borrowing
    assert p.kept_back() == 2
    assert p.lend_room() == 0
    a.release()
    assert p.kept_back() == 3


def test_phantoms_count_in_flight_and_in_the_gap() -> None:
    clock = Clock()
    p = pool(lend={"a": 0.0}, clock=clock)
    p.add_phantoms("a", 2, clock.now + 10)  # within share or unknown: a's gap is 3
    assert p.kept_back() == 3
    assert p.lend_room() == 10 - 2 - 3
    p.add_phantoms("b", 3, clock.now + 20, borrowing=True)  # b's gap unchanged
    assert p.kept_back() == 3
    assert p.lend_room() == 10 - 5 - 3
    assert p.drop_phantom("a")
    assert p.kept_back() == 4
    assert p.lend_room() == 10 - 4 - 4
    clock.now += 10  # a's last phantom ends
    assert p.kept_back() == 5
    assert p.lend_room() == 10 - 3 - 5
    clock.now += 10
    assert p.lend_room() == 5


def test_capacity_changes_move_the_room() -> None:
    p = pool(lend={"a": 0.0})
    fill(p, "b", 2)
    assert p.lend_room() == 10 - 2 - 5
    p.set_capacity(20)  # a keeps its 10
    assert p.kept_back() == 10
    assert p.lend_room() == 20 - 2 - 10
    p.set_capacity(4)  # a keeps its 2
    assert p.kept_back() == 2
    assert p.lend_room() == 0
    assert p.acquire_lent("x") is None


def test_set_lend_moves_the_room_at_once() -> None:
    p = pool()
    fill(p, "b", 5)
    assert p.lend_room() == 5
    p.set_lend({"a": 0.0, "b": 0.0})  # b is at its reservation: it has no gap
    assert p.kept_back() == 5
    assert p.lend_room() == 0
    p.set_lend({"a": 0.4})
    assert p.kept_back() == 3
    p.set_lend({})
    assert p.kept_back() == 0
    with pytest.raises(ShareError):
        p.set_lend({"a": 1.5})
    assert p.kept_back() == 0  # a refused map changes nothing


def test_a_team_without_share_may_be_named_and_keeps_nothing() -> None:
    p = pool(lend={"x": 0.0})
    assert p.kept_back() == 0
    assert p.acquire_lent("x") is not None
    assert p.kept_back() == 0


@pytest.mark.parametrize(
    "lend",
    [
        pytest.param({"a": 1.5}, id="above-1"),
        pytest.param({"a": -0.1}, id="negative"),
        pytest.param({"a": math.nan}, id="nan"),
        pytest.param({"a": math.inf}, id="inf"),
        pytest.param({"a": True}, id="bool"),
        pytest.param({"a": "0.5"}, id="string"),
        pytest.param({"": 0.5}, id="empty-team"),
    ],
)
def test_bad_lend_maps_are_refused(lend: dict[str, float]) -> None:
    with pytest.raises(ShareError, match="lend of"):
        check_lend(lend)
    with pytest.raises(ValueError):
        pool(lend=lend)


def test_check_lend_returns_floats() -> None:
    assert check_lend({"a": 0, "b": 1, "c": 0.25}) == {"a": 0.0, "b": 1.0, "c": 0.25}


def test_priority_next_is_what_acquire_gives() -> None:
    p = pool(capacity=4)
    for team, cls in [("a", Class.INTERACTIVE), ("a", Class.BATCH), ("a", Class.BATCH)]:
        expected = p.priority_next(team, cls)
        assert p.acquire(team, cls).priority == expected
    p.charge("b", 5.0)
    for team in ("b", "x", "a"):
        assert p.priority_next(team, Class.BATCH) == p.acquire(team, Class.BATCH).priority
    assert p.priority_next("y") == p.acquire("y").priority


def test_when_every_team_lends_nothing_kept_slots_stay_free() -> None:
    """Every caller waits and every team lends 0: borrowers only use unreserved slots."""
    p = Pool("p", 6, {"a": 0.5, "b": 0.25}, lend={"a": 0.0, "b": 0.0}, clock=lambda: 0.0)
    borrowers = [g for g in (p.acquire_lent("x") for _ in range(6)) if g is not None]
    assert len(borrowers) == 6 - 3 - 1  # a keeps 3, b keeps 1
    for team, reservation in (("b", 1), ("a", 3)):
        for _ in range(reservation):
            in_flight = sum(p.usage()[1].values())
            assert in_flight < p.capacity  # a free slot for the within-share request
            assert not p.acquire(team).borrowing


def test_a_team_that_lends_may_spill_onto_kept_slots() -> None:
    """docs/spec.md §17, not guaranteed: b lent its slots; when it comes back its
    within-share requests take a's kept slots, and a then finds the pool full."""
    p = Pool("p", 4, {"a": 0.5, "b": 0.5}, lend={"a": 0.0}, clock=lambda: 0.0)
    assert [p.acquire_lent("x") is not None for _ in range(3)] == [True, True, False]
    p.acquire("b")
    p.acquire("b")
    assert sum(p.usage()[1].values()) == p.capacity
    assert p.kept_back() == 2
