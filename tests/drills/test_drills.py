"""Failover drills, one nemesis each, named by the sentence they prove.

Real etcd, three `fairshare serve` processes, three gateways under load through the
client library; invariants checked at every poll and at the end (tests/drill_harness.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import nemeses
import pytest
from drill_harness import LEASE_TTL_S, MAX_REQUEST_S, DrillCluster, DrillResult

pytestmark = [pytest.mark.drill, pytest.mark.etcd, pytest.mark.timeout(90)]

WARMUP_S = 1.5
AFTER_S = 3.0

Drill = Callable[[str], Awaitable[tuple[DrillCluster, DrillResult]]]


@pytest.fixture
async def drill(report: list[DrillResult]) -> AsyncIterator[Drill]:
    clusters: list[DrillCluster] = []

    async def run(name: str) -> tuple[DrillCluster, DrillResult]:
        cluster = DrillCluster(name)
        clusters.append(cluster)
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
    for cluster in clusters:
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
