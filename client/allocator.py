"""The gateway's client library: acquire a priority, release it when the request ends.

Guarantees:
- ``acquire`` answers within ``deadline_s``: it retries ``UNAVAILABLE`` (and deadline
  expiries) on the configured targets in turn, with the same request id, so the owner
  answers a retry with the same grant; when no replica answers in time it applies the
  pool's degraded mode (learnt from ``ListPools``; ``fail_open`` when unknown): a grant at
  the lowest borrowing priority marked ``degraded``, or ``NoOwner`` for ``fail_closed``.
- An acquire it gave up on is not left counted at the owner: the request is queued and
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
  re-reports them to the new owner with ``Adopt(complete=true)``.
- A grant no owner counted is re-reported (``Adopt(complete=false)``) as soon as an owner
  of its pool answers, whatever that owner's epoch: degraded grants (epoch 0, decided by
  this client or by a replica without an owner) and late grants (decided at an epoch
  older than one the client had already seen, so missing from its complete re-report).
- Degraded grant ids are random (see ``degraded_grant_id``): a restarted gateway does not
  reuse an id that an owner remembers as settled.

Non-guarantees: releases buffered when the process dies are lost (the owner's phantoms
then expire after the pool's ``max_request_s``), and so are the oldest buffered releases
once ``max_pending_releases`` are buffered (counted in ``dropped_releases``; their grants
stay counted at the owner until ``max_request_s`` and their consumption is not charged);
a degraded grant counts nowhere until an owner answers the client.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import secrets
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Final, TypeVar

import grpc
from grpc import aio
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_delay,
    wait_random_exponential,
)

from fairshare import Class, degraded_priority
from fairshare.limits import MAX_ADOPT_GRANTS
from ha.api import (
    AllocatorError,
    Epoch,
    GrantRef,
    NodeId,
    NoOwner,
    PeerUnavailable,
    PoolName,
)
from ha.settings import DegradedMode
from server.channels import open_channel
from server.convert import SERVICE_CLASS_PB, adopt_request
from server.pb.fairshare.v1 import allocator_pb2 as pb
from server.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from server.peers import to_allocator_error

logger = logging.getLogger(__name__)

T = TypeVar("T")

RETRYABLE: Final = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
ABANDON_KEEP_S: Final = 30.0
"""How long the client keeps resending an acquire it gave up on (an owner that decided it
remembers its answer for less than that under load, and a new owner closes it anyway)."""
_MODES: Final = {pb.FAIL_OPEN: DegradedMode.FAIL_OPEN, pb.FAIL_CLOSED: DegradedMode.FAIL_CLOSED}


def _retryable(error: BaseException) -> bool:
    return isinstance(error, aio.AioRpcError) and error.code() in RETRYABLE


def _pool_of(grant_id: str) -> str:
    """The pool a grant id names ('' when it is not one of ours: the server says why)."""
    try:
        return GrantRef.decode(grant_id).pool
    except AllocatorError:
        return ""


def degraded_grant_id(pool: str, team: str, holder: str) -> str:
    """The id of a grant this client decides itself (``fail_open``, no replica answered).

    Epoch 0 marks it degraded; its sequence number is random (62 bits, as the owners'
    own degraded ids), so ids stay unique across the gateway's restarts: a restarted
    gateway's grant never collides with one an owner remembers as settled. It carries no
    owner's authentication: only owners can issue those.
    """
    return GrantRef(PoolName(pool), Epoch(0), secrets.randbits(62), team, holder).encode()


@dataclass(eq=False)
class ClientGrant:
    """One live grant held by this client.

    Attributes:
        pool, team, service_class, est_tokens: what was asked.
        grant_id: the opaque id releases go by.
        priority: the vLLM priority to send the request with.
        borrowing: above the team's reservation.
        saturated: the pool was full when it was decided.
        degraded: decided locally with no replica reachable (``fail_open``).
        owner, epoch: who decided (empty / 0 when degraded).
    """

    pool: str
    team: str
    service_class: Class
    est_tokens: int
    grant_id: str
    priority: int
    borrowing: bool
    saturated: bool
    degraded: bool
    owner: str
    epoch: int
    _client: AllocatorClient | None = field(default=None, repr=False)
    _released: bool = field(default=False, repr=False)

    @property
    def released(self) -> bool:
        """True once ``release`` was called."""
        return self._released

    async def release(self, consumed: float = 0.0) -> None:
        """Ends the grant; idempotent. Returns once the release is sent or buffered.

        Args:
            consumed: cost units the request consumed (e.g. GPU-seconds); negative or
                non-finite values count as 0.
        """
        if self._released:
            return
        self._released = True
        if self._client is not None:
            await self._client._release(self, consumed)


class AllocatorClient:
    """Asyncio client of the allocator for one gateway (``holder``)."""

    def __init__(
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
        }
        for name, bound in bounds.items():
            if bound < 1:
                raise ValueError(f"{name} must be >= 1, got {bound}")
        self.holder = holder
        self.deadline_s = deadline_s
        self._targets = list(targets)
        self._credentials = credentials
        self._channels: dict[str, aio.Channel] = {}
        # Gateways start on different replicas so that one hung replica stalls few.
        self._preferred = random.randrange(len(self._targets))
        self._modes: dict[str, DegradedMode] = {}
        self._epochs: dict[str, int] = {}
        self._live: dict[str, ClientGrant] = {}
        self._pending: dict[str, float] = {}
        self._release_retry_s = release_retry_s
        self._release_batch = release_batch
        self._max_pending = max_pending_releases
        self._dropped_releases = 0
        self._pending_full = False  # warned once; re-armed when the buffer drains to half
        # Acquires given up on, by request id, with when: resent by the background task.
        self._abandoned: dict[str, tuple[pb.AcquireRequest, float]] = {}
        self._max_abandoned = max_abandoned
        self._dropped_abandoned = 0
        self._abandoned_full = False
        self._resend_batch = resend_batch
        self._slots = asyncio.Semaphore(flush_concurrency)
        # Per pool, live grants no owner has counted yet (degraded, or late: see _adopt).
        self._unreported: dict[str, set[str]] = {}
        self._reporting: set[str] = set()  # pools with an Adopt in flight
        self._tasks: set[asyncio.Task[None]] = set()
        self._flusher: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._epoch_check_s = epoch_check_s
        self._route_to_owner = route_to_owner
        self._owners: dict[str, str] = {}  # pool -> its owner's address, when known
        self._learning: asyncio.Task[None] | None = None
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> AllocatorClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, *, flush_timeout_s: float = 2.0) -> None:
        """Sends buffered releases and settles acquires given up on (for at most
        ``flush_timeout_s``), then closes."""
        if self._closed:
            return
        self._closed = True
        try:
            async with asyncio.timeout(flush_timeout_s):
                await self._flush(until_empty=True)
        except TimeoutError:
            logger.warning(
                "closing with %d releases unacknowledged and %d acquires given up on unsettled",
                len(self._pending),
                len(self._abandoned),
            )
        tasks = [
            *self._tasks,
            *(t for t in (self._flusher, self._watcher, self._learning) if t is not None),
        ]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    @property
    def live_grants(self) -> list[ClientGrant]:
        """The grants acquired and not yet released."""
        return list(self._live.values())

    @property
    def pending_releases(self) -> int:
        """Releases not yet acknowledged by a replica."""
        return len(self._pending)

    @property
    def dropped_releases(self) -> int:
        """Releases dropped unsent because the buffer was full (a counter)."""
        return self._dropped_releases

    @property
    def abandoned_acquires(self) -> int:
        """Acquires given up on whose grant is still to be found and released."""
        return len(self._abandoned)

    @property
    def dropped_abandoned(self) -> int:
        """Acquires given up on and dropped without their grant released: the queue was
        full, the request too old, or the server refused it (a counter)."""
        return self._dropped_abandoned

    # -- calls ---------------------------------------------------------------------------------

    def _stub(self, target: str) -> pb_grpc.AllocatorStub:
        channel = self._channels.get(target)
        if channel is None:
            # Bounded reconnect backoff: a replica restarted on its address is reached
            # again within about a second (see server.channels).
            channel = open_channel(target, self._credentials)
            self._channels[target] = channel
        return pb_grpc.AllocatorStub(channel)

    async def _call(self, method: str, request: object, *, deadline_s: float, pool: str = "") -> T:
        """Calls ``method`` on the pool's owner first (when known), then on the targets in
        turn, until one answers or the deadline passes.

        Raises:
            aio.AioRpcError: the last error (retryable ones only after the deadline).
        """
        start = time.monotonic()
        attempt = itertools.count()
        owner = self._owners.get(pool) if self._route_to_owner and pool else None

        def log_retry(state: RetryCallState) -> None:
            logger.debug("%s: attempt %d failed; retrying", method, state.attempt_number)

        async for trying in AsyncRetrying(
            stop=stop_after_delay(deadline_s),
            wait=wait_random_exponential(multiplier=deadline_s / 20, max=deadline_s / 4),
            retry=retry_if_exception(_retryable),
            before_sleep=log_retry,
            reraise=True,
        ):
            with trying:
                number = next(attempt)
                left = max(deadline_s - (time.monotonic() - start), 0.001)
                # One attempt may take a third of the deadline: a replica that hangs
                # (paused, partitioned) must leave time to try another one.
                if len(self._targets) > 1 or owner is not None:
                    left = min(left, max(deadline_s / 3, 0.05))
                if owner is not None and number == 0:
                    try:
                        return await getattr(self._stub(owner), method)(request, timeout=left)  # type: ignore[no-any-return]
                    except aio.AioRpcError as e:
                        if e.code() in RETRYABLE and self._owners.get(pool) == owner:
                            del self._owners[pool]  # learnt again at the next epoch
                        raise
                index = self._preferred + number - (1 if owner is not None else 0)
                target = self._targets[index % len(self._targets)]
                response: T = await getattr(self._stub(target), method)(request, timeout=left)
                self._preferred = index % len(self._targets)
                return response
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    async def refresh_pools(self) -> list[pb.PoolInfo]:
        """Reads ListPools: learns each pool's degraded mode and owner epoch."""
        listing: pb.ListPoolsResponse = await self._call(
            "ListPools", pb.ListPoolsRequest(), deadline_s=max(self.deadline_s, 1.0)
        )
        for info in listing.pools:
            self._modes[info.pool] = _MODES.get(info.degraded_mode, DegradedMode.FAIL_OPEN)
            if info.owner_address:
                self._owners[info.pool] = info.owner_address
            else:
                self._owners.pop(info.pool, None)
            self._saw_epoch(info.pool, info.epoch)
        return list(listing.pools)

    async def acquire(
        self,
        pool: str,
        team: str,
        service_class: Class = Class.INTERACTIVE,
        est_tokens: int = 0,
    ) -> ClientGrant:
        """Acquires a priority for one request.

        Returns:
            The grant; call ``release`` on it when the request ends.

        Raises:
            NoOwner: no replica answered in time and the pool fails closed.
            UnknownPool, InvalidArgument: as the server answered.
        """
        grant = await self._acquire(pool, team, Class(service_class), est_tokens, try_only=False)
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
        self, pool: str, team: str, service_class: Class, est_tokens: int, *, try_only: bool
    ) -> ClientGrant | None:
        request = pb.AcquireRequest(
            pool=pool,
            team=team,
            service_class=SERVICE_CLASS_PB[service_class],
            est_tokens=est_tokens,
            holder=self.holder,
            request_id=uuid.uuid4().hex,
            try_only=try_only,
        )
        try:
            r: pb.AcquireResponse = await self._call(
                "Acquire", request, deadline_s=self.deadline_s, pool=pool
            )
        except aio.AioRpcError as e:
            if e.code() not in RETRYABLE:
                raise to_allocator_error(e, address="", pool=pool) from e
            self._abandon(request)
            return self._degraded(pool, team, service_class, est_tokens, e)
        known = self._epochs.get(pool, 0)
        self._saw_epoch(pool, r.epoch)
        if not r.granted:
            return None
        grant = ClientGrant(
            pool=pool,
            team=team,
            service_class=service_class,
            est_tokens=est_tokens,
            grant_id=r.grant_id,
            priority=r.priority,
            borrowing=r.borrowing,
            saturated=r.saturated,
            degraded=r.degraded,
            owner=r.owner,
            epoch=r.epoch,
            _client=self,
        )
        self._live[grant.grant_id] = grant
        if r.epoch == 0 or r.epoch < known:
            # Degraded at a replica, or late: decided at an epoch older than one this
            # client already re-reported its grants to, so its complete inventory may
            # have closed this grant's phantom. Either way no owner counts it now.
            self._unreported.setdefault(pool, set()).add(grant.grant_id)
            self._report(pool)
        self._ensure_watcher()
        return grant

    def _abandon(self, request: pb.AcquireRequest) -> None:
        """Queues an acquire this client gave up on, for the background task to resend.

        An answer that came too late still counts a grant at the owner, and nobody would
        release it: the team would lose a slot until ``max_request_s``. The same request
        id makes the owner answer with that grant (or decide one now), which is then
        released at no cost (see ``_resend``).
        """
        if len(self._abandoned) >= self._max_abandoned:
            del self._abandoned[next(iter(self._abandoned))]
            self._dropped_abandoned += 1
            if not self._abandoned_full:
                self._abandoned_full = True
                logger.warning(
                    "%d acquires given up on are queued for resending; dropping the oldest: "
                    "a grant an owner decided for one stays counted until its pool's "
                    "max_request_s (dropped_abandoned counts them)",
                    len(self._abandoned) + 1,
                )
        self._abandoned[request.request_id] = (request, time.monotonic())
        self._ensure_flusher()

    async def _resend(self, request_id: str) -> bool:
        """Sends an abandoned acquire again and releases the grant it names.

        Returns:
            False when no replica answered (the pool's round stops), else True.
        """
        entry = self._abandoned.get(request_id)
        if entry is None:
            return True
        request, since = entry
        try:
            r: pb.AcquireResponse = await self._call(
                "Acquire", request, deadline_s=self.deadline_s, pool=request.pool
            )
        except aio.AioRpcError as e:
            retryable = e.code() in RETRYABLE
            if retryable and time.monotonic() - since < ABANDON_KEEP_S:
                return False
            self._abandoned.pop(request_id, None)
            self._dropped_abandoned += 1
            logger.info(
                "pool %s: an acquire given up on may hold a slot until it expires: %s",
                request.pool,
                e.code(),
            )
            return not retryable
        self._abandoned.pop(request_id, None)
        self._saw_epoch(request.pool, r.epoch)
        if not r.granted:
            return True
        self._buffer(r.grant_id, 0.0)
        return await self._send_release(r.grant_id, 0.0)

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
            epoch=0,
            _client=self,
        )
        self._live[grant_id] = grant
        # Counted nowhere yet: reported to the first owner of the pool that answers.
        self._unreported.setdefault(pool, set()).add(grant_id)
        self._ensure_watcher()
        return grant

    def _saw_epoch(self, pool: str, epoch: int) -> None:
        """Re-reports live grants when a pool shows an epoch they were not decided in, and
        grants no owner counted yet whenever an owner of the pool answers."""
        if epoch == 0:
            return
        known = self._epochs.get(pool)
        self._epochs[pool] = max(epoch, known or 0)
        if known is not None and epoch <= known:
            self._report(pool)
            return
        if self._route_to_owner:
            self._learn_routes()
        older = any(g.pool == pool and g.epoch != epoch for g in self._live.values())
        if known is None and not older:
            return
        self._spawn(self._adopt(pool, epoch, complete=True), f"adopt {pool}@{epoch}")

    def _report(self, pool: str) -> None:
        """Reports the pool's grants no owner counted, at the newest epoch seen, unless an
        Adopt of the pool is already in flight (it re-checks when it ends)."""
        epoch = self._epochs.get(pool, 0)
        if epoch and self._unreported.get(pool) and pool not in self._reporting:
            self._spawn(self._adopt(pool, epoch, complete=False), f"report {pool}@{epoch}")

    async def _adopt(self, pool: str, epoch: int, *, complete: bool) -> None:
        """Re-reports grants to the pool's owner at ``epoch``.

        Complete: every live grant of the pool not decided at ``epoch`` (the owner closes
        this holder's other phantoms). Not complete: the grants no owner counted yet.
        """
        unreported = self._unreported.get(pool, set())
        if complete:
            grants = [g for g in self._live.values() if g.pool == pool and g.epoch != epoch]
        else:
            grants = [self._live[i] for i in unreported if i in self._live]
            unreported.intersection_update(self._live)
            if not grants:
                return
        # An Adopt carries at most MAX_ADOPT_GRANTS; a larger inventory goes in several,
        # only the last one complete. Grants a replica signed go last, so the complete
        # one carries the proof of holdership the owner asks for (docs/ha.md, "Adopt").
        grants.sort(key=lambda g: g.epoch != 0)
        self._reporting.add(pool)
        try:
            for start in range(0, len(grants) or 1, MAX_ADOPT_GRANTS):
                chunk = grants[start : start + MAX_ADOPT_GRANTS]
                last = start + MAX_ADOPT_GRANTS >= len(grants)
                request = adopt_request(
                    pool=pool,
                    epoch=epoch,
                    holder=self.holder,
                    complete=complete and last,
                    grants=chunk,
                )
                r: pb.AdoptResponse = await self._call("Adopt", request, deadline_s=2.0, pool=pool)
        except aio.AioRpcError as e:
            if not complete and e.code() not in (*RETRYABLE, grpc.StatusCode.FAILED_PRECONDITION):
                # Refused for good (not a wrong epoch): retrying the same grants cannot help.
                unreported.difference_update(g.grant_id for g in grants)
                logger.error(
                    "pool %s: the owner refused to count %d grants: %s",
                    pool,
                    len(grants),
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
        unreported.difference_update(g.grant_id for g in grants)
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

    # -- releases ------------------------------------------------------------------------------

    async def _release(self, grant: ClientGrant, consumed: float) -> None:
        self._live.pop(grant.grant_id, None)
        unreported = self._unreported.get(grant.pool)
        if unreported is not None:
            unreported.discard(grant.grant_id)  # its release charges it at the owner
        self._buffer(grant.grant_id, consumed)
        if not await self._send_release(grant.grant_id, consumed):
            self._ensure_flusher()

    def _buffer(self, grant_id: str, consumed: float) -> None:
        """Keeps a release until a replica acknowledges it; drops the oldest when full."""
        if grant_id not in self._pending and len(self._pending) >= self._max_pending:
            del self._pending[next(iter(self._pending))]
            self._dropped_releases += 1
            if not self._pending_full:
                self._pending_full = True
                logger.warning(
                    "%d releases are buffered unacknowledged; dropping the oldest: its "
                    "grant stays counted at its owner until the pool's max_request_s and "
                    "its consumption is not charged (dropped_releases counts them)",
                    len(self._pending) + 1,
                )
        self._pending[grant_id] = consumed

    async def _send_release(self, grant_id: str, consumed: float) -> bool:
        """One release attempt; True when it is settled (acknowledged or hopeless)."""
        try:
            await self._call(
                "Release",
                pb.ReleaseRequest(grant_id=grant_id, consumed=consumed),
                deadline_s=self.deadline_s,
                pool=_pool_of(grant_id),
            )
        except aio.AioRpcError as e:
            if e.code() in RETRYABLE:
                return False
            # A release the server refuses for good (bad id, unknown pool) never succeeds.
            error: AllocatorError = to_allocator_error(e, address="")
            logger.error("release of %s refused: %s", grant_id, error)
        self._pending.pop(grant_id, None)
        return True

    async def _flush(self, *, until_empty: bool = False) -> None:
        """Retries buffered releases and resends abandoned acquires; once, or
        (``until_empty``, when closing) until neither is left: a client that closes
        leaves no grant counted at an owner that it could still release."""
        while self._pending or self._abandoned:
            await self._flush_round(resend=True)
            if not until_empty:
                return
            if self._pending or self._abandoned:
                await asyncio.sleep(self._release_retry_s)

    async def _flush_round(self, *, resend: bool) -> None:
        """One round of the backlog: up to ``resend_batch`` abandoned acquires and
        ``release_batch`` releases, each pool on its own (see ``_flush_pool``)."""
        work: dict[str, list[Callable[[], Awaitable[bool]]]] = {}
        if resend:
            for request_id, (request, _) in itertools.islice(
                self._abandoned.items(), self._resend_batch
            ):
                work.setdefault(request.pool, []).append(partial(self._resend, request_id))
        for grant_id, consumed in itertools.islice(self._pending.items(), self._release_batch):
            work.setdefault(_pool_of(grant_id), []).append(
                partial(self._send_release, grant_id, consumed)
            )
        await asyncio.gather(*(self._flush_pool(sends) for sends in work.values()))
        if len(self._pending) <= self._max_pending // 2:
            self._pending_full = False
        if len(self._abandoned) <= self._max_abandoned // 2:
            self._abandoned_full = False

    async def _flush_pool(self, sends: Sequence[Callable[[], Awaitable[bool]]]) -> None:
        """Sends one pool's share of a round: the first call alone, as a probe, then the
        others ``flush_concurrency`` at a time (shared by all pools). A pool whose owner
        does not answer stops at its first unanswered call, until the next round; the
        other pools go on."""
        stalled = False

        async def send(call: Callable[[], Awaitable[bool]]) -> None:
            nonlocal stalled
            async with self._slots:
                if not stalled and not await call():
                    stalled = True

        await send(sends[0])
        await asyncio.gather(*(send(call) for call in sends[1:]))

    def _learn_routes(self) -> None:
        """Reads ListPools in the background (once at a time) to learn owners' addresses."""
        if self._closed or (self._learning is not None and not self._learning.done()):
            return

        async def learn() -> None:
            try:
                await self.refresh_pools()
            except aio.AioRpcError as e:
                logger.debug("learning the owners failed: %s", e.code())

        self._learning = asyncio.get_running_loop().create_task(
            learn(), name=f"fairshare-client-{self.holder}-routes"
        )

    def _ensure_watcher(self) -> None:
        if self._closed or (self._watcher is not None and not self._watcher.done()):
            return
        self._watcher = asyncio.get_running_loop().create_task(
            self._watch_epochs(), name=f"fairshare-client-{self.holder}-epochs"
        )

    async def _watch_epochs(self) -> None:
        """Reads ListPools now and then while grants are live (see ``epoch_check_s``)."""
        while self._live and not self._closed:
            await asyncio.sleep(self._epoch_check_s)
            try:
                await self.refresh_pools()
            except aio.AioRpcError as e:
                logger.debug("epoch check failed: %s", e.code())

    def _ensure_flusher(self) -> None:
        if self._closed or (self._flusher is not None and not self._flusher.done()):
            return
        self._flusher = asyncio.get_running_loop().create_task(
            self._flush_loop(), name=f"fairshare-client-{self.holder}-release-flush"
        )

    async def _flush_loop(self) -> None:
        try:
            while (self._pending or self._abandoned) and not self._closed:
                await asyncio.sleep(self._release_retry_s)
                await self._flush()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception(
                "release flush task failed; %d releases and %d abandoned acquires buffered",
                len(self._pending),
                len(self._abandoned),
            )

    def _spawn(self, coro: Coroutine[object, object, None], name: str) -> None:
        if self._closed:
            coro.close()
            return
        task = asyncio.get_running_loop().create_task(coro, name=f"fairshare-client {name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class SyncGrant:
    """A ``ClientGrant`` for synchronous code."""

    def __init__(self, grant: ClientGrant, client: SyncAllocatorClient) -> None:
        self.grant = grant
        self._client = client

    def __getattr__(self, name: str) -> object:
        return getattr(self.grant, name)

    def release(self, consumed: float = 0.0) -> None:
        """Ends the grant (see ``ClientGrant.release``)."""
        self._client._run(self.grant.release(consumed))


class SyncAllocatorClient:
    """A blocking wrapper: runs an ``AllocatorClient`` on a private event loop thread."""

    def __init__(self, targets: Sequence[str], *, holder: str, deadline_s: float = 0.75) -> None:
        """Starts the loop thread; see ``AllocatorClient`` for the arguments."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"fairshare-client-{holder}", daemon=True
        )
        self._thread.start()
        self._client: AllocatorClient = self._run(
            self._make(targets, holder=holder, deadline_s=deadline_s)
        )

    @staticmethod
    async def _make(targets: Sequence[str], *, holder: str, deadline_s: float) -> AllocatorClient:
        # Created on the loop thread so its channels bind to that loop.
        return AllocatorClient(targets, holder=holder, deadline_s=deadline_s)

    def _run(self, coro: Coroutine[object, object, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def __enter__(self) -> SyncAllocatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def refresh_pools(self) -> list[pb.PoolInfo]:
        """See ``AllocatorClient.refresh_pools``."""
        return self._run(self._client.refresh_pools())

    def acquire(
        self, pool: str, team: str, service_class: Class = Class.INTERACTIVE, est_tokens: int = 0
    ) -> SyncGrant:
        """See ``AllocatorClient.acquire``."""
        return SyncGrant(
            self._run(self._client.acquire(pool, team, service_class, est_tokens)), self
        )

    def close(self) -> None:
        """Flushes releases, closes the client and stops the loop thread."""
        if not self._loop.is_running():
            return
        try:
            self._run(self._client.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._loop.close()


__all__ = [
    "AllocatorClient",
    "ClientGrant",
    "NoOwner",
    "PeerUnavailable",
    "SyncAllocatorClient",
    "SyncGrant",
    "degraded_priority",
]
