"""The bounds on grants in flight (``ha.owned.bounds``): per pool and per holder, on the owner.

The finding they answer: one holder took 204 800 grants on a pool of capacity 4, and every
one of them stayed in memory, in each checkpoint and, after a crash, as a phantom. Past a
bound an Acquire is refused naming it; a release or an expiry makes room; a SetCapacity
moves the default bounds; an Adopt counts only what fits and leaves the rest as phantoms.
What the bounds hold back is borrowing: a request within its team's share is always served.

The pools share C between "a" and "b"; the floods come from "x", a team without share,
whose every request borrows.
"""

from __future__ import annotations

import random

import pytest
from owned_pool import owned_pool

from fairshare import Class, Grant, Pool
from ha.api import Epoch, GrantRef, HeldGrant, LimitExceeded
from ha.clock import FakeClock
from ha.owned.held import HeldGrants, holding_of
from ha.owned.journal import MemoryLog
from ha.owned.pool import OwnedPool
from ha.owned.snapshot import GrantKey
from ha.settings import ConfigError, PoolConfig

pytestmark = pytest.mark.timeout(30)


SHARES = {"a": 0.5, "b": 0.5}


async def acquire(
    owned: OwnedPool, holder: str, team: str = "x", request_id: str = "", *, try_only: bool = False
) -> str:
    """A grant id for ``holder``; raises what the owner raises."""
    d = await owned.acquire(
        team=team,
        cls=Class.INTERACTIVE,
        est_tokens=0,
        holder=holder,
        request_id=request_id,
        try_only=try_only,
    )
    assert d.granted
    return d.grant_id


async def refused(owned: OwnedPool, holder: str, **kwargs: object) -> str:
    """The limit an Acquire of ``holder`` is refused at."""
    with pytest.raises(LimitExceeded) as info:
        await acquire(owned, holder, **kwargs)  # type: ignore[arg-type]
    assert info.value.limit in str(info.value)
    return info.value.limit


def release(owned: OwnedPool, grant_id: str) -> None:
    owned.release(GrantRef.decode(grant_id), 1.0)


async def test_the_pool_bound_refuses_past_it_and_a_release_makes_room() -> None:
    config = PoolConfig("p", 2, SHARES, max_in_flight=5)
    owned = owned_pool(config, 1, FakeClock(), MemoryLog())
    grants = [await acquire(owned, f"h{i % 3}") for i in range(5)]
    assert await refused(owned, "fresh") == "max_in_flight"
    assert await refused(owned, "fresh", try_only=True) == "max_in_flight"
    teams_before = {t.team for t in owned.teams()}
    assert await refused(owned, "fresh", team="new-team") == "max_in_flight"
    assert {t.team for t in owned.teams()} == teams_before  # nothing admitted when refused
    release(owned, grants[0])
    await acquire(owned, "fresh")
    assert await refused(owned, "h0") == "max_in_flight"


async def test_the_holder_bound_refuses_one_holder_only_and_a_release_makes_room() -> None:
    config = PoolConfig("p", 2, SHARES, max_in_flight_per_holder=3)
    owned = owned_pool(config, 1, FakeClock(), MemoryLog())
    mine = [await acquire(owned, "h") for _ in range(3)]
    assert await refused(owned, "h") == "max_in_flight_per_holder"
    others = [await acquire(owned, "g") for _ in range(3)]  # another holder is not held back
    assert await refused(owned, "g") == "max_in_flight_per_holder"
    release(owned, mine[1])
    await acquire(owned, "h")
    release(owned, others[0])
    release(owned, others[0])  # a repeated release frees nothing more
    await acquire(owned, "g")
    assert await refused(owned, "g") == "max_in_flight_per_holder"


