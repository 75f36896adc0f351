"""What a client still owes the owners: releases not acknowledged, acquires given up on.

A release is buffered until a replica acknowledges it (at most ``max_pending_releases``;
when full the oldest is dropped and counted). An acquire the client gave up on is queued
(at most ``max_abandoned``, for ``ABANDON_KEEP_S``) and sent again with the same request
id, so the owner answers with the grant it decided, which is then released at no cost.
A background task retries both every ``release_retry_s``, pool by pool: each pool is
probed with one call, then the rest goes ``flush_concurrency`` at a time, so a pool
without an owner holds back only its own backlog, and at most ``resend_batch`` acquires
are resent per round, so a recovering cluster is not met by a burst of them.

``Backlog`` is the part of an ``AllocatorClient`` that keeps all this: the client hands it
each release (``release``) and each acquire it gave up on (``abandon``);
``fairshare.client.adoption`` hands it the releases of the client-made grants it
re-reported (``release_group``), and sends the next group of a pool only once none of
those is left (``releasing_client_made``).

Non-guarantees: the backlog is lost with the process; a release the server refuses for
good (a bad id, an unknown pool) is logged and dropped.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Final

from grpc import aio

from fairshare.client.calls import RETRYABLE
from fairshare.client.grants import client_made, pool_of
from fairshare.digest import grant_id_digest
from fairshare.errors import AllocatorError
from fairshare.wire.errors import to_allocator_error
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb

if TYPE_CHECKING:
    from fairshare.client.calls import Call
    from fairshare.client.state import ClientState

logger = logging.getLogger(__name__)

ABANDON_KEEP_S: Final = 30.0
"""How long the client keeps resending an acquire it gave up on (an owner that decided it
remembers its answer for less than that under load, and a new owner closes it anyway)."""


class Backlog:
    """Buffered releases and acquires given up on, retried in the background."""

    def __init__(  # noqa: PLR0913 (the client's tuning options, keyword-only)
        self,
        state: ClientState,
        call: Call,
        send_release: Callable[[str, pb.ReleaseRequest], Awaitable[pb.ReleaseResponse]],
        *,
        saw_epoch: Callable[[str, int], None],
        deadline_s: float,
        release_retry_s: float,
        release_batch: int,
        max_pending: int,
        flush_concurrency: int,
        max_abandoned: int,
        resend_batch: int,
    ) -> None:
        """Args:
        state: the client's shared state (its background tasks stop once it is closed).
        call: calls a replica (resends go through it, ``deadline_s`` each).
        send_release: sends one release of a pool (batched with others of the pool).
        saw_epoch: told the pool and epoch of each answer to a resent acquire.
        deadline_s, release_retry_s, release_batch, flush_concurrency, max_abandoned,
            resend_batch: as ``AllocatorClient`` takes them; ``max_pending`` is its
            ``max_pending_releases``.
        """
        self._state = state
        self._call = call
        self._send = send_release
        self._saw_epoch = saw_epoch
        self._deadline_s = deadline_s
        self._release_retry_s = release_retry_s
        self._release_batch = release_batch
        self._pending: dict[str, float] = {}  # grant id -> what it consumed
        self._max_pending = max_pending
        self.dropped_releases = 0
        """Releases dropped unsent because the buffer was full (a counter)."""
        self._pending_full = False  # warned once; re-armed when the buffer drains to half
        # Acquires given up on, by request id, with when: resent by the background task.
        self._abandoned: dict[str, tuple[pb.AcquireRequest, float]] = {}
        self._max_abandoned = max_abandoned
        self.dropped_abandoned = 0
        """Acquires given up on and dropped without their grant released (a counter)."""
        self._abandoned_full = False
        self._resend_batch = resend_batch
        self._slots = asyncio.Semaphore(flush_concurrency)
        self._flusher: asyncio.Task[None] | None = None

    @property
    def pending_releases(self) -> int:
        """Releases buffered, not yet acknowledged by a replica."""
        return len(self._pending)

    @property
    def abandoned_acquires(self) -> int:
        """Acquires given up on whose grant is still to be found and released."""
        return len(self._abandoned)

    def tasks(self) -> list[asyncio.Task[None]]:
        """Its background loop, if it ever started (for the client's ``close``)."""
        return [] if self._flusher is None else [self._flusher]

    def abandon(self, request: pb.AcquireRequest) -> None:
        """Queues an acquire this client gave up on, for the background task to resend.

        An answer that came too late still counts a grant at the owner, and nobody would
        release it: the team would lose a slot until ``max_request_s``. The same request
        id makes the owner answer with that grant (or decide one now), which is then
        released at no cost (see ``_resend``).
        """
        if len(self._abandoned) >= self._max_abandoned:
            del self._abandoned[next(iter(self._abandoned))]
            self.dropped_abandoned += 1
            if not self._abandoned_full:
                self._abandoned_full = True
                logger.warning(
                    "%d acquires given up on are queued for resending; dropping the oldest: "
                    "a grant an owner decided for one stays counted until its pool's "
                    "max_request_s (dropped_abandoned counts them)",
                    len(self._abandoned) + 1,
                )
        # Resent to be found or decided, never to wait again for a lent slot.
        request.wait_s = 0.0
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
                "Acquire", request, deadline_s=self._deadline_s, pool=request.pool
            )
        except aio.AioRpcError as e:
            retryable = e.code() in RETRYABLE
            if retryable and time.monotonic() - since < ABANDON_KEEP_S:
                return False
            self._abandoned.pop(request_id, None)
            self.dropped_abandoned += 1
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

    async def release(self, grant_id: str, consumed: float) -> None:
        """Sends a release, kept until a replica acknowledges it."""
        self._buffer(grant_id, consumed)
        if not await self._send_release(grant_id, consumed):
            self._ensure_flusher()

    async def release_group(self, releases: Sequence[tuple[str, float]]) -> None:
        """Sends releases side by side, each kept until a replica acknowledges it."""
        for grant_id, consumed in releases:
            self._buffer(grant_id, consumed)
        sent = await asyncio.gather(*(self._send_release(g, c) for g, c in releases))
        if not all(sent):
            self._ensure_flusher()

    def releasing_client_made(self, pool: str) -> bool:
        """True while a release of a grant of ``pool`` the client made itself is kept."""
        return any(client_made(i) and pool_of(i) == pool for i in self._pending)

    def _buffer(self, grant_id: str, consumed: float) -> None:
        """Keeps a release until a replica acknowledges it; drops the oldest when full."""
        if grant_id not in self._pending and len(self._pending) >= self._max_pending:
            del self._pending[next(iter(self._pending))]
            self.dropped_releases += 1
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
            await self._send(
                pool_of(grant_id), pb.ReleaseRequest(grant_id=grant_id, consumed=consumed)
            )
        except aio.AioRpcError as e:
            if e.code() in RETRYABLE:
                return False
            # A release the server refuses for good (bad id, unknown pool) never succeeds.
            error: AllocatorError = to_allocator_error(e, address="")
            logger.error("release of grant %s refused: %s", grant_id_digest(grant_id), error)
        self._pending.pop(grant_id, None)
        return True

    async def flush(self, *, until_empty: bool = False) -> None:
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
            work.setdefault(pool_of(grant_id), []).append(
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

    def _ensure_flusher(self) -> None:
        self._flusher = self._state.background(self._flusher, self._flush_loop, "release-flush")

    async def _flush_loop(self) -> None:
        try:
            while (self._pending or self._abandoned) and not self._state.closed:
                await asyncio.sleep(self._release_retry_s)
                await self.flush()
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception(
                "release flush task failed; %d releases and %d abandoned acquires buffered",
                len(self._pending),
                len(self._abandoned),
            )
