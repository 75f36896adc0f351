"""The nemeses of the failover drills, shared by the CI drills and `make drill`.

Each takes a started cluster, does its harm, waits until the pools have owners again,
and returns (when the harm began, when it ended) on the monotonic clock.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable

from drill_harness import LEASE_TTL_S, DrillCluster, Replica, wait_serving

Nemesis = Callable[[DrillCluster], Awaitable[tuple[float, float]]]


async def owner_of(cluster: DrillCluster, pool: str) -> str:
    return (await cluster.owners())[pool][0]


async def sigkill_owner(cluster: DrillCluster) -> tuple[float, float]:
    victim = cluster.replica(await owner_of(cluster, "gpu-a"))
    at = time.monotonic()
    victim.signal(signal.SIGKILL)
    await cluster.wait_owned(exclude=victim.node)
    end = time.monotonic()
    await restart(victim)
    return at, end


async def sigstop_owner(cluster: DrillCluster) -> tuple[float, float]:
    victim = cluster.replica(await owner_of(cluster, "gpu-b"))
    at = time.monotonic()
    victim.signal(signal.SIGSTOP)
    await asyncio.sleep(2 * LEASE_TTL_S)
    victim.signal(signal.SIGCONT)
    await cluster.wait_owned()
    return at, time.monotonic()


async def sigstop_etcd(cluster: DrillCluster) -> tuple[float, float]:
    at = time.monotonic()
    cluster.etcd.pause()
    await asyncio.sleep(2 * LEASE_TTL_S)
    cluster.etcd.resume()
    await cluster.wait_owned()
    return at, time.monotonic()


async def rolling_restart(cluster: DrillCluster) -> tuple[float, float]:
    at = time.monotonic()
    for replica in cluster.replicas:
        replica.signal(signal.SIGTERM)
        code = replica.wait(15.0)
        if code != 0:
            raise AssertionError(f"{replica.node} exited {code} on SIGTERM")
        replica.start()
        await wait_serving(replica.address)
        await cluster.wait_owned()
        await asyncio.sleep(0.5)
    return at, time.monotonic()


async def switchover(cluster: DrillCluster) -> tuple[float, float]:
    source = await owner_of(cluster, "gpu-a")
    target = next(r.node for r in cluster.replicas if r.node != source)
    at = time.monotonic()
    await cluster.switchover("gpu-a", target)
    for _ in range(200):
        if await owner_of(cluster, "gpu-a") == target:
            break
        await asyncio.sleep(0.01)
    return at, time.monotonic()


async def empty_state_dir(cluster: DrillCluster) -> tuple[float, float]:
    victim = cluster.replica(await owner_of(cluster, "gpu-a"))
    at = time.monotonic()
    victim.signal(signal.SIGKILL)
    victim.wait(5.0)
    victim.start(empty_state=True)
    await wait_serving(victim.address)
    await cluster.wait_owned()
    return at, time.monotonic()


async def killed_gateway(cluster: DrillCluster) -> tuple[float, float]:
    """A gateway dies holding grants, and the owner dies too: its phantoms must expire."""
    at = time.monotonic()
    await cluster.live_gateway().kill()
    victim = cluster.replica(await owner_of(cluster, "gpu-a"))
    victim.signal(signal.SIGKILL)
    await cluster.wait_owned(exclude=victim.node)
    end = time.monotonic()
    await restart(victim)
    return at, end


async def restart(replica: Replica) -> None:
    """A supervisor brings a killed replica back."""
    replica.wait(5.0)
    replica.start()
    await wait_serving(replica.address)


NEMESES: dict[str, Nemesis] = {
    "sigkill-owner": sigkill_owner,
    "sigstop-owner": sigstop_owner,
    "sigstop-etcd": sigstop_etcd,
    "rolling-restart": rolling_restart,
    "switchover": switchover,
    "empty-state-dir": empty_state_dir,
    "killed-gateway": killed_gateway,
}