async def test_a_request_within_its_share_is_served_at_either_bound() -> None:
    """One team floods a gateway every team shares: the holder reaches its bound and the
    pool its own, yet a team asking for no more than its share is served, up to its
    reservation (C = 4: 2 each for a and b)."""
    config = PoolConfig("p", 4, SHARES, max_in_flight=8, max_in_flight_per_holder=4)
    owned = owned_pool(config, 1, FakeClock(), MemoryLog())
    for _ in range(4):
        await acquire(owned, "shared")
    assert await refused(owned, "shared") == "max_in_flight_per_holder"
    await acquire(owned, "shared", team="a")
    await acquire(owned, "shared", team="a")
    assert await refused(owned, "shared", team="a") == "max_in_flight_per_holder"  # a borrows
    await acquire(owned, "other")
    await acquire(owned, "other")  # the pool's bound: 8 counted after it
    assert await refused(owned, "other") == "max_in_flight"
    await acquire(owned, "other", team="b")
    await acquire(owned, "other", team="b")
    assert len([t for t in owned.teams() if t.in_flight]) == 3
    assert await refused(owned, "other", team="b") == "max_in_flight"


async def test_a_retried_acquire_past_the_bound_gets_its_first_answer() -> None:
    owned = owned_pool(
        PoolConfig("p", 2, SHARES, max_in_flight_per_holder=2), 1, FakeClock(), MemoryLog()
    )
    first = await acquire(owned, "h", request_id="r1")
    await acquire(owned, "h", request_id="r2")
    assert await acquire(owned, "h", request_id="r1") == first
    assert await refused(owned, "h", request_id="r3") == "max_in_flight_per_holder"


async def test_expired_grants_make_room() -> None:
    clock = FakeClock()
    config = PoolConfig("p", 2, SHARES, max_request_s=60.0, max_in_flight_per_holder=2)
    owned = owned_pool(config, 1, clock, MemoryLog())
    await acquire(owned, "dead")
    await acquire(owned, "dead")
    assert await refused(owned, "dead") == "max_in_flight_per_holder"
    await clock.advance(61.0)
    assert owned.expire() == 2
    await acquire(owned, "dead")


def test_the_defaults_follow_the_capacity_with_a_floor() -> None:
    config = PoolConfig("p", 4)
    assert config.in_flight_bounds(4) == (256, 128)  # the floors: a small pool
    assert config.in_flight_bounds(0) == (256, 128)
    assert config.in_flight_bounds(100) == (3200, 1600)  # 32 x C and 16 x C
    fixed = PoolConfig("p", 4, max_in_flight=10, max_in_flight_per_holder=3)
    assert fixed.in_flight_bounds(4) == (10, 3)
    assert fixed.in_flight_bounds(50) == (50, 3)  # never below the live capacity


async def test_a_set_capacity_moves_the_default_bounds() -> None:
    owned = owned_pool(PoolConfig("p", 4, SHARES), 1, FakeClock(), MemoryLog())
    held = [await acquire(owned, "h") for _ in range(128)]
    assert await refused(owned, "h") == "max_in_flight_per_holder"
    owned.set_capacity(10)  # 16 x 10 = 160 per holder
    held += [await acquire(owned, "h") for _ in range(32)]
    assert await refused(owned, "h") == "max_in_flight_per_holder"
    owned.set_capacity(2)  # back to the floor (128), below the 160 held: room below 128 only
    for grant_id in held[:32]:
        release(owned, grant_id)
    assert await refused(owned, "h") == "max_in_flight_per_holder"
    release(owned, held[32])
    await acquire(owned, "h")


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"max_in_flight": 0}, "p.max_in_flight"),
        ({"max_in_flight": 3}, "p.max_in_flight"),  # below the capacity (4)
        ({"max_in_flight": True}, "p.max_in_flight"),
        ({"max_in_flight": 8.0}, "p.max_in_flight"),
        ({"max_in_flight_per_holder": 0}, "p.max_in_flight_per_holder"),
        ({"max_in_flight_per_holder": "2"}, "p.max_in_flight_per_holder"),
    ],
)
def test_bad_bounds_are_refused_at_load(fields: dict[str, object], path: str) -> None:
    with pytest.raises(ConfigError) as info:
        PoolConfig("p", 4, **fields).validate("p")  # type: ignore[arg-type]
    assert info.value.path == path


