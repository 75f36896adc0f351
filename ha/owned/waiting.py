"""Borrowers an owner holds back by its pool's lending limit, until a slot is lent to them.

A request that would borrow while no team lends a slot (``fairshare.Pool.acquire_lent``
refused it), and whose caller allows a wait (``wait_s`` > 0), is not answered at once:
``Waiting.hold`` queues it (``fairshare.holding.HeldQueue``, in (priority, arrival) order)
and returns its grant when the owner lets it in, which the owner tries whenever a slot
may have opened (``wake``: a release, an expiry, a capacity change, phantoms closed).

Guaranteed:
- A held request is not in flight: it counts nowhere, and nothing of it is written.
- It ends exactly once: admitted (its grant is returned), its wait over (per the pool's
  ``on_wait_end``: a grant decided then, borrowing or within share, or ``LimitExceeded``
  naming ``lend``), its caller gone (cancelled: it leaves the queue at once, and a grant
  admitted in the same instant is released at no cost), or the owner stopped
  (``NotDeciding``: the caller's router sends it to the next owner with the wait it has
  left).
- Order: held requests are let in by (priority when queued, arrival), and a newcomer that
  may wait is decided only after every held request the pool now lends a slot to.
- At most ``PoolConfig.held_bound`` requests are held; one more gets ``on_wait_end`` at
  once (a refusal names ``max_held``).
- A pool whose teams all lend everything (no ``lend`` below 1) holds nobody: its
  decisions are those of a pool without lending limits.

Not guaranteed: that a request admitted is still a borrower (its team may have dropped
below its reservation meanwhile: it is then within share, as it should be).
"""

from __future__ import annotations

import asyncio
import math

from fairshare import Class, Grant, Pool
from fairshare.holding import HeldQueue
from fairshare.modes import WaitEnd
from ha.api import LimitExceeded
from ha.clock import Clock
from ha.settings import PoolConfig

LEND_LIMIT = "lend"
"""The limit a refusal at the end of a wait names (``LimitExceeded.limit``)."""
HELD_LIMIT = "max_held"
"""The limit a refusal names when the queue is full."""


class Stopped(Exception):
    """The owner stopped deciding while the request was held."""


class Waiting:
    """The held borrowers of one owned pool (see the module doc)."""

    def __init__(self, pool: Pool, config: PoolConfig, clock: Clock) -> None:
        self._pool = pool
        self._config = config
        self._clock = clock
        self._queue: HeldQueue[asyncio.Future[Grant]] = HeldQueue(config.held_bound(pool.capacity))
        self._stopped = False
        self.lending = not config.lends_all()
        """Whether any team keeps slots back: only then is anybody held."""

    def held_by_team(self) -> dict[str, int]:
        """How many requests each team has held now (teams with none left out)."""
        return self._queue.count_by_team()

    async def acquire(self, team: str, cls: Class, est_tokens: int, wait_s: float) -> Grant:
        """Decides one request that may wait ``wait_s`` for a lent slot.

        Raises:
            LimitExceeded: the wait ended, or the queue is full, and the pool's
                ``on_wait_end`` is ``refuse``.
            Stopped: the owner stopped while the request was held.
            ValueError: bad team, class or tokens (as ``Pool.acquire``).
        """
        if wait_s <= 0 or not self.lending:
            return self._pool.acquire(team, cls, est_tokens)
        # Room may have opened since the last wake (a phantom's end): those held first,
        # so that a newcomer never takes a slot ahead of a borrower already waiting.
        self.wake()
        grant = self._pool.acquire_lent(team, cls, est_tokens)
        if grant is not None:
            return grant
        if self._stopped:
            raise Stopped
        future: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        priority = self._pool.priority_next(team, cls)
        deadline = self._clock.monotonic() + wait_s
        if not self._queue.push(
            future, team, cls=cls, est_tokens=est_tokens, priority=priority, deadline=deadline
        ):
            return self._wait_over(team, cls, est_tokens, HELD_LIMIT)
        timer: asyncio.Future[None] = asyncio.ensure_future(self._clock.sleep(wait_s))
        try:
            await asyncio.wait((future, timer), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._leave(future, gone=True)
            raise
        finally:
            timer.cancel()
        self._leave(future, gone=False)
        if future.done() and not future.cancelled():
            if isinstance(future.exception(), Stopped):
                raise Stopped
            return future.result()  # let in at the very end of its wait
        return self._wait_over(team, cls, est_tokens, LEND_LIMIT)

    def wake(self) -> int:
        """Lets in every held request the pool now lends a slot to; returns how many."""
        admitted = self._queue.admit(self._pool)
        for future, grant in admitted:
            if future.done():  # its caller went in the same instant: nobody runs it
                grant.release(0.0)
            else:
                future.set_result(grant)
        return len(admitted)

    def stop(self) -> None:
        """Ends every wait with ``Stopped``; nothing is held from now on."""
        self._stopped = True
        ended = self._queue.expired(math.inf)
        for future in ended:
            if not future.done():
                future.set_exception(Stopped())
                future.exception()  # retrieved: its caller may be gone

    def _leave(self, future: asyncio.Future[Grant], *, gone: bool) -> None:
        """Takes a request whose wait is over out of the queue. When its caller is
        ``gone``, a grant it was given in the meantime, which nobody will run, is released
        at no cost."""
        self._queue.remove(future)
        if not future.done():
            future.cancel()
        elif gone and not future.cancelled() and future.exception() is None:
            future.result().release(0.0)

    def _wait_over(self, team: str, cls: Class, est_tokens: int, limit: str) -> Grant:
        if self._config.on_wait_end is WaitEnd.REFUSE:
            what = "no slot was lent to it in its wait" if limit == LEND_LIMIT else "full"
            raise LimitExceeded(limit, f"pool {self._config.name}: a borrower was held: {what}")
        return self._pool.acquire(team, cls, est_tokens)
