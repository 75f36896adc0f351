"""Which grants of earlier epochs no owner counted, and which of them are settled.

An owner restores usage and phantoms from its predecessor's snapshot, but some earlier
grants were never counted by anyone: those issued after an owner's last readable write
(``unknown_after``), those of owners whose snapshots nobody read (``unknown_between``),
degraded grants (``DEGRADED_EPOCH``) and phantoms their holder closed (``uncounted``).
Their releases must be charged, once: ``settled`` remembers the ones that were. The
snapshot carries all four (see ``ha.owned.snapshot``).

Guarantees: ``chargeable`` is True for exactly those grants (an unsigned degraded one
only once an owner counted it); ``settle`` remembers a
chargeable one; entries older than ``horizon`` are dropped by ``forget`` (no request
outlives it); each table is capped at ``MEMORY_CAP`` entries, the oldest going first.

Non-guarantees: past the cap, a retried release of a forgotten settled grant is charged
again (logged).
"""

from __future__ import annotations

import logging

from ha.api import DEGRADED_EPOCH, Epoch
from ha.owned.snapshot import GrantKey, PoolSnapshot

logger = logging.getLogger(__name__)

MEMORY_CAP = 10_000
"""Entries kept per accounting table in every snapshot (etcd refuses values over 1.5 MiB)."""


class Settled:
    """The accounting of one pool's uncounted grants of earlier epochs (see module)."""

    def __init__(self, pool: str) -> None:
        self._pool = pool
        # Epoch -> (sequence, since): grants above it were never counted.
        self.unknown_after: dict[int, tuple[int, float]] = {}
        # (lo, hi, since): every grant of an epoch strictly between lo and hi is uncounted.
        self.unknown_between: list[tuple[int, int, float]] = []
        self.uncounted: dict[GrantKey, float] = {}  # known, not counted, still chargeable
        self.settled: dict[GrantKey, float] = {}  # unknown-window grants settled, at wall

    def start_unknown(self, epoch: Epoch, now: float) -> None:
        """No earlier snapshot could be read: no grant of an epoch below ``epoch`` was
        counted, and none is taken as settled."""
        self.unknown_between = [(0, epoch, now)]

    def restore(self, snapshot: PoolSnapshot, epoch: Epoch, now: float, shift: float = 0.0) -> None:
        """Takes over ``snapshot``'s accounting for an owner at ``epoch``: the grants its
        writer issued after it, and every epoch between its writer's and ``epoch``, were
        never counted. Its times move by ``shift`` (now minus the snapshot's wall time):
        each entry keeps the age it had at the snapshot."""
        self.unknown_after = {e: (seq, w + shift) for e, (seq, w) in snapshot.unknown_after.items()}
        self.unknown_after[snapshot.epoch] = (snapshot.issued, now)
        # Owners between the snapshot's writer and this one never had a write read back.
        self.unknown_between = [
            *((lo, hi, w + shift) for lo, hi, w in snapshot.unknown_between),
            (snapshot.epoch, epoch, now),
        ]
        self.uncounted = {k: w + shift for k, w in snapshot.uncounted.items()}
        self.settled = {k: w + shift for k, w in snapshot.settled.items()}

    def chargeable(self, key: GrantKey, *, signed: bool = True) -> bool:
        """True for a grant no owner counts now whose release must be charged.

        An unsigned (client-made) degraded id proves nothing: it is chargeable only once
        an owner counted it (``signed=False``: only as ``uncounted``), so a made-up one
        charges nothing (see ``ha.owned.pool``, ``release``).
        """
        if key in self.uncounted:
            return True  # closed by its holder's re-report, its session lapsed, ...
        if key.epoch == DEGRADED_EPOCH:
            return signed
        window = self.unknown_after.get(key.epoch)
        if window is not None and key.seq > window[0]:
            return True
        return any(lo < key.epoch < hi for lo, hi, _ in self.unknown_between)

    def is_settled(self, key: GrantKey) -> bool:
        return key in self.settled

    def settle(self, key: GrantKey, now: float) -> bool:
        """Remembers that ``key`` was released, if it is chargeable; returns whether it
        did."""
        if not self.chargeable(key):
            return False
        self.settled[key] = now
        _cap(self.settled, self._pool, "settled releases")
        return True

    def uncount(self, keys: list[GrantKey], now: float) -> None:
        """Marks grants as no longer counted in flight but still to be charged (phantoms
        closed by their holder's complete re-report)."""
        for key in keys:
            self.uncounted[key] = now
        _cap(self.uncounted, self._pool, "closed phantoms")

    def forget(self, horizon: float) -> None:
        """Drops windows and entries older than ``horizon``."""
        if self.unknown_after:
            self.unknown_after = {e: w for e, w in self.unknown_after.items() if w[1] >= horizon}
        if self.settled:
            self.settled = {k: w for k, w in self.settled.items() if w >= horizon}
        if self.uncounted:
            self.uncounted = {k: w for k, w in self.uncounted.items() if w >= horizon}
        if self.unknown_between:
            self.unknown_between = [r for r in self.unknown_between if r[2] >= horizon]


def _cap(table: dict[GrantKey, float], pool: str, what: str) -> None:
    """Keeps a snapshot's accounting table bounded: past the cap the oldest entries go,
    and a retry of their release could be charged again."""
    if len(table) > MEMORY_CAP:
        for key in list(table)[: len(table) - MEMORY_CAP]:
            del table[key]
        logger.warning(
            "pool %s: more than %d %s remembered; forgetting the oldest", pool, MEMORY_CAP, what
        )
