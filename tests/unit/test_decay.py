"""Usage decay (docs/spec.md §6)."""

from __future__ import annotations

import math

import pytest

from fairshare import Pool

HOUR = 3600.0


class Clock:
    """A wall clock that moves only when told to."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def usage_of(pool: Pool, team: str) -> float:
    return pool.usage()[0][team]


def close(got: float, want: float) -> bool:
    return abs(got - want) <= 1e-9 * abs(want)


@pytest.mark.parametrize(
    ("half_life_s", "elapsed", "expected_fraction"),
    [
        pytest.param(HOUR, HOUR, 0.5, id="one-half-life-halves"),
        pytest.param(HOUR, 2 * HOUR, 0.25, id="two-half-lives-quarter"),
        pytest.param(HOUR, HOUR / 2, 2**-0.5, id="half-a-half-life"),
        pytest.param(7 * 24 * HOUR, 7 * 24 * HOUR, 0.5, id="default-week"),
        pytest.param(1.0, 0.25, 2**-0.25, id="short-step"),
        pytest.param(HOUR, 50 * HOUR, 2**-50, id="fifty-half-lives"),
        pytest.param(HOUR, 0.0, 1.0, id="no-time-no-decay"),
    ],
)
def test_usage_decays_exactly(half_life_s: float, elapsed: float, expected_fraction: float) -> None:
    clock = Clock()
    pool = Pool("p", 10, {"a": 1.0}, half_life_s=half_life_s, clock=clock)
    pool.acquire("a").release(100.0)
    clock.now += elapsed
    assert close(usage_of(pool, "a"), 100.0 * expected_fraction)
    stat = pool.snapshot()[0]
    assert close(stat.usage, 100.0 * expected_fraction)


def test_half_life_via_set_usage_and_charge_at_different_times() -> None:
    clock = Clock()
    pool = Pool("p", 10, {"a": 0.5, "b": 0.5}, half_life_s=HOUR, clock=clock)
    pool.set_usage("a", 8.0)
    clock.now += HOUR
    pool.charge("a", 4.0)  # 8 decayed to 4, plus 4
    assert close(usage_of(pool, "a"), 8.0)
    clock.now += HOUR
    assert close(usage_of(pool, "a"), 4.0)
    pool.set_usage("b", 3.0)  # as of now
    assert close(usage_of(pool, "b"), 3.0)
    clock.now += 2 * HOUR
    assert close(usage_of(pool, "b"), 0.75)


def test_decay_survives_many_half_lives_with_charges() -> None:
    """Stored usage is rescaled now and then; decay must stay exact across that."""
    clock = Clock()
    pool = Pool("p", 10, {"a": 0.5, "b": 0.5}, half_life_s=1.0, clock=clock)
    expected = 0.0
    for _ in range(400):  # 400 half-lives: well past every rescale threshold
        pool.charge("a", 1.0)
        expected += 1.0
        clock.now += 1.0
        expected *= 0.5
    assert close(usage_of(pool, "a"), expected)
    assert close(expected, 1.0)  # 1/2 + 1/4 + ... converges to 1
    assert usage_of(pool, "b") == 0.0
    ranks = {s.team: s.rank for s in pool.snapshot()}
    assert ranks == {"b": 0, "a": 1}


def test_decay_after_a_very_long_idle_time_is_zero_not_nan() -> None:
    clock = Clock()
    pool = Pool("p", 10, {"a": 1.0}, half_life_s=1.0, clock=clock)
    pool.charge("a", 5.0)
    clock.now += 1e6
    assert usage_of(pool, "a") == pytest.approx(0.0, abs=1e-300)
    pool.charge("a", 2.0)
    assert close(usage_of(pool, "a"), 2.0)


def test_decay_keeps_the_order_of_teams() -> None:
    clock = Clock()
    pool = Pool("p", 10, {"a": 0.5, "b": 0.5}, half_life_s=HOUR, clock=clock)
    pool.charge("a", 1.0)
    pool.charge("b", 2.0)
    before = {s.team: (s.rank, s.level_fairshare) for s in pool.snapshot()}
    clock.now += 5 * HOUR
    after = {s.team: (s.rank, s.level_fairshare) for s in pool.snapshot()}
    assert before.keys() == after.keys()
    for team, (rank, lf) in before.items():
        assert after[team][0] == rank
        assert close(after[team][1], lf)  # S/U is a ratio: a common decay factor cancels


def test_old_usage_weighs_less_than_new() -> None:
    """Equal usage charged one half-life apart: the older one counts half."""
    clock = Clock()
    pool = Pool("p", 10, {"a": 0.5, "b": 0.5}, half_life_s=HOUR, clock=clock)
    pool.charge("a", 2.0)
    clock.now += HOUR
    pool.charge("b", 1.0)
    assert {s.team: s.rank for s in pool.snapshot()} == {"a": 0, "b": 0}  # 1 and 1
    clock.now += HOUR
    pool.charge("b", 0.5)
    assert {s.team: s.rank for s in pool.snapshot()} == {"a": 0, "b": 1}


def test_half_life_zero_keeps_usage_forever() -> None:
    clock = Clock()
    pool = Pool("p", 10, {"a": 1.0}, half_life_s=0, clock=clock)
    assert pool.decay_rate == 0.0
    pool.acquire("a").release(7.5)
    for step in (1.0, 1e6, 1e9, 1e12):
        clock.now += step
        assert usage_of(pool, "a") == 7.5
    pool.charge("a", 2.5)
    assert usage_of(pool, "a") == 10.0


@pytest.mark.parametrize(
    ("half_life_s", "expected"),
    [
        pytest.param(HOUR, math.log(2) / HOUR, id="hour"),
        pytest.param(7 * 24 * HOUR, math.log(2) / (7 * 24 * HOUR), id="week"),
        pytest.param(1, math.log(2), id="int-second"),
        pytest.param(0.0, 0.0, id="off"),
    ],
)
def test_decay_rate(half_life_s: float, expected: float) -> None:
    pool = Pool("p", 1, {"a": 1.0}, half_life_s=half_life_s, clock=Clock())
    assert pool.decay_rate == pytest.approx(expected, rel=1e-15)


def test_default_half_life_is_a_week() -> None:
    pool = Pool("p", 1, {"a": 1.0}, clock=Clock())
    assert pool.decay_rate == pytest.approx(math.log(2) / (7 * 24 * 3600.0), rel=1e-15)


@pytest.mark.parametrize(
    "half_life_s",
    [
        pytest.param(-1.0, id="negative"),
        pytest.param(math.nan, id="nan"),
        pytest.param(math.inf, id="inf"),
    ],
)
def test_bad_half_life_is_rejected(half_life_s: float) -> None:
    with pytest.raises(ValueError):
        Pool("p", 1, {"a": 1.0}, half_life_s=half_life_s, clock=Clock())
