"""What the replication layer offers the server: ids, decisions, errors, the Allocator.

The ids (``fairshare.ids``) and errors (``fairshare.errors``) are the core's, re-exported
here for the replication layer's modules; ``wire`` translates gRPC messages to these types
and back and maps the errors to status codes in one table. Nothing here knows about gRPC.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from fairshare import Class, TeamStat
from fairshare.errors import (
    AllocatorError,
    InvalidArgument,
    LimitExceeded,
    NoOwner,
    OutOfRange,
    PeerUnavailable,
    PermissionDenied,
    StoreFull,
    StoreUnavailable,
    UnknownNode,
    UnknownPool,
    WrongEpoch,
)
from fairshare.ids import (
    ANY_EPOCH,
    DEGRADED_EPOCH,
    MAC_BYTES,
    NO_EPOCH,
    Epoch,
    GrantRef,
    NodeId,
    PoolName,
)
from fairshare.records import (
    AdoptResult,
    Decision,
    HeldGrant,
    KeepAliveResult,
    PoolInfo,
    PoolView,
)
from fairshare.sessions import Session

# -- status ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PoolStatus:
    """One pool as this replica sees it, for metrics and health.

    Attributes:
        pool: pool name.
        owned: this replica owns the pool and may decide for it now.
        owner: node id of the owner this replica routes to (empty: none known).
        epoch: that owner's epoch (``NO_EPOCH``: none).
        transitions: epochs of this pool that this replica started (each ownership
            change is counted once, by the new owner; summed over replicas it is the
            number of ownership changes).
        fence_left_s: seconds before this replica self-fences (0 when it does not own).
        snapshot_age_s: how long the stored state has lagged the owner's: 0 while the
            last write covers every change (an idle pool writes nothing and stays at 0),
            else seconds since the first change not yet written (owner only; -1 before
            the epoch's first write).
        teams: the owner's team table; empty when this replica does not own the pool.
        within: team -> its within-share count (``PoolView.within``), for the teams of
            ``teams``; empty when this replica does not own the pool.
        held: team -> its borrowers held back by the lending limit (``PoolView.held``);
            empty when this replica does not own the pool.
        degraded_decisions: decisions made without an owner by this replica.
        store_full: the store refused this replica's last write for the pool for lack
            of space (the pool cannot be served from here until a write succeeds).
        store_refused_writes: writes for the pool refused as full, since start.
        charges_clamped: releases this replica, as owner, charged at the pool's bound
            (``PoolConfig.max_charge``) instead of the larger amount claimed.
        grant_ids_refused: releases and adopted grants this replica, as owner, refused
            as not genuine (bad MAC, unsigned with an epoch, another holder's).
        unproven_releases: releases of client-made degraded ids that no owner counted
            first, which this replica, as owner, did not charge.
    """

    pool: PoolName
    owned: bool
    owner: NodeId
    epoch: Epoch
    transitions: int
    fence_left_s: float
    snapshot_age_s: float
    teams: Sequence[TeamStat]
    degraded_decisions: int
    store_full: bool = False
    store_refused_writes: int = 0
    charges_clamped: int = 0
    grant_ids_refused: int = 0
    unproven_releases: int = 0
    within: Mapping[str, int] = field(default_factory=dict)
    held: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MemberStatus:
    """One replica of the cluster as this replica's cluster view sees it (for the
    status page).

    Attributes:
        node: its node id.
        address: the address it advertises.
        member_for_s: how long this replica has seen its membership (its lease-bound
            member key) without a break; -1 for this replica while it is no member.
        pools: the pools the view routes to it (owner keys naming it), sorted.
        lease_left_s: this replica only: seconds before it self-fences (0: fenced or no
            lease); None for the others, whose leases only etcd knows (their member key
            is there while their lease lives).
    """

    node: NodeId
    address: str
    member_for_s: float
    pools: Sequence[PoolName]
    lease_left_s: float | None = None


# -- the service ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AcquireCall:
    """One Acquire as a replica received it: the arguments of ``Allocator.acquire``, as
    one record that the node hands to the replica's call router (``ha.routing``)."""

    pool: str
    team: str
    cls: Class
    est_tokens: int
    holder: str = ""
    request_id: str = ""
    try_only: bool = False
    wait_s: float = 0.0
    epoch: Epoch = ANY_EPOCH
    forwarded: bool = False
    session: Session | None = None


class Allocator(Protocol):
    """The allocator as the server sees it: embedded (one node) or replicated.

    Every coroutine is safe to call concurrently. Errors are the classes above.

    ``forwarded`` is the one mark of a call a peer forwarded (``Peers``): it is answered
    from this replica's own state, never forwarded again; a replica that does not decide
    for the pool raises WrongEpoch naming the owner it routes to.
    """

    async def acquire(  # noqa: PLR0913 (the call's fields, keyword-only)
        self,
        *,
        pool: str,
        team: str,
        cls: Class,
        est_tokens: int,
        holder: str = "",
        request_id: str = "",
        try_only: bool = False,
        wait_s: float = 0.0,
        epoch: Epoch = ANY_EPOCH,
        forwarded: bool = False,
        session: Session | None = None,
    ) -> Decision:
        """Decides one request; forwards to the owner when this replica is not it.

        ``request_id`` (with ``holder``) makes a retry return the same grant. A forwarded
        call names the ``epoch`` its forwarder routed to: a replica that does not own the
        pool at exactly that epoch (at any, for ``ANY_EPOCH``) raises WrongEpoch instead
        of forwarding again. ``epoch`` means nothing in a call that is not forwarded.
        The grant belongs to ``session`` when one is given (``ha.owned.sessions``).
        ``wait_s`` > 0 lets the owner hold a request that would borrow past the pool's
        lending limit that long before it answers (``ha.owned.waiting``).
        """
        ...

    async def release(self, grant_id: str, consumed: float, *, forwarded: bool = False) -> None:
        """Ends a grant; idempotent. Non-finite or negative consumption counts as 0."""
        ...

    async def adopt(
        self,
        *,
        pool: str,
        epoch: Epoch,
        holder: str,
        grants: Sequence[HeldGrant],
        complete: bool,
        forwarded: bool = False,
        session: Session | None = None,
    ) -> AdoptResult:
        """Re-reports a holder's live grants of earlier epochs to the current owner.

        ``epoch`` is the owner epoch the holder expects (``ANY_EPOCH``: the current one);
        an owner at another epoch raises WrongEpoch. A complete inventory closes only the
        phantoms of ``session`` (of ``holder`` made without a session, when none).
        """
        ...

    async def keep_alive(
        self, pools: Sequence[str], session: Session, *, forwarded: bool = False
    ) -> KeepAliveResult:
        """Renews ``session`` with the owner of each of ``pools`` (forwarding to the
        owners of pools this replica does not own); pools no owner answered for are in
        neither list of the result."""
        ...

    async def snapshot(self, pool: str, *, forwarded: bool = False) -> PoolView:
        """The pool's team table, from its owner."""
        ...

    async def list_pools(self) -> list[PoolInfo]:
        """Every configured pool with its current owner, as this replica sees it."""
        ...

    async def set_capacity(self, pool: str, capacity: int, *, forwarded: bool = False) -> int:
        """Changes C on the owner, persists it, and returns the previous C."""
        ...

    async def switchover(self, pool: str, node: str, *, forwarded: bool = False) -> None:
        """Moves a pool to the named replica through the graceful handover."""
        ...

    def status(self) -> list[PoolStatus]:
        """Every configured pool as this replica sees it (cheap; for metrics scrapes)."""
        ...


class Peers(Protocol):
    """How a replica calls another one (the server implements it over gRPC).

    Every call is marked as forwarded, so the receiver answers from its own state and
    never forwards again. Errors: WrongEpoch (the peer does not own the pool at that
    epoch; it says whom it routes to), PeerUnavailable (no answer within ``timeout``),
    and UnknownPool, InvalidArgument, NoOwner as the peer raised them.
    """

    async def acquire(  # noqa: PLR0913 (the call's fields, keyword-only)
        self,
        address: str,
        *,
        pool: str,
        team: str,
        cls: Class,
        est_tokens: int,
        holder: str,
        request_id: str,
        try_only: bool,
        epoch: Epoch,
        timeout: float,
        session: Session | None = None,
        wait_s: float = 0.0,
    ) -> Decision:
        """Acquire on the owner at ``address``, which must own ``pool`` at ``epoch``."""
        ...

    async def release(self, address: str, grant_id: str, consumed: float, timeout: float) -> None:
        """Release on the owner at ``address``."""
        ...

    async def adopt(
        self,
        address: str,
        *,
        pool: str,
        epoch: Epoch,
        holder: str,
        grants: Sequence[HeldGrant],
        complete: bool,
        timeout: float,
        session: Session | None = None,
    ) -> AdoptResult:
        """Adopt on the owner at ``address``."""
        ...

    async def keep_alive(
        self, address: str, pools: Sequence[str], session: Session, timeout: float
    ) -> KeepAliveResult:
        """KeepAlive on the owner at ``address`` of ``pools``."""
        ...

    async def snapshot(self, address: str, pool: str, timeout: float) -> PoolView:
        """Snapshot from the owner at ``address``."""
        ...

    async def set_capacity(self, address: str, pool: str, capacity: int, timeout: float) -> int:
        """SetCapacity on the owner at ``address``; returns the previous C."""
        ...

    async def switchover(self, address: str, pool: str, node: str, timeout: float) -> None:
        """Switchover on the owner at ``address``."""
        ...

    async def close(self) -> None:
        """Closes every channel."""
        ...


__all__ = [
    "ANY_EPOCH",
    "DEGRADED_EPOCH",
    "MAC_BYTES",
    "NO_EPOCH",
    "AcquireCall",
    "AdoptResult",
    "Allocator",
    "AllocatorError",
    "Decision",
    "Epoch",
    "GrantRef",
    "HeldGrant",
    "InvalidArgument",
    "KeepAliveResult",
    "LimitExceeded",
    "MemberStatus",
    "NoOwner",
    "NodeId",
    "OutOfRange",
    "PeerUnavailable",
    "Peers",
    "PermissionDenied",
    "PoolInfo",
    "PoolName",
    "PoolStatus",
    "PoolView",
    "Session",
    "StoreFull",
    "StoreUnavailable",
    "UnknownNode",
    "UnknownPool",
    "WrongEpoch",
]
