"""After an allocator failover, fail-open requests that have not started are decided again.

A request sent fail-open (a degraded grant: no owner answered, the lowest borrowing
priority) keeps that priority in vLLM after an owner is back; adopted as it is, it starves
behind every borrower and holds its team's reservation (docs/gateway.md, "Failover").
The gateway owns the upstream connection, so it knows which of those requests have not
sent a first byte to their client yet: it aborts them (closing the upstream request, so
vLLM drops the sequence) and sends them again with a fresh decision.

``Redecider`` keeps, per pool, the requests holding a degraded grant and not yet answered
(``watch`` / ``unwatch``, by the request path); ``owner_answered`` is the
``client.AllocatorClient.on_owner_answer`` listener: when an owner answers for a pool, it
signals up to ``max_per_signal`` of that pool's watched requests, oldest first, and forgets
them (the rest are signalled at the next answer, which comes with the next acquire or the
client's background ListPools).

Guarantees: a request is signalled at most once (the request path watches it only on its
first decision); a request whose first byte has been sent is no longer watched, so it is
never signalled. Not guaranteed: that a signalled request was not already running in vLLM
(a non-streaming request sends nothing until it ends, so it may be aborted mid-generation).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fairshare.gateway.config import RedecideSettings

T = TypeVar("T")


class Redecide(Exception):
    """An owner answered while this fail-open request had not started: decide again."""


@dataclass(eq=False)
class Watched:
    """One fail-open request not yet answered; ``signal`` is set to re-decide it."""

    pool: str
    key: int
    signal: asyncio.Event = field(default_factory=asyncio.Event)


class Redecider:
    """The fail-open requests of each pool that may still be decided again."""

    def __init__(self, settings: RedecideSettings) -> None:
        self._settings = settings
        self._watched: dict[str, dict[int, Watched]] = {}
        self._keys = itertools.count()

    @property
    def enabled(self) -> bool:
        return self._settings.enabled

    def watched(self, pool: str) -> int:
        """How many requests of ``pool`` are watched now."""
        return len(self._watched.get(pool, ()))

    def watch(self, pool: str) -> Watched | None:
        """Watches a request that holds a degraded grant of ``pool`` (None when disabled)."""
        if not self._settings.enabled:
            return None
        entry = Watched(pool, next(self._keys))
        self._watched.setdefault(pool, {})[entry.key] = entry
        return entry

    def unwatch(self, entry: Watched) -> None:
        """Stops watching ``entry`` (its first byte goes out, or it ended)."""
        pool = self._watched.get(entry.pool)
        if pool is not None:
            pool.pop(entry.key, None)

    def owner_answered(self, pool: str, epoch: int) -> None:
        """An owner answered for ``pool``: signals its oldest watched requests."""
        watched = self._watched.get(pool)
        if not watched:
            return
        for key in list(itertools.islice(watched, self._settings.max_per_signal)):
            watched.pop(key).signal.set()


async def unless_signalled(
    first: Coroutine[Any, Any, T], watched: Watched | None, close: Callable[[T], None]
) -> T:
    """Awaits ``first`` (the first attempt at an upstream), or raises ``Redecide`` if
    ``watched`` is signalled before it ends (``first`` is then cancelled: the upstream
    request is closed). When the caller is cancelled meanwhile, ``first`` is cancelled too,
    or, had it just ended, what it opened is closed with ``close``."""
    if watched is None:
        return await first
    attempt = asyncio.ensure_future(first)
    signal = asyncio.ensure_future(watched.signal.wait())
    try:
        await asyncio.wait({attempt, signal}, return_when=asyncio.FIRST_COMPLETED)
        if not attempt.done():
            attempt.cancel()
            await asyncio.wait({attempt})  # its own cleanup closes the upstream request
    except asyncio.CancelledError:
        if not attempt.done():
            attempt.cancel()
        elif not attempt.cancelled() and attempt.exception() is None:
            close(attempt.result())
        raise
    finally:
        signal.cancel()
    if attempt.cancelled():
        raise Redecide
    return attempt.result()
