"""A replica: owns some pools, forwards the rest, and fails over.

``Node`` is the replica the server runs (``ha.api.Allocator`` plus start, stop_deciding,
close, status): it builds the pieces, runs their loops and answers through them.
- ``ha.cluster.ownership``: the pools this node owns (campaign, rebalancing, losses) and
  ``ha.cluster.handover`` (graceful handover, resignation, stale keys);
- ``ha.routing``: every call, answered from the owned pool, forwarded to the owner, or
  degraded, with the stubs of grants obtained elsewhere;
- ``ha.owned.pool``: one owned pool during one epoch.

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
- A replicated node starts serving even when etcd does not answer at start: it answers
  every call as when etcd is lost later (each pool per its degraded mode) and joins the
  cluster in the background, retrying with a backoff (``ha.cluster.lease.NodeLease.join``)
  for as long as it runs. Only a refusal that waiting cannot cure
  (``ha.store.etcd.AccessRefused``: TLS handshake, password, permission) stops the start.

Non-guarantees: availability while the store is unreachable for longer than the fencing
deadline (pools then run degraded); decisions made in degraded mode are not counted until
adopted.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
from collections.abc import Coroutine, Sequence

from fairshare import Class
from ha.api import (
    ANY_EPOCH,
    NO_EPOCH,
    AcquireCall,
    AdoptResult,
    Decision,
    Epoch,
    HeldGrant,
    KeepAliveResult,
    MemberStatus,
    NodeId,
    Peers,
    PoolInfo,
    PoolName,
    PoolStatus,
    PoolView,
    Session,
)
from ha.clock import Clock, SystemClock, system_clock
from ha.cluster.lease import NodeLease
from ha.cluster.ownership import Ownership
from ha.cluster.view import ClusterView
from ha.grantkeys import GrantKeys, KeyFileError, ephemeral_keys
from ha.owned.genuine import IdCounters
from ha.routing import ROUTE_POLL_S, CallRouter
from ha.settings import PoolConfig, Timing
from ha.store.contract import LeaseNotFound, Store, StoreUnavailable
from ha.store.etcd import AccessRefused, EtcdAccess
from ha.store.keys import Keys, Route
from ha.store.opening import open_store
from ha.store.writes import WatchedStore

logger = logging.getLogger(__name__)

_CANCELLED_WAIT_S = 1.0
"""How long ``close`` waits for its cancelled tasks to end."""


class Node:
    """One allocator replica; implements ``ha.api.Allocator`` (see module)."""

    def __init__(  # noqa: PLR0913 (a replica's wiring: its settings and collaborators)
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
        grant_keys = grant_keys if grant_keys is not None else ephemeral_keys()
        self.address = advertise
        self.timing = timing
        self.embedded = embedded
        self._owns_store = owns_store  # close() closes it too
        self._configs = {PoolName(p.name): p for p in pools}
        keys = Keys(prefix)
        self._clock: Clock = clock if clock is not None else SystemClock()
        # Every store call goes through it: a full store is noticed in one place.
        self._writes = WatchedStore(
            store,
            keys=keys,
            pools=self._configs,
            monotonic=self._clock.monotonic,
            node=node_id,
        )
        self._store = self._writes
        self._lease = NodeLease(
            store=self._writes,
            clock=self._clock,
            timing=timing,
            keys=keys,
            node=node_id,
            address=advertise,
            on_lost=self._lease_lost,
        )
        self.view = ClusterView(
            store=self._writes, keys=keys, clock=self._clock, on_owner_change=self._owner_changed
        )
        self._id_counters = {name: IdCounters() for name in self._configs}
        self.ownership = Ownership(
            node_id=node_id,
            address=advertise,
            configs=self._configs,
            timing=timing,
            clock=self._clock,
            store=self._writes,
            keys=keys,
            lease=self._lease,
            view=self.view,
            grant_keys=grant_keys,
            id_counters=self._id_counters,
            embedded=embedded,
            spawn=self._spawn,
        )
        self._calls = CallRouter(
            node_id=node_id,
            address=advertise,
            configs=self._configs,
            timing=timing,
            clock=self._clock,
            view=self.view,
            peers=peers,
            grant_keys=grant_keys,
            ownership=self.ownership,
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self._joined = False

    # -- lifecycle ------------------------------------------------------------------

    @property
    def joined(self) -> bool:
        """True once this node has joined the cluster (its first lease granted); it stays
        True when the store is lost later (the pools' status tells that)."""
        return self._joined

    async def start(self, *, ready_timeout_s: float = 10.0) -> None:
        """Joins the cluster and starts the background loops.

        Replicated: one attempt to join; when the store does not answer, the node joins
        in the background (see module) and answers meanwhile as without a store.
        Embedded: retries for ``ready_timeout_s`` and returns once this node owns every
        pool.

        Raises:
            StoreUnavailable: embedded, the store did not answer or the node could not
                take its pools within ``ready_timeout_s``.
            AccessRefused: replicated, etcd refused this node's TLS or credentials.
        """
        deadline = self._clock.monotonic() + ready_timeout_s
        while True:
            try:
                await self._lease.acquire()
                break
            except AccessRefused:
                raise
            except StoreUnavailable as e:
                if not self.embedded:
                    logger.warning(
                        "node %s cannot reach the store (%s): serving without it, each pool "
                        "per its degraded mode, and joining in the background",
                        self.node_id,
                        e,
                    )
                    self._spawn("join", self._join_later())
                    return
                if self._clock.monotonic() >= deadline:
                    raise
                logger.warning("node %s cannot reach the store yet: %s", self.node_id, e)
                await self._clock.sleep(0.2)
        self._start_loops()
        if self.embedded:
            while len(self.ownership.owned) < len(self._configs):
                if self._clock.monotonic() >= deadline:
                    raise StoreUnavailable("embedded node could not take its pools")
                await self._clock.sleep(ROUTE_POLL_S)

    def _start_loops(self) -> None:
        """The node holds its first lease: it is a member; its loops start."""
        self._joined = True
        self.ownership.started()
        for name, coro in (
            ("lease", self._lease.run()),
            ("cluster-view", self.view.run()),
            ("reconcile", self.ownership.run()),
            ("snapshots", self._snapshot_loop()),
        ):
            self._tasks.append(asyncio.create_task(self._guard(name, coro), name=name))

    async def _join_later(self) -> None:
        """Joins once the store answers, unless the node closes first (``close`` revokes
        the lease it finds)."""
        if await self._lease.join(lambda: self.ownership.closing):
            self._start_loops()

    async def stop_deciding(self) -> None:
        """Stops deciding for every pool (first step of a graceful shutdown)."""
        self.ownership.stop()

    async def close(self) -> None:
        """Final snapshots, then gives up ownership at once so successors campaign.

        Ends within ``timing.close_bound_s``: every step is bounded. The final snapshots may
        take as long as this node may still decide; a task that does not end when
        cancelled is logged (as a BUG) and left behind; a lease that cannot be revoked
        in time expires by itself.
        """
        budget = max(self.timing.rpc_timeout_s, self._lease.seconds_left())
        campaigns = await self.ownership.close(budget + self.timing.rpc_timeout_s)
        await self._cancel([*self._tasks, *self._background, *campaigns])
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
            if not self.ownership.closing:
                logger.error("BUG: background task %s of node %s ended", name, self.node_id)

    # -- Allocator (answered by ha.routing) ---------------------------------------------

    async def acquire(  # noqa: PLR0913 (the call's fields, keyword-only)
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
        """``ha.api.Allocator.acquire``, handed to the call router as one ``AcquireCall``."""
        call = AcquireCall(
            pool=pool,
            team=team,
            cls=cls,
            est_tokens=est_tokens,
            holder=holder,
            request_id=request_id,
            try_only=try_only,
            wait_s=wait_s,
            epoch=epoch,
            forwarded=forwarded,
            session=session,
        )
        return await self._calls.acquire(call)

    async def release(self, grant_id: str, consumed: float, *, forwarded: bool = False) -> None:
        """``ha.api.Allocator.release``."""
        await self._calls.release(grant_id, consumed, forwarded=forwarded)

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
        return await self._calls.adopt(
            pool=pool,
            epoch=epoch,
            holder=holder,
            grants=grants,
            complete=complete,
            forwarded=forwarded,
            session=session,
        )

    async def keep_alive(
        self, pools: Sequence[str], session: Session, *, forwarded: bool = False
    ) -> KeepAliveResult:
        """``ha.api.Allocator.keep_alive``."""
        return await self._calls.keep_alive(pools, session, forwarded=forwarded)

    async def snapshot(self, pool: str, *, forwarded: bool = False) -> PoolView:
        """``ha.api.Allocator.snapshot``."""
        return await self._calls.snapshot(pool, forwarded=forwarded)

    async def list_pools(self) -> list[PoolInfo]:
        """``ha.api.Allocator.list_pools``."""
        return await self._calls.list_pools()

    async def set_capacity(self, pool: str, capacity: int, *, forwarded: bool = False) -> int:
        """``ha.api.Allocator.set_capacity``."""
        return await self._calls.set_capacity(pool, capacity, forwarded=forwarded)

    async def switchover(self, pool: str, node: str, *, forwarded: bool = False) -> None:
        """``ha.api.Allocator.switchover``: the pin it makes is ``CallRouter.switchover``'s."""
        await self._calls.switchover(pool, node, forwarded=forwarded)

    def status(self) -> list[PoolStatus]:
        """``ha.api.Allocator.status``."""
        result = []
        for name in sorted(self._configs):
            owned = self.ownership.owned.get(name)
            route = self.view.route(name)
            owning = owned is not None and owned.can_decide()
            table = owned.view() if owning and owned is not None else None
            result.append(
                PoolStatus(
                    pool=name,
                    owned=owning,
                    owner=route.node if route else NodeId(""),
                    epoch=route.epoch if route else NO_EPOCH,
                    transitions=self.ownership.transitions[name],
                    fence_left_s=self._lease.seconds_left() if owning else 0.0,
                    snapshot_age_s=owned.snapshot_age_s() if owned is not None else -1.0,
                    teams=table.teams if table is not None else (),
                    within=table.within if table is not None else {},
                    held=table.held if table is not None else {},
                    degraded_decisions=self._calls.degraded[name],
                    store_full=self._writes.full(name),
                    store_refused_writes=self._writes.refused_writes(name),
                    charges_clamped=self._id_counters[name].charges_clamped,
                    grant_ids_refused=self._id_counters[name].ids_refused,
                    unproven_releases=self._id_counters[name].unproven_releases,
                )
            )
        return result

    def members(self) -> list[MemberStatus]:
        """The replicas of the cluster view, this one first (listed even while it is no
        member), then by node id (``ClusterView.member_status``)."""
        return self.view.member_status(self.node_id, self.address, self._lease.seconds_left())

    # -- events and background ------------------------------------------------------------

    def _owner_changed(self, pool: PoolName, route: Route | None) -> None:
        self.ownership.owner_changed(pool, route)
        if route is not None:
            self._spawn(f"readopt-{pool}", self._calls.stubs.readopt(pool, route))

    def _lease_lost(self) -> None:
        self.ownership.lease_lost()

    async def _snapshot_loop(self) -> None:
        while True:
            await self._clock.sleep(self.timing.snapshot_interval_s)
            self.ownership.tick()
            self._calls.stubs.forget()

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


async def open_node(  # noqa: PLR0913 (a replica's wiring, as Node's constructor)
    *,
    node_id: NodeId,
    advertise: str,
    pools: Sequence[PoolConfig],
    timing: Timing,
    state_dir: pathlib.Path,
    etcd_endpoints: Sequence[str],
    prefix: str,
    peers: Peers,
    etcd_access: EtcdAccess | None = None,
    clock: Clock | None = None,
    grant_keys: GrantKeys | None = None,
) -> Node:
    """Builds a node: embedded on a local file store when no etcd endpoint is given.

    ``etcd_access``: TLS and auth for etcd (``ha.store.etcd.EtcdAccess``; None: plaintext, no
    auth). ``grant_keys`` sign and verify grant ids; None: with etcd endpoints an error (the
    replicas must share keys), embedded the key kept in ``state_dir`` (made on first use).
    Without ``clock`` it runs on ``ha.clock.system_clock()``: the system's clocks, or
    the test-only wall offset hook when ``FAIRSHARE_TEST_WALL_OFFSET_FILE`` is set.

    Raises:
        KeyFileError: replicated without grant keys, or the generated key file is unusable.
        StoreUnavailable: the store cannot be opened (embedded: the state dir is not a
            directory, its disk is full, a record is corrupt; the message names the file).
            An etcd that does not answer is no error: the node joins when it does.
        AccessRefused: etcd refused the TLS handshake, the password or a permission.

    The caller starts it with ``await node.start()``.
    """
    if clock is None:
        clock = system_clock()
    if grant_keys is None and etcd_endpoints:
        raise KeyFileError("replicas on etcd need a grant key file shared by all (grants.key_file)")
    store = await open_store(
        node_id=node_id,
        state_dir=state_dir,
        etcd_endpoints=etcd_endpoints,
        rpc_timeout_s=timing.rpc_timeout_s,
        etcd_access=etcd_access,
        clock=clock,
    )
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
        embedded=not etcd_endpoints,
        owns_store=True,
        grant_keys=keys,
    )
