"""Switchover and rebalancing on the in-memory store under a fake clock.

An operator's switchover holds (the handover key pins the pool to its target while the
target's member key lives), rebalancing toward a pool's preferred replica waits until
that replica has been a member for ``rebalance_settle_s``, and a graceful handover is one
transition with no false loss in the log. The Cluster helper comes from test_node.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
from test_node import POOLS, TIMING, Cluster, acquire

from ha.api import HeldGrant, NodeId, WrongEpoch
from ha.cluster.view import preferred_owner
from ha.node import Node
from ha.store.contract import NO_LEASE, LeaseId

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    c = Cluster(3)
    await c.start()
    yield c
    await c.close()


def _members(cluster: Cluster) -> list[NodeId]:
    return [n.node_id for n in cluster.nodes]


def _owner_id(cluster: Cluster, pool: str) -> str:
    owner = cluster.owner(pool)
    return owner.node_id if owner is not None else ""


async def _switch(cluster: Cluster, pool: str, target: Node) -> None:
    await cluster.nodes[0].switchover(pool, target.node_id)
    for _ in range(50):
        if cluster.owner(pool) is target:
            return
        await cluster.clock.advance(0.02)
    raise AssertionError(f"{pool} never reached {target.node_id}: {_owner_id(cluster, pool)}")


def _transitions(nodes: list[Node], pool: str) -> int:
    return sum(s.transitions for n in nodes for s in n.status() if s.pool == pool)


async def test_a_switchover_to_a_non_preferred_replica_holds(cluster: Cluster) -> None:
    pool = "pool-1"
    preferred = preferred_owner(pool, _members(cluster))
    assert _owner_id(cluster, pool) == preferred
    target = next(n for n in cluster.nodes if n.node_id != preferred)
    await _switch(cluster, pool, target)
    # Many ticks, well past the settle time that rebalancing waits for.
    for _ in range(int(3 * TIMING.rebalance_settle_s / 0.25)):
        await cluster.clock.advance(0.25)
        assert _owner_id(cluster, pool) == target.node_id
    # Every replica reads the same pin from the store.
    assert all(n.view.pinned(pool) == target.node_id for n in cluster.nodes)
    # Another switchover replaces the pin: back to the preferred replica, and it holds.
    back = next(n for n in cluster.nodes if n.node_id == preferred)
    await _switch(cluster, pool, back)
    await cluster.clock.advance(2 * TIMING.rebalance_settle_s)
    assert _owner_id(cluster, pool) == preferred


async def test_a_pin_holds_for_every_owner(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pinned target self-fences for a while (its member key stays): another replica
    takes the pool meanwhile, then hands it back to the target, and the pin stays."""
    pool = "pool-1"
    preferred = preferred_owner(pool, _members(cluster))
    target = next(n for n in cluster.nodes if n.node_id != preferred)
    await _switch(cluster, pool, target)
    monkeypatch.setattr(target._lease, "fenced", lambda: False)
    for _ in range(40):
        await cluster.clock.advance(0.05)
        if _owner_id(cluster, pool) not in ("", target.node_id):
            break
    interim = _owner_id(cluster, pool)
    assert interim not in ("", target.node_id)
    monkeypatch.undo()
    # Back once the target has been a member for rebalance_settle_s (it never left).
    for _ in range(int((TIMING.rebalance_settle_s + 1.0) / 0.05)):
        await cluster.clock.advance(0.05)
        if cluster.owner(pool) is target:
            break
    assert cluster.owner(pool) is target, f"{pool} stayed on {_owner_id(cluster, pool)}"
    assert all(n.view.pinned(pool) == target.node_id for n in cluster.nodes)
    await cluster.clock.advance(2 * TIMING.rebalance_settle_s)
    assert cluster.owner(pool) is target


async def test_a_pin_ends_when_its_target_leaves_the_cluster(cluster: Cluster) -> None:
    pool = "pool-2"
    preferred = preferred_owner(pool, _members(cluster))
    target = next(n for n in cluster.nodes if n.node_id != preferred)
    await _switch(cluster, pool, target)
    # The target leaves (a restart: same node id, a new member key): the pin is void.
    await target.close()
    cluster.nodes.remove(target)
    await cluster.settle_owners()
    back = cluster.make(target.node_id)
    cluster.peers.down.discard(back.address)
    cluster.nodes.append(back)
    await back.start()
    assert all(n.view.pinned(pool) is None for n in cluster.nodes)
    await cluster.clock.advance(TIMING.rebalance_settle_s + 1.0)
    assert _owner_id(cluster, pool) == preferred_owner(pool, _members(cluster))


async def test_a_switchover_to_the_owner_itself_pins_it_there(cluster: Cluster) -> None:
    """Pinned where it is, a pool does not follow a preferred replica that joins later."""
    pool = "pool-3"
    owner = cluster.owner(pool)
    assert owner is not None
    await cluster.nodes[0].switchover(pool, owner.node_id)
    await cluster.clock.advance(0.2)
    late = next(
        name
        for name in (f"late{i}" for i in range(100))
        if preferred_owner(pool, [*_members(cluster), NodeId(name)]) == name
    )
    newcomer = cluster.make(late)
    cluster.nodes.append(newcomer)
    await newcomer.start()
    await cluster.clock.advance(2 * TIMING.rebalance_settle_s)
    assert cluster.owner(pool) is owner
    assert all(n.view.pinned(pool) == owner.node_id for n in cluster.nodes)


