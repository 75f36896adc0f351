"""The drills' simulated gateways: workers that acquire, hold and release grants through
the project's client library, entering every grant in the shared ledger.

A gateway can be drained (its releases flushed) or killed (its held grants abandoned and
its unsent releases marked lost, as a dead process would leave them). Its workers pick a
pool and team at random for each request, or each keeps to one (``assignments``: a team
that keeps that many requests in flight); ``park`` makes every worker hold its grant until
``unpark``, so a drill can look at a moment when nothing moves.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

from drill_config import POOLS
from drill_ledger import GrantRecord, Ledger

from fairshare import Class
from fairshare.client import AllocatorClient, ClientGrant


class Gateway:
    """A simulated gateway: workers that acquire, hold and release with consumption."""

    def __init__(
        self,
        name: str,
        targets: list[str],
        ledger: Ledger,
        *,
        workers: int,
        seed: int,
        holder: str | None = None,
        route_to_owner: bool = True,
        quiet: set[str] | None = None,
        assignments: list[tuple[str, str]] | None = None,
        hold_s: Callable[[random.Random], float] | None = None,
    ):
        self.name = name
        self.quiet: set[str] = set() if quiet is None else quiet  # pools to leave alone
        self.holder = holder or name
        self.client = AllocatorClient(
            targets,
            holder=self.holder,
            deadline_s=1.0,
            release_retry_s=0.2,
            route_to_owner=route_to_owner,
        )
        self.ledger = ledger
        self.workers = workers
        self.random = random.Random(seed)
        self.stop = asyncio.Event()
        self.dead = False
        self.tasks: list[asyncio.Task[None]] = []
        self.errors: list[str] = []
        self.assignments = assignments  # worker i -> (pool, team); None: random
        self.hold_s = hold_s or _short  # how long each request runs
        self.parked = 0  # workers holding a grant while parked
        self._parking = False
        self._unparked = asyncio.Event()
        self._parked = asyncio.Event()  # set while parked: wakes the running requests

    def start(self) -> None:
        self.tasks = [
            asyncio.create_task(self._work(i), name=f"{self.name}-{i}") for i in range(self.workers)
        ]

    async def _work(self, index: int) -> None:
        for _ in range(100_000):  # bounded; the stop event ends it much sooner
            if self.stop.is_set():
                return
            if self.assignments is not None:
                pool, team = self.assignments[index % len(self.assignments)]
            else:
                open_pools = [p for p in POOLS if p not in self.quiet]
                if not open_pools:
                    await asyncio.sleep(0.05)
                    continue
                pool = self.random.choice(open_pools)
                team = self.random.choice(list(POOLS[pool]))
            cls = Class.BATCH if self.random.random() < 0.3 else Class.INTERACTIVE
            sent = time.monotonic()
            try:
                grant = await self.client.acquire(pool, team, cls, est_tokens=100)
            except Exception as e:
                self.errors.append(f"acquire: {e!r}")
                await asyncio.sleep(0.05)
                continue
            record = self._record(pool, team, grant, sent)
            hold = self.hold_s(self.random)
            try:
                await self._run(hold)
            except asyncio.CancelledError:
                record.abandoned = True
                raise
            consumed = round(hold * 10, 3)
            record.released_at = time.monotonic()
            record.released_wall = time.time()
            record.consumed = consumed
            await grant.release(consumed)

    async def _run(self, hold: float) -> None:
        """A request that runs for ``hold`` seconds; while the gateway is parked it stays
        in flight and its time stands still."""
        left = hold
        for _ in range(1000):  # bounded; each round is a park or the end of the hold
            if self._parking:
                self.parked += 1
                try:
                    await asyncio.wait_for(self._unparked.wait(), 30.0)
                finally:
                    self.parked -= 1
            started = time.monotonic()
            try:
                await asyncio.wait_for(self._parked.wait(), left)
            except TimeoutError:
                return
            left -= time.monotonic() - started

    def park(self) -> None:
        """Every worker holds the grant it has, or gets next, until ``unpark`` (at most
        30 s): nothing is released meanwhile, and parked time does not count in a
        request's running time."""
        self._unparked.clear()
        self._parking = True
        self._parked.set()

    def unpark(self) -> None:
        self._parking = False
        self._parked.clear()
        self._unparked.set()

    async def hold(self, pool: str, team: str) -> tuple[ClientGrant, GrantRecord]:
        """Acquires one interactive grant outside the workers and records it, held until
        ``release_held``."""
        sent = time.monotonic()
        grant = await self.client.acquire(pool, team, Class.INTERACTIVE, est_tokens=100)
        return grant, self._record(pool, team, grant, sent)

    def _record(self, pool: str, team: str, grant: ClientGrant, sent: float) -> GrantRecord:
        """Enters a grant just answered (``sent``: when its Acquire went out) in the ledger."""
        record = GrantRecord(
            self.holder,
            pool,
            team,
            grant.grant_id,
            grant.epoch,
            grant.priority,
            grant.borrowing,
            grant.degraded,
            sent,
            time.monotonic(),
        )
        self.ledger.enter(record)
        return record

    @staticmethod
    async def release_held(grant: ClientGrant, record: GrantRecord, consumed: float) -> None:
        record.released_at = time.monotonic()
        record.released_wall = time.time()
        record.consumed = consumed
        await grant.release(consumed)

    async def drain(self) -> None:
        """Stops acquiring, lets held grants finish, and flushes every release."""
        self.stop.set()
        await asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), 10)
        await self.client.close(flush_timeout_s=10)

    async def kill(self) -> None:
        """The gateway dies: its held grants are never released."""
        self.dead = True
        self.stop.set()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.client._state.closed = True  # no flush: a dead process sends nothing
        # Releases not acknowledged, and ended degraded grants still to be re-reported
        # before their release: a dead process sends none of them.
        unsent = set(self.client._backlog._pending)
        unsent.update(gid for ended in self.client._adoption._ended.values() for gid in ended)
        for record in self.ledger.grants:
            if record.holder == self.holder and record.grant_id in unsent:
                record.release_lost = True
        for task in [
            *self.client._state.tasks,
            self.client._adoption._watcher,
            self.client._backlog._flusher,
        ]:
            if task is not None:
                task.cancel()
        for channel in self.client._calls._channels.values():
            await channel.close()


def _short(rng: random.Random) -> float:
    return rng.uniform(0.02, 0.4)
