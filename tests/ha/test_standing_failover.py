"""A team's within-share count survives a change of owner (docs/design.md, "Standing
across a failover"): phantoms keep their grants' standing, a re-reported grant counts with
the standing its signed id carries, and what is unknown counts as within share; and
ages survive it whatever the successor's wall clock says."""

from __future__ import annotations

import json

import pytest
from owned_pool import owned_pool

from fairshare import Class
from ha.api import DEGRADED_EPOCH, Epoch, GrantRef, HeldGrant, PoolName
from ha.clock import FakeClock
from ha.grantkeys import ephemeral_keys
from ha.owned.genuine import degraded_grant_id
from ha.owned.journal import MemoryLog
from ha.owned.pool import OwnedPool
from ha.owned.rereports import adopted_standing
from ha.owned.snapshot import PoolSnapshot
from ha.settings import PoolConfig

pytestmark = pytest.mark.timeout(30)

CONFIG = PoolConfig("p", 10, {"a": 0.4, "b": 0.6}, max_request_s=600.0)  # a: 4, b: 6


def owner(epoch: int, clock: FakeClock, log: MemoryLog) -> OwnedPool:
    return owned_pool(CONFIG, epoch, clock, log)


async def acquire(owned: OwnedPool, team: str, holder: str = "h") -> tuple[str, bool]:
    d = await owned.acquire(
        team=team, cls=Class.INTERACTIVE, est_tokens=0, holder=holder, request_id="", try_only=False
    )
    assert d.granted
    return d.grant_id, d.borrowing


async def successor_of(
    first: OwnedPool, clock: FakeClock, log: MemoryLog, into: MemoryLog | None = None
) -> OwnedPool:
    """The owner of the next epoch, restored from what ``first`` wrote to ``log``; it
    writes to ``into``."""
    await first.flush()
    first.stop()
    snapshot = log.snapshot(decay_rate=first.pool.decay_rate)
    nxt = owner(int(first.epoch) + 1, clock, MemoryLog() if into is None else into)
    nxt.restore(snapshot)
    return nxt


async def test_a_successor_restores_the_within_share_count_not_the_in_flight_count() -> None:
    clock, log = FakeClock(), MemoryLog()
    first = owner(1, clock, log)
    held = [await acquire(first, "a") for _ in range(7)]  # 4 within share, 3 borrowing
    assert [b for _, b in held] == [False] * 4 + [True] * 3
    second = await successor_of(first, clock, log)
    assert second.pool.within()["a"] == 4
    assert (await acquire(second, "a"))[1]  # the reservation is in use: it borrows
    # Two within-share requests of the old owner end: their slots come back at once, as
    # they would have with no failover (borrowers' phantoms do not hold them).
    for grant_id, _ in held[:2]:
        second.release(GrantRef.decode(grant_id), 1.0)
    assert second.pool.within()["a"] == 2
    assert [(await acquire(second, "a"))[1] for _ in range(3)] == [False, False, True]


async def test_sustained_churn_across_a_failover_never_promises_a_reserved_slot_twice() -> None:
    """A team keeps 10 in flight; each finish is replaced; the owner changes twice on the
    way. Within-share requests in flight never exceed the reservation, and the count is
    back at the reservation after every replacement."""
    clock, log = FakeClock(), MemoryLog()
    owned = owner(1, clock, log)
    running: list[tuple[str, bool]] = [await acquire(owned, "a") for _ in range(10)]
    for step in range(60):
        if step in (20, 40):
            written, log = log, MemoryLog()
            owned = await successor_of(owned, clock, written, into=log)
        grant_id, _ = running.pop(step * 7 % len(running))
        owned.release(GrantRef.decode(grant_id), 1.0)
        running.append(await acquire(owned, "a"))
        assert sum(1 for _, b in running if not b) == 4
        assert owned.pool.within()["a"] == 4


async def test_a_holder_cannot_change_the_standing_its_id_was_signed_with() -> None:
    clock, log = FakeClock(), MemoryLog()
    first = owner(1, clock, log)
    within = [await acquire(first, "a") for _ in range(4)]
    borrower, borrowing = await acquire(first, "a")
    assert borrowing
    second = await successor_of(first, clock, log)
    # It claims its borrower was within share and its within-share grants borrowed:
    # counted so, the team would get 3 more within-share slots than its reservation.
    report = [HeldGrant(borrower, "a", 0, False, 0)] + [
        HeldGrant(g, "a", 10, True, 0) for g, _ in within
    ]
    result = second.adopt(holder="h", grants=report, complete=True)
    assert result.adopted == 5
    assert second.pool.within()["a"] == 4
    assert (await acquire(second, "a"))[1]


