"""Failover edge cases: request ids across restarts, epochs that never wrote, unreadable
snapshots, and re-reports racing a new owner's restore (in-memory store, fake clock).
The Cluster helper comes from test_node.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest
from test_node import POOLS, TIMING, Cluster, FlakyStore, acquire

from fairshare import Class
from ha.api import GrantRef, HeldGrant, NodeId
from ha.clock import FakeClock, settle
from ha.cluster.view import preferred_owner
from ha.node import Node
from ha.store.contract import Write

pytestmark = pytest.mark.timeout(30)


class GatedStore(FlakyStore):
    """Blocks every state write (a commit fenced on ``block_key``, the pool's owner key) of
    the first epoch above ``block_above``."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.block_above: int | None = None
        self.block_key = ""
        self.blocked_epoch: int | None = None
        self.gate = asyncio.Event()

    async def commit_fenced(
        self,
        writes: Sequence[Write],
        *,
        fence_key: str,
        fence_revision: int,
        timeout_s: float | None = None,
    ) -> bool:
        if (
            self.block_above is not None
            and fence_key == self.block_key
            and fence_revision > self.block_above
        ):
            if self.blocked_epoch is None:
                self.blocked_epoch = fence_revision
            if fence_revision == self.blocked_epoch:
                await self.gate.wait()
        return await super().commit_fenced(
            writes, fence_key=fence_key, fence_revision=fence_revision, timeout_s=timeout_s
        )


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    c = Cluster(3)
    await c.start()
    yield c
    await c.close()


def _epoch(node: Node, pool: str) -> int:
    return next(s.epoch for s in node.status() if s.pool == pool)


async def _team(node: Node, pool: str, team: str):  # type: ignore[no-untyped-def]
    view = await node.snapshot(pool)
    return next((s for s in view.teams if s.team == team), None)


# -- 1. generated request ids repeat after a replica restart ----------------------------


async def test_a_restarted_replica_does_not_get_an_old_answer(cluster: Cluster) -> None:
    """Node.acquire generates request ids "<node>:<seq>" with seq restarting at 0 in
    every process. The owner's _answers (100k entries, no time bound) still holds the
    first process's answers, so the restarted replica's first forwarded request gets a
    stale grant: already released, counted nowhere, priority 0."""
    pool = "pool-0"
    owner = cluster.owner(pool)
    assert owner is not None
    forwarder = cluster.other(pool)
    first = await acquire(forwarder, pool, "a", holder="")
    await forwarder.release(first.grant_id, 1.0)

    # Rolling restart of the forwarder (same node id, as a StatefulSet pod).
    await forwarder.close()
    cluster.nodes.remove(forwarder)
    back = cluster.make(forwarder.node_id)
    cluster.nodes.append(back)
    await back.start()
    await cluster.clock.advance(TIMING.campaign_delay_s + 0.1)
    assert cluster.owner(pool) is owner  # the owner kept the pool (and its _answers)

    second = await acquire(back, pool, "a", holder="")
    assert second.grant_id != first.grant_id, "a new request got the answer of an old one"
    stat = await _team(owner, pool, "a")
    assert stat is not None and stat.in_flight == 1, "the granted request is not counted"


# -- 2. an epoch that never wrote a snapshot is forgotten by its successor ---------------


async def test_release_of_a_grant_from_an_epoch_that_never_wrote_is_charged() -> None:
    """Owner e2 issues a borrowing grant (no durable wait) and crashes before its first
    snapshot write lands (etcd slow/paused). e3 restores e1's snapshot: _unknown_after
    has windows for e1 and earlier only, so a grant of e2 is neither chargeable nor
    adoptable: its release charges nothing and its re-report is ignored."""
    c = Cluster(3)
    store = GatedStore(c.clock)
    c.store = store
    c.peers.nodes.clear()
    c.nodes = [c.make(f"n{i}") for i in range(3)]
    await c.start()
    try:
        pool = "pool-0"
        first = c.owner(pool)
        assert first is not None
        e1 = _epoch(first, pool)
        await c.clock.advance(TIMING.snapshot_interval_s * 2)  # e1 has written
        store.block_key = "/test/owners/" + pool
        store.block_above = e1
        c.crash(first)
        await c.clock.advance(TIMING.lease_ttl_s + 0.5)
        second = c.owner(pool)
        assert second is not None
        e2 = _epoch(second, pool)
        assert store.blocked_epoch == e2  # its first write hangs
        grant = await acquire(second, pool, "z", holder="gw")  # share 0: borrowing
        assert grant.borrowing and grant.epoch == e2
        c.crash(second)
        await c.clock.advance(TIMING.lease_ttl_s + 0.5)
        third = c.owner(pool)
        assert third is not None and _epoch(third, pool) > e2

        # The holder re-reports the grant: it should be counted again.
        result = await third.adopt(
            pool=pool,
            epoch=_epoch(third, pool),
            holder="gw",
            grants=[HeldGrant(grant.grant_id, "z", grant.priority, True, 1)],
            complete=True,
        )
        adopted = result.adopted
        # ...and its release must be charged.
        await third.release(grant.grant_id, 5.0)
        stat = await _team(third, pool, "z")
        usage = stat.usage if stat is not None else 0.0
        # Observed: (0, 0.0): the re-report was ignored and the release charged nothing.
        assert (adopted, round(usage, 2)) == (1, 5.0)
    finally:
        store.gate.set()
        await c.close()


# -- 3. an unreadable snapshot is treated as no snapshot ---------------------------------


async def test_an_unreadable_snapshot_does_not_free_the_reserved_slots(cluster: Cluster) -> None:
    """PoolSnapshot.decode returns None on any unreadable/other-version snapshot and
    restore(None) starts empty: no phantoms, so the successor promises every reserved
    slot again while the old owner's within-share requests still run (e.g. a rolling
    upgrade where the new version writes a snapshot the old one cannot read)."""
    pool = "pool-2"
    owner = cluster.owner(pool)
    assert owner is not None
    held = [await acquire(owner, pool, "a", holder="gw1") for _ in range(5)]
    assert all(not d.borrowing for d in held)  # team a's 5 reserved slots are in use
    cluster.crash(owner)
    # A snapshot this version cannot read (another version, or damaged).
    await cluster.store.put("/test/state/" + pool, b'{"version": 3}')
    await cluster.clock.advance(TIMING.lease_ttl_s + 0.5)
    await cluster.settle_owners()
    successor = cluster.owner(pool)
    assert successor is not None
    fresh = await acquire(successor, pool, "a", holder="gw2")
    assert fresh.borrowing, "a 6th within-share slot of team a was promised (reserved 5)"


# -- 4. a forwarding replica's re-report races the new owner's restore -------------------


async def test_a_forwarders_re_report_reaches_the_new_owner() -> None:
    """Stubs.readopt (ha.stubs) fires on the watch event of the new owner key, i.e. while
    the new owner is still reading the snapshot (not yet in its owned table); the
    forwarded Adopt gets WrongEpoch and readopt gave up after one try."""
    c = Cluster(3)
    await c.start()
    try:
        # A pool whose owner's successor is not the forwarder.
        for cfg in POOLS:
            owner = c.owner(cfg.name)
            assert owner is not None
            rest = [n for n in c.nodes if n is not owner]
            succ = preferred_owner(cfg.name, [n.node_id for n in rest])
            forwarder = next(n for n in rest if n.node_id != succ)
            break
        pool = cfg.name
        grant = await acquire(forwarder, pool, "z", holder="gw")  # borrowing, forwarded
        assert grant.granted
        c.crash(owner)
        await c.clock.advance(TIMING.lease_ttl_s + 0.5)
        await c.settle_owners()
        new = c.owner(pool)
        assert new is not None and new.node_id == succ
        await c.clock.advance(1.0)
        stat = await _team(new, pool, "z")
        ref = GrantRef.decode(grant.grant_id)
        assert ref.epoch < _epoch(new, pool)
        assert stat is not None and stat.in_flight == 1, "the forwarder's grant was not re-counted"
    finally:
        await c.close()


del Class, NodeId, settle
