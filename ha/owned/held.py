"""The grants an owner counts in flight: its own, and earlier ones it counted again.

A grant made in a holder session (``ha.owned.sessions``) lives as long as its session: it never
expires by age, however long its request runs, and ``lapse`` ends it with its session. A
grant made without one (a client that opens no session, a degraded grant re-reported)
lives at most ``max_request_s``.

Guarantees: each grant is kept once, with the time it was issued (or adopted, or the
deadline its phantom had), its standing (a successor's phantom keeps it) and its session;
``expire`` releases, charging nothing, every grant without a session older than
``max_request_s``; ``lapse`` every grant of one session; ``live`` and ``rows`` list
exactly the grants kept, for a snapshot; ``len`` and ``holding`` count the grants kept, in
all and of one holding (``holding_of``), in O(1) (what the in-flight bounds read).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import chain
from typing import TypeVar

from fairshare import Grant
from ha.api import Epoch
from ha.owned.snapshot import GrantKey, LiveGrant, live_row

_K = TypeVar("_K")


def holding_of(holder: str, session: str) -> str:
    """Whose grants ``HeldGrants.holding`` counts together: the holder session's, or the
    holder's when it has none (a session id and a holder name cannot be confused: the
    former is kept with a prefix no name has here)."""
    return f"\x00{session}" if session else holder


@dataclass(slots=True)
class Held:
    """One grant counted in flight."""

    grant: Grant
    key: GrantKey
    team: str
    wall: float  # when it was issued or adopted (the epoch's clock)
    row: str  # its entry in a snapshot's live list, encoded once (see ha.owned.snapshot.live_row)
    unsigned: bool = False  # a client-made degraded grant (no MAC)
    session: str = ""  # the holder session it belongs to; empty: none (it ages)


class HeldGrants:
    """The grants of one owner at ``epoch`` (see module)."""

    def __init__(self, epoch: Epoch, max_request_s: float) -> None:
        self._epoch = epoch
        self._limit = max_request_s
        # Grants without a session, in the order they were issued (they expire by age).
        self._own: dict[int, Held] = {}  # this epoch's grants by sequence number
        self._adopted: dict[GrantKey, Held] = {}  # earlier grants counted again
        # Grants of sessions (they live as long as their session).
        self._in_session: dict[GrantKey, Held] = {}
        self._by_session: dict[str, set[GrantKey]] = {}
        self._holdings: dict[str, int] = {}  # holding_of -> grants kept (none: absent)

    def __len__(self) -> int:
        """How many grants are kept."""
        return len(self._own) + len(self._adopted) + len(self._in_session)

    def holding(self, holding: str) -> int:
        """How many grants of ``holding`` (``holding_of``) are kept."""
        return self._holdings.get(holding, 0)

    def issue(
        self, seq: int, grant: Grant, holder: str, team: str, wall: float, session: str = ""
    ) -> Held:
        """Keeps a grant of this epoch, issued at ``wall``; returns it as kept."""
        key = GrantKey(self._epoch, seq, holder)
        held = self._held(grant, key, team, wall, session)
        if session:
            self._keep_in_session(held)
        else:
            self._own[seq] = held
        self._count(held, 1)
        return held

    def adopt(
        self, key: GrantKey, grant: Grant, wall: float, *, unsigned: bool, session: str = ""
    ) -> Held:
        """Keeps an earlier grant counted again, as if issued at ``wall``; returns it as
        kept."""
        self.take_adopted(key)  # kept once: a second adoption replaces the first
        held = self._held(grant, key, grant.team, wall, session)
        held.unsigned = unsigned
        if session:
            self._keep_in_session(held)
        else:
            self._adopted[key] = held
        self._count(held, 1)
        return held

    def take_own(self, key: GrantKey) -> Held | None:
        """Forgets this epoch's grant ``key`` (released) and returns it, if kept."""
        held = self._own.get(key.seq)
        if held is not None and held.key == key:
            return self._counted_out(self._own.pop(key.seq))
        return self._counted_out(self._take_in_session(key))

    def take_adopted(self, key: GrantKey) -> Held | None:
        """Forgets the adopted grant ``key`` (released) and returns it, if kept."""
        held = self._adopted.pop(key, None)
        return self._counted_out(held if held is not None else self._take_in_session(key))

    def adopted(self, key: GrantKey) -> bool:
        return key in self._adopted or key in self._in_session

    def of_session(self, session: str) -> set[GrantKey]:
        """The keys of the grants kept for ``session``."""
        return set(self._by_session.get(session, ()))

    def expire(self, horizon: float) -> list[GrantKey]:
        """Releases (charging nothing) the grants without a session issued before
        ``horizon``; returns their keys."""
        expired = _expire(self._own, horizon) + _expire(self._adopted, horizon)
        for held in expired:
            self._count(held, -1)
        return [held.key for held in expired]

    def lapse(self, session: str) -> list[GrantKey]:
        """Releases (charging nothing) every grant of ``session``; returns their keys."""
        keys = list(self._by_session.pop(session, ()))
        for key in keys:
            held = self._in_session.pop(key)
            held.grant.release(0.0)
            self._count(held, -1)
        return keys

    def live(self) -> list[LiveGrant]:
        """The grants as a snapshot's live list."""
        limit = self._limit
        return [
            LiveGrant(held.key, held.team, held.wall + limit, held.grant.borrowing, held.session)
            for held in self._all()
        ]

    def rows(self) -> Iterator[str]:
        """The grants' encoded live rows (what ``live`` encodes to)."""
        return (held.row for held in self._all())

    def _all(self) -> Iterator[Held]:
        return chain(self._own.values(), self._adopted.values(), self._in_session.values())

    def _keep_in_session(self, held: Held) -> None:
        self._in_session[held.key] = held
        self._by_session.setdefault(held.session, set()).add(held.key)

    def _take_in_session(self, key: GrantKey) -> Held | None:
        held = self._in_session.pop(key, None)
        if held is not None:
            keys = self._by_session[held.session]
            keys.discard(key)
            if not keys:
                del self._by_session[held.session]
        return held

    def _counted_out(self, held: Held | None) -> Held | None:
        if held is not None:
            self._count(held, -1)
        return held

    def _count(self, held: Held, change: int) -> None:
        """Adds ``change`` to the count of ``held``'s holding; a count of 0 is dropped, so
        the table holds only holdings with grants kept."""
        who = holding_of(held.key.holder, held.session)
        left = self._holdings.get(who, 0) + change
        if left:
            self._holdings[who] = left
        else:
            del self._holdings[who]

    def _held(self, grant: Grant, key: GrantKey, team: str, wall: float, session: str) -> Held:
        until = wall + self._limit
        row = live_row(LiveGrant(key, team, until, grant.borrowing, session))
        return Held(grant, key, team, wall, row, session=session)


def _expire(table: dict[_K, Held], horizon: float) -> list[Held]:
    """Releases the grants of ``table`` issued before ``horizon``; the table is in issue
    order, so the scan stops at the first live one."""
    expired = []
    for key in list(table):
        held = table[key]
        if held.wall > horizon:
            break
        del table[key]
        held.grant.release(0.0)
        expired.append(held)
    return expired
