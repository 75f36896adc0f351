"""Integer slots from fractions: reservations from shares (largest-remainder method), and
the idle reserved slots a team keeps back from borrowers under its lend fraction."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from fairshare.shares import check_shares

# A product such as 0.29 * 100 comes out of binary floating point as 28.999999999999996.
# Quotas this close to a whole number are taken as that number, so no slot is lost to
# representation error; real fractional parts are never this small in practice. The
# representation error of share * scale * C is a few ulps (about 1e-16 relative); 2**-40
# (about 1e-12) leaves a wide margin yet keeps a quota's real fractional part intact up
# to C of about 5e11 (1e-9 rounded the quota x.5 to x from C of about 5e8).
_SNAP_RELATIVE = 2.0**-40


def _snap(x: float) -> float:
    """Returns the nearest integer when x is within rounding error of it, else x."""
    nearest = round(x)
    if abs(x - nearest) <= _SNAP_RELATIVE * max(1.0, abs(x)):
        return float(nearest)
    return x


def apportion(capacity: int, names: Iterable[str], shares: Mapping[str, float]) -> dict[str, int]:
    """Divides ``capacity`` slots into integer reservations (Hamilton's method).

    Every name first gets ``floor(share * capacity)``; the slots left, up to
    ``floor(sum(share) * capacity)`` and never more than ``capacity``, go one each to the
    names with the largest fractional parts, ties to the name that sorts first. A name
    missing from ``shares`` has share 0. Shares summing to more than 1 are scaled down
    proportionally first.

    Args:
        capacity: the pool's concurrency C, an int >= 0.
        names: the names to reserve for; the result has an entry for each.
        shares: name -> share, a valid shares map (see ``check_shares``).

    Returns:
        name -> reserved slots; the sum never exceeds ``capacity`` and equals it when the
        shares of ``names`` sum to 1.

    Raises:
        ValueError: capacity is not an int >= 0.
        ShareError: ``shares`` is not a valid shares map (a ``ValueError`` too).
    """
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0:
        raise ValueError(f"capacity must be an int >= 0, got {capacity!r}")
    checked = check_shares(shares)
    unique = sorted(set(names))
    raw = {name: checked.get(name, 0.0) for name in unique}
    total_share = _snap(math.fsum(raw.values()))
    scale = 1.0 / total_share if total_share > 1.0 else 1.0

    exact = {name: share * scale * capacity for name, share in raw.items()}
    quotas = {name: _snap(quota) for name, quota in exact.items()}
    result = {name: math.floor(quota) for name, quota in quotas.items()}
    slots = min(capacity, math.floor(_snap(math.fsum(quotas.values()))))
    left = slots - sum(result.values())
    if left > 0:
        # Largest fractional part first; equal parts go to the name that sorts first.
        by_remainder = sorted(unique, key=lambda n: (-(quotas[n] - result[n]), n))
        for name in by_remainder[:left]:
            if quotas[name] - result[name] <= 0.0:
                break
            result[name] += 1
    elif left < 0:
        # Snapping is relative, so with a huge C (about 1e12 and more) it can round several
        # quotas up by a real fraction, and above 2**53 floats round C itself: take the
        # excess back from the names most above their quota, the last name first on ties,
        # so that the sum never exceeds C.
        by_surplus = sorted(unique, key=lambda n: (result[n] - exact[n], n), reverse=True)
        while left < 0:
            for name in by_surplus:
                if left < 0 and result[name] > 0:
                    result[name] -= 1
                    left += 1
    return result


def kept_back(reserved: int, within: int, lend: float) -> int:
    """The idle reserved slots a team keeps back from borrowers (docs/spec.md §17).

    The team's gap is ``max(0, reserved - within)``; it lends ``floor(lend x gap)`` of it
    and keeps the rest. A product within rounding error of a whole number counts as that
    number (as quotas do in ``apportion``), so lend 0.29 of a gap of 100 lends 29.

    Args:
        reserved: the team's reservation.
        within: its within-share count (``Pool.within``).
        lend: the fraction it lends, already checked to be in [0, 1].

    Returns:
        An int in [0, gap]: 0 with lend 1, the whole gap with lend 0.
    """
    gap = max(0, reserved - within)
    return gap - min(gap, math.floor(_snap(lend * gap)))
