"""Reservations that hold under sustained load, across a SIGKILL of the owner.

Every team keeps 1.5 or 3 times its reservation in flight (each worker of a gateway keeps
one request of its team in flight, sending the next as each ends) while the owner of a
pool is killed. Checked, besides the ledger's invariants at every poll (no team ever has
more within-share grants in flight than its reservation, old owner's included: no
reserved slot is handed out twice):

- before the kill and after every holder has re-reported (no phantom left), at a moment
  when nothing moves (every worker holds its grant), each team's within-share grants as
  the owner counts them are exactly those in flight in the ledger, and the team gets the
  rest of its reservation: the next requests are within share until it holds all of its
  reserved slots, and the one after borrows.
"""

from __future__ import annotations

import asyncio
import random
import time

import nemeses
import pytest
from drill_config import LEASE_TTL_S, POOLS, RESERVED
from drill_harness import DrillCluster
from drill_ledger import DrillResult

pytestmark = [pytest.mark.drill, pytest.mark.etcd, pytest.mark.timeout(120)]

OVERLOAD = {
    ("gpu-a", "inst-a"): 1.5,
    ("gpu-a", "inst-b"): 3.0,
    ("gpu-b", "research"): 1.5,
    ("gpu-b", "product"): 3.0,
    ("gpu-b", "eval"): 3.0,
}
"""Team -> how many times its reservation it keeps in flight."""
GATEWAYS = 3
MAX_REQUEST_S = 20.0
"""Longer than the other drills' (6 s): long requests here run for seconds, parked besides,
and none may outlive its grant (that it would lose its slot is another matter)."""
LONG = 0.4
"""The fraction of requests that run for seconds, across the owner's outage (the rest end
within 0.4 s)."""


def hold_s(rng: random.Random) -> float:
    """Mixed lengths: long requests keep the old owner's grants running (and so its
    phantoms counting) after the new owner starts deciding."""
    return rng.uniform(2.0, 6.0) if rng.random() < LONG else rng.uniform(0.02, 0.4)


WARMUP_S = 2.0
AFTER_S = 3.0


def workers() -> list[tuple[str, str]]:
    """One entry per worker: each team's reservation times its overload."""
    return [
        team
        for team, factor in OVERLOAD.items()
        for _ in range(round(RESERVED[team[0]][team[1]] * factor))
    ]


async def still(cluster: DrillCluster) -> None:
    """Parks every worker on a grant and waits until every release has reached an owner."""
    for gw in cluster.gateways:
        gw.park()
    deadline = time.monotonic() + 15.0
    expected = len(workers())
    while time.monotonic() < deadline:
        parked = sum(gw.parked for gw in cluster.gateways)
        pending = sum(gw.client.pending_releases for gw in cluster.gateways)
        if parked == expected and pending == 0:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"workers did not park: {parked}/{expected}, {pending} releases")


async def check_reservations_kept(cluster: DrillCluster, when: str) -> list[str]:
    """At a still moment: the owner's within-share count of each team is what is in flight,
    and the team gets every reserved slot it does not hold (then borrows)."""
    problems: list[str] = []
    await still(cluster)
    live = cluster.ledger.live_within()
    probe = cluster.gateways[0]
    for pool in POOLS:
        view = await cluster.snapshot(pool)
        assert view is not None, f"no replica answers Snapshot({pool})"
        teams = {t.team: t for t in view.teams}
        for team, reserved in RESERVED[pool].items():
            stat = teams[team]
            counted = stat.in_flight - stat.borrowing
            held = live.get((pool, team), 0)
            if stat.phantoms or counted != held:
                problems.append(
                    f"{when}: {pool}/{team}: the owner counts {counted} within share "
                    f"({stat.phantoms} phantoms), {held} are in flight"
                )
            extra = [await probe.hold(pool, team) for _ in range(reserved - held + 1)]
            standing = [record.borrowing for _, record in extra]
            if standing != [False] * (reserved - held) + [True]:
                problems.append(
                    f"{when}: {pool}/{team} (reservation {reserved}, {held} within share "
                    f"in flight): the next requests were borrowing={standing}"
                )
            for grant, record in extra:
                await probe.release_held(grant, record, 0.0)
    for gw in cluster.gateways:
        gw.unpark()
    return problems


async def wait_no_phantoms(cluster: DrillCluster) -> None:
    deadline = time.monotonic() + MAX_REQUEST_S + 4 * LEASE_TTL_S
    while time.monotonic() < deadline:
        if await cluster.phantoms() == 0:
            return
        await asyncio.sleep(0.2)
    raise AssertionError("phantoms never reached 0")


async def test_a_team_over_its_reservation_keeps_its_reserved_slots_across_a_sigkill(
    report: list[DrillResult], drill_clusters: list[DrillCluster]
) -> None:
    cluster = DrillCluster("sustained-overload", gateways=0, max_request_s=MAX_REQUEST_S)
    drill_clusters.append(cluster)
    try:
        await cluster.start()
        every = workers()
        for i in range(GATEWAYS):
            cluster.add_gateway(assignments=every[i::GATEWAYS], hold_s=hold_s)
        await asyncio.sleep(WARMUP_S)
        problems = await check_reservations_kept(cluster, "before the kill")
        at, end = await nemeses.sigkill_owner(cluster)
        await asyncio.sleep(AFTER_S)
        await wait_no_phantoms(cluster)
        problems += await check_reservations_kept(cluster, "after the re-reports")
        await asyncio.sleep(1.0)
        result = await cluster.finish(nemesis_at=at, nemesis_end=end)
        report.append(result)
        assert result.grants > 150, f"too little load to prove anything: {result.grants}"
        assert not problems and not result.violations, (
            "\n".join(problems + result.violations) + "\n" + cluster.logs()
        )
    finally:
        await cluster.close()
