"""Conversions between ``fairshare.v1`` messages and the core's values: the only ones.

The servicer turns requests into calls and answers into messages with these; a forwarding
replica (``server.peers``) and the client library do the reverse. A field that exists on
both sides keeps its name and meaning; where the wire is narrower, the conversion to the
message says how a value is bounded.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Protocol

from fairshare import Class, TeamStat
from fairshare.errors import InvalidArgument
from fairshare.ids import Epoch, NodeId, PoolName
from fairshare.modes import DegradedMode
from fairshare.records import (
    AdoptResult,
    Decision,
    HeldGrant,
    KeepAliveResult,
    PoolInfo,
    PoolView,
)
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb

_MAX_INT32: Final = 2**31 - 1
_MAX_INT64: Final = 2**63 - 1

# -- team tables ---------------------------------------------------------------------------


def team_stat_pb(stat: TeamStat, within: int | None = None, held: int | None = None) -> pb.TeamStat:
    """One TeamStat as its message (same field names; rank capped to int32 and tokens to
    int64, so a table never fails to encode: the door keeps them far below anyway), with
    the team's within-share count and held borrowers when given (unset otherwise)."""
    return pb.TeamStat(
        team=stat.team,
        share=stat.share,
        reserved=stat.reserved,
        in_flight=stat.in_flight,
        borrowing=stat.borrowing,
        in_flight_tokens=min(stat.in_flight_tokens, _MAX_INT64),
        usage=stat.usage,
        level_fairshare=stat.level_fairshare,
        rank=min(stat.rank, _MAX_INT32),
        phantoms=stat.phantoms,
        within=None if within is None else min(within, _MAX_INT32),
        held=None if held is None else min(held, _MAX_INT32),
    )


def team_stat(message: pb.TeamStat) -> TeamStat:
    """A TeamStat message as the domain record."""
    return TeamStat(
        team=message.team,
        share=message.share,
        reserved=message.reserved,
        in_flight=message.in_flight,
        borrowing=message.borrowing,
        in_flight_tokens=message.in_flight_tokens,
        usage=message.usage,
        level_fairshare=message.level_fairshare,
        rank=message.rank,
        phantoms=message.phantoms,
    )


def pool_view_pb(view: PoolView) -> pb.SnapshotResponse:
    """A pool's table as the Snapshot answer; each team's within-share count
    (``PoolView.within``) and its held borrowers (``PoolView.held``) go in its own TeamStat,
    unset for a team the view has none of."""
    return pb.SnapshotResponse(
        pool=view.pool,
        capacity=view.capacity,
        owner=view.owner,
        epoch=view.epoch,
        teams=[
            team_stat_pb(stat, view.within.get(stat.team), view.held.get(stat.team))
            for stat in view.teams
        ],
        snapshot_age_s=view.snapshot_age_s,
    )


def pool_view(message: pb.SnapshotResponse) -> PoolView:
    """A Snapshot answer as the domain record. ``within`` and ``held`` hold the teams whose
    figure was sent: none from an owner that predates the field (unknown, never read as 0)."""
    return PoolView(
        PoolName(message.pool),
        message.capacity,
        NodeId(message.owner),
        Epoch(message.epoch),
        [team_stat(t) for t in message.teams],
        message.snapshot_age_s if message.HasField("snapshot_age_s") else None,
        within={t.team: t.within for t in message.teams if t.HasField("within")},
        held={t.team: t.held for t in message.teams if t.HasField("held")},
    )


# -- enums ---------------------------------------------------------------------------------

SERVICE_CLASS_PB: Final = {Class.INTERACTIVE: pb.INTERACTIVE, Class.BATCH: pb.BATCH}
"""fairshare.Class -> the ServiceClass enum value."""

DEGRADED_MODE_PB: Final = {
    DegradedMode.FAIL_OPEN: pb.FAIL_OPEN,
    DegradedMode.FAIL_CLOSED: pb.FAIL_CLOSED,
}
"""fairshare.modes.DegradedMode -> the DegradedMode enum value."""

_DEGRADED_MODES: Final[dict[int, DegradedMode]] = {
    int(value): mode for mode, value in DEGRADED_MODE_PB.items()
}


def service_class(value: int) -> Class:
    """The service class a request names.

    Raises:
        InvalidArgument: ``service_class`` names no class.
    """
    try:
        return Class(value)
    except ValueError:
        raise InvalidArgument("service_class", f"unknown service class {value}") from None


def degraded_mode(value: int) -> DegradedMode:
    """The degraded mode a PoolInfo names (``FAIL_OPEN`` for a value it does not know)."""
    return _DEGRADED_MODES.get(value, DegradedMode.FAIL_OPEN)


