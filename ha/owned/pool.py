"""One pool as decided by its owner during one epoch.

Its parts keep one table each: ``ha.owned.held`` (grants in flight), ``ha.owned.phantoms`` (the
previous owner's), ``ha.owned.settled`` (earlier grants nobody counted), ``ha.owned.answers``
(answers to retries), ``ha.owned.genuine`` (id checks, the charge bound), ``ha.owned.teams``
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
import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from itertools import chain

from fairshare import Class, Pool, TeamStat
from fairshare.limits import MAX_SESSIONS
from fairshare.sessions import Session
from ha.api import (
    DEGRADED_EPOCH,
    AdoptResult,
    Decision,
    Epoch,
    GrantRef,
    HeldGrant,
    InvalidArgument,
    LimitExceeded,
    NodeId,
    PermissionDenied,
    PoolName,
    PoolView,
    WrongEpoch,
)
from ha.clock import Clock, EpochTime
from ha.grantkeys import GrantKeys, ephemeral_keys
from ha.owned.answers import Answer, Answers
from ha.owned.bounds import beyond
from ha.owned.commit import CommitFailed, GroupCommitter
from ha.owned.genuine import IdCounters, IdGuard
from ha.owned.held import HeldGrants, holding_of
from ha.owned.journal import Changes, Journal, StateWriter, encode_checkpoint, encode_record
from ha.owned.phantoms import Phantoms
from ha.owned.sessions import Sessions
from ha.owned.settled import Settled
from ha.owned.snapshot import GrantKey, PoolSnapshot
from ha.owned.teams import admit, restorable
from ha.settings import PoolConfig

logger = logging.getLogger(__name__)

# A team table of more teams than this is built at most once per _VIEW_CACHE_S.
_FRESH_TEAMS = 64
_VIEW_CACHE_S = 1.0
# Expired phantoms and accounting entries are dropped at a write at most this often: a
# scan of every table at every write (hundreds a second) would cost more than the writes.
_FORGET_EVERY_S = 1.0


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
        # Every age within this epoch runs on the monotonic clock: a wall step must not
        # expire live grants (and let as many more in) nor decay usage. Wall time enters
        # only where owners meet: the snapshot a successor restores.
        self._now = EpochTime(clock)
        self._fenced = fenced
        self.pool = Pool(
            config.name,
            config.capacity,
            config.shares,
            half_life_s=config.half_life_s,
            clock=self._now,
        )
        self._deciding = True
        self._seq = 0
        self._held = HeldGrants(epoch, config.max_request_s)  # counted in flight
        # Earlier grants the previous owner counted, each standing for one phantom.
        self._phantoms = Phantoms(self.pool)
        self._earlier = Settled(config.name)  # earlier grants nobody counted (ha.owned.settled)
        self._sessions = Sessions(session_ttl_s, MAX_SESSIONS)
        self._answers = Answers()  # (holder, request id) -> the first answer
        self._teams_cache: tuple[float, Sequence[TeamStat], Mapping[str, int]] | None = None
        self._release_memory_s = release_memory_s
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
        self._log = log
        self._journal = Journal()
        self._last_write_mono = -1.0
        # What the snapshot holds changes only through the calls below (see ``changed``);
        # each bumps the version, and a write records the version it encodes.
        self._version = 0
        self._written = -1  # the version the latest write started encodes; -1: none yet
        self._behind_since: float | None = None  # monotonic: first change not yet durable
        self._forgot_at = -math.inf
        self._committer = GroupCommitter(
            self._persist,
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
        now = self._now()
        if snapshot is None:
            # Nothing was ever written, or it is gone: no earlier grant was counted.
            self._earlier.start_unknown(self.epoch, now)
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
        self._sessions.restore(((sid, d, h) for sid, (d, h) in snapshot.sessions.items()), now)
        self._phantoms.restore(
            snapshot.live, now=now, shift=shift, latest=latest, sessions=self._sessions
        )
        self._earlier.restore(snapshot, self.epoch, now, shift)
        self._forget(now)
        return len(snapshot.usage), len(self._phantoms)

    def restore_unreadable(self) -> int:
        """Takes over after a snapshot that could not be read: fails safe.

        Usage is lost, but no reserved slot is promised twice: every team counts its
        whole reservation as phantoms for ``max_request_s``, and no grant of an earlier
        epoch is taken as settled. Returns the phantoms added.
        """
        now = self._now()
        added = self._phantoms.fill(self.pool.reserved(), now + self.config.max_request_s)
        self._earlier.start_unknown(self.epoch, now)
        return added

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
        return self._version != self._written

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
        if self._last_write_mono < 0:
            return -1.0
        if self._behind_since is None:
            return 0.0
        return max(0.0, self._clock.monotonic() - self._behind_since)

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
    ) -> Decision:
        """Decides one request; within-share grants are durable before they return, and
        so is the session a call opens.

        The grant belongs to ``session`` (it lives as long as the session does), or to
        none (it lives at most ``max_request_s``).

        Raises:
            NotDeciding: the node may not decide for this pool now.
            InvalidArgument: bad team, class or tokens.
            PermissionDenied: ``session`` is open with another secret or holder.
            LimitExceeded: opening ``session`` would keep too many; or the request would
                borrow and the pool, or the holder session (the holder, without one),
                already has its bound of grants in flight (``ha.owned.bounds``); nothing is
                counted or admitted.
        """
        if not self.can_decide():
            raise NotDeciding(self.name)
        opened = session is not None and self._open(session, holder)
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
            self._held,
            holding_of(holder, sid),
            within_share=within_share,
        )
        if full is not None:
            if opened:
                await self.durable()  # what the next grant of the session relies on
            raise full
        self._admit(team)
        self._touch()  # a team may be admitted even when nothing is granted
        try:
            grant = (
                self.pool.try_acquire(team, cls, est_tokens)
                if try_only
                else self.pool.acquire(team, cls, est_tokens)
            )
        except ValueError as e:
            raise InvalidArgument(_field_of(e), str(e)) from e
        if grant is None:
            answer = Answer(granted=False, grant_id="", priority=0, borrowing=False, saturated=True)
        else:
            self._seq += 1
            ref = GrantRef(self.name, self.epoch, self._seq, team, holder, "", grant.borrowing, sid)
            held = self._held.issue(self._seq, grant, holder, team, self._now(), sid)
            self._changes.counted(held.key, held.row)
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

    def keep_alive(self, session: Session) -> bool:
        """Renews ``session``; False when it is not open here (never opened with this
        owner's pool, or lapsed: its grants no longer count).

        Raises:
            NotDeciding: the node may not decide for this pool now.
            PermissionDenied: the session is open with another secret.
        """
        if not self.can_decide():
            raise NotDeciding(self.name)
        return self._sessions.renew(session, self._now())

    @property
    def session_ttl_s(self) -> float:
        return self._sessions.ttl_s

    def _open(self, session: Session, holder: str) -> bool:
        """Checks and renews ``session`` for ``holder``; records it when this call opens
        it (returns True: the caller makes it durable before answering)."""
        if not self._sessions.check(session, holder, self._now()):
            return False
        self._changes.sessions[session.id] = (session.digest, holder)
        self._touch()
        return True

    def release(self, ref: GrantRef, consumed: float) -> None:
        """Ends a grant of this epoch or an earlier one; idempotent across owners.

        Raises:
            WrongEpoch: the grant is of a later epoch than this owner's (it is stale).
            PermissionDenied: the id is not genuine (see ``ha.owned.genuine``).
        """
        self._ids.check(ref, "grant_id")
        if ref.epoch > self.epoch:
            raise WrongEpoch(self.name, NodeId(""), "", ref.epoch)
        key = GrantKey(ref.epoch, ref.seq, ref.holder)
        own = ref.epoch == self.epoch
        held = self._held.take_own(key) if own else self._held.take_adopted(key)
        self._touch()
        changes = self._changes
        if held is not None:
            # A grant of a holder session may run past max_request_s: what it may have
            # consumed follows the time it was held.
            held_s = self._now() - held.wall
            held.grant.release(self._ids.bounded(ref, consumed, held_s=held_s))
            changes.dropped(held.key)
            changes.team(held.team)
            if not own:
                self._settle(key)
            return
        phantom = self._phantoms.take(key)
        if phantom is not None:
            # The previous owner counted it: charge it and close its phantom.
            team = phantom.team
            self.pool.charge(team, self._ids.bounded(ref, consumed))
            self._phantoms.drop(phantom)
            changes.dropped(key)
            changes.team(team)
            self._settle(key)
        elif self._earlier.is_settled(key):
            pass  # settled before: its consumption is already in the usage
        elif self._earlier.chargeable(key, signed=bool(ref.mac)):
            # No owner counts it (made after a crashed owner's last write, degraded, or
            # ended unreleased: its session lapsed, or it outlived max_request_s):
            # charge what it consumed, once.
            team = ref.team or "unknown"
            self._admit(team)
            self.pool.charge(team, self._ids.bounded(ref, consumed))
            changes.team(team)
            self._settle(key)
        elif not ref.mac:
            # A client-made degraded id no owner counted proves nothing: anyone can make
            # one. Its holder re-reports it (Adopt) before releasing it.
            self._ids.counters.unproven_releases += 1
        # Otherwise it was settled before the snapshot this owner restored: its
        # consumption is already in the usage.

    def adopt(
        self,
        *,
        holder: str,
        grants: Sequence[HeldGrant],
        complete: bool,
        session: Session | None = None,
    ) -> AdoptResult:
        """Counts a holder's live grants of earlier epochs again.

        Each is counted in the team, with the standing (``adopted_standing``) and in the
        session its id names, never those the holder claims; a grant of a session that is
        not open here (it lapsed) is not counted again. A grant the previous owner counted
        closes its own phantom; a grant nobody counted (see ``release``) is simply counted;
        a grant already settled is ignored.

        A complete inventory speaks for the caller's own grants only. Presented with a
        ``session``, it closes every phantom of that session it did not claim; without
        one, every phantom of ``holder`` made without a session, if it carries a signed
        grant of ``holder`` (an unsigned one proves nothing). Nobody closes another
        session's phantoms: two processes that share a holder name do not disturb each
        other.

        Raises:
            NotDeciding: the node may not decide for this pool now (an adopt is a
                decision: it changes what the pool counts in flight).
            PermissionDenied: a grant id is not genuine, or is unsigned and names
                another holder, or ``session`` is open with another secret or holder;
                nothing is counted then.
            InvalidArgument: a grant is of another pool.

        Borrowing grants (every unsigned one is) beyond the bounds on grants in flight
        (``ha.owned.bounds``, the pool's and the grant's holder's) are not counted, and
        logged: each keeps its
        phantom, if it has one, until it ends, and a complete inventory that left any out
        closes no other phantom (they stay until they expire: the cautious side).
        """
        if not self.can_decide():
            raise NotDeciding(self.name)
        refs = [GrantRef.decode(held.grant_id) for held in grants]
        proven = self._check_adopted(holder, refs)
        if session is not None:
            self._open(session, holder)
        self._touch()
        adopted = 0
        dropped = 0
        left_out = 0  # grants beyond the in-flight bounds
        full: LimitExceeded | None = None
        for held, ref in zip(grants, refs, strict=True):
            key = GrantKey(ref.epoch, ref.seq, ref.holder)
            if not self._counts_again(key, ref):
                continue
            recorded = self._phantoms.get(key)
            borrowing = adopted_standing(ref, None if recorded is None else recorded.borrowing)
            met = beyond(
                self.config,
                self.pool.capacity,
                self._held,
                holding_of(ref.holder, ref.session),
                within_share=not borrowing,
            )
            if met is not None:
                left_out, full = left_out + 1, met  # its phantom, if any, counts on
                continue
            # The id's team, never the one the holder claims: a grant signed for one team
            # re-reported as another would be counted and charged there.
            team = ref.team or held.team
            self._admit(team)
            try:
                grant = self.pool.adopt(team, held.priority, borrowing, held.est_tokens)
            except ValueError as e:
                raise InvalidArgument(f"grants.{_field_of(e)}", str(e)) from e
            phantom = self._phantoms.take(key)
            # It keeps the deadline its phantom had: re-counting does not extend a request.
            issued = self._now() if phantom is None else phantom.until - self.config.max_request_s
            kept = self._held.adopt(key, grant, issued, unsigned=not ref.mac, session=ref.session)
            self._changes.counted(key, kept.row)
            adopted += 1
            if phantom is not None and self._phantoms.drop(phantom):
                dropped += 1
        if full is not None:
            logger.warning(
                "pool %s at epoch %d: %d grants re-reported by holder %r are not counted "
                "again (%s); their phantoms count on until they end%s",
                self.name,
                self.epoch,
                left_out,
                holder,
                full,
                ", and so do the caller's unclaimed ones" if complete else "",
            )
        elif complete:
            # (With grants left out, the unclaimed phantoms cannot be told from theirs.)
            dropped += self._close_unclaimed(holder, session, proven)
        return AdoptResult(adopted, dropped, self.node, self.epoch)

    def _counts_again(self, key: GrantKey, ref: GrantRef) -> bool:
        """Whether a re-reported grant of an earlier epoch is counted again: not when it is
        counted already or was released, nor when its session lapsed; only when the
        previous owner counted it (a phantom) or no owner ever did (see ``release``)."""
        if ref.epoch >= self.epoch or self._held.adopted(key) or self._earlier.is_settled(key):
            return False
        if ref.session and not self._sessions.live(ref.session):
            return False
        return key in self._phantoms or self._earlier.chargeable(key)

    def _check_adopted(self, holder: str, refs: Sequence[GrantRef]) -> bool:
        """Checks every re-reported grant before any is counted; returns whether one of
        them is a signed grant of ``holder`` (what lets a complete inventory close its
        phantoms).

        Raises:
            InvalidArgument: a grant is of another pool.
            PermissionDenied: a grant id is not genuine, or is unsigned and names another
                holder.
        """
        proven = False
        for i, ref in enumerate(refs):
            field = f"grants[{i}].grant_id"
            if ref.pool != self.name:
                raise InvalidArgument(field, f"grant of pool {ref.pool!r}, not {self.name!r}")
            self._ids.check(ref, field)
            if not ref.mac and ref.holder != holder:
                self._ids.refused()
                raise PermissionDenied(
                    field, f"an unsigned grant of holder {ref.holder!r} adopted by {holder!r}"
                )
            proven = proven or (bool(ref.mac) and ref.holder == holder)
        return proven

    def _close_unclaimed(self, holder: str, session: Session | None, proven: bool) -> int:
        """After a complete inventory: closes the phantoms it did not claim, those of
        ``session``, or without one those of ``holder`` made without a session if
        ``proven`` (it carried a signed grant of ``holder``; else they are left to expire);
        returns how many phantoms the pool dropped."""
        if session is not None:
            return self._uncount(*self._phantoms.close_session(session.id))
        if not proven:
            if self._phantoms.holds(holder):
                logger.warning(
                    "pool %s at epoch %d: a complete re-report for holder %r carries no "
                    "signed grant of it; its phantoms stay until they expire",
                    self.name,
                    self.epoch,
                    holder,
                )
            return 0
        # The holder does not hold these any more: their releases may still be on the way,
        # so they stay chargeable, but they no longer count in flight.
        return self._uncount(*self._phantoms.close(holder))

    def _uncount(self, keys: list[GrantKey], ended: int = 0) -> int:
        """Records grants (or phantoms) that no longer count in flight but whose release
        may still come and must be charged once; returns ``ended``."""
        if not keys:
            return ended
        now = self._now()
        self._earlier.uncount(keys, now)
        for key in keys:
            self._changes.dropped(key)
            if key in self._earlier.uncounted:  # not dropped at once by the table's cap
                self._changes.uncounted[key] = now
        self._touch()
        return ended

    def expire(self) -> int:
        """Ends the grants whose holder is presumed dead; returns how many.

        A grant of a holder session ends when its session lapses (nobody renewed it for
        ``session_ttl_s``), with every phantom of that session; a grant without one when
        it is older than ``max_request_s`` (no such request lives longer). Without this a
        dead gateway would keep its team's slots for ever. Nothing is charged now; a late
        release is, once, for what it consumed.
        """
        now = self._now()
        self._forget(now)  # phantoms end here too: the pool's never expire by themselves
        lapsed = self._sessions.lapsed(now)
        for sid in lapsed:
            self._uncount(self._held.lapse(sid))
            self._uncount(*self._phantoms.close_session(sid))
            self._changes.sessions[sid] = None
            self._touch()
        if lapsed:
            logger.warning(
                "pool %s at epoch %d: %d holder sessions lapsed (not renewed for %gs); "
                "their grants and phantoms no longer count",
                self.name,
                self.epoch,
                len(lapsed),
                self._sessions.ttl_s,
            )
            self._committer.nudge()
        horizon = now - self.config.max_request_s
        expired = len(keys := self._held.expire(horizon))
        if expired:
            self._uncount(keys)
            logger.warning(
                "pool %s at epoch %d: %d grants outlived max_request_s (%gs) unreleased; "
                "their holders are presumed dead",
                self.name,
                self.epoch,
                expired,
                self.config.max_request_s,
            )
            self._committer.nudge()
        return expired

    def set_capacity(self, capacity: int) -> int:
        self._touch()
        try:
            return self.pool.set_capacity(capacity)
        except ValueError as e:
            raise InvalidArgument("capacity", str(e)) from e

    def view(self) -> PoolView:
        teams, within = self._tables()
        return PoolView(self.name, self.pool.capacity, self.node, self.epoch, teams, within=within)

    def teams(self) -> Sequence[TeamStat]:
        """The pool's team table (Snapshot, metrics), as ``_tables`` keeps it."""
        return self._tables()[0]

    def within(self) -> Mapping[str, int]:
        """Every team's within-share count (``Pool.within``), as ``_tables`` keeps it."""
        return self._tables()[1]

    def _tables(self) -> tuple[Sequence[TeamStat], Mapping[str, int]]:
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

    # -- persistence ----------------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        """The state to persist now."""
        state = self._state()
        return dataclasses.replace(state, live=self._held.live() + self._phantoms.live())

    def _state(self) -> PoolSnapshot:
        """The state to persist now, but for the requests in flight."""
        now = self._now()
        if now >= self._forgot_at + _FORGET_EVERY_S:
            self._forget(now)
        usage, _ = self.pool.usage()
        return PoolSnapshot(
            pool=self.name,
            epoch=self.epoch,
            wall=now,
            capacity=self.pool.capacity,
            usage=usage,
            issued=self._seq,
            unknown_after=dict(self._earlier.unknown_after),
            unknown_between=list(self._earlier.unknown_between),
            uncounted=dict(self._earlier.uncounted),
            settled=dict(self._earlier.settled),
            configured=self.config.capacity,
            sessions={sid: (d, h) for sid, d, h in self._sessions.rows()},
        )

    async def _persist(self) -> None:
        # A record of what changed since the previous write when the journal allows it
        # (``ha.owned.journal``): its cost follows the changes, not the requests in flight. A
        # checkpoint otherwise, from the rows each request keeps encoded.
        now = self._now()
        if now >= self._forgot_at + _FORGET_EVERY_S:
            self._forget(now)
        changes = self._journal.take()
        self._written = version = self._version  # nothing changes it before the encoding
        record = None if self._journal.due else self._record(changes, now)
        started = self._clock.monotonic()
        if record is not None:
            self._journal.recorded(len(record))
            await self._log.append(record)
        else:
            checkpoint = encode_checkpoint(
                self._state(), chain(self._held.rows(), self._phantoms.rows())
            )
            self._journal.checkpointed(checkpoint.size)
            await self._log.checkpoint(checkpoint)
        self._last_write_mono = self._clock.monotonic()
        if version == self._version:
            self._behind_since = None
        elif self._behind_since is not None:
            # Changes made during the write are not in it: they lag since it started at
            # the latest.
            self._behind_since = max(self._behind_since, started)

    def _record(self, changes: Changes, now: float) -> bytes | None:
        """The record of ``changes`` as of ``now``; None when too large for one."""
        return encode_record(
            epoch=self.epoch,
            wall=now,
            capacity=self.pool.capacity,
            issued=self._seq,
            usage={team: self.pool.usage_of(team) for team in changes.teams},
            changes=changes,
        )

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

    # -- internals --------------------------------------------------------------------

    def _touch(self) -> None:
        """Records a change of the state a snapshot holds (see ``changed``)."""
        self._version += 1
        if self._behind_since is None:
            self._behind_since = self._clock.monotonic()

    @property
    def _changes(self) -> Changes:
        return self._journal.changes

    def _admit(self, team: str) -> None:
        if team and not self.pool.knows(team):
            admit(self.pool, self.config, team)
            self._changes.team(team)

    def _settle(self, key: GrantKey) -> None:
        now = self._now()
        if self._earlier.settle(key, now):
            self._changes.settled[key] = now

    def _forget(self, now: float) -> None:
        """Drops what no request can outlive: phantoms, windows and settled entries older
        than ``max_request_s``."""
        self._forgot_at = now
        self._phantoms.forget(now, self._sessions)
        self._earlier.forget(now - max(self.config.max_request_s, self._release_memory_s))


def adopted_standing(ref: GrantRef, recorded: bool | None) -> bool:
    """Whether a re-reported grant counts as a borrower (True) or within share.

    Never the holder's word, which could give its team more within-share grants than its
    reservation: the standing its signed id carries; for a degraded grant (epoch 0),
    borrowing, as every degraded grant is; else the standing the previous owner recorded
    (``recorded``, its phantom's); else, unknown (an id issued before ids carried it, not
    in the restored state), within share: the safe side, it can only make new requests of
    its team borrow.
    """
    if ref.borrowing is not None:
        return ref.borrowing
    if ref.epoch == DEGRADED_EPOCH:
        return True
    return bool(recorded)


def _field_of(error: ValueError) -> str:
    text = str(error)
    names = {"class": "service_class"}
    for field in ("team", "est_tokens", "class", "priority", "capacity"):
        if text.startswith(field):
            return names.get(field, field)
    return "request"
