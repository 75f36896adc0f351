"""When a pool's next campaign may start after failed ones, and when to say so.

Guarantees: after the n-th failure in a row, the next attempt waits 50 ms x 2^(n-1),
at most ``BACKOFF_MAX_S``, jittered down to half (replicas facing a store that refuses
writes neither hammer it nor retry in step); a streak is logged at its first failure,
then at most once per ``LOG_EVERY_S``; an answer (won or lost) ends the streak.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ha.api import PoolName
from ha.clock import Clock

BACKOFF_MAX_S = 1.0
"""Failed campaigns for a pool are retried after 50 ms, doubling up to this, jittered."""
LOG_EVERY_S = 10.0
"""A streak of failed campaigns for a pool logs its first failure, then one line per this."""
_FIRST_S = 0.05


@dataclass(slots=True)
class _Streak:
    failures: int = 0
    not_before: float = 0.0
    logged_at: float = float("-inf")


class CampaignBackoff:
    """Every pool's streak of failed campaigns (see module)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._streaks: dict[PoolName, _Streak] = {}

    def waiting(self, name: PoolName, now: float) -> bool:
        """True while the pool's next campaign must wait."""
        streak = self._streaks.get(name)
        return streak is not None and now < streak.not_before

    def ended(self, name: PoolName) -> None:
        """A campaign got an answer: the streak ends."""
        self._streaks.pop(name, None)

    def failed(self, name: PoolName) -> int | None:
        """Counts a failed campaign and delays the next one; returns the failures so far
        when this one is to be logged, None when it is not."""
        now = self._clock.monotonic()
        streak = self._streaks.setdefault(name, _Streak())
        streak.failures += 1
        delay = min(BACKOFF_MAX_S, _FIRST_S * 2 ** min(streak.failures - 1, 10))
        streak.not_before = now + delay * random.uniform(0.5, 1.0)
        if now - streak.logged_at < LOG_EVERY_S:
            return None
        streak.logged_at = now
        return streak.failures
