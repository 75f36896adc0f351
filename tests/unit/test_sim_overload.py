"""Sustained overload in the simulator: the standing rule before the within-share count
(kept as a simulator-only allocator), and the ``sustained-overload`` scenario."""

from __future__ import annotations

import itertools

import pytest

from fairshare import Class, Pool
from sim.allocators import InFlightRuleAllocator, PoolAllocator
from sim.model import Request

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
