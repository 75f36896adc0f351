"""Campaign pacing under churn: a pool whose target cannot take it gets an owner within a
bound while other pools keep being taken (in-memory store, fake clock). The Cluster
helper comes from test_node.py.
"""

from __future__ import annotations

import pytest
from test_node import POOLS, TIMING, Cluster, FlakyStore

from ha.clock import FakeClock
from ha.cluster.view import preferred_owner
from ha.store.contract import KeyValue, LeaseId, StoreUnavailable
from ha.store.keys import decode_owner

pytestmark = pytest.mark.timeout(30)

CHURN_S = 0.2
"""How often another pool's owner key is deleted (and at once taken again by its owner):
shorter than ``campaign_delay_s``, so no replica ever sees ``campaign_delay_s`` in which
no pool was taken."""


class RefusingStore(FlakyStore):
    """Refuses one node's creates of one owner key (a target failing at one pool)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(clock)
        self.refuse: tuple[str, str] | None = None
        """(owner key, node) whose creates fail as if the store had not answered."""

    async def create(self, key: str, value: bytes, *, lease: LeaseId) -> KeyValue | None:
        if self.refuse is not None and key == self.refuse[0]:
            route = decode_owner(value, 0)
            if route is not None and route.node == self.refuse[1]:
                raise StoreUnavailable("refused for the test")
        return await super().create(key, value, lease=lease)


async def _delete_owner_key(cluster: Cluster, pool: str) -> None:
    kv = await cluster.store.get(f"/test/owners/{pool}")
    assert kv is not None, f"{pool} has no owner key"
    assert await cluster.store.delete_fenced(kv.key, create_revision=kv.create_revision)


async def test_a_pool_its_target_fails_to_take_is_owned_within_the_bound_under_churn() -> None:
    cluster = Cluster(2, store=RefusingStore)
    store = cluster.store
    assert isinstance(store, RefusingStore)
    await cluster.start()
    try:
        pool = POOLS[0].name
        names = [n.node_id for n in cluster.nodes]
        target = preferred_owner(pool, names)
        other = next(n for n in cluster.nodes if n.node_id != target)
        owner = cluster.owner(pool)
        assert owner is not None and owner.node_id == target
        churned = [p.name for p in POOLS[1:]]

        store.refuse = (f"/test/owners/{pool}", str(target))
        await _delete_owner_key(cluster, pool)
        start = cluster.clock.monotonic()
        bound = TIMING.lease_ttl_s + TIMING.campaign_delay_s
        taken_after: float | None = None
        step = 0
        while cluster.clock.monotonic() - start < 3 * bound:
            await _delete_owner_key(cluster, churned[step % len(churned)])
            step += 1
            await cluster.clock.advance(CHURN_S)
            # Every churned pool was taken again within this step: the churn holds.
            assert all(cluster.owner(p) is not None for p in churned), step
            if cluster.owner(pool) is not None:
                taken_after = cluster.clock.monotonic() - start
                break
        assert cluster.owner(pool) is other, (
            f"{pool} still ownerless {cluster.clock.monotonic() - start:.2f}s after its "
            f"target {target} failed to take it, under churn (bound {bound:g}s)"
        )
        assert taken_after is not None
        # Not at once: the churn keeps the other replica waiting for its target ...
        assert taken_after >= TIMING.lease_ttl_s, taken_after
        # ... but only up to the bound (plus a reconcile tick and a churn step).
        assert taken_after <= bound + CHURN_S + 0.1, taken_after
    finally:
        await cluster.close()