# -- Acquire -------------------------------------------------------------------------------


def acquire_request(
    *,
    pool: str,
    team: str,
    cls: Class,
    est_tokens: int,
    holder: str,
    request_id: str,
    try_only: bool,
    epoch: int = 0,
    wait_s: float = 0.0,
) -> pb.AcquireRequest:
    """The Acquire message; ``epoch`` 0 leaves it unset (a caller that is not a peer), and
    ``wait_s`` 0 too (answer at once)."""
    return pb.AcquireRequest(
        pool=pool,
        team=team,
        service_class=SERVICE_CLASS_PB[cls],
        est_tokens=est_tokens,
        holder=holder,
        request_id=request_id,
        try_only=try_only,
        epoch=epoch,
        wait_s=wait_s,
    )


def required_epoch(request: pb.AcquireRequest) -> Epoch | None:
    """The epoch a forwarding peer requires of the owner; None when the request sets none."""
    return Epoch(request.epoch) if request.epoch else None


def decision_pb(decision: Decision) -> pb.AcquireResponse:
    """A decision as the Acquire answer."""
    return pb.AcquireResponse(
        granted=decision.granted,
        grant_id=decision.grant_id,
        priority=decision.priority,
        borrowing=decision.borrowing,
        saturated=decision.saturated,
        degraded=decision.degraded,
        owner=decision.owner,
        epoch=decision.epoch,
    )


def decision(message: pb.AcquireResponse) -> Decision:
    """An Acquire answer as the domain record."""
    return Decision(
        granted=message.granted,
        grant_id=message.grant_id,
        priority=message.priority,
        borrowing=message.borrowing,
        saturated=message.saturated,
        degraded=message.degraded,
        owner=NodeId(message.owner),
        epoch=Epoch(message.epoch),
    )


# -- Adopt ---------------------------------------------------------------------------------


class Held(Protocol):
    """A live grant as a holder re-reports it (``HeldGrant``, the client's grants)."""

    @property
    def grant_id(self) -> str: ...
    @property
    def team(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def borrowing(self) -> bool: ...
    @property
    def est_tokens(self) -> int: ...


def adopt_request(
    *, pool: str, epoch: int, holder: str, complete: bool, grants: Iterable[Held]
) -> pb.AdoptRequest:
    """The Adopt message re-reporting ``grants`` to the owner of ``pool`` at ``epoch``."""
    return pb.AdoptRequest(
        pool=pool,
        epoch=epoch,
        holder=holder,
        complete=complete,
        grants=[
            pb.HeldGrant(
                grant_id=g.grant_id,
                team=g.team,
                priority=g.priority,
                borrowing=g.borrowing,
                est_tokens=g.est_tokens,
            )
            for g in grants
        ],
    )


def held_grant(message: pb.HeldGrant) -> HeldGrant:
    """One re-reported grant as the domain record."""
    return HeldGrant(
        grant_id=message.grant_id,
        team=message.team,
        priority=message.priority,
        borrowing=message.borrowing,
        est_tokens=message.est_tokens,
    )


def adopt_result_pb(result: AdoptResult) -> pb.AdoptResponse:
    """What an Adopt changed, as its answer."""
    return pb.AdoptResponse(
        adopted=result.adopted,
        phantoms_dropped=result.phantoms_dropped,
        owner=result.owner,
        epoch=result.epoch,
    )


def adopt_result(message: pb.AdoptResponse) -> AdoptResult:
    """An Adopt answer as the domain record."""
    return AdoptResult(
        message.adopted, message.phantoms_dropped, NodeId(message.owner), Epoch(message.epoch)
    )


# -- KeepAlive -----------------------------------------------------------------------------


def keep_alive_result_pb(result: KeepAliveResult) -> pb.KeepAliveResponse:
    """What a KeepAlive renewed, as its answer."""
    return pb.KeepAliveResponse(
        renewed=list(result.renewed), unknown=list(result.unknown), ttl_s=result.ttl_s
    )


def keep_alive_result(message: pb.KeepAliveResponse) -> KeepAliveResult:
    """A KeepAlive answer as the domain record."""
    return KeepAliveResult(list(message.renewed), list(message.unknown), message.ttl_s)


# -- ListPools -----------------------------------------------------------------------------


def pool_info_pb(info: PoolInfo, mode: DegradedMode) -> pb.PoolInfo:
    """One line of ListPools with the pool's degraded mode."""
    return pb.PoolInfo(
        pool=info.pool,
        capacity=info.capacity,
        owner=info.owner,
        owner_address=info.owner_address,
        epoch=info.epoch,
        degraded_mode=DEGRADED_MODE_PB[mode],
        lends_all=info.lends_all,
    )
