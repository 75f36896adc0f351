"""Pool methods and properties, one row of docs/spec.md §7 at a time."""

from __future__ import annotations

import dataclasses
import math
from enum import IntEnum

import pytest

import fairshare
from fairshare import (
    BORROW_BASE,
    MAX_RANK,
    RANK_STEP,
    WITHIN_SHARE_BASE,
    Class,
    Pool,
    TeamStat,
)

HOUR = 3600.0


class Clock:
    """A wall clock that moves only when told to."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_pool(
    capacity: int = 10,
    shares: dict[str, float] | None = None,
    clock: Clock | None = None,
    half_life_s: float = HOUR,
) -> Pool:
    if shares is None:
        shares = {"a": 0.5, "b": 0.3, "c": 0.2}
    return Pool("gpu", capacity, shares, half_life_s=half_life_s, clock=clock or Clock())


def stats(pool: Pool) -> dict[str, TeamStat]:
    return {s.team: s for s in pool.snapshot()}


def in_flight(pool: Pool) -> dict[str, int]:
    return pool.usage()[1]


# -- constants, Class, exports --------------------------------------------------------------


def test_constants() -> None:
    assert (WITHIN_SHARE_BASE, BORROW_BASE, RANK_STEP, MAX_RANK) == (0, 10, 10, 9)


def test_class_values() -> None:
    assert issubclass(Class, IntEnum)
    assert Class.INTERACTIVE == 0
    assert Class.BATCH == 1
    assert [c.name for c in Class] == ["INTERACTIVE", "BATCH"]


def test_public_names() -> None:
    for name in (
        "Pool",
        "Grant",
        "Class",
        "TeamStat",
        "apportion",
        "WITHIN_SHARE_BASE",
        "BORROW_BASE",
        "RANK_STEP",
        "MAX_RANK",
    ):
        assert hasattr(fairshare, name), name


# -- construction and properties ------------------------------------------------------------


def test_name_capacity_and_reservations() -> None:
    pool = make_pool()
    assert pool.name == "gpu"
    assert pool.capacity == 10
    assert pool.reserved() == {"a": 5, "b": 3, "c": 2}


def test_properties_are_read_only() -> None:
    pool = make_pool()
    for attr in ("name", "capacity", "decay_rate"):
        with pytest.raises(AttributeError):
            setattr(pool, attr, 1)


def test_default_clock_is_wall_time() -> None:
    pool = Pool("p", 2, {"a": 1.0})
    pool.charge("a", 1.0)
    assert pool.usage()[0]["a"] == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize(
    ("capacity", "shares"),
    [
        pytest.param(-1, {"a": 1.0}, id="negative-capacity"),
        pytest.param(1.5, {"a": 1.0}, id="float-capacity"),
        pytest.param(2, {"a": math.nan}, id="nan-share"),
        pytest.param(2, {"a": -0.5}, id="negative-share"),
        pytest.param(2, {"a": math.inf}, id="inf-share"),
    ],
)
def test_bad_pool_is_rejected(capacity: int, shares: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Pool("p", capacity, shares, clock=Clock())


def test_shares_above_one_are_scaled_for_reservations_but_reported_as_configured() -> None:
    pool = make_pool(shares={"a": 3.0, "b": 1.0}, capacity=8)
    assert pool.reserved() == {"a": 6, "b": 2}
    assert stats(pool)["a"].share == 3.0


# -- argument validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("team", "cls", "est_tokens"),
    [
        pytest.param("", Class.INTERACTIVE, 0, id="empty-team"),
        pytest.param("a", 2, 0, id="class-2"),
        pytest.param("a", -1, 0, id="class-minus-1"),
        pytest.param("a", "batch", 0, id="class-string"),
        pytest.param("a", 0.0, 0, id="class-float"),
        pytest.param("a", None, 0, id="class-none"),
        pytest.param("a", Class.BATCH, -1, id="negative-tokens"),
    ],
)
@pytest.mark.parametrize("method", ["acquire", "try_acquire"])
def test_bad_request_is_rejected(method: str, team: str, cls: object, est_tokens: int) -> None:
    pool = make_pool()
    with pytest.raises(ValueError):
        getattr(pool, method)(team, cls, est_tokens)
    assert in_flight(pool) == {"a": 0, "b": 0, "c": 0}  # nothing counted, nobody registered


@pytest.mark.parametrize(
    ("team", "est_tokens"),
    [
        pytest.param("", 0, id="empty-team"),
        pytest.param("a", -5, id="negative-tokens"),
    ],
)
def test_bad_adopt_is_rejected(team: str, est_tokens: int) -> None:
    pool = make_pool()
    with pytest.raises(ValueError):
        pool.adopt(team, 10, True, est_tokens)


# -- saturated and try_acquire ------------------------------------------------------------


def test_saturated_iff_c_or_more_in_flight_before() -> None:
    pool = make_pool(capacity=3)
    grants = [pool.acquire(t) for t in ("a", "b", "x")]
    assert [g.saturated for g in grants] == [False, False, False]
    assert pool.acquire("c").saturated  # 3 in flight before it
    assert pool.acquire("a").saturated
    grants[0].release()
    grants[1].release()
    grants[2].release()
    # 2 left in flight (c and a): below C again.
    assert not pool.acquire("b").saturated


def test_saturated_counts_phantoms() -> None:
    clock = Clock()
    pool = make_pool(capacity=2, clock=clock)
    pool.add_phantoms("x", 2, clock.now + 10)
    assert pool.acquire("a").saturated
    clock.now += 10
    assert not pool.acquire("a").saturated  # phantoms gone; 1 grant in flight


def test_try_acquire_below_c_acts_like_acquire() -> None:
    pool = make_pool(capacity=2, shares={"a": 0.5, "b": 0.5})
    first = pool.try_acquire("a", Class.BATCH, est_tokens=3)
    assert first is not None
    assert (first.priority, first.borrowing, first.saturated, first.est_tokens) == (
        1,
        False,
        False,
        3,
    )
    second = pool.try_acquire("a")
    assert second is not None
    assert second.borrowing
    assert second.priority == BORROW_BASE
    assert pool.try_acquire("b") is None  # full: even a within-share request is refused
    assert in_flight(pool) == {"a": 2, "b": 0}
    second.release()
    third = pool.try_acquire("b")
    assert third is not None
    assert not third.borrowing


def test_try_acquire_counts_phantoms_and_their_expiry() -> None:
    clock = Clock()
    pool = make_pool(capacity=2, clock=clock)
    pool.add_phantoms("a", 2, clock.now + 5)
    assert pool.try_acquire("b") is None
    clock.now += 5
    assert pool.try_acquire("b") is not None


def test_try_acquire_with_capacity_zero_is_always_none() -> None:
    pool = make_pool(capacity=0)
    assert pool.try_acquire("a") is None


# -- adopt ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("priority", "borrowing"),
    [
        pytest.param(0, False, id="within-interactive"),
        pytest.param(1, False, id="within-batch"),
        pytest.param(41, True, id="borrowing-rank3-batch"),
        pytest.param(101, True, id="borrowing-capped"),
    ],
)
def test_adopt_keeps_the_standing_it_had(priority: int, borrowing: bool) -> None:
    pool = make_pool(capacity=2)
    grant = pool.adopt("a", priority, borrowing, est_tokens=9)
    assert (grant.team, grant.priority, grant.borrowing, grant.est_tokens) == (
        "a",
        priority,
        borrowing,
        9,
    )
    s = stats(pool)["a"]
    assert (s.in_flight, s.borrowing, s.in_flight_tokens) == (1, int(borrowing), 9)
    grant.release(2.0)
    s = stats(pool)["a"]
    assert (s.in_flight, s.borrowing, s.in_flight_tokens, s.usage) == (0, 0, 0, 2.0)


def test_adopted_requests_count_toward_reservation_and_capacity() -> None:
    pool = make_pool(capacity=2, shares={"a": 0.5, "b": 0.5})
    pool.adopt("a", 0, False)
    assert pool.acquire("a").borrowing  # a's one slot is taken by the adopted request
    assert pool.try_acquire("b") is None  # 2 in flight: the pool is full


def test_adopt_decides_nothing_even_when_over_reservation() -> None:
    pool = make_pool(capacity=1, shares={"a": 1.0})
    grants = [pool.adopt("a", 0, False) for _ in range(3)]
    assert all(g.priority == 0 and not g.borrowing for g in grants)
    assert stats(pool)["a"].in_flight == 3


def test_adopt_registers_an_unknown_team() -> None:
    pool = make_pool()
    pool.adopt("x", 10, True)
    assert stats(pool)["x"].in_flight == 1
    assert pool.reserved()["x"] == 0


# -- phantoms -------------------------------------------------------------------------------


def test_phantoms_count_in_flight_and_toward_reservation() -> None:
    clock = Clock()
    pool = make_pool(capacity=10, clock=clock)  # a: 5 slots
    pool.add_phantoms("a", 4, clock.now + 60)
    s = stats(pool)["a"]
    assert (s.phantoms, s.in_flight) == (4, 0)  # TeamStat.in_flight excludes phantoms
    assert in_flight(pool)["a"] == 4  # usage() includes them
    assert not pool.acquire("a").borrowing  # 4 < 5
    assert pool.acquire("a").borrowing  # 5 >= 5


def test_phantoms_expire_by_themselves_at_until() -> None:
    clock = Clock()
    pool = make_pool(clock=clock)
    pool.add_phantoms("a", 2, clock.now + 10)
    pool.add_phantoms("a", 1, clock.now + 20)
    clock.now += 9.999
    assert stats(pool)["a"].phantoms == 3
    clock.now = 1_010.0
    assert stats(pool)["a"].phantoms == 1  # expired exactly at `until`
    assert in_flight(pool)["a"] == 1
    clock.now = 1_020.0
    assert stats(pool)["a"].phantoms == 0
    assert in_flight(pool)["a"] == 0
    assert pool.drop_phantom("a") is False


def test_phantom_expiry_seen_by_every_reader() -> None:
    clock = Clock()
    pool = make_pool(capacity=1, shares={"a": 1.0}, clock=clock)
    pool.add_phantoms("a", 1, clock.now + 1)
    assert pool.acquire("a").borrowing
    clock.now += 1
    assert pool.usage()[1] == {"a": 1}
    assert not pool.drop_phantom("a")


def test_drop_phantom_removes_the_longest_lasting() -> None:
    clock = Clock()
    pool = make_pool(clock=clock)
    pool.add_phantoms("a", 1, clock.now + 30)
    pool.add_phantoms("a", 1, clock.now + 10)
    pool.add_phantoms("a", 1, clock.now + 20)
    assert pool.drop_phantom("a") is True  # the one until +30
    clock.now += 20
    assert stats(pool)["a"].phantoms == 0  # +10 and +20 are gone; +30 was dropped
    assert pool.drop_phantom("a") is False


def test_drop_phantom_keeps_the_shorter_ones() -> None:
    clock = Clock()
    pool = make_pool(clock=clock)
    pool.add_phantoms("a", 2, clock.now + 10)
    pool.add_phantoms("a", 1, clock.now + 100)
    assert pool.drop_phantom("a")
    clock.now += 50
    assert stats(pool)["a"].phantoms == 0


def test_drop_phantom_of_team_without_phantoms() -> None:
    clock = Clock()
    pool = make_pool(clock=clock)
    pool.add_phantoms("a", 1, clock.now + 10)
    assert pool.drop_phantom("b") is False
    assert pool.drop_phantom("nobody") is False
    assert stats(pool)["a"].phantoms == 1
    assert "nobody" not in stats(pool)


@pytest.mark.parametrize(
    ("n", "delta"),
    [
        pytest.param(0, 10.0, id="n-0"),
        pytest.param(-3, 10.0, id="n-negative"),
        pytest.param(2, 0.0, id="until-now"),
        pytest.param(2, -5.0, id="until-past"),
        pytest.param(2, math.nan, id="until-nan"),
    ],
)
def test_add_phantoms_that_do_nothing(n: int, delta: float) -> None:
    clock = Clock()
    pool = make_pool(clock=clock)
    pool.add_phantoms("a", n, clock.now + delta)
    assert stats(pool)["a"].phantoms == 0
    assert in_flight(pool)["a"] == 0
    assert not pool.drop_phantom("a")


def test_phantoms_of_unknown_team_register_it_with_no_share() -> None:
    clock = Clock()
    pool = make_pool(clock=clock)
    pool.add_phantoms("x", 3, clock.now + 5)
    s = stats(pool)["x"]
    assert (s.phantoms, s.in_flight, s.reserved, s.share) == (3, 0, 0, 0.0)


def test_phantoms_charge_no_usage() -> None:
    clock = Clock()
    pool = make_pool(clock=clock)
    pool.add_phantoms("a", 3, clock.now + 5)
    clock.now += 10
    assert pool.usage()[0]["a"] == 0.0


# -- charge, set_usage, usage -------------------------------------------------------------


def test_charge_adds_usage_without_a_grant() -> None:
    pool = make_pool()
    pool.charge("a", 2.0)
    pool.charge("a", 3.0)
    pool.charge("x", 1.0)  # a team never seen before
    usage, flight = pool.usage()
    assert usage == {"a": 5.0, "b": 0.0, "c": 0.0, "x": 1.0}
    assert flight == {"a": 0, "b": 0, "c": 0, "x": 0}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param(4.5, 4.5, id="finite"),
        pytest.param(0.0, 0.0, id="zero"),
        pytest.param(-1.0, 0.0, id="negative"),
        pytest.param(math.nan, 0.0, id="nan"),
        pytest.param(math.inf, 0.0, id="inf"),
        pytest.param(-math.inf, 0.0, id="minus-inf"),
    ],
)
def test_set_usage(value: float, expected: float) -> None:
    pool = make_pool()
    pool.charge("a", 100.0)
    pool.set_usage("a", value)
    assert pool.usage()[0]["a"] == expected
    assert stats(pool)["a"].usage == expected


def test_set_usage_replaces_and_reranks() -> None:
    pool = make_pool(shares={"a": 0.5, "b": 0.5})
    pool.set_usage("a", 1.0)
    pool.set_usage("b", 2.0)
    assert {t: s.rank for t, s in stats(pool).items()} == {"a": 0, "b": 1}
    pool.set_usage("a", 3.0)
    assert {t: s.rank for t, s in stats(pool).items()} == {"b": 0, "a": 1}
    pool.set_usage("a", 0.0)
    assert stats(pool)["a"].level_fairshare == math.inf


def test_set_usage_is_as_of_now_then_decays() -> None:
    clock = Clock()
    pool = make_pool(clock=clock)
    clock.now += 5 * HOUR  # long after the pool was made
    pool.set_usage("a", 8.0)
    assert pool.usage()[0]["a"] == pytest.approx(8.0, rel=1e-12)
    clock.now += HOUR
    assert pool.usage()[0]["a"] == pytest.approx(4.0, rel=1e-12)


def test_usage_restores_into_another_pool() -> None:
    """What one owner persists, the next one restores (set_usage + add_phantoms)."""
    clock = Clock()
    old = make_pool(clock=clock)
    old.acquire("a").release(3.0)
    old.acquire("a")
    old.add_phantoms("b", 2, clock.now + 60)
    usage, flight = old.usage()
    assert flight == {"a": 1, "b": 2, "c": 0}
    new = make_pool(clock=clock)
    for team, value in usage.items():
        new.set_usage(team, value)
        new.add_phantoms(team, flight[team], clock.now + 60)
    assert new.usage() == (usage, flight)
    assert [(s.team, s.rank) for s in new.snapshot()] == [(s.team, s.rank) for s in old.snapshot()]


# -- set_capacity ----------------------------------------------------------------------------


def test_set_capacity_returns_previous_and_recomputes_reservations() -> None:
    pool = make_pool(capacity=10)
    assert pool.set_capacity(20) == 10
    assert pool.capacity == 20
    assert pool.reserved() == {"a": 10, "b": 6, "c": 4}
    assert pool.set_capacity(0) == 20
    assert pool.reserved() == {"a": 0, "b": 0, "c": 0}
    assert pool.set_capacity(3) == 0
    assert pool.reserved() == {"a": 1, "b": 1, "c": 1}  # 1.5, 0.9, 0.6


def test_set_capacity_keeps_the_standing_of_requests_in_flight() -> None:
    pool = make_pool(capacity=10, shares={"a": 0.5, "b": 0.5})
    within = [pool.acquire("a") for _ in range(5)]
    borrowers = [pool.acquire("a") for _ in range(2)]
    assert pool.set_capacity(2) == 10  # a now has 1 slot
    s = stats(pool)["a"]
    assert (s.in_flight, s.borrowing, s.reserved) == (7, 2, 1)
    assert all(not g.borrowing and g.priority == 0 for g in within)
    assert all(g.borrowing for g in borrowers)
    assert pool.acquire("a").borrowing  # judged against the new reservation
    assert pool.acquire("a").saturated
    for g in within + borrowers:
        g.release()
    assert stats(pool)["a"].borrowing == 2  # the two admitted after the change


def test_set_capacity_up_lets_new_requests_in_within_share() -> None:
    pool = make_pool(capacity=2, shares={"a": 0.5, "b": 0.5})
    pool.acquire("a")
    assert pool.acquire("a").borrowing
    pool.set_capacity(6)
    assert not pool.acquire("a").borrowing  # 2 in flight < 3
    assert pool.try_acquire("b") is not None


def test_set_capacity_keeps_unknown_teams_at_zero() -> None:
    pool = make_pool()
    pool.acquire("x")
    pool.set_capacity(100)
    assert pool.reserved()["x"] == 0


@pytest.mark.parametrize(
    "c",
    [pytest.param(-1, id="negative"), pytest.param(2.0, id="float"), pytest.param(None, id="none")],
)
def test_set_capacity_rejects_bad_values(c: object) -> None:
    pool = make_pool()
    with pytest.raises(ValueError):
        pool.set_capacity(c)  # type: ignore[arg-type]
    assert pool.capacity == 10


# -- snapshot -------------------------------------------------------------------------------


def test_snapshot_is_sorted_by_team_name() -> None:
    pool = make_pool(shares={"m": 0.5, "B": 0.25, "z": 0.25})
    pool.acquire("a")
    pool.charge("Z", 1.0)
    assert [s.team for s in pool.snapshot()] == ["B", "Z", "a", "m", "z"]


def test_snapshot_fields() -> None:
    clock = Clock()
    pool = make_pool(capacity=4, shares={"a": 0.5, "b": 1.5}, clock=clock)
    assert pool.reserved() == {"a": 1, "b": 3}
    pool.set_usage("a", 3.0)
    pool.set_usage("b", 1.0)
    pool.acquire("a", est_tokens=100)
    pool.acquire("a", Class.BATCH, est_tokens=50)
    pool.add_phantoms("a", 2, clock.now + 10)
    pool.acquire("x", est_tokens=1).release(0.0)
    got = pool.snapshot()
    assert [dataclasses.asdict(s) for s in got] == [
        {
            "team": "a",
            "share": 0.5,
            "reserved": 1,
            "in_flight": 2,
            "borrowing": 1,
            "in_flight_tokens": 150,
            "usage": 3.0,
            # S = 0.25, U = 0.75
            "level_fairshare": pytest.approx(1 / 3, rel=1e-12),
            "rank": 1,
            "phantoms": 2,
        },
        {
            "team": "b",
            "share": 1.5,
            "reserved": 3,
            "in_flight": 0,
            "borrowing": 0,
            "in_flight_tokens": 0,
            "usage": 1.0,
            # S = 0.75, U = 0.25
            "level_fairshare": pytest.approx(3.0, rel=1e-12),
            "rank": 0,
            "phantoms": 0,
        },
        {
            "team": "x",
            "share": 0.0,
            "reserved": 0,
            "in_flight": 0,
            "borrowing": 0,
            "in_flight_tokens": 0,
            "usage": 0.0,
            "level_fairshare": 0.0,
            "rank": 2,
            "phantoms": 0,
        },
    ]


def test_teamstat_is_a_frozen_dataclass() -> None:
    s = make_pool().snapshot()[0]
    assert dataclasses.is_dataclass(s)
    assert [f.name for f in dataclasses.fields(TeamStat)] == [
        "team",
        "share",
        "reserved",
        "in_flight",
        "borrowing",
        "in_flight_tokens",
        "usage",
        "level_fairshare",
        "rank",
        "phantoms",
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.rank = 3  # type: ignore[misc]


def test_empty_pool() -> None:
    pool = Pool("empty", 5, {}, clock=Clock())
    assert pool.snapshot() == []
    assert pool.reserved() == {}
    assert pool.usage() == ({}, {})
    grant = pool.acquire("x")
    assert grant.borrowing
    assert grant.priority == BORROW_BASE  # the only team: rank 0
