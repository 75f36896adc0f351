"""The grants a replica obtained for its callers from another owner, or degraded.

A replica that forwards an Acquire (or decides it degraded) keeps a stub of the grant, so
that the grant is re-reported (Adopt) to every new owner of its pool: a failover then
loses no grant the callers of this replica hold.

Guarantees: a stub lives until its grant is released through this replica, or for the
longest ``max_request_s`` (no request runs longer); ``readopt`` re-reports a pool's stubs
of earlier epochs to a new owner until it takes them, the route moves on, or
``forward_deadline_s`` passes.

Non-guarantees: a grant released through another replica keeps its stub here until it
ages out; its re-report is then ignored by the owner (already settled).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from fairshare import Grant
from fairshare.limits import MAX_ADOPT_GRANTS
from ha.api import (
    Decision,
    Epoch,
    HeldGrant,
    NodeId,
    NoOwner,
    Peers,
    PeerUnavailable,
    PoolName,
    WrongEpoch,
)
from ha.clock import Clock
from ha.cluster.ownership import Ownership
from ha.cluster.view import ClusterView
from ha.settings import PoolConfig, Timing
from ha.store.keys import Route

logger = logging.getLogger(__name__)

_RETRY_S = 0.05
"""How soon a re-report that was not taken is tried again."""


@dataclass(slots=True)
class Stub:
    """A grant this replica obtained for its caller from another owner (or degraded)."""

    grant: Grant
    held: HeldGrant
    pool: PoolName
    epoch: Epoch
    since: float  # monotonic: a wall step must not forget (or keep) it early


class Stubs:
    """One replica's stubs, by grant id (see module)."""

    def __init__(
        self,
        *,
        node_id: NodeId,
        configs: Mapping[PoolName, PoolConfig],
        timing: Timing,
        clock: Clock,
        view: ClusterView,
        peers: Peers,
        ownership: Ownership,
    ) -> None:
        self.node_id = node_id
        self.timing = timing
        self.view = view
        self._configs = configs
        self._clock = clock
        self._peers = peers
        self._ownership = ownership
        self._stubs: dict[str, Stub] = {}

    def take(self, grant_id: str) -> Stub | None:
        """Forgets the stub of ``grant_id`` (released) and returns it, if there was one."""
        return self._stubs.pop(grant_id, None)

    def put_back(self, grant_id: str, stub: Stub) -> None:
        """Keeps a stub taken for a release that did not go through."""
        self._stubs[grant_id] = stub

    def keep(self, pool: PoolName, team: str, est_tokens: int, decision: Decision) -> None:
        """Remembers a grant made elsewhere, to release it and re-report it on failover."""
        grant_id = decision.grant_id

        def release(consumed: float) -> None:
            self._stubs.pop(grant_id, None)

        held = HeldGrant(grant_id, team, decision.priority, decision.borrowing, est_tokens)
        grant = Grant.remote(
            team, decision.priority, decision.borrowing, decision.saturated, release
        )
        self._stubs[grant_id] = Stub(grant, held, pool, decision.epoch, self._clock.monotonic())

    async def readopt(self, pool: PoolName, route: Route) -> None:
        """Re-reports the grants this replica obtained for its callers to a new owner.

        The new owner may still be restoring when its key appears, so this retries until
        the owner takes it, the route moves on, or the forward deadline passes. When this
        node is the new owner, it re-counts them itself once the pool is installed.
        """
        stubs = [s for s in self._stubs.values() if s.pool == pool and s.epoch < route.epoch]
        if not stubs:
            return
        grants = [s.held for s in stubs]
        holder = f"replica:{self.node_id}"
        deadline = self._clock.monotonic() + self.timing.forward_deadline_s
        while self._clock.monotonic() < deadline and self.view.route(pool) == route:
            owned = self._ownership.deciding(pool)
            try:
                if route.node == self.node_id:
                    if owned is not None and owned.epoch == route.epoch:
                        owned.adopt(holder=holder, grants=grants, complete=False)
                        return
                else:
                    while grants:  # an Adopt carries at most MAX_ADOPT_GRANTS
                        await self._peers.adopt(
                            route.address,
                            pool=pool,
                            epoch=route.epoch,
                            holder=holder,
                            grants=grants[:MAX_ADOPT_GRANTS],
                            complete=False,
                            timeout=self.timing.rpc_timeout_s,
                        )
                        grants = grants[MAX_ADOPT_GRANTS:]
                    return
            except (WrongEpoch, PeerUnavailable, NoOwner) as e:
                logger.debug("pool %s: re-report to %s not taken yet: %s", pool, route.node, e)
            await self._clock.sleep(_RETRY_S)
        logger.info("pool %s: gave up re-reporting %d grants to %s", pool, len(grants), route.node)

    def forget(self) -> None:
        """Forgets the stubs older than the longest ``max_request_s``."""
        longest = max((c.max_request_s for c in self._configs.values()), default=0.0)
        horizon = self._clock.monotonic() - longest
        for grant_id in [g for g, s in self._stubs.items() if s.since < horizon]:
            del self._stubs[grant_id]
