"""The replica's state as one JSON document: what the status page shows.

``status_report`` runs on the replica's event loop (it reads ``ha.node.Node``, whose state
only the loop may touch) and returns plain JSON-ready values; ``server.status_page``
serves it from the metrics port's threads.

What it guarantees:
- per pool: the local view (owned here, owner, epoch, degraded mode, fencing, the age of
  the stored state, degraded decisions) and the team table **of the owner**: read here
  when this replica owns the pool, else asked of the owner with the Snapshot call the
  replicas already forward (``source`` says which: ``local``, ``owner``, or
  ``unavailable`` with the error, when no owner answered within ``FORWARD_TIMEOUT_S``);
- per team: share, reservation, its within-share count (``within``: within-share grants
  plus phantoms counted as within, what decides its next request's standing; null when
  the owner did not send it), grants in flight within share (``within_grants``) and
  borrowing, its borrowers held back by the pool's lending limit (``held``: waiting at
  the owner for a slot; null when the owner did not send it), phantoms, decayed
  usage, level fairshare (``"inf"`` for a team with a share and no usage yet: JSON has no
  infinity), rank, and the priority its next borrowing request would get;
- per replica: the members of the cluster view, the pools each owns, and this replica's
  own lease (seconds before it self-fences).

What it does not guarantee: one instant. Each pool is read at its own moment (a forwarded
table comes a round trip later than the local view); the page is a picture for people,
not an input to decisions. The age of the stored state is the owner's, forwarded with its
table (null when no owner answered, or one of a version that does not send it).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

from fairshare import TeamStat
from ha import AllocatorError, MemberStatus, PoolConfig, PoolInfo, PoolStatus, PoolView

FORWARD_TIMEOUT_S: Final = 1.0
"""How long the report waits for a pool's owner to answer its Snapshot."""

Json = dict[str, Any]


class StatusSource(Protocol):
    """What the report reads of a replica (``ha.node.Node`` is one)."""

    @property
    def node_id(self) -> str: ...

    @property
    def joined(self) -> bool: ...

    def status(self) -> list[PoolStatus]: ...

    def members(self) -> list[MemberStatus]: ...

    async def list_pools(self) -> list[PoolInfo]: ...

    async def snapshot(self, pool: str, *, forwarded: bool = False) -> PoolView: ...


async def status_report(node: StatusSource, configs: Sequence[PoolConfig]) -> Json:
    """The replica's status (see module); call it on the node's event loop."""
    modes = {config.name: config for config in configs}
    infos = {info.pool: info for info in await node.list_pools()}
    local = node.status()
    tables = await asyncio.gather(*(_table(node, view) for view in local))
    pools = []
    for view, (source, error, remote, teams) in zip(local, tables, strict=True):
        info = infos.get(view.pool)
        config = modes.get(view.pool)
        pools.append(
            {
                "pool": view.pool,
                "capacity": remote.capacity if remote is not None else _capacity(info, config),
                "owner": view.owner,
                "owner_address": info.owner_address if info is not None else "",
                "epoch": int(view.epoch),
                "owned_here": view.owned,
                "degraded_mode": config.degraded_mode.value if config is not None else "",
                "snapshot_age_s": _age(view, remote),
                "fence_left_s": view.fence_left_s,
                "degraded_decisions": view.degraded_decisions,
                "store_full": view.store_full,
                "source": source,
                "error": error,
                "in_flight": sum(t["in_flight"] for t in teams),
                "phantoms": sum(t["phantoms"] for t in teams),
                "teams": teams,
            }
        )
    return {
        "node": node.node_id,
        "joined": node.joined,
        "time": time.time(),
        "pools": pools,
        "replicas": [_member(m) for m in node.members()],
    }


async def _table(
    node: StatusSource, view: PoolStatus
) -> tuple[str, str, PoolView | None, list[Json]]:
    """(source, error, the owner's view if asked, the team rows) of one pool."""
    if view.owned:
        return "local", "", None, _teams(view.teams, view.within, view.held)
    try:
        async with asyncio.timeout(FORWARD_TIMEOUT_S):
            remote = await node.snapshot(view.pool)
    except TimeoutError:
        return "unavailable", f"the owner did not answer within {FORWARD_TIMEOUT_S:g}s", None, []
    except AllocatorError as e:
        return "unavailable", f"{type(e).__name__}: {e}", None, []
    held = remote.held if remote.held else None  # an owner that predates it sends none
    return "owner", "", remote, _teams(remote.teams, remote.within, held)


def _age(view: PoolStatus, remote: PoolView | None) -> float | None:
    """The lag of the pool's stored state, as its owner knows it."""
    if view.owned:
        return view.snapshot_age_s
    return remote.snapshot_age_s if remote is not None else None


def _capacity(info: PoolInfo | None, config: PoolConfig | None) -> int:
    if info is not None:
        return info.capacity
    return config.capacity if config is not None else 0


def _teams(
    stats: Sequence[TeamStat], within: Mapping[str, int], held: Mapping[str, int] | None
) -> list[Json]:
    """The team rows; ``held`` None: not known here (the Snapshot call does not carry it)."""
    return [
        _team(stat, within.get(stat.team), None if held is None else held.get(stat.team, 0))
        for stat in stats
    ]


def _team(stat: TeamStat, within: int | None, held: int | None) -> Json:
    lf = stat.level_fairshare
    return {
        "team": stat.team,
        "share": stat.share,
        "reserved": stat.reserved,
        "within": within,
        "in_flight": stat.in_flight,
        "within_grants": stat.in_flight - stat.borrowing,
        "borrowing": stat.borrowing,
        "held": held,
        "phantoms": stat.phantoms,
        "usage": stat.usage,
        "level_fairshare": lf if math.isfinite(lf) else "inf",
        "rank": stat.rank,
        "borrow_priority": stat.borrow_priority,
    }


def _member(member: MemberStatus) -> Json:
    return {
        "node": member.node,
        "address": member.address,
        "member_for_s": member.member_for_s,
        "pools": list(member.pools),
        "lease_left_s": member.lease_left_s,
    }
