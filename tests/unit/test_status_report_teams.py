"""The status report's team rows: the within-share count, from the local table or the
owner's forwarded one, and null (unknown, not 0) from an owner that does not send it; the
borrowers held back by the lending limit, likewise."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from fairshare import TeamStat
from ha.api import Epoch, MemberStatus, NodeId, PoolInfo, PoolName, PoolStatus, PoolView
from ha.settings import PoolConfig
from server.status_report import status_report

CONFIGS = [PoolConfig("here", 8, {"a": 0.5, "b": 0.5}), PoolConfig("there", 8, {"a": 1.0})]
# a: 6 in flight, 3 of them borrowing, and one phantom of unknown standing (within).
A = TeamStat("a", 0.5, 4, 6, 3, 0, 1.0, 0.5, 0, 1)
B = TeamStat("b", 0.5, 4, 0, 0, 0, 0.0, float("inf"), 0, 0)


class Source:
    """One replica that owns ``here`` and forwards ``there`` to an owner whose table
    carries ``remote_within``."""

    def __init__(self, remote_within: Mapping[str, int]) -> None:
        self.remote_within = remote_within

    node_id = "n0"
    joined = True

    def status(self) -> list[PoolStatus]:
        common = {"transitions": 1, "fence_left_s": 3.0, "snapshot_age_s": 0.0}
        return [
            PoolStatus(
                pool=PoolName("here"),
                owned=True,
                owner=NodeId("n0"),
                epoch=Epoch(1),
                teams=[A, B],
                degraded_decisions=0,
                within={"a": 4, "b": 0},
                held={"a": 2},
                **common,  # type: ignore[arg-type]
            ),
            PoolStatus(
                pool=PoolName("there"),
                owned=False,
                owner=NodeId("n1"),
                epoch=Epoch(2),
                teams=(),
                degraded_decisions=0,
                **common,  # type: ignore[arg-type]
            ),
        ]

    def members(self) -> list[MemberStatus]:
        return []

    async def list_pools(self) -> list[PoolInfo]:
        return []

    async def snapshot(self, pool: str, *, forwarded: bool = False) -> PoolView:
        return PoolView(
            PoolName(pool), 8, NodeId("n1"), Epoch(2), [A], 0.0, within=self.remote_within
        )


def teams(remote_within: Mapping[str, int]) -> dict[str, dict[str, dict[str, object]]]:
    report = asyncio.run(status_report(Source(remote_within), CONFIGS))
    return {p["pool"]: {t["team"]: t for t in p["teams"]} for p in report["pools"]}


def test_rows_carry_the_count_and_the_grants_within_share_apart() -> None:
    shown = teams({"a": 4})
    a = shown["here"]["a"]
    # The phantom counts in the within-share count, not in the grants in flight.
    assert (a["reserved"], a["within"], a["within_grants"], a["borrowing"]) == (4, 4, 3, 3)
    assert shown["here"]["b"]["within"] == 0
    assert shown["there"]["a"]["within"] == 4


def test_an_owner_that_does_not_send_the_count_shows_it_unknown() -> None:
    a = teams({})["there"]["a"]
    assert a["within"] is None and a["within_grants"] == 3


def test_held_borrowers_show_and_are_unknown_from_an_owner_that_does_not_send_them() -> None:
    shown = teams({"a": 4})
    assert (shown["here"]["a"]["held"], shown["here"]["b"]["held"]) == (2, 0)
    assert shown["there"]["a"]["held"] is None
