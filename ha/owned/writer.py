"""What an owner writes of its pool, and how far the stored state lags its own.

A write is a record of what changed since the previous one when the journal allows it
(``ha.owned.journal``): its cost follows the changes, not the requests in flight; else a
checkpoint, from the rows each request keeps encoded. ``PoolWriter.write`` is what the
owner's group committer (``ha.owned.commit``) runs, one at a time; it reads the owner's
tables (``ha.owned.tables``) and writes to the owner's log (``ha.owned.poolstate.PoolLog``,
fenced on the epoch), and calls back into nothing.
"""

from __future__ import annotations

import dataclasses
from itertools import chain

from ha.clock import Clock
from ha.owned.journal import Changes, StateWriter, encode_checkpoint, encode_record
from ha.owned.snapshot import PoolSnapshot
from ha.owned.tables import PoolTables


class PoolWriter:
    """Writes ``tables`` to ``log`` (see module)."""

    def __init__(self, tables: PoolTables, log: StateWriter, clock: Clock) -> None:
        self._tables = tables
        self._log = log
        self._clock = clock
        self._written = -1  # the version the latest write started encodes; -1: none yet
        self._last_write_mono = -1.0

    @property
    def changed(self) -> bool:
        """True when the state differs from what the latest write started encodes (or
        nothing was written yet in this epoch); see ``OwnedPool.changed``."""
        return self._tables.version != self._written

    def snapshot_age_s(self) -> float:
        """How long the stored state has lagged behind the owner's: 0 while the last
        successful write covers every change, else the seconds since the first change it
        does not cover; -1 before the first write of this epoch."""
        if self._last_write_mono < 0:
            return -1.0
        if self._tables.behind_since is None:
            return 0.0
        return max(0.0, self._clock.monotonic() - self._tables.behind_since)

    def snapshot(self) -> PoolSnapshot:
        """The state to persist now."""
        t = self._tables
        return dataclasses.replace(self._state(), live=t.held.live() + t.phantoms.live())

    async def write(self) -> None:
        """Writes the state as of now: a record, or a checkpoint (see module).

        Raises:
            Exception: whatever the log raised; the write may not have been stored.
        """
        t = self._tables
        now = t.now()
        t.forget_due(now)
        changes = t.journal.take()
        self._written = version = t.version  # nothing changes it before the encoding
        record = None if t.journal.due else self._record(changes, now)
        started = self._clock.monotonic()
        if record is not None:
            t.journal.recorded(len(record))
            await self._log.append(record)
        else:
            checkpoint = encode_checkpoint(self._state(), chain(t.held.rows(), t.phantoms.rows()))
            t.journal.checkpointed(checkpoint.size)
            await self._log.checkpoint(checkpoint)
        self._last_write_mono = self._clock.monotonic()
        t.wrote(version, started)

    def _state(self) -> PoolSnapshot:
        """The state to persist now, but for the requests in flight."""
        t = self._tables
        now = t.now()
        t.forget_due(now)
        usage, _ = t.pool.usage()
        return PoolSnapshot(
            pool=t.name,
            epoch=t.epoch,
            wall=now,
            capacity=t.pool.capacity,
            usage=usage,
            issued=t.issued,
            unknown_after=dict(t.earlier.unknown_after),
            unknown_between=list(t.earlier.unknown_between),
            uncounted=dict(t.earlier.uncounted),
            settled=dict(t.earlier.settled),
            configured=t.config.capacity,
            sessions={sid: (d, h) for sid, d, h in t.sessions.rows()},
        )

    def _record(self, changes: Changes, now: float) -> bytes | None:
        """The record of ``changes`` as of ``now``; None when too large for one."""
        t = self._tables
        return encode_record(
            epoch=t.epoch,
            wall=now,
            capacity=t.pool.capacity,
            issued=t.issued,
            usage={team: t.pool.usage_of(team) for team in changes.teams},
            changes=changes,
        )
