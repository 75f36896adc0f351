"""The pools a replica owns: campaigns, rebalancing, losses.

Guarantees:
- This node decides for a pool only while it holds the pool's owner key (watched) and its
  lease is within the self-fencing deadline; every durable write is fenced on the epoch
  (the owner key's create_revision).
- A new owner restores the usage of the previous one (decayed to now) and counts its
  in-flight requests as phantoms until they are released or re-reported, or end (after
  ``max_request_s``, or when their holder session lapses).
- Placement: a pool belongs to the node an operator's switchover pinned it to while that
  pin holds, otherwise to its preferred replica; an owner hands a pool to that replica only
  once it has been a member without a break for ``rebalance_settle_s``. A graceful handover
  (``ha.cluster.handover``) is one transition, counted by the new owner, not a loss.
- An ownerless pool that its target does not take is campaigned for by every other replica
  at the latest ``lease_ttl_s + campaign_delay_s`` after it became ownerless, however many
  other pools are being taken meanwhile.
- For ``campaign_delay_s`` after joining, a node campaigns only for pools it has seen owned
  and then ownerless (a handover or a failover): a pool no replica has owned since it joined
  waits, so a cluster that starts one replica after another does not give every pool to
  the first; a pool handed over while its target has just joined (a rolling restart) is
  taken at once.
- Failed campaigns for a pool back off and are logged sparingly (``ha.cluster.backoff``).
- A node has at most ``IN_FLIGHT`` campaigns (each ends once its first snapshot is written)
  and ``IN_FLIGHT`` rebalancing handovers under way at a time: with a thousand ownerless
  pools it takes a few at a time, each within its RPC timeout, rather than all at once,
  losing most to timeouts (and its lease, whose renewals queue behind them).

Non-guarantees: ownership while the store is unreachable for longer than the fencing
deadline.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from typing import Final

from ha.api import Epoch, NodeId, PoolName, WrongEpoch
from ha.clock import Clock
from ha.cluster.backoff import CampaignBackoff
from ha.cluster.handover import TICK_S, Handovers, Mark
from ha.cluster.lease import NodeLease
from ha.cluster.view import ClusterView, preferred_owner
from ha.grantkeys import GrantKeys
from ha.owned.genuine import IdCounters
from ha.owned.pool import OwnedPool
from ha.owned.poolstate import PoolLog, load
from ha.settings import PoolConfig, Timing
from ha.store.contract import LeaseNotFound, StoreFull, StoreUnavailable, bounded
from ha.store.keys import Keys, Route, encode_capacity, encode_owner
from ha.store.writes import WatchedStore

logger = logging.getLogger(__name__)

IN_FLIGHT: Final = 16
"""Campaigns (lettings-go of stale keys included) and rebalancing handovers one node has
under way at a time, each. Each is a few store calls; the next starts when one ends (its
end wakes the reconcile loop), so a node takes its pools as fast as the store answers."""

Spawn = Callable[[str, Coroutine[object, object, None]], None]
"""Starts a background task of the node under a name (the node logs its failure)."""


class Ownership:
    """The pools one node owns, and the loop that takes and gives them up (see module)."""

    def __init__(  # noqa: PLR0913 (what a node shares with its owners and its call router)
        self,
        *,
        node_id: NodeId,
        address: str,
        configs: Mapping[PoolName, PoolConfig],
        timing: Timing,
        clock: Clock,
        store: WatchedStore,
        keys: Keys,
        lease: NodeLease,
        view: ClusterView,
        grant_keys: GrantKeys,
        id_counters: Mapping[PoolName, IdCounters],
        embedded: bool,
        spawn: Spawn,
    ) -> None:
        """Args:
        embedded: the only replica: it campaigns at once, without ``campaign_delay_s``.
        spawn: starts the node's background tasks (snapshots, resignations, handovers).
        """
        self.node_id = node_id
        self.address = address
        self.timing = timing
        self.embedded = embedded
        self.view = view
        self._configs = configs
        self._clock = clock
        self._store = store
        self._keys = keys
        self._lease = lease
        self._grant_keys = grant_keys
        self._id_counters = id_counters
        self._spawn = spawn
        self.owned: dict[PoolName, OwnedPool] = {}
        """The pools this node owns now (some may be stopped: see ``deciding``)."""
        self.transitions: dict[PoolName, int] = dict.fromkeys(configs, 0)
        """Epochs of each pool this node started."""
        self.closing = False
        self._handovers = Handovers(
            owned=self.owned, store=store, keys=keys, view=view, clock=clock, timing=timing
        )
        self._campaigns: dict[PoolName, asyncio.Task[None]] = {}
        self._backoff = CampaignBackoff(clock)
        self._absent_since: dict[PoolName, float] = {}
        # When the latest owner key appeared (monotonic): while pools keep being taken,
        # their targets are at work and a node that is not a pool's target waits for it.
        self._taken_at = -math.inf
        self._started = 0.0
        # Pools this node has seen owned: one of them without an owner lost it (a handover,
        # a failover), so settling after the join does not hold its campaign back.
        self._seen_owned: set[PoolName] = set()

    # -- what the node asks --------------------------------------------------------------

    def started(self) -> None:
        """The node joined the cluster now: ``campaign_delay_s`` counts from here."""
        self._started = self._clock.monotonic()

    def deciding(self, name: PoolName) -> OwnedPool | None:
        """The pool if this node owns it and may decide for it now; else None."""
        owned = self.owned.get(name)
        return owned if owned is not None and owned.can_decide() else None

    def handing_over(self, name: PoolName) -> bool:
        """True while a handover of ``name`` is under way."""
        return self._handovers.under_way(name)

    async def switchover(self, owned: OwnedPool, target: NodeId) -> None:
        """Pins the pool this node owns to ``target``: here, or handed over there.

        Raises:
            StoreUnavailable: the pin could not be written (nothing moved).
            UnknownNode: ``target`` is no member now.
        """
        if target == self.node_id:
            await self._handovers.mark_successor(owned.name, target, Mark.PIN)
            logger.info("pool %s pinned to %s at epoch %d", owned.name, target, owned.epoch)
        else:
            await self._handovers.handover(owned, target, why="planned switchover", mark=Mark.PIN)

    def stop(self) -> None:
        """Stops deciding for every pool and campaigns no more (shutdown's first step)."""
        self.closing = True
        for owned in self.owned.values():
            owned.stop()

    async def close(self, budget_s: float) -> Collection[asyncio.Task[None]]:
        """Stops, writes every final snapshot (within ``budget_s``), forgets every pool.

        Returns the campaign tasks, cancelled: the caller waits for them to end.
        """
        self.stop()
        for task in self._campaigns.values():
            task.cancel()
        finals = [owned.close() for owned in list(self.owned.values())]
        try:
            async with asyncio.timeout(budget_s):
                await asyncio.gather(*finals)
        except TimeoutError:
            logger.warning("node %s: final snapshots did not end in time", self.node_id)
        for owned in self.owned.values():
            logger.info("released pool %s at epoch %d: shutting down", owned.name, owned.epoch)
        self.owned.clear()
        return list(self._campaigns.values())

    def tick(self) -> None:
        """The snapshot loop's turn: expires stale grants and writes every owned pool whose
        state changed since its last write (``OwnedPool.changed``: an idle pool writes
        nothing); publishes a capacity the cluster view does not show yet."""
        for owned in list(self.owned.values()):
            if owned.can_decide():
                owned.expire()
                if owned.changed:
                    self._spawn(f"snapshot-{owned.name}", self.sync(owned))
                published = self.view.capacity(owned.name)
                if published is None:
                    published = self._configs[owned.name].capacity
                if published != owned.capacity:
                    self._spawn(f"capacity-{owned.name}", self._republish(owned))

    async def publish_capacity(self, owned: OwnedPool) -> None:
        """Writes the pool's capacity to its capacity key, fenced on the epoch, so every
        replica's ListPools reports it (``ClusterView.capacity``).

        Raises:
            StoreUnavailable: the store did not answer; the next ``tick`` tries again.
            WrongEpoch: this node no longer owns the pool at that epoch.
        """
        ok = await bounded(
            self._store.put_fenced(
                self._keys.capacity(owned.name),
                encode_capacity(owned.capacity, owned.epoch),
                fence_key=self._keys.owner(owned.name),
                fence_revision=owned.epoch,
            ),
            self.timing.rpc_timeout_s,
        )
        if not ok:
            raise WrongEpoch(owned.name, NodeId(""), "", owned.epoch)

    async def _republish(self, owned: OwnedPool) -> None:
        try:
            await self.publish_capacity(owned)
        except (StoreUnavailable, WrongEpoch) as e:
            logger.debug("pool %s: capacity not published yet: %s", owned.name, e)

    async def sync(self, owned: OwnedPool) -> None:
        """Writes ``owned`` now; a failed write wakes the reconcile loop to drop it."""
        await owned.flush()
        if owned.lost:
            self.view.changed.set()

    def owner_changed(self, pool: PoolName, route: Route | None) -> None:
        """The pool's owner key changed: drops the pool if it is no longer ours."""
        if route is not None:
            self._taken_at = self._clock.monotonic()
            self._seen_owned.add(pool)
        if route is not None and route.node != self.node_id:
            self._store.clear(pool)  # another node wrote its owner key: not our disk's
        owned = self.owned.get(pool)
        if owned is not None and (route is None or route.epoch != owned.epoch):
            self._drop(owned, "its owner key was deleted" if route is None else "another owner")

    def lease_lost(self) -> None:
        """The node's lease expired: every pool is lost."""
        for owned in list(self.owned.values()):
            self._drop(owned, "the lease expired")

    def _drop(self, owned: OwnedPool, why: str) -> None:
        if self.owned.get(owned.name) is owned:
            del self.owned[owned.name]
            owned.stop()
            logger.warning("lost pool %s at epoch %d: %s", owned.name, owned.epoch, why)

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """Reconciles on every change of the cluster view, and every tick."""
        while True:
            sleeper = asyncio.ensure_future(self._clock.sleep(TICK_S))
            waiter = asyncio.ensure_future(self.view.changed.wait())
            try:
                await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                waiter.cancel()
            self.view.changed.clear()
            if not self.closing:
                self._reconcile()

    def _reconcile(self) -> None:
        """Campaigns for ownerless pools, gives up lost ones, and rebalances.

        Placement: a pool belongs to the node an operator's switchover pinned it to while
        that pin holds (``ClusterView.pinned``), otherwise to its preferred replica. An
        owner moves a pool to that node only once it has been a member without a break
        for ``rebalance_settle_s`` (hysteresis: a flapping replica does not drag pools
        back and forth); an ownerless pool is campaigned for by the pin's target, a fresh
        hint's target, or the preferred replica at once, by the others after
        ``campaign_delay_s`` in which no pool was taken, and at the latest
        ``lease_ttl_s + campaign_delay_s`` after the pool became ownerless. For
        ``campaign_delay_s`` after the join, only pools seen owned are campaigned for.
        """
        now = self._clock.monotonic()
        self._give_up_unfenced()
        if not self._lease.fenced() or not self.view.ready.is_set():
            return
        members = list(self.view.members) or [self.node_id]
        settling = not self.embedded and now - self._started < self.timing.campaign_delay_s
        settled = self.view.settled(self.timing.rebalance_settle_s)
        # Once per turn, not per pool: this loop runs twenty times a second over every pool.
        candidates = tuple(sorted({*settled, self.node_id}))
        for name in self._configs:
            mine = self.owned.get(name)
            route = self.view.route(name)
            if mine is not None:
                # Not absent while ours: a pool this node hands over is absent afresh when
                # its key goes, so this node then waits campaign_delay_s like the others
                # and the target, which campaigns at once, wins the race.
                self._absent_since.pop(name, None)
                if not settling:
                    self._rebalance(name, mine, settled, candidates)
            elif route is not None:
                self._absent_since.pop(name, None)
                self._let_go_if_stale(name, route)
            elif (
                name not in self._campaigns
                and (not settling or name in self._seen_owned)
                and self._room()
            ):
                self._campaign_when_due(name, members, now)

    def _give_up_unfenced(self) -> None:
        """Resigns every owned pool whose fenced write failed, or all when self-fenced
        (except the pools a handover is letting go on purpose)."""
        fenced = self._lease.fenced()  # once for all: no time passes in this loop
        for name, owned in list(self.owned.items()):
            if self._handovers.under_way(name):
                continue  # it stopped deciding on purpose; the handover lets it go
            if owned.lost or not fenced:
                self._drop(owned, "its fenced write failed" if owned.lost else "self-fenced")
                self._spawn(f"resign-{name}", self._handovers.resign(owned))

    def _rebalance(
        self,
        name: PoolName,
        mine: OwnedPool,
        settled: Sequence[NodeId],
        candidates: tuple[NodeId, ...],
    ) -> None:
        """Hands an owned pool over to its pin's target or preferred replica, if that is
        another node that has been a member for ``rebalance_settle_s``."""
        if self._handovers.under_way(name) or self._handovers.count >= IN_FLIGHT:
            return  # (at the cap: the next reconcile after one ends looks again)
        pinned = self.view.pinned(name)
        target = pinned or preferred_owner(name, candidates)
        # The owner check last: it reads the clock, and most pools are where they belong.
        if (
            target is not None
            and target != self.node_id
            and target in settled
            and mine.can_decide()
        ):
            self._handovers.begin(name)
            self._spawn(
                f"rebalance-{name}",
                self._handovers.handover(
                    mine,
                    target,
                    why="back to its pinned replica" if pinned else "rebalancing",
                    mark=Mark.KEEP if pinned else Mark.HINT,
                    started=True,
                ),
            )

    def _let_go_if_stale(self, name: PoolName, route: Route) -> None:
        """A pool whose key names this node but that this process does not decide for."""
        if (
            route.node == self.node_id
            and self._room()
            and name not in self._campaigns
            and not self._handovers.under_way(name)
        ):
            # Our key, but this process does not decide from it (it self-fenced, a write
            # failed, or an earlier process of ours held it): let it go so that a fresh
            # epoch restores from the last snapshot.
            self._campaigns[name] = asyncio.create_task(
                self._let_go(name, route.epoch), name=f"let-go-{name}"
            )

    def _room(self) -> bool:
        """True while fewer than ``IN_FLIGHT`` campaigns of this node are under way."""
        return len(self._campaigns) < IN_FLIGHT

    def _campaign_when_due(self, name: PoolName, members: Sequence[NodeId], now: float) -> None:
        """Campaigns for an ownerless pool at once if this node is its target (the pin's,
        a fresh hint's, or the preferred replica), otherwise once it has been ownerless
        for ``campaign_delay_s`` and no pool has been taken for as long, or at the latest
        ``lease_ttl_s + campaign_delay_s`` after it became ownerless (as seen here),
        however many other pools are being taken meanwhile."""
        if self._backoff.waiting(name, now):
            return
        since = self._absent_since.setdefault(name, now)
        pinned = self.view.pinned(name)
        target = pinned or preferred_owner(name, members)
        hint = self.view.handovers.get(name)
        fresh = hint is not None and self._clock.time() - hint.wall < 2 * self.timing.lease_ttl_s
        if pinned is None and hint is not None and fresh and hint.node in self.view.members:
            target = hint.node
        delay = 0.0 if target == self.node_id else self.timing.campaign_delay_s
        # Not before campaign_delay_s has passed without any pool being taken: a target
        # that campaigns for hundreds of pools (``IN_FLIGHT`` at a time) gets them all,
        # rather than losing most to the others and taking them back by handovers.
        # Waiting for that quiet is bounded by lease_ttl_s, the time the cluster gives a
        # silent replica before it counts as gone: while pools keep being taken (churn,
        # or a backlog longer than that) a target that has not taken this one by then is
        # failing at it (its campaigns for it back off, or its view is stale), and the
        # pool would otherwise stay ownerless for as long as the churn lasts.
        quiet_from = min(max(since, self._taken_at), since + self.timing.lease_ttl_s)
        if now - quiet_from >= delay:
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
            self._backoff.ended(name)
        except (StoreUnavailable, LeaseNotFound) as e:
            self._campaign_failed(name, e)
        except Exception:
            logger.exception("BUG: campaign for pool %s failed", name)
        finally:
            self._campaigns.pop(name, None)
            self.view.changed.set()

    def _campaign_failed(self, name: PoolName, e: Exception) -> None:
        attempt = self._backoff.failed(name)
        if attempt is None:
            return
        full = isinstance(e, StoreFull)
        logger.log(
            logging.ERROR if full else logging.WARNING,
            "node %s: campaign for pool %s failed%s (attempt %d): %s",
            self.node_id,
            name,
            ": store full" if full else "",
            attempt,
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
        log = PoolLog(
            self._store,
            self._keys,
            name,
            epoch,
            # A write whose answer is late has an unknown outcome and costs the pool, so
            # it may take as long as this node may still decide, not just one RPC
            # timeout: a store that stalls for less than that (an fsync spike, a leader
            # election) costs latency, not the pool. The store may send the same write
            # again meanwhile.
            budget_s=lambda: max(self.timing.rpc_timeout_s, self._lease.seconds_left()),
        )
        owned = OwnedPool(
            config=config,
            epoch=epoch,
            node=self.node_id,
            clock=self._clock,
            # Decide only on the lease the owner key was created on: a node that lost
            # that lease and joined again must not decide from this epoch.
            fenced=lambda: self._lease.lease == lease and self._lease.fenced(),
            log=log,
            commit_window_s=self.timing.commit_window_s,
            release_commit_s=self.timing.release_commit_s,
            release_memory_s=self.timing.release_memory_s,
            session_ttl_s=self.timing.session_ttl_s,
            keys=self._grant_keys,
            counters=self._id_counters[name],
        )
        loaded = await load(
            self._store, self._keys, name, decay_rate=owned.pool.decay_rate, timeout_s=rpc
        )
        log.resume(loaded.position)
        if loaded.unreadable:
            phantoms = owned.restore_unreadable()
            teams = 0
            logger.error(
                "pool %s at epoch %d: the previous owner's state is unreadable; usage "
                "starts from zero and every reservation counts as taken for %gs",
                name,
                epoch,
                config.max_request_s,
            )
        else:
            teams, phantoms = owned.restore(loaded.snapshot)
        route = self.view.route(name)
        if (
            self.closing
            or self._lease.lease != lease
            or (route is not None and route.epoch != epoch)
        ):
            return
        self.owned[name] = owned
        # Counted once per epoch, by the node that starts it: a handover or a failover is
        # one transition, whatever the losing side saw.
        self.transitions[name] += 1
        logger.info(
            "acquired pool %s at epoch %d: restored usage of %d teams, %d phantoms",
            name,
            epoch,
            teams,
            phantoms,
        )
        # Within the campaign: ``IN_FLIGHT`` bounds these writes too.
        await self.sync(owned)

    async def _let_go(self, name: PoolName, epoch: Epoch) -> None:
        """Lets go of our stale owner key (``Handovers.let_go``); the pool may be
        campaigned for again once it ends."""
        try:
            await self._handovers.let_go(name, epoch)
        finally:
            self._campaigns.pop(name, None)
