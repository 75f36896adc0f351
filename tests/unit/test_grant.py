"""Grant and release (docs/spec.md §11; consumption rules in §6)."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import pytest

from fairshare import Class, Grant, Pool

THREADS = 8


class Clock:
    """A wall clock that moves only when told to."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_pool(capacity: int = 4) -> Pool:
    return Pool("p", capacity, {"a": 0.5, "b": 0.5}, half_life_s=0, clock=Clock())


def stat(pool: Pool, team: str):  # type: ignore[no-untyped-def]
    return {s.team: s for s in pool.snapshot()}[team]


def run_at_once(n: int, target: Callable[[], None]) -> None:
    """Runs ``target`` in n threads released by one barrier, and re-raises their errors."""
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def body() -> None:
        try:
            barrier.wait()
            target()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=body) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


# -- the record -----------------------------------------------------------------------------


def test_grant_fields() -> None:
    pool = make_pool()
    grant = pool.acquire("a", Class.BATCH, est_tokens=123)
    assert grant.team == "a"
    assert grant.priority == 1
    assert grant.borrowing is False
    assert grant.saturated is False
    assert grant.est_tokens == 123
    assert isinstance(grant.priority, int)
    assert "team='a'" in repr(grant)


@pytest.mark.parametrize(
    "field", ["priority", "borrowing", "saturated", "team", "est_tokens"], ids=str
)
def test_grant_is_frozen_looking(field: str) -> None:
    grant = make_pool().acquire("a")
    with pytest.raises(AttributeError):
        setattr(grant, field, 5)


# -- release --------------------------------------------------------------------------------


def test_release_ends_in_flight_borrowing_and_tokens_and_charges() -> None:
    pool = make_pool(capacity=2)
    within = pool.acquire("a", est_tokens=10)
    borrower = pool.acquire("a", est_tokens=5)
    assert borrower.borrowing
    s = stat(pool, "a")
    assert (s.in_flight, s.borrowing, s.in_flight_tokens) == (2, 1, 15)
    borrower.release(2.0)
    s = stat(pool, "a")
    assert (s.in_flight, s.borrowing, s.in_flight_tokens, s.usage) == (1, 0, 10, 2.0)
    within.release(3.0)
    s = stat(pool, "a")
    assert (s.in_flight, s.borrowing, s.in_flight_tokens, s.usage) == (0, 0, 0, 5.0)
    assert pool.usage() == ({"a": 5.0, "b": 0.0}, {"a": 0, "b": 0})


def test_release_default_consumption_is_zero() -> None:
    pool = make_pool()
    pool.acquire("a").release()
    assert stat(pool, "a").usage == 0.0
    assert stat(pool, "a").in_flight == 0


def test_release_is_idempotent() -> None:
    pool = make_pool()
    grant = pool.acquire("a", est_tokens=7)
    other = pool.acquire("a")
    grant.release(1.0)
    grant.release(1.0)
    grant.release(5.0)
    s = stat(pool, "a")
    assert (s.in_flight, s.in_flight_tokens, s.usage) == (1, 0, 1.0)
    assert grant.released
    assert not other.released


def test_release_by_eight_threads_at_once_charges_exactly_once() -> None:
    for _ in range(50):
        pool = make_pool()
        keep = pool.acquire("a", est_tokens=1)
        grant = pool.acquire("a", est_tokens=10)
        run_at_once(THREADS, lambda g=grant: g.release(1.0))  # type: ignore[misc]
        s = stat(pool, "a")
        assert (s.in_flight, s.in_flight_tokens, s.usage) == (1, 1, 1.0)
        assert keep.released is False


@pytest.mark.parametrize(
    "consumed",
    [
        pytest.param(math.nan, id="nan"),
        pytest.param(-1.0, id="negative"),
        pytest.param(-math.inf, id="minus-inf"),
        pytest.param(math.inf, id="inf"),
        pytest.param(0.0, id="zero"),
        pytest.param(-0.0, id="minus-zero"),
    ],
)
def test_bad_consumption_counts_zero_but_still_releases(consumed: float) -> None:
    pool = make_pool()
    pool.charge("a", 1.0)
    grant = pool.acquire("a")
    grant.release(consumed)
    s = stat(pool, "a")
    assert s.usage == 1.0
    assert s.in_flight == 0
    assert math.isfinite(s.level_fairshare)


@pytest.mark.parametrize(
    ("consumed", "expected"),
    [
        pytest.param(math.nan, 0.0, id="nan"),
        pytest.param(-2.0, 0.0, id="negative"),
        pytest.param(math.inf, 0.0, id="inf"),
        pytest.param(2.5, 2.5, id="finite"),
        pytest.param(3, 3.0, id="int"),
    ],
)
def test_charge_sanitises_consumption(consumed: float, expected: float) -> None:
    pool = make_pool()
    pool.charge("a", consumed)
    assert stat(pool, "a").usage == expected
    assert stat(pool, "a").in_flight == 0


def test_release_after_set_capacity_and_rank_changes_still_balances() -> None:
    pool = make_pool(capacity=2)
    grants = [pool.acquire("a") for _ in range(3)]
    pool.set_capacity(10)
    for g in grants:
        g.release(1.0)
    s = stat(pool, "a")
    assert (s.in_flight, s.borrowing, s.usage) == (0, 0, 3.0)


# -- Grant.remote ---------------------------------------------------------------------------


def test_remote_grant_fields_and_single_call() -> None:
    calls: list[float] = []
    grant = Grant.remote("a", 21, True, True, calls.append)
    assert (grant.team, grant.priority, grant.borrowing, grant.saturated) == ("a", 21, True, True)
    assert grant.est_tokens == 0
    grant.release(2.5)
    grant.release(4.0)
    grant.release()
    assert calls == [2.5]
    assert grant.released


@pytest.mark.parametrize(
    ("consumed", "expected"),
    [
        pytest.param(math.nan, 0.0, id="nan"),
        pytest.param(-1.0, 0.0, id="negative"),
        pytest.param(math.inf, 0.0, id="inf"),
        pytest.param(1.25, 1.25, id="finite"),
    ],
)
def test_remote_grant_passes_sanitised_consumption(consumed: float, expected: float) -> None:
    calls: list[float] = []
    Grant.remote("a", 0, False, False, calls.append).release(consumed)
    assert calls == [expected]


class Recorder:
    """A release callback that records its calls, safe from several threads."""

    def __init__(self) -> None:
        self.calls: list[float] = []
        self._lock = threading.Lock()

    def __call__(self, amount: float) -> None:
        with self._lock:
            self.calls.append(amount)


def test_remote_grant_released_by_eight_threads_calls_once() -> None:
    for _ in range(50):
        record = Recorder()
        grant = Grant.remote("a", 10, True, False, record)
        run_at_once(THREADS, lambda g=grant: g.release(1.0))  # type: ignore[misc]
        assert record.calls == [1.0]


def test_remote_grant_is_counted_in_no_pool() -> None:
    pool = make_pool()
    grant = Grant.remote("a", 0, False, False, lambda _: None)
    grant.release(3.0)
    assert pool.usage() == ({"a": 0.0, "b": 0.0}, {"a": 0, "b": 0})
