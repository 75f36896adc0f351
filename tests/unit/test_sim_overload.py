"""Sustained overload in the simulator: the standing rule before the within-share count
(kept as a simulator-only allocator), and the ``sustained-overload`` scenario."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path

import pytest

from fairshare import Class, Pool
from fairshare.sim import command
from fairshare.sim.allocators import (
    AllocatorFactory,
    FcfsAllocator,
    InFlightRuleAllocator,
    PoolAllocator,
    in_flight_rule,
    in_process,
)
from fairshare.sim.engine import Simulator
from fairshare.sim.holdings import Holdings, sample_holdings
from fairshare.sim.model import Hardware, Request
from fairshare.sim.scenarios import SCENARIOS, ScenarioResult, overload, sustained_overload
from fairshare.sim.scenarios.runs import Setup, run
from fairshare.sim.workloads import BATCH, INTERACTIVE, Flood, Mix, Shape, Tokens

pytestmark = pytest.mark.timeout(60)


def _churn(allocator: PoolAllocator, steps: int) -> list[int]:
    """Team a keeps 6 requests in flight; each step the oldest ends and the next is sent.

    Returns:
        a's within-share requests in flight after each step.
    """
    rid = itertools.count()

    def send() -> Request:
        req = Request(
            rid=next(rid),
            team="a",
            cls=Class.INTERACTIVE,
            arrival_s=0.0,
            prompt_tokens=10,
            output_tokens=10,
            service_s=1.0,
        )
        allocator.admit(req)
        return req

    in_flight = [send() for _ in range(6)]
    held = []
    for _ in range(steps):
        allocator.release(in_flight.pop(0), 1.0)
        in_flight.append(send())
        held.append(sum(1 for r in in_flight if not r.borrowing))
    return held


def _pool() -> Pool:
    return Pool("p", 10, {"a": 0.4, "b": 0.6}, clock=lambda: 0.0)


def test_the_old_rule_erodes_a_busy_teams_reservation_and_the_core_keeps_it() -> None:
    # Reservation 4: under the rule that counted every request in flight, each
    # within-share request that ends is replaced by a borrower (issue 26's table).
    assert _churn(InFlightRuleAllocator(_pool()), 8) == [3, 2, 1, 0, 0, 0, 0, 0]
    assert _churn(PoolAllocator(_pool()), 8) == [4] * 8


def test_the_old_rule_uses_the_pools_priorities_usage_and_phantoms() -> None:
    pool = _pool()
    pool.add_phantoms("a", 3, until=10.0, borrowing=True)
    allocator = InFlightRuleAllocator(pool)
    req = Request(1, "a", Class.BATCH, 0.0, 10, 10, 1.0)
    allocator.admit(req)
    # Borrowing phantoms counted towards the reservation then: 3 < 4, within share.
    assert (req.priority, req.borrowing) == (1, False)
    second = Request(2, "a", Class.BATCH, 0.0, 10, 10, 1.0)
    allocator.admit(second)
    assert second.borrowing and second.priority == pool.snapshot()[0].borrow_priority + 1
    allocator.release(req, 2.5)
    assert pool.usage()[0]["a"] == pytest.approx(2.5)
    assert pool.usage()[1]["a"] == 3 + 1
    # A team the pool does not know has no reservation: the pool decides (it borrows).
    stranger = Request(3, "z", Class.INTERACTIVE, 0.0, 10, 10, 1.0)
    allocator.admit(stranger)
    assert stranger.borrowing and stranger.grant is not None


def _flood_holdings(fairshare: AllocatorFactory, horizon_s: float = 60.0) -> Holdings:
    """Team a (reservation 2 of C = 4) keeps 3 fixed-size requests in flight; b none."""
    shape = Shape(Class.INTERACTIVE, Tokens(100, 0.0), Tokens(50, 0.0))  # 1.01 s each
    sampled: list[Holdings] = []
    setup = Setup(
        capacity=4,
        shares={"a": 0.5, "b": 0.5},
        sources=[Flood("a", outstanding=3, shape=shape)],
        horizon_s=horizon_s,
        seed=1,
        half_life_s=600.0,
        pool="p",
        controls=lambda sim: sampled.append(sample_holdings(sim, ["a", "b"], every_s=0.25)),
    )
    run(setup, fairshare=fairshare)
    return sampled[0]


def test_holdings_sample_each_teams_requests_in_flight_and_within_share() -> None:
    held = _flood_holdings(in_process)
    assert held.times[:3] == [0.0, 0.25, 0.5] and held.times[-1] <= 60.0
    assert held.in_flight["a"][0] == 0  # sampled before the flood's first requests
    assert set(held.in_flight["a"][1:]) == {3} and set(held.in_flight["b"]) == {0}
    assert set(held.within["a"][1:]) == {2}
    assert held.held_fraction("a", 2) == held.held_fraction("b", 2) == 1.0
    assert held.mean(held.within_running, "a", after_s=1.0) == 2.0
    assert held.running_fraction("a", 2) == 1.0 and set(held.running["a"][1:]) == {3}
    assert math.isnan(held.held_fraction("a", 2, after_s=61.0))
    # The rule before: after the first two finish, a holds none within share.
    old = _flood_holdings(in_flight_rule)
    assert set(old.within["a"][old.times.index(5.0) :]) == {0}
    assert old.held_fraction("a", 2, after_s=5.0) == 0.0
    with pytest.raises(ValueError, match="every_s"):
        sample_holdings(
            Simulator(capacity=1, hardware=Hardware(), allocator=FcfsAllocator(), horizon_s=1.0),
            ["a"],
            0.0,
        )


def test_a_mix_draws_its_shapes_by_weight() -> None:
    rng = random.Random(1)
    assert {Mix(((INTERACTIVE, 1.0), (BATCH, 0.0))).draw(rng) for _ in range(50)} == {INTERACTIVE}
    drawn = [Mix(((INTERACTIVE, 3.0), (BATCH, 1.0))).draw(rng) for _ in range(4000)]
    assert drawn.count(BATCH) / len(drawn) == pytest.approx(0.25, abs=0.03)


# -- the sustained-overload scenario, at a tenth of the report's horizon -----------------


@pytest.fixture(scope="module")
def overloaded() -> ScenarioResult:
    return sustained_overload(scale=0.1)


def test_sustained_overload_meets_its_targets(overloaded: ScenarioResult) -> None:
    assert SCENARIOS["sustained-overload"] is sustained_overload
    missed = [f"{t.text}: {t.value:.3f} vs {t.bound:.3f}" for t in overloaded.targets if not t.met]
    assert overloaded.ok, missed
    figures = overloaded.figures
    for team in overload.SHARES:
        # The current rule holds the reservation at every sample; the rule before, never.
        assert figures[f"{team}_held_pct"] == 100.0
        assert figures[f"{team}_within_mean"] == figures[f"reserved_{team}"]
        assert figures[f"{team}_held_pct_before"] == 0.0
        assert figures[f"{team}_within_requests_before"] < figures[f"{team}_within_requests"]
        # A team has its reservation's worth running more often under the current rule.
        assert figures[f"{team}_running_pct"] > figures[f"{team}_running_pct_before"]
    assert figures["within_preempted_beside_borrower"] == 0
    assert sum(figures[f"preemptions_{t}"] for t in overload.SHARES) > 0  # KV pressure


def test_sustained_overload_compares_the_rule_before(overloaded: ScenarioResult) -> None:
    assert (
        list(overloaded.runs)
        == list(overloaded.holdings)
        == [
            overload.SHIPPED,
            overload.BEFORE,
        ]
    )
    assert overloaded.compared == overload.BEFORE
    held = [c for c in overloaded.comparisons if "within share, after the warm-up" in c.text]
    assert len(held) == len(overload.SHARES)
    assert all((c.value, c.other) == (100.0, 0.0) for c in held)
    # Where the wait target stops holding: the KV cache holds fewer requests of the long
    # mix than are reserved; the standing still holds.
    figures = overloaded.figures
    assert figures["kv_holds_requests"] > sum(figures[f"reserved_{t}"] for t in overload.SHARES)
    assert figures["kv_holds_requests_long_mix"] < sum(
        figures[f"reserved_{t}"] for t in overload.SHARES
    )
    for team in overload.SHARES:
        assert figures[f"{team}_held_pct_long_mix"] == 100.0
        assert figures[f"{team}_within_p99_wait_s_long_mix"] > figures["mean_service_s_long_mix"]


def test_the_cli_draws_the_within_share_requests_held(tmp_path: Path) -> None:
    out = tmp_path / "simulation"
    args = ["--scenario", "sustained-overload", "--out", str(out), "--scale", "0.05", "--check"]
    assert command.main(args) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "sustained-overload-preemptions.png",
        "sustained-overload-served.png",
        "sustained-overload-waits.png",
        "sustained-overload-within.png",
    ]
    text = (tmp_path / "simulation.md").read_text(encoding="utf-8")
    assert "](simulation/sustained-overload-within.png)" in text
