"""Campaigns against a store that refuses them back off, on the in-memory store and a
fake clock: no real sleeps, no sockets."""

from __future__ import annotations

import logging

import pytest

from ha.api import NodeId, Peers
from ha.clock import FakeClock
from ha.node import Node
from ha.settings import PoolConfig, Timing
from ha.store.contract import KeyValue, LeaseId, StoreFull
from ha.store.memory import MemoryStore

pytestmark = pytest.mark.timeout(30)

TIMING = Timing(
    lease_ttl_s=3.0,
    keepalive_interval_s=0.5,
    rpc_timeout_s=0.25,
    fence_margin_s=0.5,
    snapshot_interval_s=0.5,
    campaign_delay_s=0.3,
    commit_window_s=0.0,  # writes start at once: nothing waits on the fake clock
    release_commit_s=0.0,
)
POOL = "pool-0"


class FullStore(MemoryStore):
    """A memory store out of space for owner keys, counting the creates refused."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.full = True
        self.refused = 0

    async def create(self, key: str, value: bytes, *, lease: LeaseId) -> KeyValue | None:
        if self.full:
            self.refused += 1
            raise StoreFull("database space exceeded")
        return await super().create(key, value, lease=lease)


async def test_campaigns_against_a_full_store_back_off_and_resume_when_it_has_room(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    store = FullStore(clock)
    node = Node(
        node_id=NodeId("n0"),
        advertise="addr-n0",
        pools=[PoolConfig(POOL, 4, {"a": 1.0})],
        timing=TIMING,
        store=store,
        peers=Peers.__new__(Peers),  # never called: a lone node forwards nothing
        prefix="/test",
        clock=clock,
    )
    await node.start()
    try:
        with caplog.at_level(logging.WARNING, logger="ha.cluster.ownership"):
            await clock.advance(TIMING.campaign_delay_s + 0.1)
            start = store.refused
            assert start >= 1
            await clock.advance(20.0)
        attempts = store.refused - start
        # Every 50 ms tick without backoff (400 attempts); with it 50 ms doubling to 1 s,
        # jittered down to half: at most 6 attempts to reach the cap, then one per
        # 0.5 to 1 s.
        assert 15 <= attempts <= 6 + 20 / 0.5, attempts
        full = [r for r in caplog.records if "store full" in r.getMessage()]
        assert full and all(r.levelno == logging.ERROR for r in full)
        assert len(full) <= 3, [r.getMessage() for r in full]  # one per 10 s, not per attempt

        store.full = False
        await clock.advance(1.5)
        assert next(s for s in node.status() if s.pool == POOL).owned
    finally:
        await node.close()
        await store.close()
