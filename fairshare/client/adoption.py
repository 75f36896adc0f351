"""How a client keeps owners counting its grants: re-reports after a change of owner.

The client keeps its live grants. When an answer or ListPools shows a pool at a new epoch,
it re-reports them to the new owner with ``Adopt(complete=true)``; a grant no owner
counted (decided degraded, or late: at an epoch older than one already re-reported to) is
re-reported with ``Adopt(complete=false)`` as soon as an owner of its pool answers. While
grants are live it reads ListPools every ``epoch_check_s`` to notice a new owner it would
not otherwise see, and, with ``route_to_owner``, learns the owners' addresses from it.

A grant the client decided itself (no replica answered) that ends before any owner
counted it is not released at once: an owner charges such an id (it carries no replica's
MAC, so anyone could make one) only once it counted it. It is re-reported with the other
uncounted grants, then released; at most the pool's capacity at a time (less the
client-made grants it holds there), each group released before the next is sent
(``_report_ended``): an owner counts one holder's such grants only within its bound on
grants in flight, so a long outage's worth of them, sent in small groups, is charged in
full.

A complete re-report closes this holder's other phantoms only if it carries a signed
grant issued to this holder (the owner's proof of holdership, docs/ha.md "Adopt"). When
the re-reported grants hold none (only degraded ones, or none at all), the client adds a
live signed grant of the new epoch as that proof (the owner counts nothing for it: it
decided it); when it has none either, it sends the complete re-report again with the
first signed grant the new epoch gives it. So the phantoms of grants the client never
received (a crash between the owner's write and its answer) end once the client works
with the new owner, not ``max_request_s`` later.

``Adoption`` is the part of an ``AllocatorClient`` that keeps all this (the epochs seen,
the grants no owner counted, the ended client-made ones): the client tells it of each
grant decided (``decided``), made (``made``) and ended (``ended``), and of each epoch and
capacity an answer shows; it releases re-reported grants through the client's
``fairshare.client.backlog``.

Non-guarantees: an Adopt that fails is retried when the next answer names the epoch; one
the owner refuses for good (not a wrong epoch) is not retried. Ended client-made grants
are kept (at most ``max_pending_releases`` per pool, the buffered releases' bound; the
oldest is dropped and counted in ``dropped_releases``) until an owner answers, and lost
with the process; a client that closes re-reports them first, within its flush time.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import grpc
from grpc import aio

from fairshare.client.calls import RETRYABLE
from fairshare.client.grants import ClientGrant, client_made
from fairshare.errors import InvalidArgument
from fairshare.ids import DEGRADED_EPOCH, NO_EPOCH, GrantRef
from fairshare.limits import MAX_ADOPT_GRANTS
from fairshare.wire.convert import adopt_request
from fairshare.wire.errors import to_allocator_error
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb

if TYPE_CHECKING:
    from fairshare.client.backlog import Backlog
    from fairshare.client.calls import Call
    from fairshare.client.state import ClientState

logger = logging.getLogger(__name__)


class Adoption:
    """Re-reports the client's grants to new owners (see the module doc)."""

    def __init__(
        self,
        state: ClientState,
        call: Call,
        backlog: Backlog,
        *,
        refresh_pools: Callable[[], Awaitable[object]],
        renewed: Callable[[str], None],
        epoch_check_s: float,
        learn_routes: bool,
        max_ended: int,
    ) -> None:
        """Args:
        state: the client's shared state; its live grants are what is re-reported.
        call: calls a replica (each Adopt gets 2 s).
        backlog: where the ended client-made grants' releases go once re-reported.
        refresh_pools: reads ListPools, telling this part each pool's capacity
            (``saw_capacity``) and epoch (``saw_epoch``).
        renewed: told each pool whose owner answered an Adopt (which renewed the session).
        epoch_check_s: the period of ListPools while grants are live.
        learn_routes: read ListPools at each new epoch (to learn the owner's address).
        max_ended: most ended client-made grants kept per pool (``max_pending_releases``).
        """
        self._state = state
        self._call = call
        self._backlog = backlog
        self._refresh_pools = refresh_pools
        self._renewed = renewed
        self._epoch_check_s = epoch_check_s
        self._learn = learn_routes
        self._epochs: dict[str, int] = {}  # pool -> the newest epoch an owner answered at
        # Per pool, live grants no owner has counted yet (degraded, or late: see _adopt).
        self._unreported: dict[str, set[str]] = {}
        self._reporting: set[str] = set()  # pools with an Adopt in flight
        # Per pool, client-made grants that ended before any owner counted them, with
        # what they consumed: re-reported, then released (see _report_ended).
        self._ended: dict[str, dict[str, tuple[ClientGrant, float]]] = {}
        self._max_ended = max_ended
        self.dropped_ended = 0
        """Ended client-made grants dropped unreported, ``max_ended`` of their pool being
        kept (a counter)."""
        self._capacities: dict[str, int] = {}  # pool -> capacity, from ListPools
        self._ending: set[str] = set()  # pools whose ended grants are being re-reported
        # Per pool, the epoch whose complete re-report carried no proof of holdership.
        self._unproven: dict[str, int] = {}
        self._owner_listeners: list[Callable[[str, int], None]] = []
        self._watcher: asyncio.Task[None] | None = None
        self._learning: asyncio.Task[None] | None = None

    @property
    def ended_grants(self) -> int:
        """Ended client-made grants waiting to be re-reported, then released."""
        return sum(len(ended) for ended in self._ended.values())

    def tasks(self) -> list[asyncio.Task[None]]:
        """Its background loops, those that ever started (for the client's ``close``)."""
        return [t for t in (self._watcher, self._learning) if t is not None]

    def epoch(self, pool: str) -> int:
        """The newest epoch an owner of ``pool`` answered at (``NO_EPOCH``: none yet)."""
        return self._epochs.get(pool, NO_EPOCH)

    def saw_capacity(self, pool: str, capacity: int) -> None:
        """Notes a pool's capacity (from ListPools): the most ended client-made grants of
        the pool re-reported at once (less the client-made grants still live there)."""
        self._capacities[pool] = capacity

    def saw_epoch(self, pool: str, epoch: int) -> None:
        """Re-reports live grants when a pool shows an epoch they were not decided in, and
        grants no owner counted yet whenever an owner of the pool answers."""
        if epoch in (NO_EPOCH, DEGRADED_EPOCH):  # no owner decided or is known
            return
        self._tell_owner_answered(pool, epoch)
        known = self._epochs.get(pool)
        self._epochs[pool] = max(epoch, known or 0)
        if known is not None and epoch <= known:
            self._report(pool)
            return
        if self._learn:
            self._learn_routes()
        older = any(g.pool == pool and g.epoch != epoch for g in self._state.live.values())
        if known is None and not older:
            return
        self._state.spawn(self._adopt(pool, epoch, complete=True), f"adopt {pool}@{epoch}")

    def on_owner_answer(self, listener: Callable[[str, int], None]) -> None:
        """Calls ``listener(pool, epoch)`` at each answer naming an owner
        (``AllocatorClient.on_owner_answer``)."""
        self._owner_listeners.append(listener)

    def _tell_owner_answered(self, pool: str, epoch: int) -> None:
        for listener in self._owner_listeners:
            try:
                listener(pool, epoch)
            except Exception:
                logger.exception("pool %s: an owner-answer listener failed", pool)

    def counted(self, grant: ClientGrant) -> bool:
        """False for a live grant no owner counted yet (degraded, or late)."""
        return grant.grant_id not in self._unreported.get(grant.pool, ())

    def decided(self, grant: ClientGrant, known: int) -> None:
        """A grant a replica decided is live; ``known`` is the pool's epoch before its
        answer came. Degraded at a replica, or late (decided at an epoch older than one
        this client already re-reported its grants to, so its complete inventory may have
        closed this grant's phantom): no owner counts it now, so it is re-reported."""
        if grant.epoch == DEGRADED_EPOCH or grant.epoch < known:
            self._unreported.setdefault(grant.pool, set()).add(grant.grant_id)
            self._report(grant.pool)
        else:
            self._granted(grant)
        self._watch()

    def made(self, grant: ClientGrant) -> None:
        """A grant the client decided itself is live: counted nowhere yet, it is reported
        to the first owner of its pool that answers."""
        self._unreported.setdefault(grant.pool, set()).add(grant.grant_id)
        self._watch()

    def _granted(self, grant: ClientGrant) -> None:
        """A new grant is live: if the last complete re-report of its pool lacked a proof
        of holdership at this grant's epoch and this grant is one, sends it again."""
        if self._unproven.get(grant.pool) == grant.epoch and self._proves(grant):
            del self._unproven[grant.pool]
            self._state.spawn(
                self._adopt(grant.pool, grant.epoch, complete=True),
                f"adopt {grant.pool}@{grant.epoch} (proven)",
            )

    def _proves(self, grant: ClientGrant) -> bool:
        """True if ``grant`` proves this client is its holder: a replica signed it, naming
        this holder (the client's own degraded ids are unsigned and prove nothing)."""
        try:
            ref = GrantRef.decode(grant.grant_id)
        except InvalidArgument:
            return False
        return bool(ref.mac) and ref.holder == self._state.holder

    def _proof(self, pool: str, epoch: int) -> ClientGrant | None:
        """A live grant of ``pool`` decided at ``epoch`` that proves holdership, if any."""
        return next(
            (
                g
                for g in self._state.live.values()
                if g.pool == pool and g.epoch == epoch and self._proves(g)
            ),
            None,
        )

    def _report(self, pool: str) -> None:
        """Reports the pool's grants no owner counted, at the newest epoch seen, unless an
        Adopt of the pool is already in flight (it re-checks when it ends)."""
        epoch = self._epochs.get(pool, NO_EPOCH)
        waiting = self._unreported.get(pool) or self._ended.get(pool)
        if epoch and waiting and pool not in self._reporting:
            self._state.spawn(self._adopt(pool, epoch, complete=False), f"report {pool}@{epoch}")

    def ended(self, grant: ClientGrant, consumed: float) -> bool:
        """Notes that ``grant`` ended. True when it is kept to be re-reported and then
        released (see the module doc): a client-made grant no owner counted yet (the
        oldest of its pool is dropped when ``max_ended`` are kept); else the caller
        releases it."""
        unreported = self._unreported.get(grant.pool)
        if unreported is None or grant.grant_id not in unreported:
            return False
        unreported.discard(grant.grant_id)
        if not client_made(grant.grant_id):
            return False  # signed by a replica: its release alone charges it at the owner
        # An owner charges it only once it counted it: re-reported first.
        ended = self._ended.setdefault(grant.pool, {})
        if len(ended) >= self._max_ended:
            del ended[next(iter(ended))]
            self.dropped_ended += 1
        ended[grant.grant_id] = (grant, consumed)
        self._report(grant.pool)
        self._watch()
        return True

    async def report_all_ended(self) -> None:
        """Re-reports, then releases, every ended client-made grant whose pool has a
        known owner (when closing)."""
        for pool in [p for p, ended in self._ended.items() if ended]:
            epoch = self._epochs.get(pool, NO_EPOCH)
            if epoch and pool not in self._reporting:
                await self._adopt(pool, epoch, complete=False)

    async def _report_ended(self, pool: str, epoch: int) -> None:
        """Re-reports the pool's ended client-made grants to its owner at ``epoch``, a
        group at a time, releasing each group before the next (see the module doc).

        Raises:
            aio.AioRpcError: an Adopt failed (the grants not yet re-reported are kept).
        """
        ended = self._ended.get(pool)
        if not ended or pool in self._ending:
            return  # one group at a time: a second loop would overrun the owner's bound
        self._ending.add(pool)
        try:
            await self._report_groups(pool, epoch, ended)
        finally:
            self._ending.discard(pool)

    async def _report_groups(
        self, pool: str, epoch: int, ended: dict[str, tuple[ClientGrant, float]]
    ) -> None:
        """The loop of ``_report_ended``: one group re-reported, then released, at a time."""
        if pool not in self._capacities:
            await self._refresh_pools()
        while ended:
            if self._backlog.releasing_client_made(pool):
                return  # an earlier group's releases are not all acknowledged yet
            live = sum(1 for g in self._state.live.values() if g.pool == pool and g.degraded)
            room = min(self._capacities.get(pool, 1) - live, MAX_ADOPT_GRANTS)
            group = list(itertools.islice(ended.values(), max(room, 1)))
            request = adopt_request(
                pool=pool,
                epoch=epoch,
                holder=self._state.holder,
                complete=False,
                grants=[grant for grant, _ in group],
            )
            await self._call("Adopt", request, deadline_s=2.0, pool=pool)
            for grant, _ in group:
                ended.pop(grant.grant_id, None)
            await self._backlog.release_group([(g.grant_id, c) for g, c in group])

    def _inventory(self, pool: str, epoch: int) -> list[ClientGrant]:
        """What a complete re-report to the owner of ``pool`` at ``epoch`` carries: every
        live grant of the pool decided at another epoch, with a proof of holdership when
        one is live (else the pool is noted in ``_unproven``)."""
        grants = [g for g in self._state.live.values() if g.pool == pool and g.epoch != epoch]
        proven = any(self._proves(g) for g in grants)
        if not proven:
            # A live signed grant of ``epoch`` proves holdership; its owner decided it, so
            # it counts nothing twice. Without one, the next one sends this again.
            proof = self._proof(pool, epoch)
            if proof is not None:
                grants.append(proof)
                proven = True
        if not proven:
            self._unproven[pool] = epoch
        elif self._unproven.get(pool) == epoch:
            del self._unproven[pool]
        return grants

    async def _adopt(self, pool: str, epoch: int, *, complete: bool) -> None:
        """Re-reports grants to the pool's owner at ``epoch``.

        Complete: every live grant of the pool not decided at ``epoch`` (the owner closes
        this holder's other phantoms). Not complete: the grants no owner counted yet.
        """
        unreported = self._unreported.get(pool, set())
        if complete:
            grants = self._inventory(pool, epoch)
        else:
            grants = [self._state.live[i] for i in unreported if i in self._state.live]
            unreported.intersection_update(self._state.live)
            if not grants and not self._ended.get(pool):
                return
        # An Adopt carries at most MAX_ADOPT_GRANTS; a larger inventory goes in several,
        # only the last one complete. Grants a replica signed go last, so the complete
        # one carries the proof of holdership the owner asks for (docs/ha.md, "Adopt").
        grants.sort(key=self._proves)
        self._reporting.add(pool)
        r: pb.AdoptResponse | None = None
        try:
            for start in range(0, len(grants) or int(complete), MAX_ADOPT_GRANTS):
                chunk = grants[start : start + MAX_ADOPT_GRANTS]
                last = start + MAX_ADOPT_GRANTS >= len(grants)
                request = adopt_request(
                    pool=pool,
                    epoch=epoch,
                    holder=self._state.holder,
                    complete=complete and last,
                    grants=chunk,
                )
                r = await self._call("Adopt", request, deadline_s=2.0, pool=pool)
            if not complete:
                await self._report_ended(pool, epoch)
        except aio.AioRpcError as e:
            if not complete and e.code() not in (*RETRYABLE, grpc.StatusCode.FAILED_PRECONDITION):
                # Refused for good (not a wrong epoch): retrying the same grants cannot help.
                unreported.difference_update(g.grant_id for g in grants)
                lost = len(self._ended.pop(pool, {}))
                logger.error(
                    "pool %s: the owner refused to count %d grants: %s",
                    pool,
                    len(grants) + lost,
                    to_allocator_error(e, address="", pool=pool),
                )
                return
            logger.warning(
                "pool %s: re-reporting %d grants failed: %s; will retry",
                pool,
                len(grants),
                e.code(),
            )
            # Forget the epoch so that the next answer (or ListPools) naming it retries.
            if complete and self._epochs.get(pool) == epoch:
                self._epochs[pool] = epoch - 1
            return
        finally:
            self._reporting.discard(pool)
        self._renewed(pool)
        unreported.difference_update(g.grant_id for g in grants)
        if r is None:
            return
        logger.info(
            "pool %s: re-reported %d live grants to %s at epoch %d (%d adopted%s)",
            pool,
            len(grants),
            r.owner,
            r.epoch,
            r.adopted,
            ", complete" if complete else "",
        )
        self._report(pool)  # grants that became unreported while this call was out

    def _learn_routes(self) -> None:
        """Reads ListPools in the background (once at a time) to learn owners' addresses."""

        async def learn() -> None:
            try:
                await self._refresh_pools()
            except aio.AioRpcError as e:
                logger.debug("learning the owners failed: %s", e.code())

        self._learning = self._state.background(self._learning, learn, "routes")

    def _watch(self) -> None:
        self._watcher = self._state.background(self._watcher, self._watch_epochs, "epochs")

    async def _watch_epochs(self) -> None:
        """Reads ListPools now and then while grants are live, or ended client-made ones
        wait to be re-reported (see ``epoch_check_s``)."""
        while (self._state.live or any(self._ended.values())) and not self._state.closed:
            await asyncio.sleep(self._epoch_check_s)
            try:
                await self._refresh_pools()
            except aio.AioRpcError as e:
                logger.debug("epoch check failed: %s", e.code())
