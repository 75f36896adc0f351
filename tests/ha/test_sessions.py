"""Holder sessions at the owner (ha/owned/sessions.py, docs/ha.md "Holder sessions"): only a
session confirms or closes what it holds, its grants live as long as it does, and it
survives a change of owner. Owner-level, on a fake clock."""

from __future__ import annotations

import pytest
from owned_pool import owned_pool

from fairshare import Class
from fairshare.sessions import Session, new_session
from ha.api import Epoch, GrantRef, HeldGrant, LimitExceeded, PermissionDenied
from ha.clock import FakeClock
from ha.owned.journal import MemoryLog
from ha.owned.pool import OwnedPool
from ha.owned.sessions import Sessions
from ha.settings import PoolConfig

pytestmark = pytest.mark.timeout(30)

CONFIG = PoolConfig("p", 10, {"a": 0.4, "b": 0.6}, max_request_s=60.0)  # a: 4, b: 6
TTL = 30.0


def owner(epoch: int, clock: FakeClock, log: MemoryLog) -> OwnedPool:
    return owned_pool(CONFIG, epoch, clock, log, session_ttl_s=TTL)


def session() -> Session:
    return Session.parse(new_session())


async def acquire(owned: OwnedPool, s: Session | None, holder: str = "gw", team: str = "a") -> str:
    d = await owned.acquire(
        team=team,
        cls=Class.INTERACTIVE,
        est_tokens=0,
        holder=holder,
        request_id="",
        try_only=False,
        session=s,
    )
    return d.grant_id


async def successor(first: OwnedPool, clock: FakeClock, log: MemoryLog) -> OwnedPool:
    await first.flush()
    first.stop()
    nxt = owner(int(first.epoch) + 1, clock, MemoryLog())
    nxt.restore(log.snapshot())
    return nxt


def held(grant_id: str) -> HeldGrant:
    return HeldGrant(grant_id, "a", 0, False, 0)


def in_flight(owned: OwnedPool, team: str = "a") -> tuple[int, int]:
    stat = next(t for t in owned.pool.snapshot() if t.team == team)
    return stat.in_flight, stat.phantoms


async def test_a_grant_names_its_session_and_the_first_one_is_durable() -> None:
    clock, log = FakeClock(), MemoryLog()
    owned = owner(1, clock, log)
    s = session()
    grant_id = await acquire(owned, s)
    assert GrantRef.decode(grant_id).session == s.id
    # The session was written before the first answer: a successor knows its secret.
    state = log.snapshot()
    assert state is not None and state.sessions == {s.id: (s.digest, "gw")}


async def test_only_the_secret_and_holder_a_session_was_opened_with_speak_for_it() -> None:
    owned = owner(1, FakeClock(), MemoryLog())
    s = session()
    await acquire(owned, s)
    forged = Session(s.id, session().digest)
    with pytest.raises(PermissionDenied):
        await acquire(owned, forged)
    with pytest.raises(PermissionDenied):
        await acquire(owned, s, holder="another")
    with pytest.raises(PermissionDenied):
        owned.keep_alive(forged)


async def test_a_complete_re_report_closes_only_its_own_sessions_phantoms() -> None:
    """Two gateways share a holder name (the default is the host name); a third caller
    takes it on purpose and re-reports a grant of its own as a complete inventory (the
    finding: it used to close the victims' phantoms, and their slots were promised
    twice)."""
    clock, log = FakeClock(), MemoryLog()
    first = owner(1, clock, log)
    one, two, intruder = session(), session(), session()
    mine = [await acquire(first, one) for _ in range(2)]
    theirs = [await acquire(first, two) for _ in range(2)]
    second = await successor(first, clock, log)
    assert in_flight(second) == (0, 4)
    bait = await acquire(second, intruder)  # a within-share grant of the same holder name
    second.adopt(holder="gw", grants=[held(bait)], complete=True, session=intruder)
    assert in_flight(second) == (1, 4)
    # The first gateway's inventory: one grant ended meanwhile.
    result = second.adopt(holder="gw", grants=[held(mine[0])], complete=True, session=one)
    assert (result.adopted, result.phantoms_dropped) == (1, 2)
    assert in_flight(second) == (2, 2)  # the second gateway's two phantoms stay
    result = second.adopt(holder="gw", grants=[held(g) for g in theirs], complete=True, session=two)
    assert (result.adopted, result.phantoms_dropped) == (2, 2)
    assert in_flight(second) == (4, 0)


async def test_a_session_grant_outlives_max_request_s_while_renewed_and_is_charged() -> None:
    clock, log = FakeClock(), MemoryLog()
    owned = owner(1, clock, log)
    s = session()
    grant_id = await acquire(owned, s)
    loose = await acquire(owned, None)  # no session: ages out at max_request_s
    for _ in range(int(3 * CONFIG.max_request_s / 10)):  # 180 s, renewed every 10 s
        await clock.advance(10.0)
        assert owned.keep_alive(s)
        owned.expire()
    assert in_flight(owned) == (1, 0)
    # It may have consumed for all the 180 s it ran: more than a grant that lives at most
    # max_request_s can (max_charge_per_s x max_request_s = 480), and it is charged so.
    held_for = 3 * CONFIG.max_request_s
    owned.release(GrantRef.decode(grant_id), CONFIG.max_charge_per_s * held_for)
    owned.release(GrantRef.decode(loose), 2.0)  # late: no longer counted, still charged
    owned.release(GrantRef.decode(loose), 2.0)  # once
    assert owned.pool.usage_of("a") == pytest.approx(CONFIG.max_charge_per_s * held_for + 2.0)


