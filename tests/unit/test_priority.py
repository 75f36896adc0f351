"""Priorities and Fair Tree ranks (docs/spec.md §2 and §5)."""

from __future__ import annotations

import math

import pytest

from fairshare import (
    BORROW_BASE,
    MAX_RANK,
    RANK_STEP,
    WITHIN_SHARE_BASE,
    Class,
    Pool,
)


class Clock:
    """A wall clock that moves only when told to."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_pool(
    shares: dict[str, float], capacity: int = 10, usage: dict[str, float] | None = None
) -> Pool:
    pool = Pool("p", capacity, shares, clock=Clock())
    for team, value in (usage or {}).items():
        pool.set_usage(team, value)
    return pool


def ranks(pool: Pool) -> dict[str, int]:
    return {s.team: s.rank for s in pool.snapshot()}


def borrow(pool: Pool, team: str, cls: Class = Class.INTERACTIVE) -> int:
    """The priority of a borrowing request of ``team`` (fills its reservation first)."""
    reserved = pool.reserved().get(team, 0)
    for _ in range(reserved):
        assert not pool.acquire(team).borrowing
    grant = pool.acquire(team, cls)
    assert grant.borrowing
    return grant.priority


# -- priority table -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        pytest.param(Class.INTERACTIVE, 0, id="within-interactive-is-0"),
        pytest.param(Class.BATCH, 1, id="within-batch-is-1"),
    ],
)
def test_within_share_priority(cls: Class, expected: int) -> None:
    pool = make_pool({"a": 0.5, "b": 0.5})
    grant = pool.acquire("a", cls)
    assert not grant.borrowing
    assert grant.priority == expected == WITHIN_SHARE_BASE + cls


@pytest.mark.parametrize(
    ("rank", "cls", "expected"),
    [
        pytest.param(r, k, BORROW_BASE + RANK_STEP * min(r, MAX_RANK) + k, id=f"rank{r}-{k.name}")
        for r in (0, 1, 2, 5, 8, 9, 10, 11, 14)
        for k in Class
    ],
)
def test_borrowing_priority(rank: int, cls: Class, expected: int) -> None:
    # Team t00 has the highest LF (least usage), t{rank} has rank `rank`.
    n = 15
    shares = {f"t{i:02d}": 1 / n for i in range(n)}
    pool = make_pool(shares, capacity=n, usage={f"t{i:02d}": float(i + 1) for i in range(n)})
    team = f"t{rank:02d}"
    assert ranks(pool)[team] == rank
    assert borrow(pool, team, cls) == expected


def test_borrowing_priority_values_are_the_spec_table() -> None:
    assert [BORROW_BASE + RANK_STEP * r + k for r in range(MAX_RANK + 1) for k in Class] == [
        10,
        11,
        20,
        21,
        30,
        31,
        40,
        41,
        50,
        51,
        60,
        61,
        70,
        71,
        80,
        81,
        90,
        91,
        100,
        101,
    ]


def test_class_accepts_plain_int_values() -> None:
    pool = make_pool({"a": 1.0})
    assert pool.acquire("a", 1).priority == 1  # type: ignore[arg-type]
    assert pool.acquire("a", 0).priority == 0  # type: ignore[arg-type]


# -- within share / borrowing boundary ------------------------------------------------------


def test_within_share_until_reservation_then_borrowing() -> None:
    pool = make_pool({"a": 0.8125, "b": 0.1875})
    assert pool.reserved() == {"a": 8, "b": 2}
    got = [pool.acquire("b") for _ in range(4)]
    assert [g.borrowing for g in got] == [False, False, True, True]
    assert [g.priority for g in got] == [0, 0, 10, 10]
    got[3].release()
    assert pool.acquire("b").borrowing  # 2 within share before it: the reservation
    got[0].release()
    # A within-share request ended: its slot is free again, whatever borrows meanwhile.
    assert not pool.acquire("b").borrowing
    assert pool.acquire("b").borrowing


def test_borrowing_is_judged_on_the_teams_own_count_not_the_pools() -> None:
    pool = make_pool({"a": 0.5, "b": 0.5}, capacity=2)
    assert pool.acquire("a").borrowing is False
    assert pool.acquire("a").borrowing is True
    assert pool.acquire("a").borrowing is True  # past C: still counted, saturated
    assert pool.acquire("b").borrowing is False  # b's slot is b's, whatever a does


def test_unknown_team_only_borrows() -> None:
    pool = make_pool({"a": 0.5, "b": 0.5}, usage={"a": 1.0, "b": 2.0})
    grants = [pool.acquire("x") for _ in range(3)]
    assert all(g.borrowing for g in grants)
    # LF(x) = 0 ranks below a (LF > 1) and b (LF < 1): rank 2.
    assert [g.priority for g in grants] == [BORROW_BASE + 2 * RANK_STEP] * 3
    stat = {s.team: s for s in pool.snapshot()}["x"]
    assert stat.share == 0.0
    assert stat.reserved == 0
    assert stat.level_fairshare == 0.0
    assert stat.rank == 2
    assert pool.reserved()["x"] == 0


def test_unknown_team_in_a_pool_without_usage_ranks_after_teams_with_share() -> None:
    pool = make_pool({"a": 1.0})
    assert borrow(pool, "x") == BORROW_BASE + RANK_STEP  # a has LF inf (rank 0), x LF 0


def test_capacity_zero_everyone_borrows() -> None:
    pool = make_pool({"a": 1.0}, capacity=0)
    grant = pool.acquire("a")
    assert grant.borrowing
    assert grant.saturated
    assert grant.priority == BORROW_BASE


# -- ranks ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shares", "usage", "expected_ranks"),
    [
        pytest.param(
            {"a": 0.5, "b": 0.5},
            {},
            {"a": 0, "b": 0},
            id="no-usage-all-inf-tie",
        ),
        pytest.param(
            {"a": 0.5, "b": 0.25, "c": 0.25},
            {"a": 2.0, "b": 1.0, "c": 1.0},
            {"a": 0, "b": 0, "c": 0},
            id="equal-lf-share-a-rank",
        ),
        pytest.param(
            {"a": 0.5, "b": 0.25, "c": 0.25},
            {"a": 4.0, "b": 1.0, "c": 1.0},
            {"b": 0, "c": 0, "a": 1},
            id="dense-rank-after-tie",
        ),
        pytest.param(
            {"a": 0.25, "b": 0.25, "c": 0.25, "d": 0.25},
            {"a": 1.0, "b": 1.0, "c": 2.0, "d": 3.0},
            {"a": 0, "b": 0, "c": 1, "d": 2},
            id="dense-not-competition-rank",
        ),
        pytest.param(
            {"a": 0.5, "b": 0.5},
            {"a": 1.0},
            {"b": 0, "a": 1},
            id="share-without-usage-is-inf-rank-0",
        ),
        pytest.param(
            {"a": 0.5, "b": 0.5, "z": 0.0},
            {"a": 1.0, "b": 3.0},
            {"a": 0, "b": 1, "z": 2},
            id="zero-share-lf-0-last",
        ),
        pytest.param(
            {"a": 0.5, "b": 0.5, "z": 0.0},
            {"a": 1.0, "b": 3.0, "z": 100.0},
            {"a": 0, "b": 1, "z": 2},
            id="zero-share-with-usage-lf-0-last",
        ),
        pytest.param(
            {"y": 0.0, "z": 0.0},
            {"y": 1.0},
            {"y": 0, "z": 0},
            id="shares-sum-to-0-every-lf-0",
        ),
        pytest.param(
            {"a": 1.0, "y": 0.0, "z": 0.0},
            {"a": 5.0, "y": 1.0},
            {"a": 0, "y": 1, "z": 1},
            id="zero-shares-tie-at-lf-0",
        ),
        pytest.param(
            {"a": 0.8125, "b": 0.1875},
            {"a": 1.0, "b": 1.0},
            {"a": 0, "b": 1},
            id="same-usage-larger-share-ranks-first",
        ),
        pytest.param(
            {"a": 0.3, "b": 0.1},
            {"a": 3.0, "b": 1.0},
            {"a": 0, "b": 0},
            id="equal-lf-from-inexact-shares",
        ),
    ],
)
def test_rank(
    shares: dict[str, float], usage: dict[str, float], expected_ranks: dict[str, int]
) -> None:
    assert ranks(make_pool(shares, usage=usage)) == expected_ranks


def test_more_than_ten_levels_rank_uncapped_priority_capped() -> None:
    n = 13
    shares = {f"t{i:02d}": 1 / n for i in range(n)}
    pool = make_pool(shares, capacity=0, usage={t: float(i + 1) for i, t in enumerate(shares)})
    assert ranks(pool) == {t: i for i, t in enumerate(shares)}
    for i, team in enumerate(shares):
        expected = BORROW_BASE + RANK_STEP * min(i, MAX_RANK)
        assert pool.acquire(team).priority == expected
        assert pool.acquire(team, Class.BATCH).priority == expected + 1
    assert max(g.rank for g in pool.snapshot()) == n - 1


def test_rank_is_over_all_known_teams_not_only_borrowers() -> None:
    pool = make_pool({"a": 0.5, "b": 0.5}, capacity=2, usage={"a": 1.0, "b": 2.0})
    # Only b borrows, yet a (higher LF, idle) keeps rank 0 and b gets rank 1.
    assert borrow(pool, "b") == BORROW_BASE + RANK_STEP


def test_unseen_team_joins_the_ranking_once_seen() -> None:
    pool = make_pool({"a": 1.0})
    assert {s.team for s in pool.snapshot()} == {"a"}
    pool.acquire("x").release(1.0)
    assert ranks(pool) == {"a": 0, "x": 1}


def test_charging_moves_a_team_down_the_ranking() -> None:
    pool = make_pool({"a": 0.5, "b": 0.5}, usage={"a": 1.0, "b": 2.0})
    assert ranks(pool) == {"a": 0, "b": 1}
    pool.acquire("a").release(2.0)  # a: 3, b: 2
    assert ranks(pool) == {"b": 0, "a": 1}
    pool.charge("b", 1.0)  # 3 and 3: tie
    assert ranks(pool) == {"a": 0, "b": 0}


@pytest.mark.parametrize(
    ("shares", "usage", "expected"),
    [
        pytest.param({"a": 0.5, "b": 0.5}, {"a": 1.0, "b": 3.0}, {"a": 2.0, "b": 2 / 3}, id="s/u"),
        pytest.param(
            {"a": 2.0, "b": 2.0}, {"a": 1.0, "b": 3.0}, {"a": 2.0, "b": 2 / 3}, id="unnormalised"
        ),
        pytest.param({"a": 0.5, "b": 0.5}, {"a": 1.0}, {"a": 0.5, "b": math.inf}, id="inf"),
        pytest.param({"a": 0.5, "z": 0.0}, {"z": 1.0}, {"a": math.inf, "z": 0.0}, id="no-share"),
        pytest.param({"y": 0.0}, {"y": 1.0}, {"y": 0.0}, id="shares-sum-0"),
    ],
)
def test_level_fairshare(
    shares: dict[str, float], usage: dict[str, float], expected: dict[str, float]
) -> None:
    got = {s.team: s.level_fairshare for s in make_pool(shares, usage=usage).snapshot()}
    assert got == pytest.approx(expected, rel=1e-12)


def test_a_snapshot_shows_the_priority_the_next_borrower_gets() -> None:
    """``TeamStat.borrow_priority`` (the status page's column) is what ``acquire`` gives
    the team's next borrowing request, for every rank."""
    pool = make_pool({"a": 0.5, "b": 0.3, "c": 0.2}, usage={"a": 40.0, "b": 5.0, "c": 1.0})
    for team in ("a", "b", "c"):
        shown = {s.team: s.borrow_priority for s in pool.snapshot()}[team]
        assert borrow(pool, team) == shown
    assert len({s.borrow_priority for s in pool.snapshot()}) == 3
