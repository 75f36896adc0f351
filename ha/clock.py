"""Time as the replication layer sees it: injected, so tests can run on a fake clock.

``monotonic`` measures durations (lease deadlines, fencing); ``time`` is wall-clock
seconds (snapshot times and usage decay, which must agree across replicas).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    """A source of time and of sleeps."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the epoch."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Suspends the calling task for ``seconds``."""
        ...


class SystemClock:
    """The real clocks of this process."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that moves only when a test calls ``advance``.

    Sleepers wake, in deadline order, when ``advance`` passes their deadline; nothing
    sleeps for real, so a test of a 5-second lease takes microseconds.
    """

    def __init__(self, *, start_wall: float = 1_700_000_000.0) -> None:
        self._mono = 1000.0
        self._wall_offset = start_wall - self._mono
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self._mono

    def time(self) -> float:
        return self._mono + self._wall_offset

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._mono + seconds, next(self._seq), future))
        await future

    async def advance(self, seconds: float, *, step: float = 0.05) -> None:
        """Moves time forward in steps of at most ``step``, letting woken tasks run."""
        target = self._mono + seconds
        while True:
            await settle()
            self._mono = min(target, self._mono + step)
            while self._sleepers and self._sleepers[0][0] <= self._mono:
                _, _, future = heapq.heappop(self._sleepers)
                if not future.done():
                    future.set_result(None)
            if self._mono >= target:
                break
        await settle()


async def settle(rounds: int = 20) -> None:
    """Lets every ready task run a few times (for tests on a fake clock)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
