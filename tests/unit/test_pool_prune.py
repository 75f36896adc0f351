"""Pool.prune: only idle teams without share and with negligible usage are forgotten."""

from __future__ import annotations

import time

from fairshare import Pool


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_prune_forgets_only_idle_unconfigured_teams_with_negligible_usage() -> None:
    clock = Clock()
    pool = Pool("p", 10, {"a": 0.5, "z": 0.0}, clock=clock)
    held = pool.acquire("busy")  # in flight: kept
    pool.acquire("idle-0").release(0.0)  # no usage: prunable
    pool.acquire("heavy").release(100.0)  # most of the usage: kept
    pool.add_phantoms("ghost", 1, clock.now + 60)  # a phantom counts as in flight
    assert pool.team_count == 6
    assert pool.prune(0) == 1
    assert not pool.knows("idle-0")
    assert {"a", "z", "busy", "heavy", "ghost"} == {t.team for t in pool.snapshot()}
    held.release(0.0)
    assert pool.prune(0) == 1  # "busy" is idle now
    clock.now += 61  # the phantom expired
    assert pool.prune(0) == 1
    assert {t.team for t in pool.snapshot()} == {"a", "z", "heavy"}  # configured kept


def test_prune_keeps_ranks_and_a_returning_team_starts_afresh() -> None:
    pool = Pool("p", 4, {"a": 0.5, "b": 0.5})
    pool.acquire("a").release(10.0)
    pool.acquire("b").release(1.0)
    for i in range(50):
        pool.acquire(f"x{i}").release(0.0)
    ranks = {t.team: t.rank for t in pool.snapshot() if t.team in ("a", "b")}
    assert pool.prune(2) == 50
    assert {t.team: t.rank for t in pool.snapshot()} == ranks
    pool.acquire("x1").release(0.0)
    assert pool.knows("x1")


def test_prune_costs_log_t_per_call() -> None:
    """With 20k prunable teams, forgetting them one at a time stays cheap."""
    pool = Pool("p", 4, {"a": 1.0})
    for i in range(20_000):
        pool.acquire(f"t{i}").release(0.0)
    started = time.perf_counter()
    for _ in range(1000):
        pool.prune(pool.team_count - 1)
    per_call = (time.perf_counter() - started) / 1000
    assert pool.team_count == 19_001
    assert per_call < 0.002, per_call