async def test_a_session_that_is_not_renewed_lapses_with_its_grants() -> None:
    clock, log = FakeClock(), MemoryLog()
    owned = owner(1, clock, log)
    dead, alive = session(), session()
    lost = [await acquire(owned, dead, holder="gw-dead") for _ in range(3)]
    await acquire(owned, alive)
    await clock.advance(TTL - 1.0)
    owned.keep_alive(alive)
    owned.expire()
    assert in_flight(owned) == (4, 0)
    await clock.advance(2.0)
    owned.expire()
    assert in_flight(owned) == (1, 0)  # the dead gateway's three slots are free again
    assert not owned.keep_alive(dead)
    # A late release of a lapsed grant still charges what it consumed, once.
    for _ in range(2):
        owned.release(GrantRef.decode(lost[0]), 4.0)
    assert owned.pool.usage_of("a") == pytest.approx(4.0)
    # And the lapse is in the state: a successor neither knows the session nor its grants.
    second = await successor(owned, clock, log)
    assert in_flight(second) == (0, 1)
    assert not second.keep_alive(dead)


async def test_a_session_survives_a_change_of_owner_and_lapses_there_unrenewed() -> None:
    clock, log = FakeClock(), MemoryLog()
    first = owner(1, clock, log)
    kept, gone = session(), session()
    grants = [await acquire(first, kept) for _ in range(2)]
    await acquire(first, gone, holder="gw-2")
    await clock.advance(50.0)  # most of max_request_s: a session grant does not age
    second = await successor(first, clock, log)
    assert in_flight(second) == (0, 3)
    for _ in range(4):  # well past max_request_s from the grants' issue
        await clock.advance(TTL / 3)
        assert second.keep_alive(kept)
        second.expire()
    assert in_flight(second) == (0, 2)  # the unrenewed session lapsed with its phantom
    result = second.adopt(
        holder="gw", grants=[held(g) for g in grants], complete=True, session=kept
    )
    assert (result.adopted, result.phantoms_dropped) == (2, 2)
    assert in_flight(second) == (2, 0)


async def test_a_renewed_sessions_phantom_outlives_max_request_s_at_the_successor() -> None:
    """A failover slower than max_request_s (a loaded machine, a long election) dropped
    a live session's phantoms: its re-report then counted nothing, and its reserved
    slots were promised again while its requests still ran."""
    clock, log = FakeClock(), MemoryLog()
    first = owner(1, clock, log)
    kept = session()
    grants = [await acquire(first, kept) for _ in range(2)]
    second = await successor(first, clock, log)
    for _ in range(int(3 * CONFIG.max_request_s / 10)):  # 180 s, renewed every 10 s
        await clock.advance(10.0)
        assert second.keep_alive(kept)
        second.expire()
    assert in_flight(second) == (0, 2)
    result = second.adopt(
        holder="gw", grants=[held(g) for g in grants], complete=True, session=kept
    )
    assert (result.adopted, result.phantoms_dropped) == (2, 2)
    # Not renewed any more, the session lapses, and its grants with it.
    await clock.advance(TTL + 1.0)
    second.expire()
    assert in_flight(second) == (0, 0)


async def test_a_grant_of_a_lapsed_session_is_not_counted_again() -> None:
    clock, log = FakeClock(), MemoryLog()
    first = owner(1, clock, log)
    s = session()
    grant_id = await acquire(first, s)
    second = await successor(first, clock, log)
    await clock.advance(TTL + 1.0)
    second.expire()
    other = session()
    result = second.adopt(holder="gw-x", grants=[held(grant_id)], complete=False, session=other)
    assert result.adopted == 0 and in_flight(second) == (0, 0)


def test_an_owner_keeps_at_most_max_sessions() -> None:
    table = Sessions(ttl_s=TTL, max_sessions=2)
    table.check(session(), "a", 0.0)
    table.check(session(), "b", 0.0)
    with pytest.raises(LimitExceeded) as info:
        table.check(session(), "c", 0.0)
    assert info.value.limit == "max_sessions"
    assert sorted(table.lapsed(TTL)) and len(table) == 0


async def test_calls_without_a_session_behave_as_before() -> None:
    clock, log = FakeClock(), MemoryLog()
    first = owner(1, clock, log)
    grants = [await acquire(first, None) for _ in range(2)]
    assert GrantRef.decode(grants[0]).session == ""
    second = await successor(first, clock, log)
    result = second.adopt(holder="gw", grants=[held(grants[0])], complete=True)
    assert (result.adopted, result.phantoms_dropped) == (1, 2)
    assert Epoch(second.epoch) == 2
