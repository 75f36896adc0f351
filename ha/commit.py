"""Group commit: one durable write covers every decision of the last few milliseconds.

Guarantee: when ``sync()`` returns, a write that started after ``sync()`` was called
has completed, so the state as of the call is durable. When that write fails, every
waiter it covered gets the failure, and so does every later ``sync()``: a pool whose
fenced write failed is lost, and its owner must not answer from it again.

Writes start at most once per window, counted from the start of the previous write: a
request that finds no write started within the last window is written at once (a lone
caller pays no gathering delay), and the requests that arrive meanwhile are covered
together by the next write, which waits only for what is left of the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from ha.clock import Clock

logger = logging.getLogger(__name__)


class CommitFailed(Exception):
    """A durable write failed; the state it covered may not be persisted."""


class GroupCommitter:
    """Coalesces durable writes of one pool."""

    def __init__(
        self, write: Callable[[], Awaitable[None]], *, window_s: float, clock: Clock, name: str
    ) -> None:
        """Args:
        write: writes the current state durably; raises on failure.
        window_s: least time between the starts of two writes; requests gather
            meanwhile.
        clock: for the gathering window.
        name: names the background task.
        """
        self._write = write
        self._window_s = window_s
        self._clock = clock
        self._name = name
        self._requested = 0  # generation asked for by the latest sync()
        self._durable = 0  # generation covered by the latest completed write
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._last_start: float | None = None  # monotonic start of the latest write
        self.writes = 0

    @property
    def failed(self) -> bool:
        return self._failure is not None

    async def sync(self) -> None:
        """Returns once the state as of this call is durable.

        Raises:
            CommitFailed: the write failed (now or before).
        """
        if self._failure is not None:
            raise CommitFailed(str(self._failure)) from self._failure
        self._requested += 1
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((self._requested, future))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"commit-{self._name}")
        await asyncio.shield(future)

    def nudge(self) -> None:
        """Asks for a write soon without waiting for it (releases use this)."""
        if self._failure is not None:
            return
        self._requested += 1
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"commit-{self._name}")

    async def close(self) -> None:
        """Waits for the write in progress, if any; later syncs fail."""
        if self._task is not None and not self._task.done():
            # A failure was already delivered to the waiters it covered.
            with contextlib.suppress(Exception):
                await self._task
        if self._failure is None:
            self._failure = CommitFailed("committer closed")
        self._settle(None, self._failure)  # nobody may wait for a write that won't come

    async def _run(self) -> None:
        while self._durable < self._requested and self._failure is None:
            if self._window_s > 0 and self._last_start is not None:
                left = self._last_start + self._window_s - self._clock.monotonic()
                if left > 0:
                    await self._clock.sleep(left)
            self._last_start = self._clock.monotonic()
            generation = self._requested
            try:
                await self._write()
            except Exception as e:  # every failure loses the pool
                self._failure = e
                logger.warning("durable write of %s failed: %s", self._name, e)
                self._settle(None, e)
                return
            self.writes += 1
            self._durable = generation
            self._settle(generation, None)

    def _settle(self, generation: int | None, error: BaseException | None) -> None:
        keep: list[tuple[int, asyncio.Future[None]]] = []
        for gen, future in self._waiters:
            if future.done():
                continue
            if error is not None:
                future.set_exception(CommitFailed(str(error)))
            elif generation is not None and gen <= generation:
                future.set_result(None)
            else:
                keep.append((gen, future))
        self._waiters = keep
