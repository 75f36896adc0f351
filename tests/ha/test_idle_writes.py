"""An idle pool writes nothing: decay is a function of time, not a reason to write.

Counted at the store (every call that writes: create, put, fenced put, commit and delete, lease
grants and revocations) under a fake clock, so "nothing" means nothing.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence

import pytest
from test_node import TIMING, Cluster, acquire

from fairshare import Class
from ha.owned.pool import OwnedPool
from ha.owned.poolstate import load
from ha.owned.snapshot import PoolSnapshot
from ha.store.contract import NO_LEASE, KeyValue, LeaseId, Write
from ha.store.keys import Keys

pytestmark = pytest.mark.timeout(30)

IDLE_S = 20 * TIMING.snapshot_interval_s


class CountingCluster(Cluster):
    """A cluster whose store records the key of every write."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.writes: list[str] = []
        store = self.store
        put, create, put_fenced = store.put, store.create, store.put_fenced
        commit_fenced = store.commit_fenced
        delete_fenced, grant_lease = store.delete_fenced, store.grant_lease

        async def counted_put(key: str, value: bytes, *, lease: LeaseId = NO_LEASE) -> int:
            self.writes.append(key)
            return await put(key, value, lease=lease)

        async def counted_create(key: str, value: bytes, *, lease: LeaseId) -> KeyValue | None:
            self.writes.append(key)
            return await create(key, value, lease=lease)

        async def counted_put_fenced(
            key: str,
            value: bytes,
            *,
            fence_key: str,
            fence_revision: int,
            timeout_s: float | None = None,
        ) -> bool:
            self.writes.append(key)
            return await put_fenced(
                key, value, fence_key=fence_key, fence_revision=fence_revision, timeout_s=timeout_s
            )

        async def counted_commit_fenced(
            writes: Sequence[Write],
            *,
            fence_key: str,
            fence_revision: int,
            timeout_s: float | None = None,
        ) -> bool:
            self.writes.append(f"<commit fenced on {fence_key}>")
            return await commit_fenced(
                writes, fence_key=fence_key, fence_revision=fence_revision, timeout_s=timeout_s
            )

        async def counted_delete_fenced(
            key: str, *, create_revision: int, timeout_s: float | None = None
        ) -> bool:
            self.writes.append(key)
            return await delete_fenced(key, create_revision=create_revision, timeout_s=timeout_s)

        async def counted_grant_lease(ttl_s: float) -> LeaseId:
            self.writes.append("<lease>")
            return await grant_lease(ttl_s)

        store.put = counted_put  # type: ignore[method-assign]
        store.create = counted_create  # type: ignore[method-assign]
        store.put_fenced = counted_put_fenced  # type: ignore[method-assign]
        store.commit_fenced = counted_commit_fenced  # type: ignore[method-assign]
        store.delete_fenced = counted_delete_fenced  # type: ignore[method-assign]
        store.grant_lease = counted_grant_lease  # type: ignore[method-assign]

    def owned(self, pool: str) -> OwnedPool:
        owner = self.owner(pool)
        assert owner is not None
        return owner.ownership.owned[pool]  # type: ignore[index]

    async def stored(self, pool: str) -> PoolSnapshot:
        loaded = await load(
            self.store,
            Keys("/test"),
            pool,
            decay_rate=self.owned(pool).pool.decay_rate,
            timeout_s=1.0,
        )
        assert loaded.snapshot is not None
        return loaded.snapshot


@pytest.fixture
async def cluster() -> AsyncIterator[CountingCluster]:
    c = CountingCluster(3)
    await c.start()
    # Past every first snapshot and rebalancing handover of the start.
    await c.clock.advance(TIMING.rebalance_settle_s + 2.0)
    yield c
    await c.close()


async def test_owned_idle_pools_write_nothing(cluster: CountingCluster) -> None:
    cluster.writes.clear()
    await cluster.clock.advance(IDLE_S)
    assert cluster.writes == []
    assert all(s.snapshot_age_s == 0.0 for n in cluster.nodes for s in n.status() if s.owned)


async def test_one_change_makes_one_write_then_none(cluster: CountingCluster) -> None:
    owner = cluster.owner("pool-1")
    assert owner is not None
    state_key = "<commit fenced on /test/owners/pool-1>"
    cluster.writes.clear()
    within = await acquire(owner, "pool-1", "a")
    assert within.granted and not within.borrowing
    assert cluster.writes == [state_key]  # the commit's write; no snapshot follows it
    await cluster.clock.advance(IDLE_S)
    assert cluster.writes == [state_key]
    # A release is written by its (lazy) commit, once.
    await owner.release(within.grant_id, 3.0)
    await cluster.clock.advance(IDLE_S)
    assert cluster.writes == [state_key] * 2
    # A borrowing grant has no commit of its own: the next snapshot writes it, once.
    for _ in range(6):
        await owner.acquire(
            pool="pool-1", team="c", cls=Class.BATCH, est_tokens=1, holder="gw", try_only=False
        )
    before = len(cluster.writes)
    await cluster.clock.advance(IDLE_S)
    assert cluster.writes[before:] == [state_key]
    assert cluster.owned("pool-1").snapshot_age_s() == 0.0


async def test_a_failover_after_an_idle_period_restores_the_same_state(
    cluster: CountingCluster,
) -> None:
    owner = cluster.owner("pool-2")
    assert owner is not None
    held = [await acquire(owner, "pool-2", "a", holder="gw1") for _ in range(2)]
    done = await acquire(owner, "pool-2", "b", holder="gw1")
    await owner.release(done.grant_id, 8.0)
    await cluster.clock.advance(TIMING.snapshot_interval_s * 2)
    cluster.writes.clear()
    await cluster.clock.advance(60.0)  # idle: nothing written
    assert cluster.writes == []
    # What a write at the moment of the crash would have stored.
    old = cluster.owned("pool-2")
    fresh = old.snapshot()
    stored = await cluster.stored("pool-2")
    assert stored.wall < fresh.wall - 59.0
    rate = old.pool.decay_rate
    for team, usage in fresh.usage.items():
        decayed = stored.usage.get(team, 0.0) * math.exp(-rate * (fresh.wall - stored.wall))
        assert decayed == pytest.approx(usage, rel=1e-9, abs=1e-12)
    assert sorted(stored.live) == sorted(fresh.live)
    assert stored.capacity == fresh.capacity and stored.issued == fresh.issued
    cluster.crash(owner)
    await cluster.clock.advance(TIMING.lease_ttl_s + 0.2)
    await cluster.settle_owners()
    successor = cluster.owned("pool-2")
    assert successor is not old
    now = successor.snapshot()
    assert {g.key for g in now.live} == {g.key for g in fresh.live} == {g.key for g in stored.live}
    assert len(held) == len(now.live)
    for team, usage in fresh.usage.items():
        expected = usage * math.exp(-rate * (now.wall - fresh.wall))
        assert now.usage.get(team, 0.0) == pytest.approx(expected, rel=1e-9, abs=1e-12)
