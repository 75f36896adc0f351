"""The gateway's client library: acquire a priority, release it when the request ends.

Guarantees:
- ``acquire`` answers within ``deadline_s``: it retries ``UNAVAILABLE`` (and deadline
  expiries) on the configured targets in turn, with the same request id, so the owner
  answers a retry with the same grant; when no replica answers in time it applies the
  pool's degraded mode (learnt from ``ListPools``; ``fail_open`` when unknown): a grant at
  the lowest borrowing priority marked ``degraded``, or ``NoOwner`` for ``fail_closed``.
- An acquire it gave up on (no answer in time, or the caller cancelled it) is not left
  counted at the owner: the request is queued and
  sent again in the background with the same request id, and the grant it names is
  released at no cost. The resends cannot storm a recovering cluster: at most
  ``resend_batch`` per ``release_retry_s``, and one probe per pool while its owner does
  not answer. A queued resend is dropped after ``ABANDON_KEEP_S`` or when the queue
  (``max_abandoned``) is full.
- A release is sent at least once while the buffer has room: it is buffered until a
  replica acknowledges it, and a background task retries the buffer every
  ``release_retry_s``, pool by pool and ``flush_concurrency`` at a time, so a pool without
  an owner holds back only its own releases. The server makes releases idempotent.
- The client keeps its live grants; when a response shows a pool at a new epoch it
  re-reports them to the new owner with ``Adopt(complete=true)``, carrying a grant the
  cluster signed for this holder (a live one of the new epoch if none of the re-reported
  is; else sent again with the first such grant), so the owner closes this holder's
  phantoms that no live grant claims.
- A grant no owner counted is re-reported (``Adopt(complete=false)``) as soon as an owner
  of its pool answers, whatever that owner's epoch: degraded grants (epoch 0, decided by
  this client or by a replica without an owner) and late grants (decided at an epoch
  older than one the client had already seen, so missing from its complete re-report).
- Degraded grant ids are random (see ``degraded_grant_id``): a restarted gateway does not
  reuse an id that an owner remembers as settled.
- Each client object has its own holder session (``fairshare.client.sessions``), made when it is
  created and sent with every call: its grants live at their owners as long as it renews
  the session (KeepAlive while grants are live), however long their requests run; its
  complete re-reports close only its own phantoms, whatever other process shares its
  holder name. When the process dies its grants stop counting within one session TTL
  (``timing.session_ttl_s``, 30 s by default).

Non-guarantees: releases buffered when the process dies are lost (its grants stop
counting when its session lapses, and their consumption is not charged), and so are the
oldest buffered releases once ``max_pending_releases`` are buffered (counted in
``dropped_releases``; their grants stay counted at the owner until the session lapses, or
``max_request_s`` for a grant made without one, and their consumption is not charged);
a degraded grant counts nowhere until an owner answers the client.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Final

import grpc
from grpc import aio

from fairshare import Class, degraded_priority
from fairshare.client.adoption import Adoption
from fairshare.client.backlog import Backlog
from fairshare.client.calls import RETRYABLE, Calls
from fairshare.client.grants import ClientGrant, degraded_grant_id
from fairshare.client.sessions import SessionKeeper
from fairshare.client.state import ClientState
from fairshare.errors import NoOwner
from fairshare.ids import DEGRADED_EPOCH, NodeId
from fairshare.modes import DegradedMode
from fairshare.sessions import new_session
from fairshare.wire.convert import acquire_request, decision, degraded_mode
from fairshare.wire.errors import failed_call, to_allocator_error
from fairshare.wire.metadata import session_entry
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb

logger = logging.getLogger(__name__)

LIST_EVERY_S: Final = 10.0
"""Least time between two background ListPools started to learn whether a pool's owner
holds nobody (``AllocatorClient.acquire``): an Acquire of a pool not listed, or not
known to the replicas yet, lists at most this often."""


class AllocatorClient:
    """Asyncio client of the allocator for one gateway (``holder``), in a holder session
    of its own.

    It holds its parts and wires them together, each handed what it uses: ``Calls`` (the
    channels, retries and batches), ``Backlog`` (releases and acquires still owed),
    ``Adoption`` (re-reports to new owners) and ``SessionKeeper`` (the session's
    keepalives), over one ``ClientState`` (the live grants, the closed flag). It decides
    the grants itself, and tells the parts of each grant it makes and each one that ends.
    """

    def __init__(  # noqa: PLR0913 (its tuning options: keyword-only, with defaults)
        self,
        targets: Sequence[str],
        *,
        holder: str,
        deadline_s: float = 0.75,
        credentials: grpc.ChannelCredentials | None = None,
        release_retry_s: float = 0.5,
        release_batch: int = 1000,
        epoch_check_s: float = 1.0,
        route_to_owner: bool = True,
        max_pending_releases: int = 10_000,
        flush_concurrency: int = 8,
        max_abandoned: int = 1_000,
        resend_batch: int = 16,
        calls_in_flight: int = 2,
    ) -> None:
        """Creates the client; channels connect lazily.

        Args:
            targets: replica addresses ``host:port``; any replica serves every pool.
            holder: this gateway's id (stable across its restarts is best).
            deadline_s: how long an acquire may look for a replica before the pool's
                degraded mode applies. Keep a third of it above the replicas'
                ``degraded_after_s`` (0.2 s by default), so that a replica's own degraded
                answer, counted in its metrics, arrives before the client gives up.
            credentials: TLS credentials; None uses plaintext.
            release_retry_s: period of the background retry of unacknowledged releases
                and of abandoned acquires.
            release_batch: most releases retried per period.
            route_to_owner: send each pool's calls straight to its owner (its address is
                learnt from ListPools whenever a new epoch shows up), falling back to
                ``targets`` when the owner does not answer; saves the forwarding hop.
            epoch_check_s: while it holds grants, how often the client reads ListPools to
                notice a new owner it would not otherwise see (a gateway that only
                releases), so its re-report closes the new owner's phantoms early.
            max_pending_releases: most unacknowledged releases kept; when full the oldest
                is dropped (``dropped_releases``), with one warning per episode.
            flush_concurrency: most calls the background retry has in flight at once
                (across pools; each pool is probed with one call before the rest is sent).
            max_abandoned: most acquires given up on kept for resending; when full the
                oldest is dropped (``dropped_abandoned``), with one warning per episode.
            resend_batch: most acquires given up on resent per ``release_retry_s``, so a
                recovering cluster is not met by a burst of them.
            calls_in_flight: most Acquire (and, apart, Release) calls of one pool out at
                once; those that come meanwhile wait for one to end and leave together in
                one batched call (``fairshare.client.calls``). 1 batches most, and adds most wait.

        Raises:
            ValueError: no targets, a deadline <= 0, or a bound < 1.
        """
        if not targets:
            raise ValueError("targets must name at least one replica")
        if deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
        bounds = {
            "max_pending_releases": max_pending_releases,
            "flush_concurrency": flush_concurrency,
            "max_abandoned": max_abandoned,
            "resend_batch": resend_batch,
            "release_batch": release_batch,
            "calls_in_flight": calls_in_flight,
        }
        for name, bound in bounds.items():
            if bound < 1:
                raise ValueError(f"{name} must be >= 1, got {bound}")
        self.holder = holder
        self._state = ClientState(holder)
        self.deadline_s = deadline_s
        self._modes: dict[str, DegradedMode] = {}  # pool -> its degraded mode, from ListPools
        self._lends_all: dict[str, bool] = {}  # pool -> its owner holds nobody, from ListPools
        self._listed_at = -math.inf  # when the last background ListPools started
        # Its text is a secret, sent with every call: never logged (its id may be).
        session = new_session()
        self._calls = Calls(
            targets,
            holder=holder,
            deadline_s=deadline_s,
            credentials=credentials,
            metadata=(session_entry(session),),
            route_to_owner=route_to_owner,
            calls_in_flight=calls_in_flight,
        )
        self._backlog = Backlog(
            self._state,
            self._calls.call,
            self._calls.release,
            saw_epoch=self._saw_epoch,
            deadline_s=deadline_s,
            release_retry_s=release_retry_s,
            release_batch=release_batch,
            max_pending=max_pending_releases,
            flush_concurrency=flush_concurrency,
            max_abandoned=max_abandoned,
            resend_batch=resend_batch,
        )
        self._adoption = Adoption(
            self._state,
            self._calls.call,
            self._backlog,
            refresh_pools=self.refresh_pools,
            renewed=self._renewed_by_call,
            epoch_check_s=epoch_check_s,
            learn_routes=route_to_owner,
            max_ended=max_pending_releases,
        )
        self._keeper = SessionKeeper(
            self._state,
            self._calls.call,
            session=session,
            deadline_s=deadline_s,
            counted=self._adoption.counted,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> AllocatorClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, *, flush_timeout_s: float = 2.0) -> None:
        """Sends buffered releases and settles acquires given up on (for at most
        ``flush_timeout_s``), then closes."""
        if self._state.closed:
            return
        self._state.closed = True
        try:
            async with asyncio.timeout(flush_timeout_s):
                await self._adoption.report_all_ended()
                await self._backlog.flush(until_empty=True)
        except TimeoutError:
            logger.warning(
                "closing with %d releases unacknowledged, %d ended degraded grants "
                "unreported and %d acquires given up on unsettled",
                self._backlog.pending_releases,
                self._adoption.ended_grants,
                self._backlog.abandoned_acquires,
            )
        tasks = [
            *self._state.tasks,
            *self._backlog.tasks(),
            *self._adoption.tasks(),
            *self._keeper.tasks(),
        ]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._calls.close()

    @property
    def live_grants(self) -> list[ClientGrant]:
        """The grants acquired and not yet released."""
        return list(self._state.live.values())

    @property
    def pending_releases(self) -> int:
        """Releases not yet acknowledged by a replica, those of ended degraded grants
        waiting to be re-reported first included."""
        return self._backlog.pending_releases + self._adoption.ended_grants

    @property
    def dropped_releases(self) -> int:
        """Releases dropped unsent because the buffer was full, those of ended degraded
        grants dropped unreported included (a counter)."""
        return self._backlog.dropped_releases + self._adoption.dropped_ended

    @property
    def abandoned_acquires(self) -> int:
        """Acquires given up on whose grant is still to be found and released."""
        return self._backlog.abandoned_acquires

    @property
    def dropped_abandoned(self) -> int:
        """Acquires given up on and dropped without their grant released: the queue was
        full, the request too old, or the server refused it (a counter)."""
        return self._backlog.dropped_abandoned

    def on_owner_answer(self, listener: Callable[[str, int], None]) -> None:
        """Calls ``listener(pool, epoch)`` each time an answer shows an owner of ``pool``
        at ``epoch``: an acquire, release or adopt it decided, or ListPools naming it.

        The hook a gateway uses to learn that a pool has an owner again after an outage
        (its degraded grants are then re-reported to that owner, see
        ``fairshare.client.adoption``). It is called synchronously, on the event loop, for
        every such answer, so it must be cheap and must not block; an exception it raises
        is logged and ignored. Not guaranteed: that it is called at all while the client
        makes no calls and holds no grant (the background ListPools runs only while
        grants are live).
        """
        self._adoption.on_owner_answer(listener)

    @property
    def session_id(self) -> str:
        """The id of this client's holder session (what may be logged; not its secret)."""
        return self._keeper.session_id

    async def refresh_pools(self) -> list[pb.PoolInfo]:
        """Reads ListPools: learns each pool's degraded mode and owner epoch."""
        listing: pb.ListPoolsResponse = await self._calls.call(
            "ListPools", pb.ListPoolsRequest(), deadline_s=max(self.deadline_s, 1.0)
        )
        for info in listing.pools:
            self._modes[info.pool] = degraded_mode(info.degraded_mode)
            self._lends_all[info.pool] = info.lends_all
            self._adoption.saw_capacity(info.pool, info.capacity)
            self._calls.learn_owner(info.pool, info.owner_address)
            self._saw_epoch(info.pool, info.epoch)
        return list(listing.pools)

    async def acquire(
        self,
        pool: str,
        team: str,
        service_class: Class = Class.INTERACTIVE,
        est_tokens: int = 0,
        *,
        wait_s: float = 0.0,
    ) -> ClientGrant:
        """Acquires a priority for one request.

        ``wait_s`` > 0 lets the pool's owner hold the request, if it would borrow past the
        pool's lending limit (``lend``), until a slot it may take opens, for at most that
        long (then, per the pool's ``on_wait_end``, it borrows anyway or is refused with
        ``LimitExceeded``). Such a call goes alone (not in a batch), may last ``wait_s``
        beyond the client's deadline, and is sent again with the wait it has left when its
        replica fails. Cancelling the call leaves the owner's queue at once. A pool that
        ListPools says lends all (``lends_all``: its owner holds nobody) gets the call as
        one without ``wait_s``, batched with others; a pool the client has not listed yet
        is listed in the background (at most every ``LIST_EVERY_S``), its calls sent as
        ones that may be held until then.

        Returns:
            The grant; call ``release`` on it when the request ends.

        Raises:
            NoOwner: no replica answered in time and the pool fails closed.
            LimitExceeded: the owner refused (a bound, or the wait ended and the pool's
                ``on_wait_end`` is ``refuse``).
            UnknownPool, InvalidArgument: as the server answered.
        """
        grant = await self._acquire(
            pool, team, Class(service_class), est_tokens, try_only=False, wait_s=wait_s
        )
        assert grant is not None  # only try_only is ever refused
        return grant

    async def try_acquire(
        self,
        pool: str,
        team: str,
        service_class: Class = Class.INTERACTIVE,
        est_tokens: int = 0,
    ) -> ClientGrant | None:
        """Like ``acquire``, but None when the pool already has C requests in flight."""
        return await self._acquire(pool, team, Class(service_class), est_tokens, try_only=True)

    async def _acquire(
        self,
        pool: str,
        team: str,
        service_class: Class,
        est_tokens: int,
        *,
        try_only: bool,
        wait_s: float = 0.0,
    ) -> ClientGrant | None:
        held = wait_s > 0 and not self._holds_nobody(pool)
        request = acquire_request(
            pool=pool,
            team=team,
            cls=service_class,
            est_tokens=est_tokens,
            holder=self.holder,
            request_id=uuid.uuid4().hex,
            try_only=try_only,
            wait_s=wait_s if held else 0.0,
        )
        try:
            r = await (self._held(request) if held else self._decide(request))
        except aio.AioRpcError as e:
            if e.code() not in RETRYABLE:
                raise to_allocator_error(e, address="", pool=pool) from e
            self._backlog.abandon(request)
            return self._degraded(pool, team, service_class, est_tokens, e)
        except asyncio.CancelledError:
            # The owner may have decided already: resent with the same request id, the
            # grant is found and released at no cost, instead of staying counted.
            self._backlog.abandon(request)
            raise
        answer = decision(r)
        known = self._adoption.epoch(pool)
        self._saw_epoch(pool, answer.epoch)
        if not answer.degraded:
            self._keeper.renewed_by_call(pool)
        if not answer.granted:
            return None
        grant = ClientGrant(
            pool=pool,
            team=team,
            service_class=service_class,
            est_tokens=est_tokens,
            grant_id=answer.grant_id,
            priority=answer.priority,
            borrowing=answer.borrowing,
            saturated=answer.saturated,
            degraded=answer.degraded,
            owner=answer.owner,
            epoch=answer.epoch,
            _client=self,
        )
        self._state.live[grant.grant_id] = grant
        self._adoption.decided(grant, known)
        self._keeper.keep()
        return grant

    def _holds_nobody(self, pool: str) -> bool:
        """Whether ListPools said that ``pool``'s owner holds nobody; a pool not listed yet
        is listed in the background (see ``acquire``)."""
        lends_all = self._lends_all.get(pool)
        if lends_all is None:
            now = time.monotonic()
            if now - self._listed_at >= LIST_EVERY_S:
                self._listed_at = now
                self._state.spawn(self._list_quietly(), "list pools")
            return False
        return lends_all

    async def _list_quietly(self) -> None:
        try:
            await self.refresh_pools()
        except aio.AioRpcError as e:
            logger.debug("ListPools failed: %s; pools not listed are sent as held", e.code())

    async def _decide(self, request: pb.AcquireRequest) -> pb.AcquireResponse:
        """One Acquire, batched with others of its pool, answered within ``deadline_s``.

        An item refused with a retryable status (its pool's owner not reached by the
        replica that answered the batch) is sent again alone, for the time left.

        Raises:
            aio.AioRpcError: the call failed (``DEADLINE_EXCEEDED`` when no answer came in
                time).
        """
        start = time.monotonic()
        try:
            async with asyncio.timeout(self.deadline_s):
                return await self._calls.acquire(request)
        except aio.AioRpcError as e:
            left = self.deadline_s - (time.monotonic() - start)
            if e.code() not in RETRYABLE or left <= 0:
                raise
        except TimeoutError:
            raise failed_call(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer within {self.deadline_s}s"
            ) from None
        return await self._calls.call("Acquire", request, deadline_s=left, pool=request.pool)

    async def _held(self, request: pb.AcquireRequest) -> pb.AcquireResponse:
        """One Acquire the owner may hold for its ``wait_s``: sent alone (a batch answers
        when its last item does), each attempt with the wait it has left and given that
        much longer. Reaching a replica takes at most ``deadline_s``, as for any Acquire
        (then the pool's degraded mode applies); a call that failed after it was held
        longer (its owner went away) is sent again, with the wait it has left.

        Not guaranteed: a replica that hangs (paused, not dead) is told from an owner that
        holds the call only when the attempt's time, its wait included, runs out.

        Raises:
            aio.AioRpcError: as ``_decide``.
        """
        held_until = time.monotonic() + request.wait_s
        while True:
            sent = time.monotonic()
            try:
                return await self._calls.call(
                    "Acquire",
                    request,
                    deadline_s=self.deadline_s,
                    pool=request.pool,
                    held_until=held_until,
                )
            except aio.AioRpcError as e:
                # Failing to reach a replica ends within about the deadline (retries
                # included): twice that means the call was held before it failed.
                now = time.monotonic()
                if e.code() not in RETRYABLE or now - sent < 2 * self.deadline_s:
                    raise
                if now >= held_until:
                    raise

    def _degraded(
        self, pool: str, team: str, service_class: Class, est_tokens: int, error: Exception
    ) -> ClientGrant:
        mode = self._modes.get(pool, DegradedMode.FAIL_OPEN)
        if mode is DegradedMode.FAIL_CLOSED:
            raise NoOwner(pool) from error
        logger.warning("pool %s: no replica answered within %gs; fail_open", pool, self.deadline_s)
        grant_id = degraded_grant_id(pool, team, self.holder)
        grant = ClientGrant(
            pool=pool,
            team=team,
            service_class=service_class,
            est_tokens=est_tokens,
            grant_id=grant_id,
            priority=degraded_priority(service_class),
            borrowing=True,
            saturated=False,
            degraded=True,
            owner=NodeId(""),
            epoch=DEGRADED_EPOCH,
            _client=self,
        )
        self._state.live[grant_id] = grant
        self._adoption.made(grant)
        self._keeper.keep()
        return grant

    def _saw_epoch(self, pool: str, epoch: int) -> None:
        """An answer named an owner of ``pool`` at ``epoch`` (``Adoption.saw_epoch``)."""
        self._adoption.saw_epoch(pool, epoch)

    def _renewed_by_call(self, pool: str) -> None:
        """An owner of ``pool`` answered an Adopt (``SessionKeeper.renewed_by_call``)."""
        self._keeper.renewed_by_call(pool)

    async def _release(self, grant: ClientGrant, consumed: float) -> None:
        """Ends ``grant`` (``ClientGrant.release``): its release is sent, or kept until
        it can be (``fairshare.client.backlog``), after its re-report when no owner
        counted it (``fairshare.client.adoption``)."""
        self._state.live.pop(grant.grant_id, None)
        if not self._adoption.ended(grant, consumed):
            await self._backlog.release(grant.grant_id, consumed)
