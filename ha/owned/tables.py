"""What one owner keeps of its pool during one epoch, and what changed in it since its last
write.

The tables: the pool itself (``fairshare.Pool``, on the epoch's clock), the grants it
counts in flight (``ha.owned.held``), the previous owner's requests as phantoms
(``ha.owned.phantoms``), the earlier grants nobody counted (``ha.owned.settled``), the
holder sessions (``ha.owned.sessions``) and the highest sequence number issued. The owner
decides with them (``ha.owned.pool``), has its re-reports (``ha.owned.rereports``) counted
into them and its writer (``ha.owned.writer``) write them: those parts hold these
``PoolTables``, never the owner.

Every change of what a snapshot holds goes through ``touch`` (the state's version) and
the journal's ``changes`` (what the next record writes), so a write knows what it covers.
The tables also take over a predecessor's snapshot (``restore``), drop what no request
outlives (``forget``) and keep the team table the status pages ask for (``team_tables``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

from fairshare import Pool, TeamStat
from fairshare.sessions import Session
from ha.api import Epoch, InvalidArgument, PoolName
from ha.clock import Clock, EpochTime
from ha.owned.held import HeldGrants
from ha.owned.journal import Changes, Journal
from ha.owned.phantoms import Phantoms
from ha.owned.sessions import MAX_SESSIONS, Sessions
from ha.owned.settled import Settled
from ha.owned.snapshot import GrantKey, PoolSnapshot
from ha.owned.teams import admit, restorable
from ha.settings import PoolConfig

logger = logging.getLogger(__name__)

# A team table of more teams than this is built at most once per _VIEW_CACHE_S.
_FRESH_TEAMS = 64
_VIEW_CACHE_S = 1.0
_FORGET_EVERY_S = 1.0
"""Expired phantoms and accounting entries are dropped at a write at most this often: a
scan of every table at every write (hundreds a second) would cost more than the writes."""


class PoolTables:
    """One owner's tables of ``config``'s pool at ``epoch`` (see module)."""

    def __init__(
        self,
        *,
        config: PoolConfig,
        epoch: Epoch,
        clock: Clock,
        session_ttl_s: float,
        release_memory_s: float,
    ) -> None:
        self.config = config
        self.name = PoolName(config.name)
        self.epoch = epoch
        self._clock = clock
        # Every age within this epoch runs on the monotonic clock: a wall step must not
        # expire live grants (and let as many more in) nor decay usage. Wall time enters
        # only where owners meet: the snapshot a successor restores.
        self.now = EpochTime(clock)
        self.pool = Pool(
            config.name,
            config.capacity,
            config.shares,
            half_life_s=config.half_life_s,
            clock=self.now,
            lend=config.lend,
        )
        self.held = HeldGrants(epoch, config.max_request_s)  # counted in flight
        # Earlier grants the previous owner counted, each standing for one phantom.
        self.phantoms = Phantoms(self.pool)
        self.earlier = Settled(config.name)  # earlier grants nobody counted
        self.sessions = Sessions(session_ttl_s, MAX_SESSIONS)
        self.issued = 0  # the highest sequence number issued at this epoch
        self.journal = Journal()
        # What a snapshot holds changes only through ``touch``: each change bumps the
        # version, and a write records the version it encodes.
        self.version = 0
        self.behind_since: float | None = None  # monotonic: first change not yet durable
        self._release_memory_s = release_memory_s
        self._forgot_at = -math.inf
        self._teams_cache: tuple[float, Sequence[TeamStat], Mapping[str, int]] | None = None

    def restore(self, snapshot: PoolSnapshot | None) -> tuple[int, int]:
        """Takes over the state a previous owner persisted (``OwnedPool.restore``).

        Returns:
            (teams whose usage was restored, phantoms added).
        """
        now = self.now()
        if snapshot is None:
            # Nothing was ever written, or it is gone: no earlier grant was counted.
            self.earlier.start_unknown(self.epoch, now)
            return 0, 0
        capacity = snapshot.capacity
        if snapshot.configured not in (None, self.config.capacity):
            # The configuration changed since that owner: its capacity is the new intent,
            # and a SetCapacity made under the old one ends here.
            capacity = self.config.capacity
            logger.info(
                "pool %s at epoch %d: configured capacity %d (was %d): it replaces %d",
                self.name,
                self.epoch,
                capacity,
                snapshot.configured,
                snapshot.capacity,
            )
        if capacity != self.pool.capacity:
            self.pool.set_capacity(capacity)
        decay = math.exp(-self.pool.decay_rate * max(0.0, now - snapshot.wall))
        for team, usage in restorable(self.config, snapshot.usage).items():
            self.pool.set_usage(team, usage * decay)
        # Ages in the snapshot run from its wall time and go on from now, on this epoch's
        # clock: a wall clock that differs between the two owners (a step, a skewed node)
        # neither ends a phantom early nor forgets a settled release. The time between
        # the write and this restore is not aged (the safe side). Each phantom lasts as
        # long as its request could still be running, and never beyond max_request_s
        # from now: chained failovers do not stretch it.
        shift = now - snapshot.wall
        latest = now + self.config.max_request_s
        # Every session gets one TTL from now to be renewed (its holder keeps it alive).
        self.sessions.restore(((sid, d, h) for sid, (d, h) in snapshot.sessions.items()), now)
        self.phantoms.restore(
            snapshot.live, now=now, shift=shift, latest=latest, sessions=self.sessions
        )
        self.earlier.restore(snapshot, self.epoch, now, shift)
        self.forget(now)
        return len(snapshot.usage), len(self.phantoms)

    def restore_unreadable(self) -> int:
        """Takes over after a snapshot that could not be read, failing safe
        (``OwnedPool.restore_unreadable``); returns the phantoms added."""
        now = self.now()
        added = self.phantoms.fill(self.pool.reserved(), now + self.config.max_request_s)
        self.earlier.start_unknown(self.epoch, now)
        return added

    @property
    def changes(self) -> Changes:
        """What changed since the previous write began (``ha.owned.journal``)."""
        return self.journal.changes

    def touch(self) -> None:
        """Records a change of the state a snapshot holds."""
        self.version += 1
        if self.behind_since is None:
            self.behind_since = self._clock.monotonic()

    def wrote(self, version: int, started: float) -> None:
        """A write that started at ``started`` (monotonic) stored the state as of
        ``version``: the state lags no more, or since that start at the latest."""
        if version == self.version:
            self.behind_since = None
        elif self.behind_since is not None:
            # Changes made during the write are not in it: they lag since it started at
            # the latest.
            self.behind_since = max(self.behind_since, started)

    def admit(self, team: str) -> None:
        """Keeps state for ``team`` from now on (``ha.owned.teams.admit``) if not yet."""
        if team and not self.pool.knows(team):
            admit(self.pool, self.config, team)
            self.changes.team(team)

    def open_session(self, session: Session, holder: str) -> bool:
        """Checks and renews ``session`` for ``holder``; records it when this call opens
        it (returns True: the caller makes it durable before answering).

        Raises:
            PermissionDenied: the session is open with another secret or holder.
            LimitExceeded: opening it would keep too many.
        """
        if not self.sessions.check(session, holder, self.now()):
            return False
        self.changes.sessions[session.id] = (session.digest, holder)
        self.touch()
        return True

    def settle(self, key: GrantKey) -> None:
        """Remembers that the earlier grant ``key``, which nobody counted, is settled."""
        now = self.now()
        if self.earlier.settle(key, now):
            self.changes.settled[key] = now

    def uncount(self, keys: list[GrantKey], ended: int = 0) -> int:
        """Records grants (or phantoms) that no longer count in flight but whose release
        may still come and must be charged once; returns ``ended``."""
        if not keys:
            return ended
        now = self.now()
        self.earlier.uncount(keys, now)
        for key in keys:
            self.changes.dropped(key)
            if key in self.earlier.uncounted:  # not dropped at once by the table's cap
                self.changes.uncounted[key] = now
        self.touch()
        return ended

    def forget(self, now: float) -> None:
        """Drops what no request can outlive: phantoms, windows and settled entries older
        than ``max_request_s``."""
        self._forgot_at = now
        self.phantoms.forget(now, self.sessions)
        self.earlier.forget(now - max(self.config.max_request_s, self._release_memory_s))

    def forget_due(self, now: float) -> None:
        """``forget``, if it last ran ``_FORGET_EVERY_S`` ago or more."""
        if now >= self._forgot_at + _FORGET_EVERY_S:
            self.forget(now)

    def team_tables(self) -> tuple[Sequence[TeamStat], Mapping[str, int]]:
        """The team table and the within-share counts. Fresh with at most
        ``_FRESH_TEAMS`` teams; with more, up to ``_VIEW_CACHE_S`` old, so that the O(T)
        tables are built at most once per that time however often they are asked for."""
        if self.pool.team_count <= _FRESH_TEAMS:
            return self.pool.snapshot(), self.pool.within()
        now = self._clock.monotonic()
        cached = self._teams_cache
        if cached is None or not 0 <= now - cached[0] < _VIEW_CACHE_S:
            cached = self._teams_cache = (now, self.pool.snapshot(), self.pool.within())
        return cached[1], cached[2]


def invalid_argument(error: ValueError, prefix: str = "") -> InvalidArgument:
    """The InvalidArgument a ValueError of ``fairshare.Pool`` stands for, naming the
    request's field as the wire does (after ``prefix``)."""
    text = str(error)
    names = {"class": "service_class"}
    for field in ("team", "est_tokens", "class", "priority", "capacity"):
        if text.startswith(field):
            return InvalidArgument(prefix + names.get(field, field), text)
    return InvalidArgument(prefix + "request", text)
