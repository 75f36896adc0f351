"""The lending limit in the simulator: borrowers held at the gateway
(``allocators.LendingAllocator``) and the ``instant-start`` scenario."""

from __future__ import annotations

import pytest

from fairshare import Class
from fairshare.sim.allocators import FcfsAllocator, LendingAllocator, PoolSpec, lending
from fairshare.sim.engine import Simulator
from fairshare.sim.model import Hardware, Request
from fairshare.sim.scenarios import SCENARIOS, instant_start
from fairshare.sim.scenarios import lending as scenario

pytestmark = pytest.mark.timeout(60)

# 1 ms per prompt token, 10 ms per output token, no KV limit: 10 + 100 tokens run 1.01 s.
HW = Hardware(prefill_s_per_token=0.001, decode_s_per_token=0.01)


def _two_slots(lend: float, *, wait_s: float = 600.0) -> tuple[Simulator, LendingAllocator]:
    """C = 2, reservations a 1 and b 1; a lends ``lend`` of its idle slot."""
    sim = Simulator(capacity=2, hardware=HW, allocator=FcfsAllocator(), horizon_s=10.0)
    spec = PoolSpec(name="p", capacity=2, shares={"a": 0.5, "b": 0.5}, half_life_s=600.0)
    allocator = lending({"a": lend}, wait_s=wait_s)(spec, sim)
    sim.allocator = allocator
    return sim, allocator


def _send(sim: Simulator, at: float, team: str, sent: dict[str, Request], name: str) -> None:
    def go() -> None:
        sent[name] = sim.send(team, Class.BATCH, 10, 100)

    sim.at(at, go)


def _b_borrows_then_a_arrives(
    lend: float, *, wait_s: float = 600.0
) -> tuple[dict[str, Request], LendingAllocator, list[bool]]:
    """b sends two requests at 0 s (the second borrows), a one at 0.5 s; whether b's
    second was held right after it was sent."""
    sim, allocator = _two_slots(lend, wait_s=wait_s)
    sent: dict[str, Request] = {}
    _send(sim, 0.0, "b", sent, "b1")
    _send(sim, 0.0, "b", sent, "b2")
    held: list[bool] = []
    sim.at(0.0, lambda: held.append(sent["b2"].held and sent["b2"] not in sim.in_flight()))
    _send(sim, 0.5, "a", sent, "a1")
    sim.run()
    return sent, allocator, held


def test_a_borrower_is_held_while_the_slot_is_kept_back_and_sent_when_one_is_lent() -> None:
    sent, allocator, held = _b_borrows_then_a_arrives(0.0)
    b1, b2, a1 = sent["b1"], sent["b2"], sent["a1"]
    # b2 would borrow a's idle slot, which a keeps back: held at the gateway, not in vLLM.
    assert held == [True]
    # a's within-share request finds its slot free and starts at once.
    assert not a1.borrowing and a1.first_start_s == 0.5
    # b1 ends at 1.01 s: the held request is admitted with the standing decided then
    # (b's reservation is free again: within share) and starts in b1's slot.
    assert b1.finish_s == b2.first_start_s == pytest.approx(1.01)
    assert not b2.held and not b2.borrowing and b2.priority == 1
    assert b2.held_s == pytest.approx(1.01) and a1.held_s == b1.held_s == 0.0
    assert allocator.waits_ended == 0 and len(allocator.held) == 0


def test_a_held_borrower_whose_wait_ends_borrows_anyway() -> None:
    sent, allocator, _ = _b_borrows_then_a_arrives(0.0, wait_s=0.3)
    b2, a1 = sent["b2"], sent["a1"]
    # At 0.3 s b2 borrows a's kept slot after all, so a waits for b's first request.
    assert allocator.waits_ended == 1
    assert b2.borrowing and b2.priority >= 10 and b2.first_start_s == pytest.approx(0.3)
    assert a1.first_start_s == pytest.approx(1.01)


def test_lending_everything_holds_a_borrower_only_while_the_pool_is_full() -> None:
    sent, allocator, held = _b_borrows_then_a_arrives(1.0)
    # b2 takes a's idle slot at once; a's request waits in vLLM for the first to end.
    assert held == [False] and sent["b2"].first_start_s == 0.0
    assert sent["a1"].first_start_s == pytest.approx(1.01)
    assert allocator.waits_ended == 0


def test_only_a_held_request_can_be_dispatched() -> None:
    sim, _ = _two_slots(0.0)
    req = sim.send("a", Class.INTERACTIVE, 10, 10)
    with pytest.raises(ValueError, match="not held"):
        sim.dispatch(req)


def test_instant_start_meets_its_targets_at_a_tenth_of_the_horizon() -> None:
    assert SCENARIOS["instant-start"] is instant_start
    result = instant_start(scale=0.1)
    missed = [f"{t.text}: {t.value:.3f} vs {t.bound:.3f}" for t in result.targets if not t.met]
    assert result.ok, missed
    figures = result.figures
    assert [x for x, _ in result.sweep] == list(scenario.LENDS)
    # Lending less costs the flood throughput and the pool utilization, monotonically.
    for key in ("utilization_pct", "flood_per_min"):
        values = [figures[f"{p}{key}"] for _, p in result.sweep]
        assert values == sorted(values, reverse=True), key
    assert figures["lend0_waits_ended"] == 0 and figures["lend0_held"] > 0
    assert figures["unlimited_held"] == 0
