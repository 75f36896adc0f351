"""The grants an owner counts in flight: its own, and earlier ones it counted again.

Guarantees: each grant is kept once, with the time it was issued (or adopted, or the
deadline its phantom had) and its standing (a successor's phantom keeps it); ``expire``
releases, charging nothing, every grant older than ``max_request_s``; ``live`` and
``rows`` list exactly the grants kept, for a snapshot; ``len`` and ``holding`` count the
grants kept, in all and of one holder, in O(1) (what the in-flight bounds read).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from typing import TypeVar

from fairshare import Grant
from ha.api import Epoch
from ha.snapshot import GrantKey, LiveGrant, live_row

_K = TypeVar("_K")


def holding_key(key: GrantKey) -> str:
    """Whose grants ``HeldGrants.holding`` counts together: the holder's name. When grants
    belong to holder sessions, this one line returns the session's id instead, and the
    per-holder bound becomes a per-session bound."""
    return key.holder


@dataclass(slots=True)
class Held:
    """One grant counted in flight."""

    grant: Grant
    key: GrantKey
    team: str
    wall: float  # when it was issued or adopted (the epoch's clock)
    row: str  # its entry in a snapshot's live list, encoded once (see ha.snapshot.live_row)
    unsigned: bool = False  # a client-made degraded grant (no MAC)


class HeldGrants:
    """The grants of one owner at ``epoch`` (see module)."""

    def __init__(self, epoch: Epoch, max_request_s: float) -> None:
        self._epoch = epoch
        self._limit = max_request_s
        self._own: dict[int, Held] = {}  # this epoch's grants by sequence number
        self._adopted: dict[GrantKey, Held] = {}  # earlier grants counted again
        self._holdings: dict[str, int] = {}  # holding_key -> grants kept (none kept: absent)

    def __len__(self) -> int:
        """How many grants are kept."""
        return len(self._own) + len(self._adopted)

    def holding(self, key: GrantKey) -> int:
        """How many grants are kept of the holding ``key`` belongs to (``holding_key``)."""
        return self._holdings.get(holding_key(key), 0)

    def issue(self, seq: int, grant: Grant, holder: str, team: str, wall: float) -> Held:
        """Keeps a grant of this epoch, issued at ``wall``; returns it as kept."""
        held = self._own[seq] = self._held(grant, GrantKey(self._epoch, seq, holder), team, wall)
        self._count(held.key, 1)
        return held

    def adopt(self, key: GrantKey, grant: Grant, wall: float, *, unsigned: bool) -> Held:
        """Keeps an earlier grant counted again, as if issued at ``wall``; returns it as
        kept."""
        if key not in self._adopted:
            self._count(key, 1)
        held = self._adopted[key] = self._held(grant, key, grant.team, wall)
        held.unsigned = unsigned
        return held

    def take_own(self, seq: int) -> Held | None:
        """Forgets this epoch's grant ``seq`` (released) and returns it, if kept."""
        held = self._own.pop(seq, None)
        if held is not None:
            self._count(held.key, -1)
        return held

    def take_adopted(self, key: GrantKey) -> Held | None:
        """Forgets the adopted grant ``key`` (released) and returns it, if kept."""
        held = self._adopted.pop(key, None)
        if held is not None:
            self._count(key, -1)
        return held

    def adopted(self, key: GrantKey) -> bool:
        return key in self._adopted

    def unsigned_of(self, holder: str) -> int:
        """How many unsigned (client-made degraded) grants of ``holder`` are kept."""
        return sum(1 for h in self._adopted.values() if h.unsigned and h.key.holder == holder)

    def expire(self, horizon: float) -> list[GrantKey]:
        """Releases (charging nothing) the grants issued before ``horizon``; returns
        their keys."""
        expired = _expire(self._own, horizon) + _expire(self._adopted, horizon)
        for key in expired:
            self._count(key, -1)
        return expired

    def live(self) -> list[LiveGrant]:
        """The grants as a snapshot's live list."""
        limit = self._limit
        return [
            LiveGrant(held.key, held.team, held.wall + limit, held.grant.borrowing)
            for held in chain(self._own.values(), self._adopted.values())
        ]

    def rows(self) -> Iterator[str]:
        """The grants' encoded live rows (what ``live`` encodes to)."""
        return chain(
            (held.row for held in self._own.values()),
            (held.row for held in self._adopted.values()),
        )

    def _count(self, key: GrantKey, change: int) -> None:
        """Adds ``change`` to the count of ``key``'s holding; a count of 0 is dropped, so
        the table holds only holdings with grants kept."""
        who = holding_key(key)
        left = self._holdings.get(who, 0) + change
        if left:
            self._holdings[who] = left
        else:
            del self._holdings[who]

    def _held(self, grant: Grant, key: GrantKey, team: str, wall: float) -> Held:
        until = wall + self._limit
        row = live_row(LiveGrant(key, team, until, grant.borrowing))
        return Held(grant, key, team, wall, row)


def _expire(table: dict[_K, Held], horizon: float) -> list[GrantKey]:
    """Releases the grants of ``table`` issued before ``horizon``; the table is in issue
    order, so the scan stops at the first live one."""
    expired = []
    for key in list(table):
        held = table[key]
        if held.wall > horizon:
            break
        del table[key]
        held.grant.release(0.0)
        expired.append(held.key)
    return expired
