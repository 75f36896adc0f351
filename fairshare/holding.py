"""Borrowers held back by the lending limit until a slot is lent to them.

A request that would borrow while no team lends a slot (``Pool.acquire_lent`` returned
None) may wait in a ``HeldQueue`` instead of going to vLLM, where it would take a slot a
team keeps back. Its owner calls ``admit(pool)`` whenever room may have appeared (a
release, a phantom's end, a capacity or lend change) and answers each request admitted;
it calls ``expired(now)`` to end waits whose deadline has passed (what then happens to
such a request, borrowing anyway or a refusal, is the owner's policy), and ``remove``
for a caller that went away. The queue keeps no clock: each entry only stores the
deadline it was given, on whatever clock its owner passes to ``expired``.

Guaranteed:

- **Order.** ``admit`` decides held requests in the order (priority when queued, arrival
  order): the head first, and a later borrower only after every earlier one was admitted.
- **Bound.** At most ``limit`` requests are held; ``push`` past it returns False and holds
  nothing.
- **No within-share request stays held.** After ``admit(pool)`` returns, no held request
  belongs to a team whose next request would be within share in ``pool``: those are
  admitted even behind a head that the pool refuses (``acquire_lent`` never refuses
  them), in order within their team.
- Every payload is held at most once; ``admit``, ``expired`` and ``remove`` each take it
  out, so a held request gets exactly one ending.

Not guaranteed:

- That a request is within share's or a borrower's when admitted: ``push`` does not look
  at the pool (the owner holds only what ``acquire_lent`` refused), and a grant carries
  the standing and priority decided when it is admitted, not the ones it was queued with.
- Deadlines: ``admit`` may admit a request whose deadline has passed; call ``expired``
  first to end those.
- Order against other threads: the queue is not locked, and a pool that other threads
  change while ``admit`` runs may let in a later request before an earlier one. One
  owner's single decision loop should own both.

Cost: ``push``, ``remove`` and each admitted or expired request are O(log n) in the
requests held; ``admit`` adds one ``acquire_lent`` for the head, and when the head is
refused, one ``within_share_next`` per team with requests held.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from sortedcontainers import SortedList

from fairshare.grant import Grant
from fairshare.pool import Pool, check_request
from fairshare.priority import Class

__all__ = ["Held", "HeldQueue"]

P = TypeVar("P", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Held(Generic[P]):
    """One held request.

    Attributes:
        payload: what the owner answers when it ends (hashable, unique in its queue).
        team: the team it is charged to.
        cls: its service class.
        est_tokens: its estimated tokens.
        priority: the priority it would have had when queued (``Pool.priority_next``);
            orders the queue.
        deadline: when its wait ends, on the owner's clock (``inf``: never).
        seq: its arrival order in the queue; breaks ties of priority.
    """

    payload: P
    team: str
    cls: Class
    est_tokens: int
    priority: int
    deadline: float
    seq: int


class HeldQueue(Generic[P]):
    """A bounded queue of held borrowers, in (priority when queued, arrival) order (see
    module)."""

    __slots__ = ("_by_payload", "_by_team", "_deadlines", "_limit", "_order", "_seq")

    def __init__(self, limit: int) -> None:
        """An empty queue that holds at most ``limit`` requests.

        Raises:
            ValueError: ``limit`` is not an int >= 0 (0 holds nothing).
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ValueError(f"limit must be an int >= 0, got {limit!r}")
        self._limit = limit
        self._seq = itertools.count()
        self._by_payload: dict[P, Held[P]] = {}
        self._order = SortedList(key=_order_key)  # every entry, by (priority, seq)
        self._deadlines = SortedList(key=_deadline_key)  # every entry, by (deadline, seq)
        self._by_team: dict[str, SortedList] = {}  # team -> its entries, by (priority, seq)

    @property
    def limit(self) -> int:
        """The most requests held at once."""
        return self._limit

    def __len__(self) -> int:
        return len(self._by_payload)

    def __contains__(self, payload: object) -> bool:
        return payload in self._by_payload

    def count_by_team(self) -> dict[str, int]:
        """How many requests each team has held (teams with none are absent)."""
        return {team: len(entries) for team, entries in self._by_team.items()}

    def next_deadline(self) -> float:
        """The earliest deadline held, ``inf`` when none (or the queue is empty)."""
        if not self._deadlines:
            return math.inf
        first: Held[P] = self._deadlines[0]
        return first.deadline

    def push(
        self,
        payload: P,
        team: str,
        *,
        cls: Class = Class.INTERACTIVE,
        est_tokens: int = 0,
        priority: int,
        deadline: float = math.inf,
    ) -> bool:
        """Holds a request behind every one held with a lower or equal priority.

        Hold only a request that ``acquire_lent`` refused, and call ``admit`` after it as
        after any other change: the queue does not check that the request borrows.

        Returns:
            False if ``limit`` requests are held already: nothing is held, the caller
            answers the request another way.

        Raises:
            ValueError: ``payload`` is held already; team, class or ``est_tokens`` as
                ``Pool.acquire`` refuses them; ``priority`` not an int; ``deadline`` NaN
                or not a number.
        """
        checked = check_request(team, cls, est_tokens)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise ValueError(f"priority must be an int, got {priority!r}")
        if isinstance(deadline, bool) or not isinstance(deadline, int | float):
            raise ValueError(f"deadline must be a number, got {deadline!r}")
        if math.isnan(deadline):
            raise ValueError("deadline must not be NaN")
        if payload in self._by_payload:
            raise ValueError(f"payload {payload!r} is held already")
        if len(self._by_payload) >= self._limit:
            return False
        entry = Held(
            payload=payload,
            team=team,
            cls=checked,
            est_tokens=est_tokens,
            priority=priority,
            deadline=float(deadline),
            seq=next(self._seq),
        )
        self._by_payload[payload] = entry
        self._order.add(entry)
        self._deadlines.add(entry)
        team_entries = self._by_team.get(team)
        if team_entries is None:
            team_entries = self._by_team[team] = SortedList(key=_order_key)
        team_entries.add(entry)
        return True

    def remove(self, payload: P) -> Held[P] | None:
        """Takes a request out without deciding it (its caller went away).

        Returns:
            Its entry, or None if it is not held (admitted, expired or removed already).
        """
        entry = self._by_payload.get(payload)
        if entry is not None:
            self._drop(entry)
        return entry

    def admit(self, pool: Pool) -> list[tuple[P, Grant]]:
        """Takes out and counts in ``pool`` every held request it now lets in.

        The head is offered to ``pool.acquire_lent`` first, then the next, until the pool
        refuses one: a refusal means no borrower can go now. Then every team whose next
        request would be within share has its held requests offered, in order, until one
        would borrow. Each request admitted is counted in ``pool`` with the standing and
        priority decided now.

        Returns:
            (payload, grant) of each request admitted, in the order decided.
        """
        admitted: list[tuple[P, Grant]] = []
        while self._order:
            head: Held[P] = self._order[0]
            if not self._take(pool, head, admitted):
                break
        else:
            return admitted
        # A refused head means the pool lends no slot now, and a within-share admission
        # never makes room (it counts one more in flight and frees at most one kept
        # slot): only teams now within share can go.
        teams = sorted(self._by_team.items(), key=lambda item: _order_key(item[1][0]))
        for team, entries in teams:
            if not pool.within_share_next(team):
                continue
            while entries and self._take(pool, entries[0], admitted):
                pass
        return admitted

    def expired(self, now: float) -> list[P]:
        """Takes out every request whose deadline is at or before ``now``.

        Returns:
            Their payloads, earliest deadline first (arrival order on ties).
        """
        ended: list[P] = []
        while self._deadlines:
            first: Held[P] = self._deadlines[0]
            if first.deadline > now:
                break
            self._drop(first)
            ended.append(first.payload)
        return ended

    def _take(self, pool: Pool, entry: Held[P], admitted: list[tuple[P, Grant]]) -> bool:
        """Offers one entry to the pool; takes it out if the pool counts it."""
        grant = pool.acquire_lent(entry.team, entry.cls, entry.est_tokens)
        if grant is None:
            return False
        self._drop(entry)
        admitted.append((entry.payload, grant))
        return True

    def _drop(self, entry: Held[P]) -> None:
        del self._by_payload[entry.payload]
        self._order.remove(entry)
        self._deadlines.remove(entry)
        team_entries = self._by_team[entry.team]
        team_entries.remove(entry)
        if not team_entries:
            del self._by_team[entry.team]


def _order_key(entry: Held[P]) -> tuple[int, int]:
    return (entry.priority, entry.seq)


def _deadline_key(entry: Held[P]) -> tuple[float, int]:
    return (entry.deadline, entry.seq)
