"""What a valid shares map is: the one check that the core, the settings and the
configuration loader all apply.

A shares map gives each team its fraction of a pool's concurrency. It is valid when every
key is a non-empty string and every value is a number (an ``int`` or a ``float``, never a
``bool``) that is finite and >= 0. Nothing is required of the sum: ``apportion`` scales
shares that add up to more than 1 down, and shares that add up to less leave slots that
only borrowers use.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


class ShareError(ValueError):
    """A shares map is not valid.

    Attributes:
        team: the offending key as given (it may not be a string).
        reason: what is wrong with it, without the team's name
            (``must be >= 0, got -1``), for callers that name the entry their own way.
    """

    def __init__(self, team: object, reason: str) -> None:
        super().__init__(f"share of {team!r} {reason}")
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
    checked: dict[str, float] = {}
    for team, share in shares.items():
        if not isinstance(team, str) or not team:
            raise ShareError(team, "is not a team name: team names must be non-empty strings")
        if isinstance(share, bool) or not isinstance(share, int | float):
            raise ShareError(team, f"must be a number, got {share!r}")
        if not math.isfinite(share):
            raise ShareError(team, f"must be finite, got {share!r}")
        if share < 0:
            raise ShareError(team, f"must be >= 0, got {share!r}")
        checked[team] = float(share)
    return checked
