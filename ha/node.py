"""A replica: owns some pools, forwards the rest, and fails over.

Guarantees:
- One epoch decides at a time: a node decides for a pool only while it holds the pool's
  owner key (watched) and its lease is within the self-fencing deadline; every durable
  write is fenced on the epoch.
- A new owner restores the usage of the previous one (decayed to now) and counts its
  in-flight requests as phantoms until they are re-reported or ``max_request_s`` passes.
- Any replica accepts every call: a non-owner forwards with the epoch it expects and
  refreshes its route on FAILED_PRECONDITION; when no owner answers within
  ``degraded_after_s`` it applies the pool's degraded mode.
- An operator's switchover holds until its target leaves the cluster or another
  switchover is made (the pin lives in the handover key, so every replica agrees);
  otherwise an owner hands a pool to its preferred replica only once that replica has
  been a member without a break for ``rebalance_settle_s``. A graceful handover is one
  transition (counted by the new owner) and is not logged as a loss.

Non-guarantees: availability while the store is unreachable for longer than the fencing
deadline (pools then run degraded); decisions made in degraded mode are not counted until
adopted.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import pathlib
import random
import secrets
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from fairshare import Class, Grant, degraded_priority
from fairshare.limits import MAX_ADOPT_GRANTS
from ha.api import (
    AdoptResult,
    Decision,
    Epoch,
    GrantRef,
    HeldGrant,
    NodeId,
    NoOwner,
    Peers,
    PeerUnavailable,
    PoolInfo,
    PoolName,
    PoolStatus,
    PoolView,
    UnknownNode,
    UnknownPool,
    WrongEpoch,
)
from ha.clock import Clock, SystemClock, system_clock
from ha.cluster import ClusterView, preferred_owner
from ha.grantkeys import GrantKeys, KeyFileError, ephemeral_keys
from ha.keys import Keys, Route, encode_handover, encode_owner
from ha.lease import NodeLease
from ha.owner import IdCounters, NotDeciding, OwnedPool, degraded_grant_id
from ha.settings import DegradedMode, PoolConfig, Timing
from ha.snapshot import PoolSnapshot
from ha.store import LeaseNotFound, Store, StoreFull, StoreUnavailable, bounded
from ha.writes import WatchedStore

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_TICK_S = 0.05
_ROUTE_POLL_S = 0.01
_LET_GO_MAX_S = 5.0
_CANCELLED_WAIT_S = 1.0
"""How long ``close`` waits for its cancelled tasks to end."""
_CAMPAIGN_BACKOFF_MAX_S = 1.0
"""Failed campaigns for a pool are retried after 50 ms, doubling up to this, jittered."""
_CAMPAIGN_LOG_S = 10.0
"""A streak of failed campaigns for a pool logs its first failure, then one line per this."""


@dataclass(slots=True)
class _Backoff:
    """A pool's streak of failed campaigns: when the next may start, when it last logged."""

    failures: int = 0
    not_before: float = 0.0
    logged_at: float = float("-inf")


class _Mark(Enum):
    """What a handover records in the handover key about the successor."""

    PIN = "pin"
    """An operator's switchover: the pool stays on the successor while it is a member."""
    HINT = "hint"
    """Rebalancing: the successor campaigns at once, the others wait (for a short while)."""
    KEEP = "keep"
    """Write nothing: the key already pins the pool to the successor."""


@dataclass(slots=True)
class _Stub:
    """A grant this replica obtained for its caller from another owner (or degraded)."""

    grant: Grant
    held: HeldGrant
    pool: PoolName
    epoch: Epoch
    since: float  # monotonic: a wall step must not forget (or keep) it early


