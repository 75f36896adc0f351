"""Failover drills, one nemesis each, named by the sentence they prove.

Real etcd, three `fairshare serve` processes, three gateways under load through the
client library; invariants checked at every poll and at the end (see harness.py).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from harness import LEASE_TTL_S, MAX_REQUEST_S, DrillCluster, DrillResult

pytestmark = [pytest.mark.drill, pytest.mark.timeout(90)]

WARMUP_S = 1.5
AFTER_S = 3.0


@pytest.fixture
async def make_cluster() -> AsyncIterator[Callable[[str], Awaitable[DrillCluster]]]:
    clusters: list[DrillCluster] = []

    async def make(name: str) -> DrillCluster:
        cluster = DrillCluster(name)
        clusters.append(cluster)
        await cluster.start()
        return cluster

    yield make
    for cluster in clusters:
        await cluster.close()


def judge(result: DrillResult, cluster: DrillCluster, report: list[DrillResult]) -> None:
    report.append(result)
    assert result.grants > 50, f"too little load to prove anything: {result.grants} grants"
    assert not result.violations, "\n".join(result.violations) + "\n" + cluster.logs()


async def owner_of(cluster: DrillCluster, pool: str) -> str:
    owners = await cluster.owners()
    return owners[pool][0]


async def test_a_killed_owner_is_replaced_within_T_plus_1s_and_no_slot_is_promised_twice(
    make_cluster: Callable[[str], Awaitable[DrillCluster]], report: list[DrillResult]
) -> None:
    cluster = await make_cluster("sigkill-owner")
    await asyncio.sleep(WARMUP_S)
    victim = cluster.replica(await owner_of(cluster, "gpu-a"))
    at = time.monotonic()
    victim.signal(signal.SIGKILL)
    took = await cluster.wait_owned(exclude=victim.node)
    end = time.monotonic()
    await asyncio.sleep(AFTER_S)
    result = await cluster.finish(nemesis_at=at, nemesis_end=end)
    judge(result, cluster, report)
    assert took <= LEASE_TTL_S + 1.0, f"no new owner {took:.2f}s after the kill"


async def test_a_paused_owner_stops_deciding_and_never_decides_again_when_resumed(
    make_cluster: Callable[[str], Awaitable[DrillCluster]], report: list[DrillResult]
) -> None:
    cluster = await make_cluster("sigstop-owner")
    await asyncio.sleep(WARMUP_S)
    victim = cluster.replica(await owner_of(cluster, "gpu-b"))
    at = time.monotonic()
    victim.signal(signal.SIGSTOP)
    await asyncio.sleep(2 * LEASE_TTL_S)
    victim.signal(signal.SIGCONT)
    await cluster.wait_owned()
    end = time.monotonic()
    await asyncio.sleep(AFTER_S)
    result = await cluster.finish(nemesis_at=at, nemesis_end=end)
    judge(result, cluster, report)
    assert "lost pool" in victim.log_text() or "self-fenced" in victim.log_text()


async def test_a_paused_etcd_degrades_the_pools_and_they_recover_without_restarts(
    make_cluster: Callable[[str], Awaitable[DrillCluster]], report: list[DrillResult]
) -> None:
    cluster = await make_cluster("sigstop-etcd")
    await asyncio.sleep(WARMUP_S)
    starts = [r.starts for r in cluster.replicas]
    at = time.monotonic()
    cluster.etcd.pause()
    await asyncio.sleep(2 * LEASE_TTL_S)
    cluster.etcd.resume()
    await cluster.wait_owned()
    end = time.monotonic()
    await asyncio.sleep(AFTER_S)
    result = await cluster.finish(nemesis_at=at, nemesis_end=end)
    judge(result, cluster, report)
    assert all(r.alive for r in cluster.replicas)
    assert [r.starts for r in cluster.replicas] == starts


async def test_a_rolling_restart_of_every_replica_keeps_usage_and_reservations(
    make_cluster: Callable[[str], Awaitable[DrillCluster]], report: list[DrillResult]
) -> None:
    from harness import wait_serving

    cluster = await make_cluster("rolling-restart")
    await asyncio.sleep(WARMUP_S)
    at = time.monotonic()
    for replica in cluster.replicas:
        replica.signal(signal.SIGTERM)
        assert replica.wait(15.0) == 0, f"{replica.node} did not exit 0 on SIGTERM"
        replica.start()
        await wait_serving(replica.address)
        await cluster.wait_owned()
        await asyncio.sleep(0.5)
    end = time.monotonic()
    await asyncio.sleep(AFTER_S)
    result = await cluster.finish(nemesis_at=at, nemesis_end=end)
    judge(result, cluster, report)


async def test_a_planned_switchover_moves_a_pool_at_once(
    make_cluster: Callable[[str], Awaitable[DrillCluster]], report: list[DrillResult]
) -> None:
    cluster = await make_cluster("switchover")
    await asyncio.sleep(WARMUP_S)
    source = await owner_of(cluster, "gpu-a")
    target = next(r.node for r in cluster.replicas if r.node != source)
    at = time.monotonic()
    await cluster.switchover("gpu-a", target)
    for _ in range(200):
        if await owner_of(cluster, "gpu-a") == target:
            break
        await asyncio.sleep(0.01)
    end = time.monotonic()
    assert await owner_of(cluster, "gpu-a") == target
    await asyncio.sleep(AFTER_S)
    result = await cluster.finish(nemesis_at=at, nemesis_end=end)
    judge(result, cluster, report)
    assert end - at < 1.0, f"switchover took {end - at:.2f}s"


async def test_a_replica_restarted_with_an_empty_state_dir_rejoins(
    make_cluster: Callable[[str], Awaitable[DrillCluster]], report: list[DrillResult]
) -> None:
    from harness import wait_serving

    cluster = await make_cluster("empty-state-dir")
    await asyncio.sleep(WARMUP_S)
    victim = cluster.replica(await owner_of(cluster, "gpu-a"))
    at = time.monotonic()
    victim.signal(signal.SIGKILL)
    victim.wait(5.0)
    victim.start(empty_state=True)
    await wait_serving(victim.address)
    await cluster.wait_owned()
    end = time.monotonic()
    await asyncio.sleep(AFTER_S + LEASE_TTL_S)
    result = await cluster.finish(nemesis_at=at, nemesis_end=end)
    judge(result, cluster, report)


async def test_a_killed_gateway_holds_nothing_for_longer_than_max_request_s(
    make_cluster: Callable[[str], Awaitable[DrillCluster]], report: list[DrillResult]
) -> None:
    cluster = await make_cluster("killed-gateway")
    await asyncio.sleep(WARMUP_S)
    dead = cluster.gateways[0]
    at = time.monotonic()
    await dead.kill()
    abandoned = [g for g in cluster.ledger.grants if g.abandoned]
    # Its owner dies too, so its grants become phantoms that nobody will re-report.
    victim = cluster.replica(await owner_of(cluster, "gpu-a"))
    victim.signal(signal.SIGKILL)
    await cluster.wait_owned(exclude=victim.node)
    end = time.monotonic()
    await asyncio.sleep(AFTER_S)
    result = await cluster.finish(nemesis_at=at, nemesis_end=end)
    judge(result, cluster, report)
    assert abandoned, "the gateway held no grant when it was killed"
    assert result.phantoms_zero_s is not None
    assert result.phantoms_zero_s <= MAX_REQUEST_S + 2 * LEASE_TTL_S