async def test_a_flapping_preferred_replica_does_not_make_its_pools_ping_pong(
    cluster: Cluster,
) -> None:
    """The preferred replica of some pools restarts every 3.5 s (longer than T, shorter
    than rebalance_settle_s), five times: its pools move away once and stay away until
    it has been up for rebalance_settle_s."""
    flapper = cluster.nodes[2]
    mine = [p.name for p in POOLS if cluster.owner(p.name) is flapper]
    assert mine, "the test needs a replica that owns a pool"
    up_s = 3.5
    assert TIMING.lease_ttl_s < up_s < TIMING.rebalance_settle_s
    owners = {p: _owner_id(cluster, p) for p in mine}
    moves = dict.fromkeys(mine, 0)

    async def watch(seconds: float) -> None:
        for _ in range(int(seconds / 0.1)):
            await cluster.clock.advance(0.1)
            for p in mine:
                now = _owner_id(cluster, p)
                if now and now != owners[p]:
                    moves[p] += 1
                    owners[p] = now

    for _ in range(5):
        await flapper.close()
        cluster.nodes.remove(flapper)
        await watch(0.5)
        flapper = cluster.make(flapper.node_id)
        cluster.peers.down.discard(flapper.address)
        cluster.nodes.append(flapper)
        await flapper.start()
        await watch(up_s)
    assert moves == dict.fromkeys(mine, 1), f"ownership changes while flapping: {moves}"
    # Once it stays up, its pools come back to it, once.
    await watch(TIMING.rebalance_settle_s)
    assert moves == dict.fromkeys(mine, 2)
    assert all(owners[p] == flapper.node_id for p in mine)


async def test_a_graceful_handover_is_one_transition_and_logs_no_loss(
    cluster: Cluster, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handover key's write takes a few reconcile ticks, as a real store's round trip
    can: the reconcile loop must not take the handed-over pool for a lost one."""
    caplog.set_level(logging.INFO)
    store_put = cluster.store.put

    async def slow_put(key: str, value: bytes, *, lease: LeaseId = NO_LEASE) -> int:
        if "/handover/" in key:
            await cluster.clock.sleep(0.2)
        return await store_put(key, value, lease=lease)

    monkeypatch.setattr(cluster.store, "put", slow_put)
    pool = "pool-4"
    owner = cluster.owner(pool)
    assert owner is not None
    d = await acquire(owner, pool, "a")
    await owner.release(d.grant_id, 1.0)
    before = _transitions(cluster.nodes, pool)
    caplog.clear()
    target = cluster.other(pool)
    switch = asyncio.ensure_future(cluster.nodes[0].switchover(pool, target.node_id))
    await cluster.clock.advance(1.0)
    await switch
    assert cluster.owner(pool) is target
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "lost pool" in m], messages
    assert _transitions(cluster.nodes, pool) - before == 1
    assert any(f"handed pool {pool} over to {target.node_id}" in m for m in messages)
    assert not [m for m in messages if "BUG" in m]


def test_a_handover_record_of_an_earlier_version_reads_as_a_hint() -> None:
    from ha.store.keys import Handover, decode_handover, encode_handover

    assert decode_handover(b'{"node": "n1", "wall": 5.0}') == Handover(NodeId("n1"), 5.0)
    pin = decode_handover(encode_handover("n2", 7.0, member=42, pinned=True))
    assert pin == Handover(NodeId("n2"), 7.0, 42, True)
    assert decode_handover(b"[]") is None


async def test_a_complete_re_report_for_an_older_epoch_is_refused_through_a_forwarder(
    cluster: Cluster,
) -> None:
    """A gateway re-reports for the epoch it knows while the pool has moved on: a replica
    that forwards it must not hand it to the newer owner, whose phantoms include grants of
    that epoch the inventory leaves out (they are the ones decided at that epoch)."""
    pool = "pool-1"
    first = cluster.owner(pool)
    assert first is not None
    older = await acquire(first, pool, "a", holder="gw")  # at epoch e0
    second = next(n for n in cluster.nodes if n is not first)
    await _switch(cluster, pool, second)
    known = await acquire(second, pool, "a", holder="gw")  # at e1: the client's epoch
    third = next(n for n in cluster.nodes if n not in (first, second))
    await _switch(cluster, pool, third)
    view = await third.snapshot(pool)
    assert next(s for s in view.teams if s.team == "a").phantoms == 2
    # The client's complete inventory for e1: every live grant not decided at e1.
    inventory = [HeldGrant(older.grant_id, "a", older.priority, older.borrowing, 1)]
    with pytest.raises(WrongEpoch):
        await first.adopt(
            pool=pool, epoch=known.epoch, holder="gw", grants=inventory, complete=True
        )
    view = await third.snapshot(pool)
    assert next(s for s in view.teams if s.team == "a").phantoms == 2, (
        "the grant decided at the client's epoch lost its phantom while still held"
    )
