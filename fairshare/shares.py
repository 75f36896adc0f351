"""What valid shares and lend maps are: the one check of each that the core, the
settings and the configuration loader all apply.

A shares map gives each team its fraction of a pool's concurrency. It is valid when every
key is a non-empty string and every value is a number (an ``int`` or a ``float``, never a
``bool``) that is finite and >= 0. Nothing is required of the sum: ``apportion`` scales
shares that add up to more than 1 down, and shares that add up to less leave slots that
only borrowers use.

A lend map gives each team the fraction of its idle reserved slots that it lends to
borrowers (docs/spec.md §17). It is valid under the same rules, with every value also
<= 1. A team may be named in it without having a share: it then has nothing to lend.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


class ShareError(ValueError):
    """A shares (or lend) map is not valid.

    Attributes:
        team: the offending key as given (it may not be a string).
        reason: what is wrong with it, without the team's name
            (``must be >= 0, got -1``), for callers that name the entry their own way.
    """

    def __init__(self, team: object, reason: str, *, what: str = "share") -> None:
        super().__init__(f"{what} of {team!r} {reason}")
        self.team = team
        self.reason = reason


def check_shares(shares: Mapping[str, float]) -> dict[str, float]:
    """Checks a shares map and returns it with every share as a ``float``.

    Entries are checked in the map's order and the first bad one is reported, its key
    before its value.

    Raises:
        ShareError: a key is not a non-empty string, or a share is not a number, is NaN,
            infinite or negative.
    """
    return _check_fractions(shares, "share", upper=math.inf)


def check_lend(lend: Mapping[str, float]) -> dict[str, float]:
    """Checks a lend map and returns it with every fraction as a ``float``.

    Entries are checked in the map's order and the first bad one is reported, its key
    before its value.

    Raises:
        ShareError: a key is not a non-empty string, or a fraction is not a number, is
            NaN, infinite, negative or above 1.
    """
    return _check_fractions(lend, "lend", upper=1.0)


def _check_fractions(values: Mapping[str, float], what: str, *, upper: float) -> dict[str, float]:
    checked: dict[str, float] = {}
    for team, value in values.items():
        if not isinstance(team, str) or not team:
            raise ShareError(
                team, "is not a team name: team names must be non-empty strings", what=what
            )
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ShareError(team, f"must be a number, got {value!r}", what=what)
        if not math.isfinite(value):
            raise ShareError(team, f"must be finite, got {value!r}", what=what)
        if value < 0:
            raise ShareError(team, f"must be >= 0, got {value!r}", what=what)
        if value > upper:
            raise ShareError(team, f"must be <= {upper:g}, got {value!r}", what=what)
        checked[team] = float(value)
    return checked
