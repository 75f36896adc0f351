"""Borrowers held at the owner by the lending limit (``ha.owned.waiting``), on a fake clock.

The pool: C = 4 shared by "a" (reservation 2, lends nothing) and "b" (reservation 2). A
team without share, "x", borrows. With "a" idle it keeps its 2 reserved slots back, so
borrowers may take 2 slots; a third that may wait is held until one opens, and is answered
then, or at its wait's end per ``on_wait_end``.
"""

from __future__ import annotations

import asyncio

import pytest
from owned_pool import owned_pool

from fairshare import Class
from fairshare.modes import WaitEnd
from ha.api import Decision, GrantRef, LimitExceeded
from ha.clock import FakeClock, settle
from ha.owned.journal import MemoryLog
from ha.owned.pool import NotDeciding, OwnedPool
from ha.settings import PoolConfig

pytestmark = pytest.mark.timeout(30)

SHARES = {"a": 0.5, "b": 0.5}


def pool(**kwargs: object) -> tuple[OwnedPool, FakeClock]:
    config = PoolConfig("p", 4, SHARES, lend={"a": 0.0}, **kwargs)  # type: ignore[arg-type]
    clock = FakeClock()
    return owned_pool(config, 1, clock, MemoryLog()), clock


async def acquire(
    owned: OwnedPool, team: str = "x", wait_s: float = 0.0, cls: Class = Class.INTERACTIVE
) -> Decision:
    return await owned.acquire(
        team=team,
        cls=cls,
        est_tokens=0,
        holder="gw",
        request_id="",
        try_only=False,
        wait_s=wait_s,
    )


def release(owned: OwnedPool, decision: Decision) -> None:
    owned.release(GrantRef.decode(decision.grant_id), 1.0)


async def test_a_borrower_past_the_limit_is_held_until_a_slot_opens() -> None:
    owned, clock = pool()
    first = [await acquire(owned, wait_s=10) for _ in range(2)]  # the 2 lent slots
    assert all(d.borrowing for d in first)
    held = asyncio.ensure_future(acquire(owned, wait_s=10))
    await settle()
    assert not held.done()
    assert owned.held_back() == {"x": 1}
    assert owned.view().held["x"] == 1 and owned.view().held["a"] == 0
    release(owned, first[0])
    await settle()
    decision = await held
    assert decision.granted and decision.borrowing
    assert owned.held_back() == {}
    # Team a's reserved slots stayed free all along: its requests start at once.
    assert (await acquire(owned, "a")).borrowing is False
    await clock.advance(0)


async def test_without_a_wait_a_borrower_is_answered_at_once_as_before() -> None:
    owned, _ = pool()
    decisions = [await acquire(owned) for _ in range(6)]
    assert all(d.granted and d.borrowing for d in decisions)


async def test_a_pool_whose_teams_lend_everything_holds_nobody() -> None:
    clock = FakeClock()
    owned = owned_pool(PoolConfig("p", 4, SHARES), 1, clock, MemoryLog())
    decisions = [await acquire(owned, wait_s=10) for _ in range(6)]
    assert all(d.granted for d in decisions)


@pytest.mark.parametrize("mode", [WaitEnd.BORROW, WaitEnd.REFUSE])
async def test_the_wait_ends_per_on_wait_end(mode: WaitEnd) -> None:
    owned, clock = pool(on_wait_end=mode)
    for _ in range(2):
        await acquire(owned, wait_s=10)
    held = asyncio.ensure_future(acquire(owned, wait_s=5))
    await clock.advance(4.9)
    assert not held.done()
    await clock.advance(0.2)
    if mode is WaitEnd.BORROW:
        decision = await held
        assert decision.granted and decision.borrowing
    else:
        with pytest.raises(LimitExceeded) as info:
            await held
        assert info.value.limit == "lend"
    assert owned.held_back() == {}


async def test_a_full_queue_answers_at_once_naming_max_held() -> None:
    owned, _ = pool(max_held=1, on_wait_end=WaitEnd.REFUSE)
    for _ in range(2):
        await acquire(owned, wait_s=10)
    held = asyncio.ensure_future(acquire(owned, wait_s=10))
    await settle()
    with pytest.raises(LimitExceeded) as info:
        await acquire(owned, wait_s=10)
    assert info.value.limit == "max_held"
    held.cancel()


async def test_a_caller_gone_leaves_the_queue_and_takes_no_slot() -> None:
    owned, _ = pool()
    first = [await acquire(owned, wait_s=10) for _ in range(2)]
    gone = asyncio.ensure_future(acquire(owned, wait_s=10))
    await settle()
    gone.cancel()
    await settle()
    assert owned.held_back() == {}
    release(owned, first[0])
    # The freed slot is there for the next borrower.
    assert (await acquire(owned, wait_s=10)).granted
    in_flight = sum(t.in_flight for t in owned.teams())
    assert in_flight == 2


async def test_held_requests_go_in_priority_then_arrival_order() -> None:
    owned, _ = pool()
    first = [await acquire(owned, wait_s=10) for _ in range(2)]
    batch = asyncio.ensure_future(acquire(owned, "y", wait_s=10, cls=Class.BATCH))
    await settle()
    interactive = asyncio.ensure_future(acquire(owned, "z", wait_s=10))
    await settle()
    release(owned, first[0])
    await settle()
    assert interactive.done() and not batch.done()
    release(owned, first[1])
    await settle()
    assert batch.done()


async def test_a_stopped_owner_fails_its_waits_over_to_the_next() -> None:
    owned, _ = pool()
    for _ in range(2):
        await acquire(owned, wait_s=10)
    held = asyncio.ensure_future(acquire(owned, wait_s=10))
    await settle()
    owned.stop()
    with pytest.raises(NotDeciding):
        await held
    assert owned.held_back() == {}


async def test_a_newcomer_never_takes_a_slot_ahead_of_a_held_borrower() -> None:
    """Room that opens without a release (a phantom ending by itself) goes to the borrower
    held first, when the next request comes, not to that request."""
    owned, clock = pool()
    owned.pool.add_phantoms("x", 1, until=clock.time() + 5.0, borrowing=True)
    await acquire(owned, wait_s=10)  # the second lent slot
    first = asyncio.ensure_future(acquire(owned, "y", wait_s=10))
    await settle()
    assert not first.done()
    await clock.advance(6.0)  # the phantom ended; nothing woke the queue
    newcomer = asyncio.ensure_future(acquire(owned, "z", wait_s=10))
    await settle()
    assert first.done() and (await first).borrowing
    assert not newcomer.done()
    newcomer.cancel()
