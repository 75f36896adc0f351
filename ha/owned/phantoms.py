"""The requests a previous owner counted in flight, as one owner's phantoms.

A new owner does not know which of its predecessor's grants are still running: it counts
each as a phantom, attributed to the grant's team and holder, until the grant is released
or re-reported, its holder's complete re-report closes it, or its request cannot be
running any more (``until``).

Each phantom keeps the standing its grant had (within share, borrowing, or unknown), so
the new owner restores every team's within-share count (``fairshare.Pool.within``): no
reserved slot is promised twice, and borrowers do not use up a reservation after a
failover any more than before it. Unknown standing counts as within share, the safe side.

Guarantees: the pool's phantom count of a team, per standing, and the phantoms of that team
and standing kept here always agree (the pool's never expire by themselves: this table
ends them, one by one); a phantom never outlives ``until``, but for one of a holder
session that is still open: that one ends when its session lapses (the owner closes it
then), however long its request runs, as the session's grants do.
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Iterator, Mapping
from typing import NamedTuple

from fairshare import Pool
from ha.owned.snapshot import GrantKey, LiveGrant, live_row


class Phantom(NamedTuple):
    team: str
    until: float  # time (of the epoch's clock) after which its request cannot be running
    row: str  # its entry in a snapshot's live list, encoded once (see ha.owned.snapshot.live_row)
    borrowing: bool | None  # its grant's standing; None: unknown (counted as within)
    session: str  # the holder session of its grant; empty: none

    @property
    def counted_borrowing(self) -> bool:
        """How the pool counts it: as a borrower only when known to be one."""
        return self.borrowing is True


class Phantoms:
    """One owner's phantoms by grant key, counted in ``pool`` (see module)."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._phantoms: dict[GrantKey, Phantom] = {}

    def __len__(self) -> int:
        return len(self._phantoms)

    def __contains__(self, key: GrantKey) -> bool:
        return key in self._phantoms

    def restore(
        self,
        live: Iterable[LiveGrant],
        *,
        now: float,
        shift: float,
        latest: float,
        sessions: Container[str],
    ) -> None:
        """Counts the grants a snapshot lists as live, each for the time it had left at
        the snapshot, from ``now`` (``shift``: now minus the snapshot's wall time), but
        never beyond ``latest`` (chained failovers do not stretch them); those ended at
        the snapshot are not. A grant of one of ``sessions`` (open at the snapshot)
        counts until ``latest``, or until its session lapses: it does not age."""
        counts: dict[tuple[str, bool], int] = {}
        for grant in live:
            if grant.session and grant.session not in sessions:
                continue  # its session had lapsed: it no longer counted
            until = latest if grant.session else min(grant.until + shift, latest)
            if until > now:
                phantom = _phantom(grant.key, grant.team, until, grant.borrowing, grant.session)
                self._phantoms[grant.key] = phantom
                kind = (grant.team, phantom.counted_borrowing)
                counts[kind] = counts.get(kind, 0) + 1
        for (team, borrowing), n in counts.items():
            self._pool.add_phantoms(team, n, math.inf, borrowing=borrowing)

    def fill(self, reserved: Mapping[str, int], until: float) -> int:
        """Counts every team's whole reservation as phantoms of unknown standing (so
        within share) until ``until`` (nothing of the previous owner could be read);
        returns how many."""
        added = 0
        for team, slots in reserved.items():
            for i in range(slots):
                key = GrantKey(-1, added + i, "")
                self._phantoms[key] = _phantom(key, team, until, None, "")
            if slots:
                self._pool.add_phantoms(team, slots, math.inf)
            added += slots
        return added

    def get(self, key: GrantKey) -> Phantom | None:
        """The phantom of ``key``, if counted."""
        return self._phantoms.get(key)

    def take(self, key: GrantKey) -> Phantom | None:
        """Removes the phantom of ``key`` from this table (not from the pool's count: the
        caller drops it there, with ``drop``) and returns it."""
        return self._phantoms.pop(key, None)

    def drop(self, phantom: Phantom) -> bool:
        """Ends a taken phantom in the pool's count; False if the pool had none of its
        team and standing (never, while the guarantee holds)."""
        return self._pool.drop_phantom(phantom.team, borrowing=phantom.counted_borrowing)

    def holds(self, holder: str) -> bool:
        """True if a phantom of ``holder`` made without a session is counted."""
        return any(k.holder == holder and not p.session for k, p in self._phantoms.items())

    def close(self, holder: str) -> tuple[list[GrantKey], int]:
        """Ends every phantom of ``holder`` made without a session; returns their keys and
        how many the pool dropped. (A session's phantoms are its own: ``close_session``.)"""
        return self._close(
            [k for k, p in self._phantoms.items() if k.holder == holder and not p.session]
        )

    def close_session(self, session: str) -> tuple[list[GrantKey], int]:
        """Ends every phantom of ``session``; returns their keys and how many the pool
        dropped."""
        return self._close([k for k, p in self._phantoms.items() if p.session == session])

    def _close(self, closed: list[GrantKey]) -> tuple[list[GrantKey], int]:
        dropped = 0
        for key in closed:
            if self.drop(self._phantoms.pop(key)):
                dropped += 1
        return closed, dropped

    def forget(self, now: float, open_sessions: Container[str] = ()) -> None:
        """Ends the phantoms whose request cannot be running at ``now``: past ``until``,
        unless their session is one of ``open_sessions`` (it still renews them)."""
        ended = [
            k
            for k, p in self._phantoms.items()
            if p.until <= now and not (p.session and p.session in open_sessions)
        ]
        for key in ended:
            self.drop(self._phantoms.pop(key))

    def live(self) -> list[LiveGrant]:
        """The phantoms as a snapshot's live list."""
        return [
            LiveGrant(key, p.team, p.until, p.borrowing, p.session)
            for key, p in self._phantoms.items()
        ]

    def rows(self) -> Iterator[str]:
        """The phantoms' encoded live rows (what ``live`` encodes to)."""
        return (p.row for p in self._phantoms.values())


def _phantom(
    key: GrantKey, team: str, until: float, borrowing: bool | None, session: str
) -> Phantom:
    row = live_row(LiveGrant(key, team, until, borrowing, session))
    return Phantom(team, until, row, borrowing, session)
