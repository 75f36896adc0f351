"""What the allocator answers and what a holder re-reports, as plain records.

Every layer passes these: the replicas decide them, ``wire`` carries them across the
network and the client library reads them. They hold values only; no behaviour.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fairshare.ids import Epoch, NodeId, PoolName
from fairshare.pool import TeamStat


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer to one Acquire.

    Attributes:
        granted: False only when ``try_only`` found the pool full (other fields empty).
        grant_id: opaque id to release with; empty when not granted.
        priority: the vLLM priority to send the request with.
        borrowing: above the team's reservation.
        saturated: the pool already had C or more in flight.
        degraded: decided without an owner (fail_open); to be adopted by the next owner.
        owner: node id of the owner that decided (empty when degraded).
        epoch: the owner's epoch (0 when degraded).
    """

    granted: bool
    grant_id: str
    priority: int
    borrowing: bool
    saturated: bool
    degraded: bool
    owner: NodeId
    epoch: Epoch


@dataclass(frozen=True, slots=True)
class HeldGrant:
    """A live grant a holder re-reports to a new owner with ``Adopt``."""

    grant_id: str
    team: str
    priority: int
    borrowing: bool
    est_tokens: int = 0


@dataclass(frozen=True, slots=True)
class KeepAliveResult:
    """What a KeepAlive renewed.

    Attributes:
        renewed: pools whose owner renewed the session.
        unknown: pools whose owner does not know the session (never opened there, or
            lapsed: its grants there no longer count).
        ttl_s: the session TTL of the owners that answered (the shortest); 0 when none
            did. A holder renews every third of it.
    """

    renewed: Sequence[str]
    unknown: Sequence[str]
    ttl_s: float


@dataclass(frozen=True, slots=True)
class AdoptResult:
    """What an Adopt changed: grants counted again and phantoms dropped."""

    adopted: int
    phantoms_dropped: int
    owner: NodeId
    epoch: Epoch


@dataclass(frozen=True, slots=True)
class PoolView:
    """A pool's team table with its owner and epoch (the Snapshot RPC).

    ``snapshot_age_s``: how far the owner's stored state lags its live one (as
    ``ha.api.PoolStatus.snapshot_age_s``); None when the owner did not say.
    ``within``: team -> its within-share count (``fairshare.Pool.within``: within-share
    grants plus phantoms counted as within), what decides its next request's standing;
    teams the owner did not report are absent.
    ``held``: team -> its borrowers the owner holds back by the pool's lending limit now,
    waiting for a slot; an owner names every team of ``teams`` (0 included), a view from
    an owner that predates the field names none (unknown, not 0).
    """

    pool: PoolName
    capacity: int
    owner: NodeId
    epoch: Epoch
    teams: Sequence[TeamStat]
    snapshot_age_s: float | None = None
    within: Mapping[str, int] = field(default_factory=dict)
    held: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PoolInfo:
    """One line of ListPools."""

    pool: PoolName
    capacity: int
    owner: NodeId
    owner_address: str
    epoch: Epoch
    lends_all: bool = False
    """No team lends less than all: the owner holds no borrower (``ha.owned.waiting``)."""
