"""The teams one pool knows: their state, their decayed usage and their dense ranks.

A ``Roster`` belongs to one ``fairshare.pool.Pool`` and is guarded by that pool's lock;
nothing here locks, reads a clock or does I/O (the pool passes ``now`` in).

Usage is stored scaled to a reference time: ``stored = usage(now) * exp(lam * (now -
t_ref))``. With one decay rate per pool every team's usage decays by the same factor, so
the order of the level fairshare values changes only when a team's stored usage does
(a charge, a restored usage), and a charge is one multiplication. The distinct ordering
keys live in a ``fairshare.ranking.DenseRanks``, so a team's dense rank is one bisection.

Guaranteed, after every method returns:

- each team's ``key`` is ``level_key(share, stored)`` and is counted once in the ranks;
- ``stored_total`` is the sum of every team's stored usage (up to rounding);
- a team is in the prunable list, keyed by its stored usage, iff it has no configured
  share and nothing in flight (no grant, no phantom), provided the caller calls ``touch``
  after changing its in-flight counts or phantoms.

Not guaranteed: anything about phantoms that have ended but were not swept yet (the pool
sweeps them), or about states the caller changed without ``touch``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

from sortedcontainers import SortedList

from fairshare.ranking import DenseRanks, level_key
from fairshare.team import TeamStat, TeamState

NEGLIGIBLE_FRACTION: Final = 2.0**-20
"""A team's decayed usage is negligible when it is at most this fraction (about one
millionth) of the pool's total decayed usage, or when the pool has no usage at all. Usage
of a team without share does not affect any rank (its level fairshare is 0 whatever it
used): it only enters the reported level fairshare of others, through the total, and a
millionth of it is below anything an operator reads there."""

# Once usage is stored scaled by more than e**_REBASE_EXPONENT, every team is rescaled to
# the present (O(T), and rare: about every 90 half-lives).
_REBASE_EXPONENT: Final = 64.0


class Roster:
    """Every team one pool knows, with the indexes kept in step with their state.

    ``states`` maps each known team to its ``TeamState``; callers read it and change a
    state's reservation, in-flight counts and phantoms (then ``touch`` it), never its
    usage or key, and add or remove teams only through ``register``, ``team`` and
    ``prune``.
    """

    __slots__ = (
        "_idle",
        "_ranks",
        "_share_total",
        "_shares",
        "lam",
        "states",
        "stored_total",
        "t_ref",
    )

    def __init__(self, shares: Mapping[str, float], *, lam: float, t_ref: float) -> None:
        """An empty roster.

        Args:
            shares: team -> share, already checked; teams missing here have share 0.
            lam: the usage decay rate, in 1/s (0: no decay).
            t_ref: the reference time stored usage is scaled to, in the pool's clock.
        """
        self._shares = shares
        self._share_total = math.fsum(shares.values())
        self.lam = lam
        self.t_ref = t_ref
        self.states: dict[str, TeamState] = {}
        # Every team's ordering key, for dense ranks.
        self._ranks = DenseRanks()
        # Teams without share and with nothing in flight, by stored usage: the candidates
        # for ``prune``. ``stored_total`` is the sum of every team's stored usage.
        self._idle = SortedList()
        self.stored_total = 0.0

    # -- teams ----------------------------------------------------------------------

    def team(self, name: str) -> TeamState:
        """The team's state, registered (reservation 0) if the roster does not know it."""
        state = self.states.get(name)
        if state is None:
            state = self.register(name, 0)
        return state

    def register(self, name: str, reserved: int) -> TeamState:
        """Adds a team the roster does not know, with no usage and nothing in flight."""
        state = TeamState(name, self._shares.get(name, 0.0), reserved)
        state.key = level_key(state.share, state.stored)
        self.states[name] = state
        self._ranks.add(state.key)
        self.touch(state)
        return state

    def touch(self, state: TeamState) -> None:
        """Keeps the team's entry in the prunable list in step with its state."""
        entry = None
        if state.in_flight == 0 and not state.phantoms and state.name not in self._shares:
            entry = (state.stored, state.name)
        if entry != state.idle:
            if state.idle is not None:
                self._idle.remove(state.idle)
            if entry is not None:
                self._idle.add(entry)
            state.idle = entry

    def prune(self, keep: int) -> int:
        """Forgets idle teams with negligible usage, smallest first, until at most
        ``keep`` are known or none is left to forget; returns how many it forgot."""
        pruned = 0
        while len(self.states) > keep and self._idle:
            stored, name = self._idle[0]
            if stored > NEGLIGIBLE_FRACTION * max(self.stored_total, 0.0) and stored > 0.0:
                break
            state = self.states.pop(name)
            self._idle.remove((stored, name))
            state.idle = None
            self._ranks.remove(state.key)
            self.stored_total -= state.stored
            pruned += 1
        if not self.states:
            self.stored_total = 0.0
        return pruned

    # -- usage and ranks ------------------------------------------------------------

    def rank(self, state: TeamState) -> int:
        """Dense rank of the team's level fairshare among all known teams, 0 first."""
        return self._ranks.rank(state.key)

    def rank_of(self, name: str) -> int:
        """Dense rank of the named team; one the roster does not know ranks as a team
        without share does (every known team is configured or has share 0)."""
        state = self.states.get(name)
        return self._ranks.rank(state.key if state is not None else level_key(0.0, 0.0))

    def decay_factor(self, now: float) -> float:
        """What stored usage is multiplied by to give usage decayed to ``now``."""
        return math.exp(-self.lam * (now - self.t_ref))

    def charge(self, state: TeamState, amount: float, now: float) -> None:
        """Adds ``amount`` (already checked, >= 0) to the team's usage as of ``now``."""
        if amount <= 0.0:
            return
        self._maybe_rebase(now)
        self._rekey(state, state.stored + amount * math.exp(self.lam * (now - self.t_ref)))

    def set_usage(self, state: TeamState, usage: float, now: float) -> None:
        """Sets the team's usage decayed to ``now`` (already checked, >= 0)."""
        self._maybe_rebase(now)
        self._rekey(state, usage * math.exp(self.lam * (now - self.t_ref)))

    def stats(self, now: float) -> list[TeamStat]:
        """Every known team's ``TeamStat`` as of ``now``, sorted by team name."""
        factor = self.decay_factor(now)
        stored_total = math.fsum(t.stored for t in self.states.values())
        # LF = S / U = (share / stored) * (sum stored / sum share): the same factor for
        # every team, applied to the key that ranks it, so equal keys give equal LF.
        lf_scale = stored_total / self._share_total if self._share_total > 0 else 0.0
        stats = []
        for name in sorted(self.states):
            t = self.states[name]
            lf = t.key * lf_scale if math.isfinite(t.key) else math.inf
            stats.append(
                TeamStat(
                    team=name,
                    share=t.share,
                    reserved=t.reserved,
                    in_flight=t.in_flight,
                    borrowing=t.borrowing,
                    in_flight_tokens=t.tokens,
                    usage=t.stored * factor,
                    level_fairshare=lf,
                    rank=self.rank(t),
                    phantoms=t.phantoms,
                )
            )
        return stats

    def _rekey(self, state: TeamState, stored: float) -> None:
        self.stored_total += stored - state.stored
        state.stored = stored
        key = level_key(state.share, state.stored)
        if key != state.key:
            self._ranks.remove(state.key)
            self._ranks.add(key)
            state.key = key
        self.touch(state)

    def _maybe_rebase(self, now: float) -> None:
        """Rescales stored usage to the present before its scale factor grows too large."""
        if self.lam * (now - self.t_ref) <= _REBASE_EXPONENT:
            return
        factor = self.decay_factor(now)
        self.t_ref = now
        self._ranks = DenseRanks()
        self._idle = SortedList()
        for state in self.states.values():
            state.stored *= factor
            state.key = level_key(state.share, state.stored)
            self._ranks.add(state.key)
            state.idle = None
            self.touch(state)
        self.stored_total = math.fsum(t.stored for t in self.states.values())
