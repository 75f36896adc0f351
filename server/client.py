"""The gateway's client library: acquire a priority, release it when the request ends.

Guarantees:
- ``acquire`` answers within ``deadline_s``: it retries ``UNAVAILABLE`` (and deadline
  expiries) on the configured targets in turn, with the same request id, so the owner
  answers a retry with the same grant; when no replica answers in time it applies the
  pool's degraded mode (learnt from ``ListPools``; ``fail_open`` when unknown): a grant at
  the lowest borrowing priority marked ``degraded``, or ``NoOwner`` for ``fail_closed``.
- An acquire it gave up on is not left counted at the owner: the same request is sent
  again in the background and the grant it names is released at no cost.
- A release is sent at least once: it is buffered until a replica acknowledges it, and a
  background task retries the buffer. The server makes releases idempotent.
- The client keeps its live grants; when a response shows a pool at a new epoch it
  re-reports them to the new owner with ``Adopt(complete=true)``.

Non-guarantees: releases buffered when the process dies are lost (the owner's phantoms
then expire after the pool's ``max_request_s``); a degraded grant counts nowhere until a
new owner adopts it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import threading
import time
import uuid
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
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

from fairshare import BORROW_BASE, MAX_RANK, RANK_STEP, Class
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
_ABANDON_DEADLINE_S: Final = 2.0
"""How long the client tries to release the grant of an acquire it gave up on."""
_MODES: Final = {pb.FAIL_OPEN: DegradedMode.FAIL_OPEN, pb.FAIL_CLOSED: DegradedMode.FAIL_CLOSED}


def _retryable(error: BaseException) -> bool:
    return isinstance(error, aio.AioRpcError) and error.code() in RETRYABLE


def _pool_of(grant_id: str) -> str:
    """The pool a grant id names ('' when it is not one of ours: the server says why)."""
    try:
        return GrantRef.decode(grant_id).pool
    except AllocatorError:
        return ""


def degraded_priority(service_class: Class) -> int:
    """The priority of a ``fail_open`` grant: the lowest borrower's."""
    return BORROW_BASE + RANK_STEP * MAX_RANK + int(service_class)


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
            release_retry_s: period of the background retry of unacknowledged releases.
            release_batch: most releases retried per period.
            route_to_owner: send each pool's calls straight to its owner (its address is
                learnt from ListPools whenever a new epoch shows up), falling back to
                ``targets`` when the owner does not answer; saves the forwarding hop.
            epoch_check_s: while it holds grants, how often the client reads ListPools to
                notice a new owner it would not otherwise see (a gateway that only
                releases), so its re-report closes the new owner's phantoms early.

        Raises:
            ValueError: no targets, or a deadline <= 0.
        """
        if not targets:
            raise ValueError("targets must name at least one replica")
        if deadline_s <= 0:
            raise ValueError(f"deadline_s must be > 0, got {deadline_s}")
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
        self._seq = itertools.count(1)
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
        """Sends buffered releases (for at most ``flush_timeout_s``), then closes."""
        if self._closed:
            return
        self._closed = True
        try:
            await asyncio.wait_for(self._flush(until_empty=True), flush_timeout_s)
        except TimeoutError:
            logger.warning("closing with %d releases unacknowledged", len(self._pending))
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
            self._spawn(self._abandon(request), f"abandon {pool} {request.request_id}")
            return self._degraded(pool, team, service_class, est_tokens, e)
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
        self._ensure_watcher()
        return grant

    async def _abandon(self, request: pb.AcquireRequest) -> None:
        """Releases what an owner decided for an acquire this client gave up on.

        An answer that came too late still counts a grant at the owner, and nobody would
        release it: the team would lose a slot until ``max_request_s``. The same request
        id makes the owner answer with that grant (or decide one now), which is then
        released at no cost.
        """
        try:
            r: pb.AcquireResponse = await self._call(
                "Acquire",
                request,
                deadline_s=max(self.deadline_s, _ABANDON_DEADLINE_S),
                pool=request.pool,
            )
        except aio.AioRpcError as e:
            logger.info(
                "pool %s: an acquire given up on may hold a slot until it expires: %s",
                request.pool,
                e.code(),
            )
            return
        if r.granted:
            self._pending[r.grant_id] = 0.0
            if not await self._send_release(r.grant_id, 0.0):
                self._ensure_flusher()

    def _degraded(
        self, pool: str, team: str, service_class: Class, est_tokens: int, error: Exception
    ) -> ClientGrant:
        mode = self._modes.get(pool, DegradedMode.FAIL_OPEN)
        if mode is DegradedMode.FAIL_CLOSED:
            raise NoOwner(pool) from error
        logger.warning("pool %s: no replica answered within %gs; fail_open", pool, self.deadline_s)
        grant_id = GrantRef(PoolName(pool), Epoch(0), next(self._seq), team, self.holder).encode()
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
        self._ensure_watcher()
        return grant

    def _saw_epoch(self, pool: str, epoch: int) -> None:
        """Re-reports live grants when a pool shows an epoch they were not decided in."""
        known = self._epochs.get(pool)
        self._epochs[pool] = max(epoch, known or 0)
        if epoch == 0 or (known is not None and epoch <= known):
            return
        if self._route_to_owner:
            self._learn_routes()
        older = any(g.pool == pool and g.epoch != epoch for g in self._live.values())
        if known is None and not older:
            return
        self._spawn(self._adopt(pool, epoch), f"adopt {pool}@{epoch}")

    async def _adopt(self, pool: str, epoch: int) -> None:
        grants = [g for g in self._live.values() if g.pool == pool and g.epoch != epoch]
        request = adopt_request(
            pool=pool, epoch=epoch, holder=self.holder, complete=True, grants=grants
        )
        try:
            r: pb.AdoptResponse = await self._call("Adopt", request, deadline_s=2.0, pool=pool)
        except aio.AioRpcError as e:
            logger.warning(
                "pool %s: re-reporting %d grants failed: %s; will retry",
                pool,
                len(grants),
                e.code(),
            )
            # Forget the epoch so that the next answer (or ListPools) naming it retries.
            if self._epochs.get(pool) == epoch:
                self._epochs[pool] = epoch - 1
            return
        logger.info(
            "pool %s: re-reported %d live grants to %s at epoch %d (%d adopted)",
            pool,
            len(grants),
            r.owner,
            r.epoch,
            r.adopted,
        )

    # -- releases ------------------------------------------------------------------------------

    async def _release(self, grant: ClientGrant, consumed: float) -> None:
        self._live.pop(grant.grant_id, None)
        self._pending[grant.grant_id] = consumed
        if not await self._send_release(grant.grant_id, consumed):
            self._ensure_flusher()

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
        """Retries buffered releases; once, or (``until_empty``) until none is left."""
        while self._pending:
            batch = list(itertools.islice(self._pending.items(), self._release_batch))
            for grant_id, consumed in batch:
                if not await self._send_release(grant_id, consumed):
                    break  # no replica answers now: wait for the next round
            if not until_empty:
                return
            if self._pending:
                await asyncio.sleep(self._release_retry_s)

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
            while self._pending and not self._closed:
                await asyncio.sleep(self._release_retry_s)
                await self._flush()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("release flush task failed; %d releases buffered", len(self._pending))

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
