"""An in-process peer transport for tests that run several ``ha.node.Node`` in one process:
a call to a peer's address is the other node's method, marked as forwarded (what
``server.peers`` carries over gRPC). An address in ``down``, or one no node was registered
under, raises ``PeerUnavailable`` as an unreachable replica would."""

from __future__ import annotations

from collections.abc import Sequence

from fairshare import Class
from ha.api import (
    AdoptResult,
    Decision,
    Epoch,
    HeldGrant,
    KeepAliveResult,
    PeerUnavailable,
    PoolView,
    Session,
)
from ha.node import Node


class LocalPeers:
    """In-process peer transport: calls the other node's methods as a forwarded call."""

    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}
        self.down: set[str] = set()

    def _node(self, address: str) -> Node:
        if address in self.down or address not in self.nodes:
            raise PeerUnavailable(address)
        return self.nodes[address]

    async def acquire(
        self,
        address: str,
        *,
        pool: str,
        team: str,
        cls: Class,
        est_tokens: int,
        holder: str,
        request_id: str,
        try_only: bool,
        epoch: Epoch,
        timeout: float,
        session: Session | None = None,
        wait_s: float = 0.0,
    ) -> Decision:
        return await self._node(address).acquire(
            pool=pool,
            team=team,
            cls=cls,
            est_tokens=est_tokens,
            holder=holder,
            request_id=request_id,
            try_only=try_only,
            wait_s=wait_s,
            epoch=epoch,
            forwarded=True,
            session=session,
        )

    async def release(self, address: str, grant_id: str, consumed: float, timeout: float) -> None:
        await self._node(address).release(grant_id, consumed, forwarded=True)

    async def adopt(
        self,
        address: str,
        *,
        pool: str,
        epoch: Epoch,
        holder: str,
        grants: Sequence[HeldGrant],
        complete: bool,
        timeout: float,
        session: Session | None = None,
    ) -> AdoptResult:
        return await self._node(address).adopt(
            pool=pool,
            epoch=epoch,
            holder=holder,
            grants=grants,
            complete=complete,
            forwarded=True,
            session=session,
        )

    async def keep_alive(
        self, address: str, pools: Sequence[str], session: Session, timeout: float
    ) -> KeepAliveResult:
        return await self._node(address).keep_alive(pools, session, forwarded=True)

    async def snapshot(self, address: str, pool: str, timeout: float) -> PoolView:
        return await self._node(address).snapshot(pool, forwarded=True)

    async def set_capacity(self, address: str, pool: str, capacity: int, timeout: float) -> int:
        return await self._node(address).set_capacity(pool, capacity, forwarded=True)

    async def switchover(self, address: str, pool: str, node: str, timeout: float) -> None:
        await self._node(address).switchover(pool, node, forwarded=True)

    async def close(self) -> None:
        return None
