"""The requests a previous owner counted in flight, as one owner's phantoms.

A new owner does not know which of its predecessor's grants are still running: it counts
each as a phantom, attributed to the grant's team and holder, until the grant is released
or re-reported, its holder's complete re-report closes it, or its request cannot be
running any more (``until``).

Guarantees: the pool's phantom count of a team and the phantoms of that team kept here
always agree (the pool's never expire by themselves: this table ends them, one by one);
a phantom never outlives ``until``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import NamedTuple

from fairshare import Pool
from ha.snapshot import GrantKey, LiveGrant, live_row


class Phantom(NamedTuple):
    team: str
    until: float  # time (of the epoch's clock) after which its request cannot be running
    row: str  # its entry in a snapshot's live list, encoded once (see ha.snapshot.live_row)


class Phantoms:
    """One owner's phantoms by grant key, counted in ``pool`` (see module)."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._phantoms: dict[GrantKey, Phantom] = {}

    def __len__(self) -> int:
        return len(self._phantoms)

    def __contains__(self, key: GrantKey) -> bool:
        return key in self._phantoms

    def restore(self, live: Iterable[LiveGrant], now: float, latest: float) -> None:
        """Counts the grants a snapshot lists as live, each until its own end but never
        beyond ``latest`` (chained failovers do not stretch them); ended ones are not."""
        counts: dict[str, int] = {}
        for grant in live:
            until = min(grant.until, latest)
            if until > now:
                self._phantoms[grant.key] = _phantom(grant.key, grant.team, until)
                counts[grant.team] = counts.get(grant.team, 0) + 1
        for team, n in counts.items():
            self._pool.add_phantoms(team, n, math.inf)

    def fill(self, reserved: Mapping[str, int], until: float) -> int:
        """Counts every team's whole reservation as phantoms until ``until`` (nothing of
        the previous owner could be read); returns how many."""
        added = 0
        for team, slots in reserved.items():
            for i in range(slots):
                key = GrantKey(-1, added + i, "")
                self._phantoms[key] = _phantom(key, team, until)
            if slots:
                self._pool.add_phantoms(team, slots, math.inf)
            added += slots
        return added

    def take(self, key: GrantKey) -> Phantom | None:
        """Removes the phantom of ``key`` from this table (not from the pool's count: the
        caller drops it there, ``Pool.drop_phantom``) and returns it."""
        return self._phantoms.pop(key, None)

    def holds(self, holder: str) -> bool:
        """True if a phantom of ``holder`` is counted."""
        return any(k.holder == holder for k in self._phantoms)

    def close(self, holder: str) -> tuple[list[GrantKey], int]:
        """Ends every phantom of ``holder``; returns their keys and how many the pool
        dropped."""
        closed = [k for k in self._phantoms if k.holder == holder]
        dropped = 0
        for key in closed:
            if self._pool.drop_phantom(self._phantoms.pop(key).team):
                dropped += 1
        return closed, dropped

    def forget(self, now: float) -> None:
        """Ends the phantoms whose request cannot be running at ``now``."""
        for key in [k for k, p in self._phantoms.items() if p.until <= now]:
            self._pool.drop_phantom(self._phantoms.pop(key).team)

    def live(self) -> list[LiveGrant]:
        """The phantoms as a snapshot's live list."""
        return [LiveGrant(key, p.team, p.until) for key, p in self._phantoms.items()]

    def rows(self) -> Iterator[str]:
        """The phantoms' encoded live rows (what ``live`` encodes to)."""
        return (p.row for p in self._phantoms.values())


def _phantom(key: GrantKey, team: str, until: float) -> Phantom:
    return Phantom(team, until, live_row(LiveGrant(key, team, until)))
