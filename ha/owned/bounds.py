"""The bounds on what an owner counts in flight: for the whole pool and for one holder.

Without them one holder could take grants without end (they are cheap to ask for and
each stays until released or ``max_request_s``): memory, the size of every checkpoint,
the phantoms a successor restores and, in replicated mode, etcd's quota would grow with
them until every pool loses its owner. With them a request may borrow only while the
pool counts fewer than ``max_in_flight`` grants in flight and its holder fewer than
``max_in_flight_per_holder`` (``ha.settings.PoolConfig.in_flight_bounds``: by default
multiples of the live capacity).

Guarantees: ``beyond`` reads two counts (``ha.owned.held.HeldGrants``), O(1) whatever is in
flight; it names the limit a grant would pass, the pool's first. What is counted is what
the owner keeps as held grants, its own and adopted ones, whatever their standing:
phantoms are not (they stand for a predecessor's grants, which obeyed the same bounds, and
end within ``max_request_s``; counting them would refuse every request after a failover of
a busy pool until its holders re-report).

A grant within its team's share is never refused: within-share grants are bounded already
(a team's within-share count never passes its reservation at a decision, and the
reservations add up to at most C), and refusing them would let one team's flood, through
a gateway every team shares, or through many holders, shut out a team that asks for no
more than its share. So what the bounds hold back is borrowing, and what is counted in
flight stays below the bound plus C.
"""

from __future__ import annotations

from ha.api import LimitExceeded
from ha.owned.held import HeldGrants
from ha.settings import PoolConfig


def beyond(
    config: PoolConfig, capacity: int, held: HeldGrants, holding: str, *, within_share: bool
) -> LimitExceeded | None:
    """None when the pool may count one more grant of ``holding`` (``ha.owned.held.holding_of``:
    a holder session, or a holder without one), of that standing, while its live capacity
    is ``capacity``: always when ``within_share``; else the error naming the limit it would
    pass (``max_in_flight``, then ``max_in_flight_per_holder``), for the caller to raise or
    log."""
    if within_share:
        return None
    pool_bound, holder_bound = config.in_flight_bounds(capacity)
    if len(held) >= pool_bound:
        return LimitExceeded(
            "max_in_flight",
            f"pool {config.name} counts {len(held)} grants in flight, at most {pool_bound} "
            f"(capacity {capacity}); requests beyond their team's share are refused until some end",
        )
    count = held.holding(holding)
    if count >= holder_bound:
        return LimitExceeded(
            "max_in_flight_per_holder",
            f"holder {holding[:64]!r} holds {count} grants in flight in pool "
            f"{config.name}, at most {holder_bound} (capacity {capacity}); its requests beyond "
            "their team's share are refused until some end",
        )
    return None
