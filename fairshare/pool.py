"""One capacity domain: reservations with borrowing, ranked by Slurm's Fair Tree.

Everything here is deterministic and does no I/O: time comes in through the injected
``clock``, so the same calls give the same answers in unit, property and drill tests.

This module holds the decisions (standing and priority of each request), the counts in
flight, the phantoms, the capacity and the lending limit (the idle reserved slots each
team keeps back from borrowers, docs/spec.md §17). The teams a pool knows, their usage
decayed on the pool's reference time and the dense ranks of their level fairshare are
``fairshare.roster``'s; a pool's grants are ``fairshare.grant``'s, its per-team state
``fairshare.team``'s.

Cost: ``acquire`` + ``release`` is O(log T) in the number of teams T: a charge is one
multiplication and a team's dense rank one bisection (``fairshare.roster`` says why). The
slots kept back are summed as they change (each change of a team's within-share count
updates its term), so ``acquire_lent``, ``lend_room`` and ``kept_back`` cost what
``acquire`` does.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping

from fairshare.apportion import apportion, kept_back
from fairshare.grant import Grant, consumption
from fairshare.priority import Class, borrowing_priority, within_share_priority
from fairshare.roster import NEGLIGIBLE_FRACTION, Roster
from fairshare.shares import check_lend, check_shares
from fairshare.team import TeamStat, TeamState

__all__ = ["NEGLIGIBLE_FRACTION", "Grant", "Pool", "TeamStat", "check_request"]


def check_request(team: str, cls: Class | int, est_tokens: int) -> Class:
    """Checks what a request names and returns its class as a ``Class``.

    Raises:
        ValueError: empty (or non-string) team, class outside ``Class`` (a ``bool``
            included; plain ints 0 and 1 are accepted), or ``est_tokens`` not an int >= 0.
    """
    if not isinstance(team, str) or not team:
        raise ValueError("team must be a non-empty string")
    if isinstance(cls, bool) or not isinstance(cls, int):
        raise ValueError(f"class must be a Class, got {cls!r}")
    try:
        checked = Class(cls)
    except ValueError:
        raise ValueError(f"class must be a Class, got {cls!r}") from None
    if isinstance(est_tokens, bool) or not isinstance(est_tokens, int) or est_tokens < 0:
        raise ValueError(f"est_tokens must be an int >= 0, got {est_tokens!r}")
    return checked


class Pool:
    """One capacity domain with concurrency C shared by teams.

    A request within its team's reservation (``share x C`` slots, see ``apportion``) gets
    ``WITHIN_SHARE_BASE + class``; a request above it borrows idle capacity with
    ``BORROW_BASE + RANK_STEP * min(rank, MAX_RANK) + class``, where rank is the dense
    rank of the team's level fairshare among all teams the pool knows, highest first.

    Each team lends borrowers at most ``floor(lend x gap)`` of its idle reserved slots
    (``gap = max(0, reservation - within-share count)``) and keeps the rest back;
    ``acquire_lent`` lets a borrower in only while the pool's count in flight plus the
    slots kept back is below C. ``acquire`` ignores the limit.

    Every method is safe to call from several threads at once.
    """

    def __init__(
        self,
        name: str,
        capacity: int,
        shares: Mapping[str, float],
        *,
        half_life_s: float = 7 * 24 * 3600.0,
        clock: Callable[[], float] | None = None,
        lend: Mapping[str, float] | None = None,
    ) -> None:
        """Creates a pool.

        Args:
            name: the pool's name.
            capacity: its sustainable concurrency C, an int >= 0.
            shares: team -> share, a valid shares map (see ``check_shares``); teams
                missing here have share 0.
            half_life_s: usage half-life in seconds; 0 disables decay.
            clock: wall-clock seconds, ``time.time`` by default.
            lend: team -> the fraction of its idle reserved slots it lends to borrowers,
                a valid lend map (see ``check_lend``); teams missing here lend 1.0
                (keep nothing back). None: every team lends 1.0.

        Raises:
            ValueError: bad capacity, share, lend fraction or half-life.
        """
        if isinstance(half_life_s, bool) or not isinstance(half_life_s, int | float):
            raise ValueError(f"half_life_s must be a number, got {half_life_s!r}")
        if not math.isfinite(half_life_s) or half_life_s < 0:
            raise ValueError(f"half_life_s must be finite and >= 0, got {half_life_s!r}")
        checked = check_shares(shares)
        lent = check_lend(lend if lend is not None else {})
        reserved = apportion(capacity, checked.keys(), checked)
        self._name = name
        self._capacity = capacity
        self._shares = checked
        lam = math.log(2) / half_life_s if half_life_s > 0 else 0.0
        self._clock: Callable[[], float] = clock if clock is not None else time.time
        self._lock = threading.Lock()
        # Every team the pool knows: its state, its usage and its rank.
        self._roster = Roster(checked, lam=lam, t_ref=self._clock())
        self._in_flight = 0  # grants of every team
        self._phantoms = 0  # live phantoms of every team, as of the last expiry sweep
        self._next_expiry = math.inf
        self._lend = lent
        self._kept = 0  # the sum of every team's TeamState.kept
        for team in sorted(self._shares):
            self._touch(self._roster.register(team, reserved.get(team, 0)))

    # -- properties -----------------------------------------------------------------

    @property
    def name(self) -> str:
        """The pool's name."""
        return self._name

    @property
    def capacity(self) -> int:
        """The pool's concurrency C."""
        return self._capacity

    @property
    def decay_rate(self) -> float:
        """Usage decay rate lambda = ln 2 / half-life, in 1/s (0 when decay is off)."""
        return self._roster.lam

    @property
    def team_count(self) -> int:
        """How many teams the pool knows now (configured ones included)."""
        return len(self._roster.states)

    def knows(self, team: str) -> bool:
        """Whether the pool has state for ``team`` now."""
        return team in self._roster.states

    def prune(self, keep: int) -> int:
        """Forgets idle teams until at most ``keep`` teams are known, if it can.

        Only a team without configured share, with nothing in flight (no grant, no
        phantom) and negligible decayed usage (see ``NEGLIGIBLE_FRACTION``) is forgotten,
        smallest usage first; it comes back, from nothing, when next named. Forgetting one
        changes no team's rank (a team without share ranks last whatever its usage).
        Cost: O(log T) per team forgotten, O(log T) when none can be.

        Returns:
            The number of teams forgotten.
        """
        with self._lock:
            self._expire(self._clock())
            return self._roster.prune(keep)

    # -- decisions ------------------------------------------------------------------

    def acquire(self, team: str, cls: Class = Class.INTERACTIVE, est_tokens: int = 0) -> Grant:
        """Counts a new request of ``team`` in flight and returns its standing.

        The request is within share iff the team's within-share count before it is
        below the team's reservation: its within-share grants in flight plus its live
        phantoms whose standing is within share or unknown. Borrowers do not use up the
        reservation, so a team that keeps more than its reservation in flight holds
        exactly its reservation within share once warm. It borrows otherwise.
        ``saturated`` tells whether the pool already had C or more in flight.

        Raises:
            ValueError: empty team, class outside ``Class``, or ``est_tokens`` < 0.
        """
        cls = check_request(team, cls, est_tokens)
        with self._lock:
            return self._decide(team, cls, est_tokens)

    def try_acquire(
        self, team: str, cls: Class = Class.INTERACTIVE, est_tokens: int = 0
    ) -> Grant | None:
        """``acquire`` only if the pool has fewer than C in flight (phantoms included).

        Decided and recorded atomically, so a fallback that moves a request to this pool
        never pushes it past C. Returns None when the pool is full.
        """
        cls = check_request(team, cls, est_tokens)
        with self._lock:
            self._expire(self._clock())
            if self._in_flight + self._phantoms >= self._capacity:
                return None
            return self._decide(team, cls, est_tokens)

    def acquire_lent(
        self, team: str, cls: Class = Class.INTERACTIVE, est_tokens: int = 0
    ) -> Grant | None:
        """``acquire``, unless the request would borrow a slot that no team lends.

        Decides exactly as ``acquire`` does, atomically: a request within its team's
        share is always counted and returned; one that would borrow is counted only if
        ``lend_room() > 0`` (in flight + phantoms + ``kept_back()`` < C), else None is
        returned and nothing is counted (nor is a team the pool did not know learnt).
        So a borrower granted here leaves in flight + phantoms + kept back <= C. With
        every team lending 1.0 it refuses a borrower exactly when ``saturated`` would be
        true. Cost: as ``acquire``.

        Raises:
            ValueError: as ``acquire``.
        """
        cls = check_request(team, cls, est_tokens)
        with self._lock:
            self._expire(self._clock())
            state = self._roster.states.get(team)
            within = state is not None and state.within < state.reserved
            if not within and self._room() <= 0:
                return None
            return self._decide(team, cls, est_tokens)

    def adopt(self, team: str, priority: int, borrowing: bool, est_tokens: int = 0) -> Grant:
        """Counts a request decided earlier as in flight with the standing it already has.

        For requests decided by a previous owner of the pool, or admitted while no owner
        was reachable. Nothing is decided: the grant carries the given priority.

        Raises:
            ValueError: empty team, a priority that is not an int, or ``est_tokens`` < 0.
        """
        check_request(team, Class.INTERACTIVE, est_tokens)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"priority must be an int, got {priority!r}")
        with self._lock:
            state = self._roster.team(team)
            self._count(state, bool(borrowing), est_tokens)
            return Grant(
                team=team,
                priority=priority,
                borrowing=bool(borrowing),
                saturated=False,
                est_tokens=est_tokens,
                pool=self,
                state=state,
            )

    # -- phantoms, usage and capacity -----------------------------------------------

    def add_phantoms(self, team: str, n: int, until: float, *, borrowing: bool = False) -> None:
        """Counts ``n`` requests of ``team`` in flight until wall time ``until``.

        Phantoms have no grant: they stand for requests that may still run but that
        nobody can release. ``borrowing`` is their standing when it is known to be
        borrowing; otherwise (within share, or unknown) they count in the team's
        within-share count, the safe side: new requests can only borrow more because of
        them. ``n <= 0`` or ``until <= now`` does nothing; expired phantoms stop counting
        by themselves.
        """
        if n <= 0 or not team:
            return
        with self._lock:
            now = self._clock()
            self._expire(now)
            if not until > now:  # also refuses NaN
                return
            state = self._roster.team(team)
            phantoms = state.phantom_list(bool(borrowing))
            in_order = not phantoms or until >= phantoms[-1]
            phantoms.extend([until] * n)
            if not in_order:
                phantoms.sort()
            self._phantoms += n
            self._next_expiry = min(self._next_expiry, phantoms[0])
            self._touch(state)

    def drop_phantom(self, team: str, *, borrowing: bool = False) -> bool:
        """Removes the team's live phantom of that standing that would last longest.

        ``borrowing`` as given to ``add_phantoms``: phantoms known to borrow, or those
        counted as within share.

        Returns:
            False if the team had no live phantom of that standing.
        """
        with self._lock:
            self._expire(self._clock())
            state = self._roster.states.get(team)
            if state is None:
                return False
            phantoms = state.phantom_list(bool(borrowing))
            if not phantoms:
                return False
            phantoms.pop()
            self._phantoms -= 1
            self._touch(state)
            return True

    def charge(self, team: str, consumed: float) -> None:
        """Adds consumption to the team's usage without a grant.

        For the release of a request this pool never counted. Negative, NaN or infinite
        consumption counts as 0.
        """
        if not team:
            raise ValueError("team must be a non-empty string")
        amount = consumption(consumed)
        with self._lock:
            state = self._roster.team(team)
            self._roster.charge(state, amount, self._clock())

    def set_usage(self, team: str, usage: float) -> None:
        """Sets the team's decayed usage as of now (restored from a previous owner).

        Negative, NaN or infinite values count as 0.
        """
        if not team:
            raise ValueError("team must be a non-empty string")
        value = consumption(usage)
        with self._lock:
            state = self._roster.team(team)
            self._roster.set_usage(state, value, self._clock())

    def usage(self) -> tuple[dict[str, float], dict[str, int]]:
        """Every known team's usage decayed to now and its in-flight count.

        The in-flight count includes live phantoms: this is what an owner persists for
        the next one.
        """
        with self._lock:
            now = self._clock()
            self._expire(now)
            factor = self._roster.decay_factor(now)
            teams = self._roster.states
            usage = {name: t.stored * factor for name, t in teams.items()}
            in_flight = {name: t.in_flight + t.phantoms for name, t in teams.items()}
            return usage, in_flight

    def usage_of(self, team: str) -> float:
        """The team's usage decayed to now; 0 for a team the pool does not know. O(1)."""
        with self._lock:
            state = self._roster.states.get(team)
            if state is None:
                return 0.0
            return state.stored * self._roster.decay_factor(self._clock())

    def set_capacity(self, c: int) -> int:
        """Changes C and recomputes the reservations; returns the previous C.

        Requests in flight keep their standing; new ones are judged against the new
        reservations: after a lowered reservation a team's new requests borrow until its
        within-share count is below the new reservation (nothing in flight is demoted).

        Raises:
            ValueError: ``c`` is not an int >= 0.
        """
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise ValueError(f"capacity must be an int >= 0, got {c!r}")
        reserved = apportion(c, self._shares.keys(), self._shares)
        with self._lock:
            previous = self._capacity
            self._capacity = c
            for name, state in self._roster.states.items():
                state.reserved = reserved.get(name, 0)
                self._touch(state)
            return previous

    def set_lend(self, lend: Mapping[str, float]) -> None:
        """Replaces every team's lend fraction; teams missing from ``lend`` lend 1.0.

        Nothing in flight changes; the slots kept back (and so ``lend_room``) follow at
        once. O(T).

        Raises:
            ShareError: ``lend`` is not a valid lend map (a ``ValueError``).
        """
        checked = check_lend(lend)
        with self._lock:
            self._lend = checked
            for state in self._roster.states.values():
                self._touch(state)

    def kept_back(self) -> int:
        """The idle reserved slots every team keeps back from borrowers now, summed: for
        each team ``gap - floor(lend x gap)`` with ``gap = max(0, reservation -
        within-share count)``. 0 when every team lends 1.0. O(1) (and expired phantoms)."""
        with self._lock:
            self._expire(self._clock())
            return self._kept

    def lend_room(self) -> int:
        """C - in flight - live phantoms - ``kept_back()``: how many more borrowers
        ``acquire_lent`` would let in now if nothing else changed. May be 0 or
        negative (``acquire`` and within-share requests do not look at it). O(1)."""
        with self._lock:
            self._expire(self._clock())
            return self._room()

    # -- views ----------------------------------------------------------------------

    def reserved(self) -> dict[str, int]:
        """Within-share slots per known team."""
        with self._lock:
            return {name: t.reserved for name, t in self._roster.states.items()}

    def priority_next(self, team: str, cls: Class = Class.INTERACTIVE) -> int:
        """The priority ``team``'s next ``acquire`` of class ``cls`` would get if decided
        now (the within-share one, or the borrowing one at the team's rank; a team the
        pool does not know ranks as one without share). Decides and counts nothing.
        O(log T).

        Raises:
            ValueError: empty team or class outside ``Class``.
        """
        cls = check_request(team, cls, 0)
        with self._lock:
            self._expire(self._clock())
            state = self._roster.states.get(team)
            if state is not None and state.within < state.reserved:
                return within_share_priority(cls)
            return borrowing_priority(self._roster.rank_of(team), cls)

    def within_share_next(self, team: str) -> bool:
        """Whether ``team``'s next ``acquire`` would be within share, if decided now: its
        within-share count is below its reservation. False for a team the pool does not
        know (it would have share 0). O(1); changes nothing but expired phantoms."""
        with self._lock:
            self._expire(self._clock())
            state = self._roster.states.get(team)
            return state is not None and state.within < state.reserved

    def within(self) -> dict[str, int]:
        """Every known team's within-share count: its grants in flight admitted within
        share plus its live phantoms whose standing is within share or unknown. A team's
        next request is within share iff its count is below its reservation."""
        with self._lock:
            self._expire(self._clock())
            return {name: t.within for name, t in self._roster.states.items()}

    def snapshot(self) -> list[TeamStat]:
        """Every known team's state, sorted by team name."""
        with self._lock:
            now = self._clock()
            self._expire(now)
            return self._roster.stats(now)

    # -- internals (callers hold self._lock unless said otherwise) --------------------

    def _room(self) -> int:
        return self._capacity - self._in_flight - self._phantoms - self._kept

    def _touch(self, state: TeamState) -> None:
        """After any change of the team's within-share count or reservation, or of the
        lend map: recounts what it keeps back and keeps the roster's indexes in step."""
        kept = kept_back(state.reserved, state.within, self._lend.get(state.name, 1.0))
        self._kept += kept - state.kept
        state.kept = kept
        self._roster.touch(state)

    def _decide(self, team: str, cls: Class, est_tokens: int) -> Grant:
        self._expire(self._clock())
        state = self._roster.team(team)
        saturated = self._in_flight + self._phantoms >= self._capacity
        borrowing = state.within >= state.reserved
        if borrowing:
            priority = borrowing_priority(self._roster.rank(state), cls)
        else:
            priority = within_share_priority(cls)
        self._count(state, borrowing, est_tokens)
        return Grant(
            team=team,
            priority=priority,
            borrowing=borrowing,
            saturated=saturated,
            est_tokens=est_tokens,
            pool=self,
            state=state,
        )

    def _count(self, state: TeamState, borrowing: bool, est_tokens: int) -> None:
        state.in_flight += 1
        state.tokens += est_tokens
        if borrowing:
            state.borrowing += 1
        self._in_flight += 1
        self._touch(state)

    def _release(self, grant: Grant, amount: float) -> None:
        """Called by ``Grant.release`` without the lock held."""
        with self._lock:
            if grant._released:
                return
            grant._released = True
            state = grant._state
            assert state is not None
            state.in_flight -= 1
            state.tokens -= grant._est_tokens
            if grant._borrowing:
                state.borrowing -= 1
            self._in_flight -= 1
            if amount > 0.0:
                self._roster.charge(state, amount, self._clock())
            self._touch(state)

    def _expire(self, now: float) -> None:
        """Drops phantoms whose time has come and finds the next expiry."""
        if now < self._next_expiry:
            return
        next_expiry = math.inf
        for state in self._roster.states.values():
            for phantoms in (state.within_phantoms, state.borrowing_phantoms):
                if not phantoms:
                    continue
                live = 0
                while live < len(phantoms) and phantoms[live] <= now:
                    live += 1
                if live:
                    del phantoms[:live]
                    self._phantoms -= live
                    self._touch(state)
                if phantoms:
                    next_expiry = min(next_expiry, phantoms[0])
        self._next_expiry = next_expiry
