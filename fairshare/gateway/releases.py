"""Releases that outlive the request that started them.

A grant must be released even when the handler that holds it is cancelled (the client
went away, or the stop's grace ran out). ``Releases.start`` runs ``grant.release`` as a
task of its own and keeps a reference to it until it ends (the event loop keeps only a
weak one, and ``asyncio.shield`` keeps none of its inner task), so the release is neither
collected nor cut by the cancel; ``wait`` lets the stop wait for them all.

Not guaranteed: a release still running when the process exits is lost with it (the
allocator then counts the grant until its pool's ``max_request_s``).
"""

from __future__ import annotations

import asyncio
import logging

from fairshare.client import ClientGrant

logger = logging.getLogger(__name__)


class Releases:
    """Grant releases running in the background, each kept until it ends."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self, grant: ClientGrant, consumed: float) -> asyncio.Task[None]:
        """Starts releasing ``grant`` with ``consumed`` (clamped to 0 when negative).

        Returns the task; awaiting it through ``asyncio.shield`` waits for the release
        without letting a cancel of the caller cut it.
        """
        task = asyncio.get_running_loop().create_task(grant.release(max(consumed, 0.0)))
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("a grant release failed: %r", task.exception())

    @property
    def running(self) -> int:
        """Releases not ended yet."""
        return len(self._tasks)

    async def wait(self) -> None:
        """Waits for every release started so far."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
