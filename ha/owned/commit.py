"""Group commit: one durable write covers every decision of the last few milliseconds.

Guarantee: when ``sync()`` returns, a write that started after ``sync()`` was called
has completed, so the state as of the call is durable. When that write fails, every
waiter it covered gets the failure, and so does every later ``sync()``: a pool whose
fenced write failed is lost, and its owner must not answer from it again.

Writes never overlap, and the requests that arrive while one is in progress are covered
together by the next. When the next write starts depends on who waits for it, counted
from the start of the previous write: a caller that a request waits on (a within-share
Acquire) gets a write ``window_s`` after it; one that nothing urgent waits on (a Release,
which the client library sends in the background) ``lazy_s`` after it, so under load
releases add at most one write per ``lazy_s`` and mostly share the writes Acquires start.
A request that finds no write started within its window is written at once: a lone
caller never waits for company.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable

from ha.clock import Clock

logger = logging.getLogger(__name__)


class CommitFailed(Exception):
    """A durable write failed; the state it covered may not be persisted."""


class GroupCommitter:
    """Coalesces durable writes of one pool."""

    def __init__(
        self,
        write: Callable[[], Awaitable[None]],
        *,
        window_s: float,
        clock: Clock,
        name: str,
        lazy_s: float = 0.0,
    ) -> None:
        """Args:
        write: writes the current state durably (an owned pool's
            ``ha.owned.writer.PoolWriter.write``); raises on failure.
        window_s: least time between the starts of two writes; requests gather
            meanwhile.
        clock: for the gathering window.
        name: names the background task.
        lazy_s: the window of ``sync(lazy=True)`` callers.
        """
        self._write = write
        self._window_s = window_s
        self._lazy_s = lazy_s
        self._clock = clock
        self._name = name
        self._requested = 0  # generation asked for by the latest request
        self._durable = 0  # generation covered by the latest completed write
        self._due = math.inf  # monotonic time by which the next write must start
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._task: asyncio.Task[None] | None = None
        self._nap: asyncio.Future[None] | None = None  # the writer's wait for ``_due``
        self._failure: BaseException | None = None
        self._last_start = -math.inf  # monotonic start of the latest write
        self.writes = 0

    @property
    def failed(self) -> bool:
        return self._failure is not None

    async def sync(self, *, lazy: bool = False) -> None:
        """Returns once the state as of this call is durable.

        Args:
            lazy: nothing urgent waits on this call: its write may start up to
                ``lazy_s`` after the previous one started, sharing a write another
                caller starts meanwhile.

        Raises:
            CommitFailed: the write failed (now or before).
        """
        if self._failure is not None:
            raise CommitFailed(str(self._failure)) from self._failure
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._request(self._lazy_s if lazy else self._window_s)
        self._waiters.append((self._requested, future))
        # Not shielded: a caller that gives up cancels its own future, which no write
        # then settles (a failure set on it would never be read).
        await future

    def nudge(self) -> None:
        """Asks for a write soon without waiting for it."""
        if self._failure is None:
            self._request(self._lazy_s)

    async def close(self) -> None:
        """Waits for the write in progress, if any; later syncs fail."""
        if self._task is not None and not self._task.done():
            if self._nap is not None:
                self._task.cancel()  # waiting for a deadline, not writing: no write comes
            # The writer delivers its own failures; ``wait`` raises none of them.
            await asyncio.wait((self._task,))
        if self._failure is None:
            self._failure = CommitFailed("committer closed")
        self._settle(None, self._failure)  # nobody may wait for a write that won't come

    def _request(self, window_s: float) -> None:
        """Records a request whose write starts ``window_s`` after the previous one, or
        at once if that is past."""
        self._requested += 1
        due = max(self._clock.monotonic(), self._last_start + window_s)
        if due < self._due:
            self._due = due
            if self._nap is not None:
                self._nap.cancel()  # the writer sleeps for a later deadline: wake it
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=f"commit-{self._name}")

    async def _run(self) -> None:
        while self._durable < self._requested and self._failure is None:
            left = self._due - self._clock.monotonic()
            if left > 0:
                # A request with an earlier deadline cancels the nap; ``wait`` does not
                # raise for it, so a cancellation of this task still ends the task.
                self._nap = asyncio.ensure_future(self._clock.sleep(left))
                try:
                    await asyncio.wait((self._nap,))
                finally:
                    self._nap.cancel()
                    self._nap = None
                continue
            self._last_start = self._clock.monotonic()
            self._due = math.inf
            generation = self._requested
            try:
                await self._write()
            except Exception as e:  # every failure loses the pool
                self._failure = e
                logger.warning("durable write of %s failed: %s", self._name, e)
                self._settle(None, e)
                return
            except BaseException:
                # Cancelled in the middle of a write: what it covered may not be stored,
                # and a write covers only what changed since the previous one, so no
                # later write may follow it.
                self._failure = CommitFailed("a write was cancelled")
                self._settle(None, self._failure)
                raise
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
