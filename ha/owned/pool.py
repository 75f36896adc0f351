"""One pool as decided by its owner during one epoch.

``OwnedPool`` decides; its parts, each holding the tables of ``ha.owned.tables`` (grants in
flight, the previous owner's as phantoms, earlier grants nobody counted, sessions, and what
changed since the last write) and none calling back into it: ``ha.owned.rereports`` takes a
holder's re-report (Adopt), ``ha.owned.writer`` writes the state, and the group committer
(``ha.owned.commit``) runs those writes. Beside them ``ha.owned.answers`` (answers to
retries), ``ha.owned.genuine`` (id checks, the charge bound) and ``ha.owned.teams``
(admission of teams).

Guarantees:
- Decisions are made only while ``can_decide()`` holds: the pool is not being handed
  over and the node's lease is within its self-fencing deadline.
- A within-share grant is returned only after a fenced write that covers it succeeded.
  A failed write loses the pool (``lost``): nothing more is decided from it.
- A retried Acquire (same holder and request id) returns the first answer.
- A borrowing grant is counted in flight (issued or adopted) only while fewer than
  ``max_in_flight`` grants are (phantoms apart), and fewer than
  ``max_in_flight_per_holder`` of its holder (``ha.owned.bounds``): an Acquire past either is
  refused (``LimitExceeded``), an Adopt leaves it out. Within-share grants are never held
  back (the reservations bound them).
- A release is counted once per grant id, whatever the epoch that issued it.
- Only genuine ids count: a signed id whose MAC does not verify under the cluster's grant
  keys, or an unsigned id of an epoch other than ``DEGRADED_EPOCH`` (0), is refused
  (``PermissionDenied``) before anything is charged or counted.
- A release charges at most ``config.max_charge()`` (``max_charge_per_s`` x
  ``max_request_s``); more is clamped to it, logged and counted (``IdCounters``).
- An unsigned (client-made degraded) id is charged only if an owner counted it first
  (adopted, then held, a phantom or closed): the release of one nobody counted charges
  nothing, and is counted (``unproven_releases``).
- Adopt counts unsigned (client-made degraded) grants only when they name the calling
  holder, as borrowers within the in-flight bounds, each for at most ``max_request_s``
  from its adoption; a complete re-report closes the holder's phantoms
  only when it proves to be that holder by carrying at least one signed grant of it.
- On restore, the previous owner's in-flight requests count as phantoms until
  ``max_request_s``, attributed to their holders, so a holder's complete re-report
  (carrying a signed grant of that holder) closes its share of them at once.
- Within an epoch, ages (grant expiry, usage decay, phantom ends) run on the monotonic
  clock (``ha.clock.EpochTime``): a step of the wall clock, either way, neither expires a
  live grant nor keeps a dead one. Wall time is read once, when the epoch starts, to
  restore the previous owner's snapshot.

Non-guarantees: borrowing grants and releases since the last snapshot are lost on a
crash; the successor is then more cautious (more phantoms), never less.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence

from fairshare import Class, Grant, TeamStat
from fairshare.sessions import Session
from ha.api import (
    AdoptResult,
    Decision,
    Epoch,
    GrantRef,
    HeldGrant,
    InvalidArgument,
    NodeId,
    PoolName,
    PoolView,
)
from ha.clock import Clock
from ha.grantkeys import GrantKeys, ephemeral_keys
from ha.owned.answers import Answer, Answers
from ha.owned.bounds import beyond
from ha.owned.commit import CommitFailed, GroupCommitter
from ha.owned.genuine import IdCounters, IdGuard
from ha.owned.held import holding_of
from ha.owned.journal import StateWriter
from ha.owned.releases import Releases
from ha.owned.rereports import ReReports
from ha.owned.snapshot import PoolSnapshot
from ha.owned.tables import PoolTables, invalid_argument
from ha.owned.waiting import Stopped, Waiting
from ha.owned.writer import PoolWriter
from ha.settings import PoolConfig

logger = logging.getLogger(__name__)


class NotDeciding(Exception):
    """The owner may not decide for the pool now (handover, fence, lost write)."""


class OwnedPool:
    """A pool this node owns at ``epoch``."""

    def __init__(  # noqa: PLR0913 (a pool owner's wiring: its fence, disk, timing, ids)
        self,
        *,
        config: PoolConfig,
        epoch: Epoch,
        node: NodeId,
        clock: Clock,
        fenced: Callable[[], bool],
        log: StateWriter,
        commit_window_s: float,
        release_commit_s: float,
        release_memory_s: float,
        keys: GrantKeys | None = None,
        counters: IdCounters | None = None,
        session_ttl_s: float = 30.0,
    ) -> None:
        """Args:
        config: the pool's configuration.
        epoch: the create_revision of this node's owner key.
        node: this node's id.
        clock: read once for wall time (the epoch's start), then for monotonic time:
            the pool's decay, grant ages and phantoms run on ``ha.clock.EpochTime``.
        fenced: True while the node's lease is within its self-fencing deadline.
        log: where the state is written (``ha.owned.journal``: records of changes and
            checkpoints), fenced on the epoch; a failed write raises (the pool is then
            lost).
        commit_window_s: group commit window.
        release_commit_s: group commit window of releases (see ha.owned.commit).
        release_memory_s: how long released ids of earlier epochs are remembered.
        keys: the cluster's grant keys; None: this process's ephemeral key (tests).
        counters: where refused ids and clamped charges are counted (kept by the node
            across epochs); None: a fresh one.
        session_ttl_s: how long a holder session lives unrenewed (``ha.owned.sessions``).
        """
        self.config = config
        self.name = PoolName(config.name)
        self.epoch = epoch
        self.node = node
        self._clock = clock
        self._fenced = fenced
        self._deciding = True
        # The tables are shared by the parts below; none of them calls back into this one.
        self._tables = tables = PoolTables(
            config=config,
            epoch=epoch,
            clock=clock,
            session_ttl_s=session_ttl_s,
            release_memory_s=release_memory_s,
        )
        self.pool = tables.pool
        self._answers = Answers()  # (holder, request id) -> the first answer
        self._keys = keys if keys is not None else ephemeral_keys()
        self.counters = counters if counters is not None else IdCounters()
        self._ids = IdGuard(
            pool=self.name,
            epoch=epoch,
            keys=self._keys,
            counters=self.counters,
            max_charge=config.max_charge(),
            clock=clock,
            max_charge_per_s=config.max_charge_per_s,
        )
        self._reports = ReReports(tables, self._ids, node)
        self._releases = Releases(tables, self._ids)
        self._waiting = Waiting(tables.pool, config, clock)
        # The committer runs the writer's writes: owner -> committer -> writer, one way.
        self._writer = PoolWriter(tables, log, clock)
        self._committer = GroupCommitter(
            self._writer.write,
            window_s=commit_window_s,
            lazy_s=release_commit_s,
            clock=clock,
            name=config.name,
        )

    # -- lifecycle ------------------------------------------------------------------

    def restore(self, snapshot: PoolSnapshot | None) -> tuple[int, int]:
        """Takes over the state a previous owner persisted.

        Returns:
            (teams whose usage was restored, phantoms added).
        """
        return self._tables.restore(snapshot)

    def restore_unreadable(self) -> int:
        """Takes over after a snapshot that could not be read: fails safe.

        Usage is lost, but no reserved slot is promised twice: every team counts its
        whole reservation as phantoms for ``max_request_s``, and no grant of an earlier
        epoch is taken as settled. Returns the phantoms added.
        """
        return self._tables.restore_unreadable()

    def can_decide(self) -> bool:
        """True while this owner may decide: not stopped, no write failed, fenced."""
        return self._deciding and not self._committer.failed and self._fenced()

    @property
    def lost(self) -> bool:
        """A fenced write failed: the pool must be given up."""
        return self._committer.failed

    def stop(self) -> None:
        """Stops deciding for good: ``can_decide()`` is False from now on, and every later
        decision raises NotDeciding. Writes already started still end; ``close`` writes
        the last one."""
        self._deciding = False
        self._waiting.stop()

    @property
    def changed(self) -> bool:
        """True when the state differs from what the latest write started encodes (or
        nothing was written yet in this epoch).

        Time alone changes nothing that must be written: usage is stored with the wall
        time it is decayed to, so a successor decays it on exactly as this owner does;
        phantoms, held grants and accounting entries past their horizon are dropped by
        a successor's restore as they are here. Only decisions, releases, adoptions,
        expiries of held grants and capacity changes make the state differ.
        """
        return self._writer.changed

    async def flush(self) -> None:
        """Writes the state now and waits for it. A failure is not raised: it marks the
        pool ``lost`` (the caller looks there)."""
        with contextlib.suppress(Exception):
            await self._committer.sync()

    async def close(self) -> None:
        """The final snapshot: writes the state once more (a failure is logged, not
        raised), then closes the writer: nothing is written for this epoch after it
        returns. Call ``stop`` first, or a decision may land after the last write."""
        try:
            await self._committer.sync()
        except Exception as e:
            logger.warning("pool %s: final snapshot failed: %s", self.name, e)
        await self._committer.close()

    @property
    def capacity(self) -> int:
        """The pool's live capacity (C), as this owner decides with it."""
        return self.pool.capacity

    def snapshot_age_s(self) -> float:
        """How long the stored state has lagged behind this owner's: 0 while the last
        successful write covers every change, else the seconds since the first change it
        does not cover; -1 before the first write of this epoch. An idle pool writes
        nothing and stays at 0."""
        return self._writer.snapshot_age_s()

    # -- decisions ------------------------------------------------------------------

    async def acquire(
        self,
        *,
        team: str,
        cls: Class,
        est_tokens: int,
        holder: str,
        request_id: str,
        try_only: bool,
        session: Session | None = None,
        wait_s: float = 0.0,
    ) -> Decision:
        """Decides one request; within-share grants are durable before they return, and
        so is the session a call opens. A request that would borrow past the pool's
        lending limit waits up to ``wait_s`` for a slot (``ha.owned.waiting``).

        The grant belongs to ``session`` (it lives as long as the session does), or to
        none (it lives at most ``max_request_s``).

        Raises:
            NotDeciding: the node may not decide for this pool now.
            InvalidArgument: bad team, class or tokens.
            PermissionDenied: ``session`` is open with another secret or holder.
            LimitExceeded: opening ``session`` would keep too many; or the request would
                borrow and the pool, or the holder session (the holder, without one),
                already has its bound of grants in flight (``ha.owned.bounds``), or it was
                held and the pool's ``on_wait_end`` refuses (``lend``, ``max_held``);
                nothing is counted or admitted.
        """
        if not self.can_decide():
            raise NotDeciding(self.name)
        opened = session is not None and self._tables.open_session(session, holder)
        sid = session.id if session is not None else ""
        # Two sessions of one holder name may reuse request ids: each has its own.
        key = (f"{holder}\x00{sid}" if sid else holder, request_id)
        if request_id:
            answered = self._answers.get(key)
            if answered is not None:
                await self.durable()  # the first answer may still be in its commit
                return answered.decision(self.node, self.epoch)
        within_share = self.pool.within_share_next(team)
        full = beyond(
            self.config,
            self.pool.capacity,
            self._tables.held,
            holding_of(holder, sid),
            within_share=within_share,
        )
        if full is not None:
            if opened:
                await self.durable()  # what the next grant of the session relies on
            raise full
        self._tables.admit(team)
        self._tables.touch()  # a team may be admitted even when nothing is granted
        grant = await self._grant(team, cls, est_tokens, try_only=try_only, wait_s=wait_s)
        if grant is None:
            answer = Answer(granted=False, grant_id="", priority=0, borrowing=False, saturated=True)
        else:
            self._tables.issued += 1
            seq = self._tables.issued
            ref = GrantRef(self.name, self.epoch, seq, team, holder, "", grant.borrowing, sid)
            held = self._tables.held.issue(seq, grant, holder, team, self._tables.now(), sid)
            self._tables.changes.counted(held.key, held.row)
            answer = Answer(
                granted=True,
                grant_id=self._keys.sign(ref),
                priority=grant.priority,
                borrowing=grant.borrowing,
                saturated=grant.saturated,
            )
        decision = answer.decision(self.node, self.epoch)
        if request_id:
            self._answers.remember(key, answer)
        if opened or (grant is not None and not grant.borrowing):
            await self.durable()
        return decision

    async def _grant(
        self, team: str, cls: Class, est_tokens: int, *, try_only: bool, wait_s: float
    ) -> Grant | None:
        """The core's decision, at once or after a wait for a lent slot (None: a
        ``try_only`` request found the pool full)."""
        try:
            if try_only:
                grant = self.pool.try_acquire(team, cls, est_tokens)
            else:
                grant = await self._waiting.acquire(team, cls, est_tokens, wait_s)
        except ValueError as e:
            raise invalid_argument(e) from e
        except Stopped:
            raise NotDeciding(self.name) from None
        if grant is not None and not self.can_decide():  # it waited: the owner stopped
            grant.release(0.0)
            raise NotDeciding(self.name)
        return grant

    def keep_alive(self, session: Session) -> bool:
        """Renews ``session``; False when it is not open here (never opened with this
        owner's pool, or lapsed: its grants no longer count).

        Raises:
            NotDeciding: the node may not decide for this pool now.
            PermissionDenied: the session is open with another secret.
        """
        if not self.can_decide():
            raise NotDeciding(self.name)
        return self._tables.sessions.renew(session, self._tables.now())

    @property
    def session_ttl_s(self) -> float:
        return self._tables.sessions.ttl_s

    def release(self, ref: GrantRef, consumed: float) -> None:
        """Ends a grant of this epoch or an earlier one; idempotent across owners
        (``ha.owned.releases``). A held borrower may take the slot it frees.

        Raises:
            WrongEpoch: the grant is of a later epoch than this owner's (it is stale).
            PermissionDenied: the id is not genuine (see ``ha.owned.genuine``).
        """
        self._releases.release(ref, consumed)
        self._waiting.wake()

    def adopt(
        self,
        *,
        holder: str,
        grants: Sequence[HeldGrant],
        complete: bool,
        session: Session | None = None,
    ) -> AdoptResult:
        """Counts a holder's live grants of earlier epochs again, and closes the phantoms a
        complete inventory did not claim (which ones: ``ha.owned.rereports``).

        Raises:
            NotDeciding: the node may not decide for this pool now (an adopt is a
                decision: it changes what the pool counts in flight).
            PermissionDenied: a grant id is not genuine, or is unsigned and names
                another holder, or ``session`` is open with another secret or holder;
                nothing is counted then.
            InvalidArgument: a grant is of another pool.
        """
        if not self.can_decide():
            raise NotDeciding(self.name)
        result = self._reports.adopt(
            holder=holder, grants=grants, complete=complete, session=session
        )
        self._waiting.wake()  # phantoms it closed free their slots
        return result

    def expire(self) -> int:
        """Ends the grants whose holder is presumed dead; returns how many.

        A grant of a holder session ends when its session lapses (nobody renewed it for
        ``session_ttl_s``), with every phantom of that session; a grant without one when
        it is older than ``max_request_s`` (no such request lives longer). Without this a
        dead gateway would keep its team's slots for ever. Nothing is charged now; a late
        release is, once, for what it consumed.
        """
        now = self._tables.now()
        self._tables.forget(now)  # phantoms end here too: the pool's never expire by themselves
        lapsed = self._tables.sessions.lapsed(now)
        for sid in lapsed:
            self._tables.uncount(self._tables.held.lapse(sid))
            self._tables.uncount(*self._tables.phantoms.close_session(sid))
            self._tables.changes.sessions[sid] = None
            self._tables.touch()
        if lapsed:
            logger.warning(
                "pool %s at epoch %d: %d holder sessions lapsed (not renewed for %gs); "
                "their grants and phantoms no longer count",
                self.name,
                self.epoch,
                len(lapsed),
                self._tables.sessions.ttl_s,
            )
            self._committer.nudge()
        horizon = now - self.config.max_request_s
        expired = len(keys := self._tables.held.expire(horizon))
        if expired:
            self._tables.uncount(keys)
            logger.warning(
                "pool %s at epoch %d: %d grants outlived max_request_s (%gs) unreleased; "
                "their holders are presumed dead",
                self.name,
                self.epoch,
                expired,
                self.config.max_request_s,
            )
            self._committer.nudge()
        self._waiting.wake()  # also phantoms that ended by themselves
        return expired

    def set_capacity(self, capacity: int) -> int:
        self._tables.touch()
        try:
            previous = self.pool.set_capacity(capacity)
        except ValueError as e:
            raise InvalidArgument("capacity", str(e)) from e
        self._waiting.wake()
        return previous

    def view(self) -> PoolView:
        teams, within = self._tables.team_tables()
        waiting = self._waiting.held_by_team()
        held = {stat.team: waiting.get(stat.team, 0) for stat in teams}
        return PoolView(
            self.name, self.pool.capacity, self.node, self.epoch, teams, within=within, held=held
        )

    def teams(self) -> Sequence[TeamStat]:
        """The pool's team table (Snapshot, metrics), as ``PoolTables.team_tables`` keeps it."""
        return self._tables.team_tables()[0]

    def held_back(self) -> Mapping[str, int]:
        """How many borrowers of each team wait for a lent slot now (``ha.owned.waiting``)."""
        return self._waiting.held_by_team()

    def within(self) -> Mapping[str, int]:
        """Every team's within-share count (``Pool.within``), as ``team_tables`` keeps it."""
        return self._tables.team_tables()[1]

    # -- persistence ----------------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        """The state to persist now (``ha.owned.writer``)."""
        return self._writer.snapshot()

    async def durable(self, *, lazy: bool = False) -> None:
        """Returns once a fenced write covers the state as of the call.

        Args:
            lazy: no request waits on it (a release): its write may start as late as
                ``release_commit_s`` after the previous write started, shared with other
                callers.

        Raises:
            NotDeciding: the write failed; the pool is lost.
        """
        try:
            await self._committer.sync(lazy=lazy)
        except CommitFailed as e:
            raise NotDeciding(f"{self.name}: durable write failed: {e}") from e
