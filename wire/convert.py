"""Conversions between fairshare.v1 messages and domain types used by more than one module."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Protocol

from fairshare import Class, TeamStat
from server.pb.fairshare.v1 import allocator_pb2 as pb

_MAX_INT32: Final = 2**31 - 1
_MAX_INT64: Final = 2**63 - 1


def team_stat_pb(stat: TeamStat) -> pb.TeamStat:
    """One TeamStat as its message (same field names; rank capped to int32 and tokens to
    int64, so a table never fails to encode: the door keeps them far below anyway)."""
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


SERVICE_CLASS_PB: Final = {Class.INTERACTIVE: pb.INTERACTIVE, Class.BATCH: pb.BATCH}
"""fairshare.Class -> the ServiceClass enum value."""


class Held(Protocol):
    """A live grant as a holder re-reports it (``ha.api.HeldGrant``, the client's grants)."""

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
