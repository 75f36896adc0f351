"""Conversions between fairshare.v1 messages and domain types used by more than one module."""

from __future__ import annotations

from typing import Final

from fairshare import Class, TeamStat
from server.pb.fairshare.v1 import allocator_pb2 as pb

_MAX_INT32: Final = 2**31 - 1


def team_stat_pb(stat: TeamStat) -> pb.TeamStat:
    """One TeamStat as its message (same field names; rank capped to int32)."""
    return pb.TeamStat(
        team=stat.team,
        share=stat.share,
        reserved=stat.reserved,
        in_flight=stat.in_flight,
        borrowing=stat.borrowing,
        in_flight_tokens=stat.in_flight_tokens,
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
