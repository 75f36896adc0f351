"""Many pools on three replicas over a real etcd: all owned fast, then idle writes nothing.

Three nodes in this process share the session's etcd; writes are counted by etcd's own
revision, which every write moves (lease renewals do not).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from ha.api import NodeId, PoolName
from ha.cluster.view import preferred_owner
from ha.node import Node
from ha.settings import PoolConfig, Timing
from ha.store.etcd import connect

pytestmark = [pytest.mark.etcd, pytest.mark.timeout(30)]

POOLS = [PoolConfig(f"idle-{i:02d}", 10, {"a": 0.5, "b": 0.5}) for i in range(50)]
TIMING = Timing(snapshot_interval_s=0.5, rebalance_settle_s=2.0)
OWNED_WITHIN_S = 10.0
IDLE_S = 3.0  # six snapshot ticks


class _Peers:
    """Nobody forwards here: the test calls no replica."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected peers.{name}")


def placed(nodes: list[Node]) -> bool:
    """Every pool owned, deciding, by exactly its preferred replica."""
    members = [n.node_id for n in nodes]
    for pool in POOLS:
        owners = [n.node_id for n in nodes if n.ownership.deciding(PoolName(pool.name)) is not None]
        if owners != [preferred_owner(pool.name, members)]:
            return False
    return True


async def test_fifty_pools_are_owned_where_they_belong_then_idle_writes_nothing(
    etcd_endpoints: list[str],
) -> None:
    prefix = f"/idle-{uuid.uuid4().hex[:8]}"
    nodes = []
    for i in range(3):
        store = await connect(etcd_endpoints, rpc_timeout_s=TIMING.rpc_timeout_s, seed=i)
        nodes.append(
            Node(
                node_id=NodeId(f"n{i}"),
                advertise=f"addr-{i}",
                pools=POOLS,
                timing=TIMING,
                store=store,
                peers=_Peers(),
                prefix=prefix,
                owns_store=True,
            )
        )
    try:
        start = time.monotonic()
        await asyncio.gather(*(n.start() for n in nodes))
        while not placed(nodes):
            assert time.monotonic() - start < OWNED_WITHIN_S, "pools not placed in time"
            await asyncio.sleep(0.05)
        # Past the first snapshots and any rebalancing, then idle.
        await asyncio.sleep(TIMING.rebalance_settle_s + 0.5)
        assert placed(nodes)
        store = nodes[0]._store
        _, before = await store.get_prefix(prefix)
        await asyncio.sleep(IDLE_S)
        _, after = await store.get_prefix(prefix)
        assert after == before, f"{after - before} writes while idle"
    finally:
        await asyncio.gather(*(n.close() for n in nodes))
