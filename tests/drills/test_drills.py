"""Failover drills, one nemesis each, named by the sentence they prove.

Real etcd, three `fairshare serve` processes, three gateways under load through the
client library; invariants checked at every poll and at the end (tests/drill_ledger.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import nemeses
import pytest
from drill_config import LEASE_TTL_S, MAX_REQUEST_S
from drill_harness import DrillCluster
from drill_ledger import DrillResult

from ha.clock import WALL_OFFSET_ENV

pytestmark = [pytest.mark.drill, pytest.mark.etcd, pytest.mark.timeout(90)]

WARMUP_S = 1.5
AFTER_S = 3.0

Drill = Callable[[str], Awaitable[tuple[DrillCluster, DrillResult]]]


@pytest.fixture
async def drill(
    report: list[DrillResult], drill_clusters: list[DrillCluster]
) -> AsyncIterator[Drill]:
    async def run(name: str) -> tuple[DrillCluster, DrillResult]:
        cluster = DrillCluster(name)
        drill_clusters.append(cluster)
        await cluster.start()
        await asyncio.sleep(WARMUP_S)
        at, end = await nemeses.NEMESES[name](cluster)
        await asyncio.sleep(AFTER_S)
        result = await cluster.finish(nemesis_at=at, nemesis_end=end)
        report.append(result)
        assert result.grants > 50, f"too little load to prove anything: {result.grants} grants"
        assert not result.violations, "\n".join(result.violations) + "\n" + cluster.logs()
        return cluster, result

    yield run
    for cluster in drill_clusters:
        await cluster.close()


async def test_a_killed_owner_is_replaced_within_T_plus_1s_and_no_slot_is_promised_twice(
    drill: Drill,
) -> None:
    _, result = await drill("sigkill-owner")
    assert result.unavailability_s <= LEASE_TTL_S + 1.0


async def test_a_paused_owner_stops_deciding_and_never_decides_again_when_resumed(
    drill: Drill,
) -> None:
    cluster, _ = await drill("sigstop-owner")
    assert any("lost pool" in r.log_text() for r in cluster.replicas)


async def test_a_paused_etcd_degrades_the_pools_and_they_recover_without_restarts(
    drill: Drill,
) -> None:
    cluster, result = await drill("sigstop-etcd")
    assert all(r.alive and r.starts == 1 for r in cluster.replicas)
    assert result.degraded > 0  # fail_open kept work flowing while nobody could decide


async def test_a_rolling_restart_of_every_replica_keeps_usage_and_reservations(
    drill: Drill,
) -> None:
    _, result = await drill("rolling-restart")
    assert result.usage_error <= 0.01


async def test_a_planned_switchover_moves_a_pool_at_once(drill: Drill) -> None:
    _, result = await drill("switchover")
    assert result.unavailability_s < 1.0


async def test_a_replica_restarted_with_an_empty_state_dir_rejoins(drill: Drill) -> None:
    cluster, _ = await drill("empty-state-dir")
    assert all(r.alive for r in cluster.replicas)


async def test_a_killed_gateway_holds_nothing_for_longer_than_max_request_s(
    drill: Drill,
) -> None:
    cluster, result = await drill("killed-gateway")
    assert any(g.abandoned for g in cluster.ledger.grants)
    assert result.phantoms_zero_s is not None
    assert result.phantoms_zero_s <= MAX_REQUEST_S + 2 * LEASE_TTL_S


async def test_an_etcd_stall_within_the_fencing_budget_changes_no_owner(drill: Drill) -> None:
    _, result = await drill("etcd-stall-within-budget")
    assert result.transitions == 0, f"{result.transitions} ownership transitions"


async def test_a_crashed_owner_is_replaced_while_the_watched_etcd_member_is_partitioned(
    drill: Drill,
) -> None:
    _, result = await drill("isolated-watch-member")
    assert result.unavailability_s <= nemeses.OWNER_FOUND_BOUND_S + 1.0


async def test_a_killed_etcd_leader_loses_no_grant_and_no_charge(drill: Drill) -> None:
    cluster, _ = await drill("kill-etcd-leader")
    assert cluster.etcd.running  # the killed member rejoined


async def test_moving_etcd_leadership_loses_no_grant_and_no_charge(drill: Drill) -> None:
    await drill("move-etcd-leader")


async def test_a_gateway_restarted_with_its_holder_id_has_its_degraded_grants_counted_and_charged(
    drill: Drill,
) -> None:
    _, result = await drill("restarted-gateway")
    assert result.degraded >= 2 * nemeses.HELD_PER_CUT


async def test_a_wall_clock_step_of_ten_minutes_on_the_owner_neither_over_admits_nor_loses_charges(
    drill: Drill,
) -> None:
    cluster, _ = await drill("wall-clock-step")
    # The step must have happened: a replica with the test hook says so when it starts.
    assert all(WALL_OFFSET_ENV in r.log_text() for r in cluster.replicas), (
        "a replica does not use the injected wall clock: the test hook is missing"
    )
