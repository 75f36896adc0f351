"""How a replica answers every call: from the pool it owns, from the owner, or degraded.

Guarantees:
- Any replica accepts every call. One that decides for the pool answers from its own
  state; otherwise it forwards to the owner with the epoch it expects and refreshes its
  route on FAILED_PRECONDITION (WrongEpoch).
- A forwarded call (``forwarded=True``) is answered from this replica's own state only,
  never forwarded again: a replica that does not decide for the pool (at the named epoch,
  for Acquire) raises WrongEpoch naming the owner it routes to.
- When no owner answers an Acquire within ``degraded_after_s``, the pool's degraded mode
  applies: ``fail_closed`` raises NoOwner, ``fail_open`` grants at ``degraded_priority``
  with a signed ``DEGRADED_EPOCH`` id, counted by no owner until adopted.
- A grant obtained from another owner (or degraded) is remembered as a stub for
  ``max_request_s``, and re-reported (Adopt) to each new owner of its pool.

Non-guarantees: decisions made in degraded mode are not counted until adopted; a stub is
forgotten after ``max_request_s`` (its request cannot be running any more).
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TypeVar

from fairshare import degraded_priority
from fairshare.digest import grant_id_digest
from ha.api import (
    ANY_EPOCH,
    DEGRADED_EPOCH,
    NO_EPOCH,
    AcquireCall,
    AdoptResult,
    Decision,
    Epoch,
    GrantRef,
    HeldGrant,
    KeepAliveResult,
    NodeId,
    NoOwner,
    Peers,
    PeerUnavailable,
    PoolInfo,
    PoolName,
    PoolView,
    Session,
    StoreUnavailable,
    UnknownNode,
    UnknownPool,
    WrongEpoch,
)
from ha.clock import Clock
from ha.cluster.ownership import Ownership
from ha.cluster.view import ClusterView
from ha.grantkeys import GrantKeys
from ha.owned.genuine import degraded_grant_id
from ha.owned.pool import NotDeciding, OwnedPool
from ha.settings import DegradedMode, PoolConfig, Timing
from ha.stubs import Stubs

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
ROUTE_POLL_S = 0.01
"""How often a call waiting for a route looks again."""


class CallRouter:
    """Answers the Allocator's calls for one replica (see module)."""

    def __init__(
        self,
        *,
        node_id: NodeId,
        address: str,
        configs: Mapping[PoolName, PoolConfig],
        timing: Timing,
        clock: Clock,
        view: ClusterView,
        peers: Peers,
        grant_keys: GrantKeys,
        ownership: Ownership,
    ) -> None:
        self.node_id = node_id
        self.address = address
        self.timing = timing
        self.view = view
        self._configs = configs
        self._clock = clock
        self._peers = peers
        self._grant_keys = grant_keys
        self._ownership = ownership
        self._owned = ownership.owned
        self.degraded: dict[PoolName, int] = dict.fromkeys(configs, 0)
        """Degraded decisions this replica made, per pool."""
        self.stubs = Stubs(
            node_id=node_id,
            configs=configs,
            timing=timing,
            clock=clock,
            view=view,
            peers=peers,
            ownership=ownership,
        )
        """The grants this replica obtained for its callers elsewhere (``ha.stubs``)."""
        self._request_seq = 0
        # Generated request ids must not repeat across restarts of this node: an owner
        # that outlived the restart would answer a new request with an old grant.
        self._incarnation = secrets.token_hex(6)

    async def acquire(self, call: AcquireCall) -> Decision:
        """``ha.api.Allocator.acquire``, its arguments as one record."""
        config = self._config(call.pool)
        name = PoolName(call.pool)
        if not call.request_id and not call.forwarded:
            # Forwarding may retry: a request id makes the owner answer a retry alike.
            self._request_seq += 1
            request_id = f"{self.node_id}:{self._incarnation}:{self._request_seq}"
            call = dataclasses.replace(call, request_id=request_id)
        if call.forwarded:  # answer from our own state only
            try:
                return await _decide(self._owner_at(name, call.epoch), call)
            except NotDeciding:
                raise self._wrong_epoch(name) from None
        deadline = self._clock.monotonic() + self.timing.degraded_after_s
        waits_until = self._clock.monotonic() + call.wait_s  # a retry waits what is left
        while True:
            wait_s = max(0.0, waits_until - self._clock.monotonic())
            local = self._ownership.deciding(name)
            if local is not None:
                try:
                    # The call as it came unless its wait changed (only a held call's
                    # retry): copying it cost each decision about 0.02 ms of CPU.
                    attempt = (
                        call if wait_s == call.wait_s else dataclasses.replace(call, wait_s=wait_s)
                    )
                    return await _decide(local, attempt)
                except NotDeciding:
                    pass
            route = self.view.route(name)
            if route is not None and route.node != self.node_id:
                try:
                    decision = await self._peers.acquire(
                        route.address,
                        pool=call.pool,
                        team=call.team,
                        cls=call.cls,
                        est_tokens=call.est_tokens,
                        holder=call.holder,
                        request_id=call.request_id,
                        try_only=call.try_only,
                        epoch=route.epoch,
                        # The owner may hold the call for its wait: the forward waits too.
                        timeout=max(self.timing.rpc_timeout_s, deadline - self._clock.monotonic())
                        + wait_s,
                        session=call.session,
                        wait_s=wait_s,
                    )
                except (WrongEpoch, PeerUnavailable) as e:
                    logger.debug("forward of %s to %s failed: %s", call.pool, route.node, e)
                else:
                    if decision.granted:
                        self.stubs.keep(name, call.team, call.est_tokens, decision)
                    return decision
            if self._clock.monotonic() >= deadline:
                return self._degrade(config, call)
            await self._clock.sleep(ROUTE_POLL_S)

    async def release(self, grant_id: str, consumed: float, *, forwarded: bool = False) -> None:
        """``ha.api.Allocator.release``."""
        ref = GrantRef.decode(grant_id)
        self._config(ref.pool)
        owned = self._ownership.deciding(ref.pool)
        if owned is not None and ref.epoch <= owned.epoch:
            owned.release(ref, consumed)
            self.stubs.take(grant_id)
            # Usage is what fairness stands on: a release is acknowledged only once a
            # fenced write covers it, so no owner loses an acknowledged consumption. No
            # request waits on a release, so its write may wait to be shared.
            try:
                await owned.durable(lazy=True)
            except NotDeciding as e:
                digest = grant_id_digest(grant_id)
                raise StoreUnavailable(f"release of grant {digest} not persisted: {e}") from e
            return
        if forwarded:
            raise self._wrong_epoch(ref.pool)
        stub = self.stubs.take(grant_id)
        try:
            await self._to_owner(
                ref.pool,
                lambda address: self._peers.release(
                    address, grant_id, consumed, self.timing.rpc_timeout_s
                ),
            )
        except BaseException:
            if stub is not None:
                self.stubs.put_back(grant_id, stub)
            raise

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
        """``ha.api.Allocator.adopt``."""
        self._config(pool)
        name = PoolName(pool)
        owned = self._ownership.deciding(name)
        if owned is not None:
            if epoch not in (ANY_EPOCH, owned.epoch):
                raise WrongEpoch(name, self.node_id, self.address, owned.epoch)
            return owned.adopt(holder=holder, grants=grants, complete=complete, session=session)
        if forwarded:
            raise self._wrong_epoch(name)
        route = self.view.route(name)
        if epoch != ANY_EPOCH and route is not None and route.epoch != epoch:
            # A complete inventory speaks for one epoch: it leaves out the grants decided
            # at it, so a newer owner would close their phantoms while they are held.
            raise WrongEpoch(name, route.node, route.address, route.epoch)
        return await self._to_owner(
            name,
            lambda address: self._peers.adopt(
                address,
                pool=pool,
                epoch=epoch,
                holder=holder,
                grants=grants,
                complete=complete,
                timeout=self.timing.rpc_timeout_s,
                session=session,
            ),
        )

    async def keep_alive(
        self, pools: Sequence[str], session: Session, *, forwarded: bool = False
    ) -> KeepAliveResult:
        """``ha.api.Allocator.keep_alive``: renews here what this replica owns, and asks
        each other owner once for its pools."""
        renewed: list[str] = []
        unknown: list[str] = []
        ttls: list[float] = []
        elsewhere: dict[str, list[str]] = {}
        for pool in dict.fromkeys(pools):
            self._config(pool)
            owned = self._ownership.deciding(PoolName(pool))
            if owned is not None:
                try:
                    alive = owned.keep_alive(session)
                except NotDeciding:
                    continue
                (renewed if alive else unknown).append(pool)
                ttls.append(owned.session_ttl_s)
                continue
            route = self.view.route(PoolName(pool))
            if not forwarded and route is not None and route.node != self.node_id:
                elsewhere.setdefault(route.address, []).append(pool)
        for address, names in elsewhere.items():
            try:
                answer = await self._peers.keep_alive(
                    address, names, session, self.timing.rpc_timeout_s
                )
            except (WrongEpoch, PeerUnavailable) as e:
                logger.debug("keepalive of %s at %s failed: %s", names, address, e)
                continue
            renewed += answer.renewed
            unknown += answer.unknown
            if answer.ttl_s > 0:
                ttls.append(answer.ttl_s)
        return KeepAliveResult(renewed, unknown, min(ttls, default=0.0))

    async def snapshot(self, pool: str, *, forwarded: bool = False) -> PoolView:
        """``ha.api.Allocator.snapshot``."""
        self._config(pool)
        name = PoolName(pool)
        owned = self._owned.get(name)
        if owned is not None and not owned.lost:
            # With the lag of the stored state, which only the owner knows (status page).
            return dataclasses.replace(owned.view(), snapshot_age_s=owned.snapshot_age_s())
        if forwarded:
            raise self._wrong_epoch(name)
        return await self._to_owner(
            name,
            lambda address: self._peers.snapshot(address, pool, self.timing.rpc_timeout_s),
        )

    async def list_pools(self) -> list[PoolInfo]:
        """``ha.api.Allocator.list_pools``: the capacity is the owner's live one, read
        from the pool here or, elsewhere, as the owner published it (``ClusterView``)."""
        result = []
        for name, config in sorted(self._configs.items()):
            route = self.view.route(name)
            owned = self._owned.get(name)
            published = self.view.capacity(name)
            if owned is not None:
                capacity = owned.capacity
            else:
                capacity = published if published is not None else config.capacity
            result.append(
                PoolInfo(
                    name,
                    capacity,
                    route.node if route else NodeId(""),
                    route.address if route else "",
                    route.epoch if route else NO_EPOCH,
                    lends_all=config.lends_all(),
                )
            )
        return result

    async def set_capacity(self, pool: str, capacity: int, *, forwarded: bool = False) -> int:
        """``ha.api.Allocator.set_capacity``."""
        self._config(pool)
        name = PoolName(pool)
        owned = self._ownership.deciding(name)
        if owned is not None:
            previous = owned.set_capacity(capacity)
            try:
                await owned.durable()
            except Exception as e:
                raise StoreUnavailable(f"capacity of {pool} not persisted: {e}") from e
            logger.info(
                "pool %s at epoch %d: capacity changed from %d to %d",
                pool,
                owned.epoch,
                previous,
                capacity,
            )
            try:
                await self._ownership.publish_capacity(owned)
            except (StoreUnavailable, WrongEpoch) as e:
                logger.warning(
                    "pool %s: capacity %d not published to the other replicas yet: %s",
                    pool,
                    capacity,
                    e,
                )
            return previous
        if forwarded:
            raise self._wrong_epoch(name)
        return await self._to_owner(
            name,
            lambda address: self._peers.set_capacity(
                address, pool, capacity, self.timing.rpc_timeout_s
            ),
        )

    async def switchover(self, pool: str, node: str, *, forwarded: bool = False) -> None:
        """Moves ``pool`` to ``node`` and pins it there.

        The pin is the handover key, naming ``node`` and the revision of its member key;
        every replica honours it (rebalancing does not move the pool away, a campaign
        prefers ``node``) until ``node`` leaves the cluster or another switchover is
        made. Raises StoreUnavailable (nothing moved) when the pin cannot be written.
        """
        self._config(pool)
        name = PoolName(pool)
        target = NodeId(node)
        if target not in self.view.members:
            raise UnknownNode(node)
        owned = self._owned.get(name)
        if owned is not None and not self._ownership.handing_over(name):
            await self._ownership.switchover(owned, target)
            return
        if forwarded:
            raise self._wrong_epoch(name)
        await self._to_owner(
            name,
            lambda address: self._peers.switchover(
                address, pool, node, self.timing.forward_deadline_s
            ),
        )

    # -- routing helpers --------------------------------------------------------------

    def _config(self, pool: str) -> PoolConfig:
        config = self._configs.get(PoolName(pool))
        if config is None:
            raise UnknownPool(pool)
        return config

    def _owner_at(self, pool: PoolName, epoch: Epoch) -> OwnedPool:
        """The pool if this node decides for it at ``epoch`` (any, for ``ANY_EPOCH``)."""
        owned = self._ownership.deciding(pool)
        if owned is None or epoch not in (ANY_EPOCH, owned.epoch):
            raise self._wrong_epoch(pool)
        return owned

    def _wrong_epoch(self, pool: PoolName) -> WrongEpoch:
        route = self.view.route(pool)
        if route is None or route.node == self.node_id:
            return WrongEpoch(pool, NodeId(""), "", NO_EPOCH)
        return WrongEpoch(pool, route.node, route.address, route.epoch)

    async def _to_owner(self, pool: PoolName, call: Callable[[str], Awaitable[_T]]) -> _T:
        """Runs ``call(address)`` on the pool's owner, refreshing the route on refusal.

        Raises:
            NoOwner: no owner answered within the forward deadline.
        """
        deadline = self._clock.monotonic() + self.timing.forward_deadline_s
        while True:
            route = self.view.route(pool)
            if route is not None and route.node != self.node_id:
                try:
                    return await call(route.address)
                except (WrongEpoch, PeerUnavailable) as e:
                    logger.debug("call for %s to %s failed: %s", pool, route.node, e)
            if self._clock.monotonic() >= deadline:
                raise NoOwner(pool)
            await self._clock.sleep(ROUTE_POLL_S * 5)

    def _degrade(self, config: PoolConfig, call: AcquireCall) -> Decision:
        name = PoolName(config.name)
        if config.degraded_mode is DegradedMode.FAIL_CLOSED:
            raise NoOwner(config.name)
        self.degraded[name] += 1
        if call.try_only:
            # Without an owner nobody knows whether the pool has room.
            return Decision(False, "", 0, False, True, True, NodeId(""), DEGRADED_EPOCH)
        priority = degraded_priority(call.cls)
        decision = Decision(
            True,
            degraded_grant_id(config.name, call.team, call.holder, self._grant_keys),
            priority,
            True,
            False,
            True,
            NodeId(""),
            DEGRADED_EPOCH,
        )
        self.stubs.keep(name, call.team, call.est_tokens, decision)
        logger.warning("pool %s: no owner reachable; granted %s degraded", config.name, call.team)
        return decision


async def _decide(owned: OwnedPool, call: AcquireCall) -> Decision:
    """Decides ``call`` from ``owned``; raises NotDeciding as ``OwnedPool.acquire`` does."""
    return await owned.acquire(
        team=call.team,
        cls=call.cls,
        est_tokens=call.est_tokens,
        holder=call.holder,
        request_id=call.request_id,
        try_only=call.try_only,
        session=call.session,
        wait_s=call.wait_s,
    )