class Node:
    """One allocator replica; implements ``ha.api.Allocator``."""

    def __init__(
        self,
        *,
        node_id: NodeId,
        advertise: str,
        pools: Sequence[PoolConfig],
        timing: Timing,
        store: Store,
        peers: Peers,
        prefix: str = "/fairshare",
        clock: Clock | None = None,
        embedded: bool = False,
        owns_store: bool = False,
        grant_keys: GrantKeys | None = None,
    ) -> None:
        self.node_id = node_id
        # Every replica of a cluster must hold the same keys (ha.grantkeys); the default,
        # one key per process, only suits tests whose nodes share a process.
        self._grant_keys = grant_keys if grant_keys is not None else ephemeral_keys()
        self.address = advertise
        self.timing = timing
        self.embedded = embedded
        self._owns_store = owns_store  # close() closes it too
        self._configs = {PoolName(p.name): p for p in pools}
        self._peers = peers
        self._keys = Keys(prefix)
        self._clock: Clock = clock if clock is not None else SystemClock()
        # Every store call goes through it: a full store is noticed in one place.
        self._writes = WatchedStore(
            store,
            keys=self._keys,
            pools=self._configs,
            monotonic=self._clock.monotonic,
            node=node_id,
        )
        store = self._store = self._writes
        self._lease = NodeLease(
            store=store,
            clock=self._clock,
            timing=timing,
            keys=self._keys,
            node=node_id,
            address=advertise,
            on_lost=self._lease_lost,
        )
        self.view = ClusterView(
            store=store, keys=self._keys, clock=self._clock, on_owner_change=self._owner_changed
        )
        self._owned: dict[PoolName, OwnedPool] = {}
        self._handing_over: set[PoolName] = set()  # owned, being handed over: not lost
        self._campaigns: dict[PoolName, asyncio.Task[None]] = {}
        self._backoffs: dict[PoolName, _Backoff] = {}
        self._absent_since: dict[PoolName, float] = {}
        self._transitions: dict[PoolName, int] = dict.fromkeys(self._configs, 0)
        self._degraded: dict[PoolName, int] = dict.fromkeys(self._configs, 0)
        self._id_counters = {name: IdCounters() for name in self._configs}
        self._stubs: dict[str, _Stub] = {}
        self._let_go_failures: dict[PoolName, tuple[Epoch, int]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self._started = 0.0
        self._closing = False
        self._request_seq = 0
        # Generated request ids must not repeat across restarts of this node: an owner
        # that outlived the restart would answer a new request with an old grant.
        self._incarnation = secrets.token_hex(6)

    # -- lifecycle ------------------------------------------------------------------

    async def start(self, *, ready_timeout_s: float = 10.0) -> None:
        """Joins the cluster and starts the background loops.

        In embedded mode it returns once this node owns every pool.
        """
        deadline = self._clock.monotonic() + ready_timeout_s
        while True:
            try:
                await self._lease.acquire()
                break
            except StoreUnavailable as e:
                if self._clock.monotonic() >= deadline:
                    raise
                logger.warning("node %s cannot reach the store yet: %s", self.node_id, e)
                await self._clock.sleep(0.2)
        self._started = self._clock.monotonic()
        for name, coro in (
            ("lease", self._lease.run()),
            ("cluster-view", self.view.run()),
            ("reconcile", self._reconcile_loop()),
            ("snapshots", self._snapshot_loop()),
        ):
            self._tasks.append(asyncio.create_task(self._guard(name, coro), name=name))
        if self.embedded:
            while len(self._owned) < len(self._configs):
                if self._clock.monotonic() >= deadline:
                    raise StoreUnavailable("embedded node could not take its pools")
                await self._clock.sleep(_ROUTE_POLL_S)

    async def stop_deciding(self) -> None:
        """Stops deciding for every pool (first step of a graceful shutdown)."""
        self._closing = True
        for owned in self._owned.values():
            owned.deciding = False

    async def close(self) -> None:
        """Final snapshots, then gives up ownership at once so successors campaign.

        Ends within ``timing.close_bound_s``: every step is bounded. The final snapshots may
        take as long as this node may still decide; a task that does not end when
        cancelled is logged (as a BUG) and left behind; a lease that cannot be revoked
        in time expires by itself.
        """
        self._closing = True
        for owned in self._owned.values():
            owned.deciding = False
        for task in self._campaigns.values():
            task.cancel()
        finals = [self._final_snapshot(owned) for owned in list(self._owned.values())]
        budget = max(self.timing.rpc_timeout_s, self._lease.seconds_left())
        try:
            async with asyncio.timeout(budget + self.timing.rpc_timeout_s):
                await asyncio.gather(*finals)
        except TimeoutError:
            logger.warning("node %s: final snapshots did not end in time", self.node_id)
        for owned in self._owned.values():
            logger.info("released pool %s at epoch %d: shutting down", owned.name, owned.epoch)
        self._owned.clear()
        await self._cancel([*self._tasks, *self._background, *self._campaigns.values()])
        self._tasks.clear()
        try:
            # Revoking deletes the member key and every owner key of this node at once.
            await self._lease.revoke()
        except (StoreUnavailable, LeaseNotFound) as e:
            logger.warning(
                "node %s could not revoke its lease (%s); it will expire", self.node_id, e
            )
        if self._owns_store:
            try:
                async with asyncio.timeout(_CANCELLED_WAIT_S):
                    await self._store.close()
            except TimeoutError:
                logger.warning("node %s: closing the store did not end in time", self.node_id)

    async def _cancel(self, tasks: Sequence[asyncio.Task[None]]) -> None:
        """Cancels ``tasks`` and waits (bounded) for them to end."""
        for task in tasks:
            task.cancel()
        if not tasks:
            return
        done, pending = await asyncio.wait(tasks, timeout=_CANCELLED_WAIT_S)
        for task in done:
            if not task.cancelled():
                task.exception()  # retrieved; _guard and _finished have logged it
        for task in pending:
            logger.error(
                "BUG: task %s of node %s did not end when cancelled; leaving it behind",
                task.get_name(),
                self.node_id,
            )

    async def _guard(self, name: str, coro: Coroutine[object, object, None]) -> None:
        try:
            await coro
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("BUG: background task %s of node %s failed", name, self.node_id)
            raise
        else:
            if not self._closing:
                logger.error("BUG: background task %s of node %s ended", name, self.node_id)

    # -- Allocator ------------------------------------------------------------------

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
        epoch: Epoch | None = None,
    ) -> Decision:
        config = self._config(pool)
        name = PoolName(pool)
        if not request_id and epoch is None:
            # Forwarding may retry: a request id makes the owner answer a retry alike.
            self._request_seq += 1
            request_id = f"{self.node_id}:{self._incarnation}:{self._request_seq}"
        decide = functools.partial(
            OwnedPool.acquire,
            team=team,
            cls=cls,
            est_tokens=est_tokens,
            holder=holder,
            request_id=request_id,
            try_only=try_only,
        )
        if epoch is not None:  # forwarded by a peer: answer from our own state only
            try:
                return await decide(self._owner_at(name, epoch))
            except NotDeciding:
                raise self._wrong_epoch(name) from None
        deadline = self._clock.monotonic() + self.timing.degraded_after_s
        while True:
            local = self._owned.get(name)
            if local is not None and local.can_decide():
                try:
                    return await decide(local)
                except NotDeciding:
                    pass
            route = self.view.route(name)
            if route is not None and route.node != self.node_id:
                try:
                    decision = await self._peers.acquire(
                        route.address,
                        pool=pool,
                        team=team,
                        cls=cls,
                        est_tokens=est_tokens,
                        holder=holder,
                        request_id=request_id,
                        try_only=try_only,
                        epoch=route.epoch,
                        timeout=max(self.timing.rpc_timeout_s, deadline - self._clock.monotonic()),
                    )
                except (WrongEpoch, PeerUnavailable) as e:
                    logger.debug("forward of %s to %s failed: %s", pool, route.node, e)
                else:
                    if decision.granted:
                        self._keep_stub(name, team, cls, est_tokens, decision)
                    return decision
            if self._clock.monotonic() >= deadline:
                return self._degrade(
                    config,
                    team=team,
                    cls=cls,
                    est_tokens=est_tokens,
                    holder=holder,
                    try_only=try_only,
                )
            await self._clock.sleep(_ROUTE_POLL_S)

    async def release(self, grant_id: str, consumed: float, *, forwarded: bool = False) -> None:
        ref = GrantRef.decode(grant_id)
        self._config(ref.pool)
        owned = self._owned.get(ref.pool)
        if owned is not None and owned.can_decide() and ref.epoch <= owned.epoch:
            owned.release(ref, consumed)
            self._stubs.pop(grant_id, None)
            # Usage is what fairness stands on: a release is acknowledged only once a
            # fenced write covers it, so no owner loses an acknowledged consumption. No
            # request waits on a release, so its write may wait to be shared.
            try:
                await owned.durable(lazy=True)
            except NotDeciding as e:
                raise StoreUnavailable(f"release of {grant_id} not persisted: {e}") from e
            return
        if forwarded:
            raise self._wrong_epoch(ref.pool)
        stub = self._stubs.pop(grant_id, None)
        try:
            await self._to_owner(
                ref.pool,
                lambda address: self._peers.release(
                    address, grant_id, consumed, self.timing.rpc_timeout_s
                ),
            )
        except BaseException:
            if stub is not None:
                self._stubs[grant_id] = stub
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
    ) -> AdoptResult:
        self._config(pool)
        name = PoolName(pool)
        owned = self._owned.get(name)
        if owned is not None and owned.can_decide():
            if epoch not in (0, owned.epoch):
                raise WrongEpoch(name, self.node_id, self.address, owned.epoch)
            return owned.adopt(holder=holder, grants=grants, complete=complete)
        if forwarded:
            raise self._wrong_epoch(name)
        return await self._to_owner(
            name,
            lambda address: self._peers.adopt(
                address,
                pool=pool,
                epoch=Epoch(0),
                holder=holder,
                grants=grants,
                complete=complete,
                timeout=self.timing.rpc_timeout_s,
            ),
        )

    async def snapshot(self, pool: str, *, forwarded: bool = False) -> PoolView:
        self._config(pool)
        name = PoolName(pool)
        owned = self._owned.get(name)
        if owned is not None and not owned.lost:
            return owned.view()
        if forwarded:
            raise self._wrong_epoch(name)
        return await self._to_owner(
            name,
            lambda address: self._peers.snapshot(address, pool, self.timing.rpc_timeout_s),
        )

    async def list_pools(self) -> list[PoolInfo]:
        result = []
        for name, config in sorted(self._configs.items()):
            route = self.view.route(name)
            owned = self._owned.get(name)
            capacity = owned.pool.capacity if owned is not None else config.capacity
            result.append(
                PoolInfo(
                    name,
                    capacity,
                    route.node if route else NodeId(""),
                    route.address if route else "",
                    route.epoch if route else Epoch(0),
                )
            )
        return result

    async def set_capacity(self, pool: str, capacity: int, *, forwarded: bool = False) -> int:
        self._config(pool)
        name = PoolName(pool)
        owned = self._owned.get(name)
        if owned is not None and owned.can_decide():
            previous = owned.set_capacity(capacity)
            try:
                await owned.committer.sync()
            except Exception as e:
                raise StoreUnavailable(f"capacity of {pool} not persisted: {e}") from e
            logger.info(
                "pool %s at epoch %d: capacity changed from %d to %d",
                pool,
                owned.epoch,
                previous,
                capacity,
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
        if owned is not None and name not in self._handing_over:
            if target == self.node_id:
                await self._mark_successor(name, target, _Mark.PIN)
                logger.info("pool %s pinned to %s at epoch %d", name, target, owned.epoch)
            else:
                await self._handover(owned, target, why="planned switchover", mark=_Mark.PIN)
            return
        if forwarded:
            raise self._wrong_epoch(name)
        await self._to_owner(
            name,
            lambda address: self._peers.switchover(
                address, pool, node, self.timing.forward_deadline_s
            ),
        )

    def status(self) -> list[PoolStatus]:
        result = []
        for name in sorted(self._configs):
            owned = self._owned.get(name)
            route = self.view.route(name)
            owning = owned is not None and owned.can_decide()
            age = -1.0
            if owned is not None and owned.last_snapshot_mono >= 0:
                age = self._clock.monotonic() - owned.last_snapshot_mono
            result.append(
                PoolStatus(
                    pool=name,
                    owned=owning,
                    owner=route.node if route else NodeId(""),
                    epoch=route.epoch if route else Epoch(0),
                    transitions=self._transitions[name],
                    fence_left_s=self._lease.seconds_left() if owning else 0.0,
                    snapshot_age_s=age,
                    teams=owned.teams() if owning and owned is not None else (),
                    degraded_decisions=self._degraded[name],
                    store_full=self._writes.full(name),
                    store_refused_writes=self._writes.refused_writes(name),
                    charges_clamped=self._id_counters[name].charges_clamped,
                    grant_ids_refused=self._id_counters[name].ids_refused,
                )
            )
        return result

    # -- routing helpers --------------------------------------------------------------

    def _config(self, pool: str) -> PoolConfig:
        config = self._configs.get(PoolName(pool))
        if config is None:
            raise UnknownPool(pool)
        return config

    def _owner_at(self, pool: PoolName, epoch: Epoch) -> OwnedPool:
        owned = self._owned.get(pool)
        if owned is None or owned.epoch != epoch or not owned.can_decide():
            raise self._wrong_epoch(pool)
        return owned

    def _wrong_epoch(self, pool: PoolName) -> WrongEpoch:
        route = self.view.route(pool)
        if route is None or route.node == self.node_id:
            return WrongEpoch(pool, NodeId(""), "", Epoch(0))
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
            await self._clock.sleep(_ROUTE_POLL_S * 5)

    def _keep_stub(
        self, pool: PoolName, team: str, cls: Class, est_tokens: int, decision: Decision
    ) -> None:
        """Remembers a grant made elsewhere, to release it and re-report it on failover."""
        grant_id = decision.grant_id

        def release(consumed: float) -> None:
            self._stubs.pop(grant_id, None)

        held = HeldGrant(grant_id, team, decision.priority, decision.borrowing, est_tokens)
        grant = Grant.remote(
            team, decision.priority, decision.borrowing, decision.saturated, release
        )
        self._stubs[grant_id] = _Stub(grant, held, pool, decision.epoch, self._clock.monotonic())
        del cls

    def _degrade(
        self,
        config: PoolConfig,
        *,
        team: str,
        cls: Class,
        est_tokens: int,
        holder: str,
        try_only: bool,
    ) -> Decision:
        name = PoolName(config.name)
        if config.degraded_mode is DegradedMode.FAIL_CLOSED:
            raise NoOwner(config.name)
        self._degraded[name] += 1
        if try_only:
            # Without an owner nobody knows whether the pool has room.
            return Decision(False, "", 0, False, True, True, NodeId(""), Epoch(0))
        priority = degraded_priority(cls)
        decision = Decision(
            True,
            degraded_grant_id(config.name, team, holder, self._grant_keys),
            priority,
            True,
            False,
            True,
            NodeId(""),
            Epoch(0),
        )
        self._keep_stub(name, team, cls, est_tokens, decision)
        logger.warning("pool %s: no owner reachable; granted %s degraded", config.name, team)
        return decision

    # -- ownership ----------------------------------------------------------------------

    async def _reconcile_loop(self) -> None:
        while True:
            sleeper = asyncio.ensure_future(self._clock.sleep(_TICK_S))
            waiter = asyncio.ensure_future(self.view.changed.wait())
            try:
                await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                waiter.cancel()
            self.view.changed.clear()
            if not self._closing:
                self._reconcile()

    def _reconcile(self) -> None:
        """Campaigns for ownerless pools, gives up lost ones, and rebalances.

        Placement: a pool belongs to the node an operator's switchover pinned it to while
        that pin holds (``ClusterView.pinned``), otherwise to its preferred replica. An
        owner moves a pool to that node only once it has been a member without a break
        for ``rebalance_settle_s`` (hysteresis: a flapping replica does not drag pools
        back and forth); an ownerless pool is campaigned for by the pin's target, a fresh
        hint's target, or the preferred replica at once, by the others after
        ``campaign_delay_s``.
        """
        now = self._clock.monotonic()
        for name, owned in list(self._owned.items()):
            if name in self._handing_over:
                continue  # it stopped deciding on purpose; the handover lets it go
            if owned.lost or not self._lease.fenced():
                self._drop(owned, "its fenced write failed" if owned.lost else "self-fenced")
                self._spawn(f"resign-{name}", self._resign(owned))
        if not self._lease.fenced() or not self.view.ready.is_set():
            return
        members = list(self.view.members) or [self.node_id]
        settling = not self.embedded and now - self._started < self.timing.campaign_delay_s
        settled = self.view.settled(self.timing.rebalance_settle_s)
        for name in self._configs:
            route = self.view.route(name)
            pinned = self.view.pinned(name)
            mine = self._owned.get(name)
            if mine is not None:
                # Not absent while ours: a pool this node hands over is absent afresh when
                # its key goes, so this node then waits campaign_delay_s like the others
                # and the target, which campaigns at once, wins the race.
                self._absent_since.pop(name, None)
                if settling or name in self._handing_over or not mine.can_decide():
                    continue
                target = pinned or preferred_owner(name, {*settled, self.node_id})
                if target is not None and target != self.node_id and target in settled:
                    self._handing_over.add(name)
                    self._spawn(
                        f"rebalance-{name}",
                        self._handover(
                            mine,
                            target,
                            why="back to its pinned replica" if pinned else "rebalancing",
                            mark=_Mark.KEEP if pinned else _Mark.HINT,
                            started=True,
                        ),
                    )
                continue
            if route is not None:
                self._absent_since.pop(name, None)
                if (
                    route.node == self.node_id
                    and name not in self._campaigns
                    and name not in self._handing_over
                ):
                    # Our key, but this process does not decide from it (it self-fenced, a
                    # write failed, or an earlier process of ours held it): let it go so
                    # that a fresh epoch restores from the last snapshot.
                    self._campaigns[name] = asyncio.create_task(
                        self._let_go(name, route.epoch), name=f"let-go-{name}"
                    )
                continue
            if name in self._campaigns or settling:
                continue
            backoff = self._backoffs.get(name)
            if backoff is not None and now < backoff.not_before:
                continue
            since = self._absent_since.setdefault(name, now)
            target = pinned or preferred_owner(name, members)
            hint = self.view.handovers.get(name)
            fresh = (
                hint is not None and self._clock.time() - hint.wall < 2 * self.timing.lease_ttl_s
            )
            if pinned is None and hint is not None and fresh and hint.node in self.view.members:
                target = hint.node
            delay = 0.0 if target == self.node_id else self.timing.campaign_delay_s
            if now - since >= delay:
                self._campaigns[name] = asyncio.create_task(
                    self._campaign(name), name=f"campaign-{name}"
                )

    async def _campaign(self, name: PoolName) -> None:
        """One attempt to own the pool. A failure (the store refused or did not answer)
        delays the next attempt for this pool by a jittered exponential backoff, so
        replicas facing a store that refuses writes do not hammer it; an answer (won or
        lost the race) ends the streak."""
        try:
            await self._take(name)
            self._backoffs.pop(name, None)
        except (StoreUnavailable, LeaseNotFound) as e:
            self._campaign_failed(name, e)
        except Exception:
            logger.exception("BUG: campaign for pool %s failed", name)
        finally:
            self._campaigns.pop(name, None)
            self.view.changed.set()

    def _campaign_failed(self, name: PoolName, e: Exception) -> None:
        now = self._clock.monotonic()
        backoff = self._backoffs.setdefault(name, _Backoff())
        backoff.failures += 1
        delay = min(_CAMPAIGN_BACKOFF_MAX_S, _TICK_S * 2 ** min(backoff.failures - 1, 10))
        backoff.not_before = now + delay * random.uniform(0.5, 1.0)
        if now - backoff.logged_at < _CAMPAIGN_LOG_S:
            return
        backoff.logged_at = now
        if isinstance(e, StoreFull):
            logger.error(
                "node %s: campaign for pool %s failed: store full (attempt %d): %s",
                self.node_id,
                name,
                backoff.failures,
                e,
            )
        else:
            logger.warning(
                "node %s: campaign for pool %s failed (attempt %d): %s",
                self.node_id,
                name,
                backoff.failures,
                e,
            )

    async def _take(self, name: PoolName) -> None:
        config = self._configs[name]
        rpc = self.timing.rpc_timeout_s
        lease = self._lease.lease
        key = self._keys.owner(name)
        try:
            kv = await bounded(
                self._store.create(key, encode_owner(self.node_id, self.address), lease=lease), rpc
            )
        except StoreUnavailable:
            # The outcome is unknown: read it back rather than retrying blindly.
            kv = await bounded(self._store.get(key), rpc)
            if kv is None or kv.lease != lease:
                raise
        if kv is None:
            return  # another node won; the watch will route to it
        epoch = Epoch(kv.create_revision)
        owned = OwnedPool(
            config=config,
            epoch=epoch,
            node=self.node_id,
            clock=self._clock,
            # Decide only on the lease the owner key was created on: a node that lost
            # that lease and joined again must not decide from this epoch.
            fenced=lambda: self._lease.lease == lease and self._lease.fenced(),
            write=lambda data: self._write_state(name, epoch, data),
            commit_window_s=self.timing.commit_window_s,
            release_commit_s=self.timing.release_commit_s,
            release_memory_s=self.timing.release_memory_s,
            keys=self._grant_keys,
            counters=self._id_counters[name],
        )
        state = await bounded(self._store.get(self._keys.state(name)), rpc)
        snapshot = PoolSnapshot.decode(state.value) if state is not None else None
        if state is not None and snapshot is None:
            phantoms = owned.restore_unreadable()
            teams = 0
            logger.error(
                "pool %s at epoch %d: the previous owner's snapshot is unreadable; usage "
                "starts from zero and every reservation counts as taken for %gs",
                name,
                epoch,
                config.max_request_s,
            )
        else:
            teams, phantoms = owned.restore(snapshot)
        route = self.view.route(name)
        if (
            self._closing
            or self._lease.lease != lease
            or (route is not None and route.epoch != epoch)
        ):
            return
        self._owned[name] = owned
        # Counted once per epoch, by the node that starts it: a handover or a failover is
        # one transition, whatever the losing side saw.
        self._transitions[name] += 1
        logger.info(
            "acquired pool %s at epoch %d: restored usage of %d teams, %d phantoms",
            name,
            epoch,
            teams,
            phantoms,
        )
        self._spawn(f"first-snapshot-{name}", self._sync(owned))

    async def _write_state(self, name: PoolName, epoch: Epoch, data: bytes) -> None:
        # A write whose answer is late has an unknown outcome and costs the pool, so it
        # may take as long as this node may still decide, not just one RPC timeout: a
        # store that stalls for less than that (an fsync spike, a leader election) costs
        # latency, not the pool. The store may send the same write again meanwhile.
        budget = max(self.timing.rpc_timeout_s, self._lease.seconds_left())
        ok = await bounded(
            self._store.put_fenced(
                self._keys.state(name),
                data,
                fence_key=self._keys.owner(name),
                fence_revision=epoch,
                timeout_s=budget,
            ),
            budget,
        )
        if not ok:
            raise WrongEpoch(name, NodeId(""), "", epoch)

    async def _handover(
        self,
        owned: OwnedPool,
        to: NodeId,
        *,
        why: str,
        mark: _Mark,
        started: bool = False,
    ) -> None:
        """Stops deciding, writes the final snapshot, names the successor, lets go.

        A pin (``_Mark.PIN``) is written before anything stops: if it cannot be written
        the switchover fails (StoreUnavailable) and this node keeps deciding. The pool
        stays in ``_owned`` (marked as being handed over, so the reconcile loop does not
        take the closed committer for a failed write) until its owner key is deleted.

        Args:
            started: the caller already marked the pool as being handed over.
        """
        name = owned.name
        if name in self._handing_over and not started:
            return  # another handover of it is under way
        if self._owned.get(name) is not owned:
            if started:
                self._handing_over.discard(name)
            return
        self._handing_over.add(name)
        try:
            if mark is _Mark.PIN:
                await self._mark_successor(name, to, mark)
            owned.deciding = False
            await self._final_snapshot(owned)
            if mark is _Mark.HINT:
                try:
                    await self._mark_successor(name, to, mark)
                except StoreUnavailable as e:
                    logger.warning("pool %s: could not name successor %s: %s", name, to, e)
            if self._owned.get(name) is not owned:
                return  # lost meanwhile (lease, owner key): that loss was logged
            # Out of the table before the delete, so its watch event is no loss; still
            # marked, so the reconcile loop does not let go of the key meanwhile.
            del self._owned[name]
            await self._resign(owned)
            logger.info("handed pool %s over to %s at epoch %d (%s)", name, to, owned.epoch, why)
        finally:
            self._handing_over.discard(name)

    async def _mark_successor(self, name: PoolName, to: NodeId, mark: _Mark) -> None:
        """Writes the handover key: a pin on ``to``'s current member key, or a hint.

        Raises:
            StoreUnavailable: the store did not answer.
            UnknownNode: a pin names a node that is no member now.
        """
        if mark is _Mark.KEEP:
            return
        member = 0
        if mark is _Mark.PIN:
            member = self.view.member_revs.get(to, 0)
            if member == 0:
                raise UnknownNode(to)
        await bounded(
            self._store.put(
                self._keys.handover(name),
                encode_handover(to, self._clock.time(), member=member, pinned=mark is _Mark.PIN),
            ),
            self.timing.rpc_timeout_s,
        )

    async def _final_snapshot(self, owned: OwnedPool) -> None:
        try:
            await owned.committer.sync()
        except Exception as e:
            logger.warning("pool %s: final snapshot failed: %s", owned.name, e)
        await owned.committer.close()

    async def _let_go(self, name: PoolName, epoch: Epoch) -> None:
        """Deletes our stale owner key of ``name`` at ``epoch``; never spins.

        A failed delete is retried with backoff: the next try waits ``rpc_timeout_s``,
        doubled per consecutive failure at this epoch, up to ``_LET_GO_MAX_S``. A
        delete that finds the key gone (the watch has yet to say so) waits one tick.
        """
        last_epoch, failures = self._let_go_failures.get(name, (epoch, 0))
        if last_epoch != epoch:
            failures = 0
        pause = 0.0
        try:
            deleted = await bounded(
                self._store.delete_fenced(self._keys.owner(name), create_revision=epoch),
                self.timing.rpc_timeout_s,
            )
        except StoreUnavailable as e:
            failures += 1
            pause = min(self.timing.rpc_timeout_s * 2 ** min(failures - 1, 10), _LET_GO_MAX_S)
            logger.warning(
                "pool %s: letting go of epoch %d failed (attempt %d, next in %.1fs): %s",
                name,
                epoch,
                failures,
                pause,
                e,
            )
        else:
            failures = 0
            if deleted:
                logger.info("let go of stale owner key of pool %s at epoch %d", name, epoch)
            else:
                pause = _TICK_S
                logger.debug("pool %s: owner key at epoch %d already gone", name, epoch)
        try:
            if failures:
                self._let_go_failures[name] = (epoch, failures)
            else:
                self._let_go_failures.pop(name, None)
            if pause:
                await self._clock.sleep(pause)
        finally:
            self._campaigns.pop(name, None)

    async def _resign(self, owned: OwnedPool) -> None:
        """Deletes our owner key (if it is still ours) so a successor can campaign."""
        for attempt in range(1, 4):
            try:
                await bounded(
                    self._store.delete_fenced(
                        self._keys.owner(owned.name), create_revision=owned.epoch
                    ),
                    self.timing.rpc_timeout_s,
                )
                return
            except StoreUnavailable as e:
                logger.warning(
                    "pool %s: resigning epoch %d failed (attempt %d of 3): %s",
                    owned.name,
                    owned.epoch,
                    attempt,
                    e,
                )
                await self._clock.sleep(self.timing.rpc_timeout_s)

    def _drop(self, owned: OwnedPool, why: str) -> None:
        if self._owned.get(owned.name) is owned:
            del self._owned[owned.name]
            owned.deciding = False
            logger.warning("lost pool %s at epoch %d: %s", owned.name, owned.epoch, why)

    def _owner_changed(self, pool: PoolName, route: Route | None) -> None:
        if route is not None and route.node != self.node_id:
            self._writes.clear(pool)  # another node wrote its owner key: not our disk's
        owned = self._owned.get(pool)
        if owned is not None and (route is None or route.epoch != owned.epoch):
            self._drop(owned, "its owner key was deleted" if route is None else "another owner")
        if route is not None:
            self._spawn(f"readopt-{pool}", self._readopt(pool, route))

    def _lease_lost(self) -> None:
        for owned in list(self._owned.values()):
            self._drop(owned, "the lease expired")

    async def _readopt(self, pool: PoolName, route: Route) -> None:
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
            owned = self._owned.get(pool)
            try:
                if route.node == self.node_id:
                    if owned is not None and owned.epoch == route.epoch and owned.can_decide():
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
            await self._clock.sleep(_ROUTE_POLL_S * 5)
        logger.info("pool %s: gave up re-reporting %d grants to %s", pool, len(grants), route.node)

    # -- background ---------------------------------------------------------------------

    async def _snapshot_loop(self) -> None:
        while True:
            await self._clock.sleep(self.timing.snapshot_interval_s)
            for owned in list(self._owned.values()):
                if owned.can_decide():
                    owned.expire()
                    self._spawn(f"snapshot-{owned.name}", self._sync(owned))
            self._forget_stubs()

    async def _sync(self, owned: OwnedPool) -> None:
        with contextlib.suppress(Exception):
            await owned.committer.sync()
        if owned.lost:
            self.view.changed.set()

    def _forget_stubs(self) -> None:
        longest = max((c.max_request_s for c in self._configs.values()), default=0.0)
        horizon = self._clock.monotonic() - longest
        for grant_id in [g for g, s in self._stubs.items() if s.since < horizon]:
            del self._stubs[grant_id]

    def _spawn(self, name: str, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "task %s of node %s failed: %r", task.get_name(), self.node_id, task.exception()
            )


async def open_node(
    *,
    node_id: NodeId,
    advertise: str,
    pools: Sequence[PoolConfig],
    timing: Timing,
    state_dir: pathlib.Path,
    etcd_endpoints: Sequence[str],
    prefix: str,
    peers: Peers,
    clock: Clock | None = None,
    grant_keys: GrantKeys | None = None,
) -> Node:
    """Builds a node: embedded on a local file store when no etcd endpoint is given.

    ``grant_keys`` sign and verify grant ids; None: with etcd endpoints an error (the
    replicas must share keys), embedded the key kept in ``state_dir`` (made on first use).
    Without ``clock`` it runs on ``ha.clock.system_clock()``: the system's clocks, or
    the test-only wall offset hook when ``FAIRSHARE_TEST_WALL_OFFSET_FILE`` is set.

    Raises:
        KeyFileError: replicated without grant keys, or the generated key file is unusable.
        StoreUnavailable: the store cannot be opened (embedded: the state dir is not a
            directory, its disk is full, a record is corrupt; the message names the file).

    The caller starts it with ``await node.start()``.
    """
    if clock is None:
        clock = system_clock()
    store: Store
    if grant_keys is None and etcd_endpoints:
        raise KeyFileError("replicas on etcd need a grant key file shared by all (grants.key_file)")
    if etcd_endpoints:
        from ha.etcdstore import connect

        # Seeded by the node id: replicas start on different members, each on the same
        # one every time it starts.
        store = await connect(etcd_endpoints, rpc_timeout_s=timing.rpc_timeout_s, seed=node_id)
        embedded = False
    else:
        from ha.memstore import FileStore

        # The store first: it names what is wrong with the state dir (not a directory,
        # full, corrupt) in one StoreUnavailable.
        store = FileStore(state_dir, clock)
        embedded = True
    keys = grant_keys
    if keys is None:
        try:
            keys = GrantKeys.generated(state_dir)
        except OSError as e:
            await store.close()
            raise StoreUnavailable(f"{state_dir}: cannot keep a grant key: {e}") from e
        except KeyFileError:
            await store.close()
            raise
    return Node(
        node_id=node_id,
        advertise=advertise,
        pools=pools,
        timing=timing,
        store=store,
        peers=peers,
        prefix=prefix,
        clock=clock,
        embedded=embedded,
        owns_store=True,
        grant_keys=keys,
    )