async def successor(first: OwnedPool, clock: FakeClock, log: MemoryLog) -> OwnedPool:
    """The owner of the next epoch, restored from what ``first`` wrote."""
    await first.flush()
    first.stop()
    nxt = owned_pool(first.config, int(first.epoch) + 1, clock, MemoryLog())
    nxt.restore(log.snapshot(decay_rate=first.pool.decay_rate))
    return nxt


def phantoms(owned: OwnedPool) -> int:
    return sum(t.phantoms for t in owned.teams())


def report(grant_ids: list[str]) -> list[HeldGrant]:
    return [HeldGrant(g, "x", 0, True) for g in grant_ids]


async def test_an_adopt_counts_what_fits_and_leaves_the_rest_as_phantoms() -> None:
    """After a failover a holder at its bound re-reports more than fits: what fits is
    counted again, the rest keep their phantoms (their slots stay counted), and the
    complete re-report closes no other phantom of the holder."""
    clock, log = FakeClock(), MemoryLog()
    config = PoolConfig("p", 4, SHARES, max_in_flight_per_holder=3)
    first = owned_pool(config, 1, clock, log)
    old = [await acquire(first, "h") for _ in range(3)]
    await acquire(first, "gone")  # another holder's: stays a phantom
    second = await successor(first, clock, log)
    assert phantoms(second) == 4
    new = [await acquire(second, "h") for _ in range(2)]  # before the holder re-reports
    result = second.adopt(holder="h", grants=report(old), complete=True)
    assert (result.adopted, result.phantoms_dropped) == (1, 1)
    assert phantoms(second) == 3  # two left out, and "gone"'s: none closed
    assert await refused(second, "h") == "max_in_flight_per_holder"
    # A grant ends: the next re-report counts one more again.
    release(second, new[0])
    result = second.adopt(holder="h", grants=report(old), complete=True)
    assert (result.adopted, result.phantoms_dropped) == (1, 1)
    assert phantoms(second) == 2
    # A grant left out is still released as its phantom: charged, and its slot freed.
    release(second, old[2])
    assert phantoms(second) == 1


async def test_an_adopt_respects_the_pool_bound() -> None:
    clock, log = FakeClock(), MemoryLog()
    config = PoolConfig("p", 4, SHARES, max_in_flight=4)
    first = owned_pool(config, 1, clock, log)
    old = [await acquire(first, "h") for _ in range(2)]
    second = await successor(first, clock, log)
    for holder in ("x", "y", "z"):
        await acquire(second, holder)
    result = second.adopt(holder="h", grants=report(old), complete=False)
    assert result.adopted == 1
    assert phantoms(second) == 1
    assert await refused(second, "h") == "max_in_flight"


def test_the_holding_counts_agree_with_the_grants_kept() -> None:
    """Issue, adopt, release and expire in random order: ``holding`` and ``len`` always
    equal a count over the grants kept (``live``)."""
    rng = random.Random(7)
    pool = Pool("p", 1000, {"a": 1.0})
    held = HeldGrants(Epoch(5), max_request_s=100.0)
    kept: dict[GrantKey, str] = {}  # key -> how it is taken back ("own" / "adopted")
    seq = 0
    wall = 0.0
    for _ in range(3000):
        wall += rng.random()
        step = rng.random()
        holder = f"h{rng.randrange(4)}"
        if step < 0.4:
            seq += 1
            grant: Grant = pool.acquire("a", Class.BATCH, 0)
            kept[held.issue(seq, grant, holder, "a", wall).key] = "own"
        elif step < 0.6:
            key = GrantKey(Epoch(rng.randrange(1, 5)), rng.randrange(50), holder)
            held.adopt(key, pool.adopt("a", 0, False, 0), wall, unsigned=False)
            kept[key] = "adopted"
        elif step < 0.95 and kept:
            key = rng.choice(list(kept))
            taken = held.take_own(key) if kept[key] == "own" else held.take_adopted(key)
            assert taken is not None
            del kept[key]
        else:
            for key in held.expire(wall - 100.0):
                del kept[key]
        live = [g.key for g in held.live()]
        assert len(held) == len(live) == len(kept)
        for name in ("h0", "h1", "h2", "h3"):
            assert held.holding(holding_of(name, "")) == sum(1 for k in live if k.holder == name)
