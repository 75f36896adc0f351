"""A replica that has just joined, on the in-memory store under a fake clock.

For ``campaign_delay_s`` after it joins a replica leaves alone the pools nobody has owned
since (a cluster starting one replica after another does not give every pool to the
first), but it takes at once a pool it is the target of and saw lose its owner: in a
rolling restart the next replica stops right after the restarted one joined. The Cluster
helper comes from test_node.py.
"""

from __future__ import annotations

import pytest
from test_node import POOLS, TIMING, Cluster

from ha.cluster.view import preferred_owner
from ha.node import Node

pytestmark = pytest.mark.timeout(30)

STEP_S = 0.01


async def _join(cluster: Cluster, name: str) -> Node:
    node = cluster.make(name)
    cluster.nodes.append(node)
    await node.start()
    return node


def _transitions(cluster: Cluster, pool: str) -> int:
    return sum(s.transitions for n in cluster.nodes for s in n.status() if s.pool == pool)


async def test_a_pool_handed_over_just_after_its_target_joined_is_taken_at_once() -> None:
    cluster = Cluster(2)
    await cluster.start()
    try:
        joined = await _join(cluster, "n2")
        await cluster.clock.advance(STEP_S)  # it has listed the members and the owners
        members = [n.node_id for n in cluster.nodes]
        moves = [
            (pool.name, owner)
            for pool in POOLS
            if (owner := cluster.owner(pool.name)) is not None
            and preferred_owner(pool.name, [m for m in members if m != owner.node_id])
            == joined.node_id
        ]
        assert moves, "the test needs a pool whose successor would be the new replica"
        pool, owner = moves[0]
        await owner.close()
        cluster.nodes.remove(owner)
        cluster.peers.down.add(owner.address)
        waited = 0.0
        while cluster.owner(pool) is None and waited < TIMING.campaign_delay_s:
            await cluster.clock.advance(STEP_S)
            waited += STEP_S
        assert cluster.owner(pool) is joined, f"{pool} ownerless {waited:.2f}s after handover"
        # One campaign and one snapshot write: a few steps, not the settling delay.
        assert waited <= TIMING.campaign_delay_s / 3
    finally:
        await cluster.close()


async def test_a_cluster_started_one_replica_after_another_places_each_pool_once() -> None:
    cluster = Cluster(0)
    try:
        await _join(cluster, "n0")
        await cluster.clock.advance(TIMING.campaign_delay_s / 2)
        assert all(cluster.owner(p.name) is None for p in POOLS), "the first took pools early"
        for name in ("n1", "n2"):
            await _join(cluster, name)
        await cluster.settle_owners()
        members = [n.node_id for n in cluster.nodes]
        for pool in POOLS:
            owner = cluster.owner(pool.name)
            assert owner is not None and owner.node_id == preferred_owner(pool.name, members)
            assert _transitions(cluster, pool.name) == 1, f"{pool.name} moved after placement"
    finally:
        await cluster.close()
