"""A one-node allocator over fairshare.Pool, for testing the gRPC layer without ha.node.

It honours the ``ha.api.Allocator`` contract as far as one node can: request-id dedupe,
idempotent release, adopt with phantoms, capacity changes, and the error classes. It
does no persistence and owns every pool at epoch 1.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

from fairshare import BORROW_BASE, MAX_RANK, RANK_STEP, Class, Grant, Pool
from ha.api import (
    ANY_EPOCH,
    AdoptResult,
    Decision,
    Epoch,
    GrantRef,
    HeldGrant,
    InvalidArgument,
    KeepAliveResult,
    MemberStatus,
    NodeId,
    NoOwner,
    PoolInfo,
    PoolName,
    PoolStatus,
    PoolView,
    Session,
    UnknownNode,
    UnknownPool,
    WrongEpoch,
)
from ha.settings import DegradedMode, PoolConfig


class FakeAllocator:
    """Owns every pool; decides locally with fairshare.Pool."""

    def __init__(
        self,
        pools: Sequence[PoolConfig],
        *,
        node_id: str = "fake-0",
        address: str = "127.0.0.1:0",
        epoch: int = 1,
    ) -> None:
        self.node_id = NodeId(node_id)
        self.address = address
        self.epoch = Epoch(epoch)
        self.configs = {p.name: p for p in pools}
        self.pools = {
            p.name: Pool(p.name, p.capacity, p.shares, half_life_s=p.half_life_s) for p in pools
        }
        self.grants: dict[str, Grant] = {}
        self.released: set[str] = set()
        self.requests: dict[tuple[str, str], Decision] = {}
        self.deciding = True
        self.owned = True
        self.degraded_decisions = 0
        self.closed = False
        self.calls: list[str] = []
        self.forwarded_calls = 0
        # Holder sessions: the ids presented (open ever after), each call's session, and
        # the pools of each KeepAlive.
        self.sessions: set[str] = set()
        self.presented: list[Session | None] = []
        self.keepalives: list[list[str]] = []
        self.session_ttl_s = 30.0
        self._seq = itertools.count(1)
        self._lock = asyncio.Lock()

    # -- lifecycle of ha.node.Node -------------------------------------------------------

    joined = True
    """Always a member: there is no cluster to join."""

    async def start(self) -> None:
        self.calls.append("start")

    async def stop_deciding(self) -> None:
        self.calls.append("stop_deciding")
        self.deciding = False

    async def close(self) -> None:
        self.calls.append("close")
        self.closed = True

    # -- ha.api.Allocator ------------------------------------------------------------------

    def _pool(self, name: str) -> Pool:
        pool = self.pools.get(name)
        if pool is None:
            raise UnknownPool(name)
        return pool

    async def acquire(
        self,
        *,
        pool: str,
        team: str,
        cls: Class,
        est_tokens: int,
        holder: str = "",
        request_id: str = "",
        try_only: bool = False,
        wait_s: float = 0.0,
        epoch: Epoch = ANY_EPOCH,
        forwarded: bool = False,
        session: Session | None = None,
    ) -> Decision:
        target = self._pool(pool)
        self._saw(session)
        if forwarded and epoch not in (ANY_EPOCH, self.epoch):
            raise WrongEpoch(pool, self.node_id, self.address, self.epoch)
        if not self.owned:
            if self.configs[pool].degraded_mode is DegradedMode.FAIL_CLOSED:
                raise NoOwner(pool)
            self.degraded_decisions += 1
            return Decision(
                granted=True,
                grant_id=GrantRef(PoolName(pool), Epoch(0), next(self._seq), team, holder).encode(),
                priority=BORROW_BASE + RANK_STEP * MAX_RANK + cls,
                borrowing=True,
                saturated=False,
                degraded=True,
                owner=NodeId(""),
                epoch=Epoch(0),
            )
        key = (holder, request_id)
        if request_id and key in self.requests:
            return self.requests[key]
        try:
            grant = (
                target.try_acquire(team, cls, est_tokens)
                if try_only
                else target.acquire(team, cls, est_tokens)
            )
        except ValueError as e:
            raise InvalidArgument("team", str(e)) from e
        if grant is None:
            decision = Decision(False, "", 0, False, True, False, self.node_id, self.epoch)
        else:
            grant_id = GrantRef(PoolName(pool), self.epoch, next(self._seq), team, holder).encode()
            self.grants[grant_id] = grant
            decision = Decision(
                granted=True,
                grant_id=grant_id,
                priority=grant.priority,
                borrowing=grant.borrowing,
                saturated=grant.saturated,
                degraded=False,
                owner=self.node_id,
                epoch=self.epoch,
            )
        if request_id:
            self.requests[key] = decision
        return decision

    async def release(self, grant_id: str, consumed: float, *, forwarded: bool = False) -> None:
        ref = GrantRef.decode(grant_id)
        self._pool(ref.pool)
        if forwarded:
            self.forwarded_calls += 1
        grant = self.grants.pop(grant_id, None)
        if grant is not None:
            grant.release(consumed)
            self.released.add(grant_id)

    async def adopt(
        self,
        *,
        pool: str,
        epoch: Epoch,
        holder: str,
        grants: Sequence[HeldGrant],
        complete: bool,
        forwarded: bool = False,
        session: Session | None = None,
    ) -> AdoptResult:
        target = self._pool(pool)
        self._saw(session)
        if epoch != self.epoch:
            raise WrongEpoch(pool, self.node_id, self.address, self.epoch)
        adopted = dropped = 0
        for held in grants:
            ref = GrantRef.decode(held.grant_id)
            if ref.epoch == self.epoch or held.grant_id in self.grants:
                continue
            self.grants[held.grant_id] = target.adopt(
                held.team, held.priority, held.borrowing, held.est_tokens
            )
            adopted += 1
            dropped += int(target.drop_phantom(held.team))
        return AdoptResult(adopted, dropped, self.node_id, self.epoch)

    async def keep_alive(
        self, pools: Sequence[str], session: Session, *, forwarded: bool = False
    ) -> KeepAliveResult:
        for pool in pools:
            self._pool(pool)
        self.keepalives.append(list(pools))
        known = [p for p in pools if session.id in self.sessions]
        return KeepAliveResult(known, [p for p in pools if p not in known], self.session_ttl_s)

    def _saw(self, session: Session | None) -> None:
        """Remembers the session a call presented (a real owner opens or renews it)."""
        self.presented.append(session)
        if session is not None:
            self.sessions.add(session.id)

    async def snapshot(self, pool: str, *, forwarded: bool = False) -> PoolView:
        target = self._pool(pool)
        return PoolView(
            PoolName(pool),
            target.capacity,
            self.node_id,
            self.epoch,
            target.snapshot(),
            within=target.within(),
        )

    async def list_pools(self) -> list[PoolInfo]:
        return [
            PoolInfo(PoolName(name), p.capacity, self.node_id, self.address, self.epoch)
            for name, p in self.pools.items()
        ]

    async def set_capacity(self, pool: str, capacity: int, *, forwarded: bool = False) -> int:
        try:
            return self._pool(pool).set_capacity(capacity)
        except ValueError as e:
            raise InvalidArgument("capacity", str(e)) from e

    async def switchover(self, pool: str, node: str, *, forwarded: bool = False) -> None:
        self._pool(pool)
        if node != self.node_id:
            raise UnknownNode(node)

    def status(self) -> list[PoolStatus]:
        return [
            PoolStatus(
                pool=PoolName(name),
                owned=self.owned,
                owner=self.node_id,
                epoch=self.epoch,
                transitions=1,
                fence_left_s=4.0,
                snapshot_age_s=0.5,
                teams=p.snapshot(),
                degraded_decisions=self.degraded_decisions,
                within=p.within(),
            )
            for name, p in self.pools.items()
        ]

    def members(self) -> list[MemberStatus]:
        pools = [PoolName(name) for name in sorted(self.pools)]
        return [MemberStatus(self.node_id, self.address, 1.0, pools, lease_left_s=4.0)]