async def test_a_standing_the_ids_and_state_do_not_carry_counts_as_within_share() -> None:
    clock = FakeClock()
    keys = ephemeral_keys()
    # A state written before live rows carried a standing (journal version 3, rows of 5).
    snapshot = PoolSnapshot(pool="p", epoch=1, wall=clock.time(), capacity=10)
    data = json.loads(snapshot.encode())
    data["version"] = 2
    data["live"] = [[1, seq, "h", "a", clock.time() + 600.0] for seq in (1, 2, 3)]
    old = PoolSnapshot.decode(json.dumps(data).encode())
    assert old is not None and {g.borrowing for g in old.live} == {None}
    second = owner(2, clock, MemoryLog())
    second.restore(old)
    assert second.pool.within()["a"] == 3  # unknown: within share, the safe side
    # Their ids, as replicas signed them then (g2: no standing), re-reported as borrowers.
    ids = [keys.sign(GrantRef(PoolName("p"), Epoch(1), seq, "a", "h")) for seq in (1, 2, 3)]
    assert all(i.startswith("g2.") for i in ids)
    second.adopt(holder="h", grants=[HeldGrant(i, "a", 10, True, 0) for i in ids], complete=True)
    assert second.pool.within()["a"] == 3


def test_the_standing_of_a_re_reported_grant_is_never_the_holders_word() -> None:
    pool = PoolName("p")
    assert adopted_standing(GrantRef(pool, Epoch(3), 1, borrowing=True), False) is True
    assert adopted_standing(GrantRef(pool, Epoch(3), 1, borrowing=False), True) is False
    assert adopted_standing(GrantRef(pool, DEGRADED_EPOCH, 1), None) is True
    assert adopted_standing(GrantRef(pool, Epoch(3), 1), True) is True
    assert adopted_standing(GrantRef(pool, Epoch(3), 1), None) is False


async def test_an_unreadable_state_fills_every_reservation_as_within_share() -> None:
    clock = FakeClock()
    second = owner(2, clock, MemoryLog())
    assert second.restore_unreadable() == 10
    assert second.pool.within() == {"a": 4, "b": 6}
    assert (await acquire(second, "a"))[1]


@pytest.mark.parametrize("step_s", [660.0, -660.0])
async def test_a_wall_clock_step_on_the_successor_neither_ends_phantoms_nor_forgets_releases(
    step_s: float,
) -> None:
    """A successor whose wall clock is 11 minutes off (a step, a skewed node) keeps each
    phantom for the time it had left at the snapshot and each settled release for the age
    it had: no slot is promised twice, no retried release charged twice."""
    clock, log = FakeClock(), MemoryLog()
    first = owner(1, clock, log)
    held = [await acquire(first, "a") for _ in range(4)]
    log2 = MemoryLog()
    second = await successor_of(first, clock, log, into=log2)
    # A replica's degraded grant released to the second owner is settled there: charged
    # once.
    degraded = GrantRef.decode(degraded_grant_id("p", "b", "h", ephemeral_keys()))
    second.release(degraded, 2.0)
    clock.step_wall(step_s)
    third = await successor_of(second, clock, log2)
    assert third.pool.within()["a"] == 4  # the old owner's four still count
    assert (await acquire(third, "a"))[1]
    await clock.advance(300.0)
    assert third.pool.within()["a"] == 4  # 300 s of the 600 s they had left
    before = third.pool.usage_of("b")
    third.release(degraded, 2.0)  # a retry of the settled release
    assert third.pool.usage_of("b") == before
    for grant_id, _ in held:
        third.release(GrantRef.decode(grant_id), 1.0)
    assert third.pool.within()["a"] == 0


async def test_a_re_reported_grant_counts_and_charges_in_the_team_its_id_names() -> None:
    clock, log = FakeClock(), MemoryLog()
    first = owner(1, clock, log)
    grant_id, _ = await acquire(first, "a")
    second = await successor_of(first, clock, log)
    second.adopt(holder="h", grants=[HeldGrant(grant_id, "b", 0, False, 0)], complete=True)
    teams = {t.team: t for t in second.pool.snapshot()}
    assert (teams["a"].in_flight, teams["b"].in_flight) == (1, 0)
    second.release(GrantRef.decode(grant_id), 3.0)
    assert (second.pool.usage_of("a"), second.pool.usage_of("b")) == (3.0, 0.0)
