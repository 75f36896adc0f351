"""Dense ranks of level fairshare: the key that orders teams and the set that ranks a key.

Level fairshare is LF = (share / sum share) / (usage / sum usage). The normalisers are
common to every team of a pool, and so is the decay factor of usage stored scaled to the
pool's reference time (see ``fairshare.roster``), so ``share / stored`` orders teams as LF
does and changes only when a team is charged. ``DenseRanks`` keeps every distinct key once,
so a team's dense rank is one bisection.

Nothing here locks: the owning pool's lock guards a ``DenseRanks``.
"""

from __future__ import annotations

import math
from typing import Final

from sortedcontainers import SortedList

# Ordering keys are rounded to this many significant bits, so that level fairshare values
# that are equal in exact arithmetic (shares 0.3 and 0.1 with usage 3 and 1) but differ in
# the last bits of binary floating point share a rank, as docs/spec.md §5 says equal values do.
# 2**-40 is far above the rounding error of a key (a few ulps of 2**-52) and far below
# any difference in service that matters.
_KEY_BITS: Final = 40


def level_key(share: float, stored: float) -> float:
    """A value that orders teams as their level fairshare does.

    Args:
        share: the team's configured share (not normalised).
        stored: the team's usage scaled to the pool's reference time.

    Returns:
        0 for a team without share, ``inf`` for one with share and no usage (or usage so
        small that the ratio overflows), else ``share / stored`` rounded to ``_KEY_BITS``
        significant bits, so that equal LF values give equal keys.
    """
    if share <= 0.0:
        return 0.0
    if stored <= 0.0:
        return math.inf
    ratio = share / stored
    if not ratio < math.inf:  # stored so small that the ratio overflows
        return math.inf
    mantissa, exponent = math.frexp(ratio)
    return math.ldexp(round(mantissa * 2.0**_KEY_BITS), exponent - _KEY_BITS)


class DenseRanks:
    """A multiset of keys that answers "how many distinct keys are larger" in O(log n).

    Every distinct key is kept once in a sorted list, with its multiplicity beside it;
    adding and removing a key are O(log n).
    """

    __slots__ = ("_count", "_keys")

    def __init__(self) -> None:
        self._keys = SortedList()
        self._count: dict[float, int] = {}

    def add(self, key: float) -> None:
        """Counts one more holder of ``key``."""
        count = self._count.get(key, 0)
        if count == 0:
            self._keys.add(key)
        self._count[key] = count + 1

    def remove(self, key: float) -> None:
        """Counts one holder of ``key`` fewer; the key must have been added."""
        count = self._count[key] - 1
        if count == 0:
            del self._count[key]
            self._keys.remove(key)
        else:
            self._count[key] = count

    def rank(self, key: float) -> int:
        """The dense rank of ``key``, 0 for the largest: the number of distinct larger keys."""
        return len(self._keys) - int(self._keys.bisect_right(key))
