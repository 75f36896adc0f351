"""Which teams a pool keeps state for: admission of unknown teams and restored usage.

Guarantees: a pool never keeps more than ``max_teams`` teams, nor, under
``unknown_teams: deny``, a team that is not configured; configured teams are always
admitted and their restored usage always kept.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Mapping

from fairshare import Pool
from ha.api import InvalidArgument, LimitExceeded
from ha.settings import PoolConfig, UnknownTeams

logger = logging.getLogger(__name__)


def admit(pool: Pool, config: PoolConfig, team: str) -> None:
    """Lets ``team`` into the pool's state, as the pool's config allows.

    A known team is always admitted. An unknown one is refused under
    ``unknown_teams: deny``; at ``max_teams`` the pool first forgets idle teams of
    negligible usage (``Pool.prune``, O(log T)), and refuses if none can be.

    Raises:
        InvalidArgument: the team is not configured and the pool denies such teams.
        LimitExceeded: the pool already keeps ``max_teams`` teams it cannot forget.
    """
    if not team or pool.knows(team):
        return  # an empty team is refused by the pool itself, naming the field
    if config.unknown_teams is UnknownTeams.DENY:
        raise InvalidArgument(
            "team", f"team {team!r} is not configured in pool {config.name} (unknown_teams: deny)"
        )
    limit = config.max_teams
    if pool.team_count >= limit:
        pool.prune(limit - 1)
    if pool.team_count >= limit:
        raise LimitExceeded(
            "max_teams",
            f"pool {config.name} already keeps {limit} teams, none idle with negligible "
            f"usage; team {team!r} refused",
        )


def restorable(config: PoolConfig, usage: Mapping[str, float]) -> Mapping[str, float]:
    """The restored usage within ``max_teams`` (and ``unknown_teams``): configured teams
    and then the largest users; the others start afresh if they come back. A state
    written before the limits, or under a larger ``max_teams``, restores in time."""
    shares = config.shares
    if config.unknown_teams is UnknownTeams.DENY:
        return {team: used for team, used in usage.items() if team in shares}
    if len(usage) <= config.max_teams:
        return usage
    room = config.max_teams - len(shares)
    others = heapq.nlargest(
        room, ((used, team) for team, used in usage.items() if team not in shares)
    )
    kept = {team: usage[team] for team in shares if team in usage}
    kept.update((team, used) for used, team in others)
    logger.warning(
        "pool %s: the restored state has %d teams, max_teams is %d; the %d smallest "
        "users start afresh",
        config.name,
        len(usage),
        config.max_teams,
        len(usage) - len(kept),
    )
    return kept
