"""What a pool knows of one team: the frozen view callers read and the mutable state
behind it.

``TeamStat`` is public (``Pool.snapshot`` returns it); ``TeamState`` belongs to ``Pool``
and the grants it issues, and is guarded by the pool's lock: nothing else may touch it.
"""

from __future__ import annotations

from dataclasses import dataclass

from fairshare.priority import Class, borrowing_priority


@dataclass(frozen=True, slots=True)
class TeamStat:
    """The state of one team in a pool at one moment.

    Attributes:
        team: team name.
        share: share as configured (not normalised); 0 for teams without one.
        reserved: within-share slots (see ``apportion``).
        in_flight: requests in flight with a grant (phantoms excluded).
        borrowing: of those, the ones admitted as borrowers.
        in_flight_tokens: the estimated tokens of the grants in flight.
        usage: consumption decayed to now (cost units).
        level_fairshare: LF = S / U (0 without share, inf with share and no usage).
        rank: dense rank of LF among all known teams, highest LF first (uncapped).
        phantoms: live phantoms (requests counted in flight without a grant).

    The team's within-share count, which decides the standing of its next request, is
    ``Pool.within``'s: it needs the standing of each phantom, which this view leaves out.
    """

    team: str
    share: float
    reserved: int
    in_flight: int
    borrowing: int
    in_flight_tokens: int
    usage: float
    level_fairshare: float
    rank: int
    phantoms: int

    @property
    def borrow_priority(self) -> int:
        """The priority an interactive request of this team would get now if it borrowed
        (a batch one gets one more): what ``rank`` means to vLLM. A request within the
        team's reservation gets the within-share priority instead."""
        return borrowing_priority(self.rank, Class.INTERACTIVE)


class TeamState:
    """Mutable state of one team inside a pool; guarded by the owning pool's lock.

    Only ``Pool`` and the grants it issues touch it; callers see ``TeamStat``."""

    __slots__ = (
        "borrowing",
        "borrowing_phantoms",
        "idle",
        "in_flight",
        "kept",
        "key",
        "name",
        "reserved",
        "share",
        "stored",
        "tokens",
        "within_phantoms",
    )

    def __init__(self, name: str, share: float, reserved: int) -> None:
        self.name = name
        self.share = share
        self.reserved = reserved
        self.in_flight = 0
        self.borrowing = 0
        self.tokens = 0
        self.kept = 0  # idle reserved slots kept back from borrowers, as last counted
        self.stored = 0.0  # usage scaled to the pool's reference time
        self.key = 0.0  # orders teams like LF does; see fairshare.ranking.level_key
        # Live phantoms' expiry times, ascending: those counted as within share (their
        # standing within or unknown) and those known to have been borrowers.
        self.within_phantoms: list[float] = []
        self.borrowing_phantoms: list[float] = []
        # Its entry (stored, name) in the pool's prunable list, while it has one.
        self.idle: tuple[float, str] | None = None

    @property
    def within(self) -> int:
        """The within-share count: within-share grants plus phantoms counted as within."""
        return self.in_flight - self.borrowing + len(self.within_phantoms)

    @property
    def phantoms(self) -> int:
        """Every live phantom, whatever its standing."""
        return len(self.within_phantoms) + len(self.borrowing_phantoms)

    def phantom_list(self, borrowing: bool) -> list[float]:
        """The expiry times of the live phantoms of one standing."""
        return self.borrowing_phantoms if borrowing else self.within_phantoms
