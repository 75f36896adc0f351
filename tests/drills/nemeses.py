"""The nemeses of the failover drills, shared by the CI drills and `make drill`.

Each takes a started cluster, does its harm, waits until the pools have owners again,
and returns (when the harm began, when it ended) on the monotonic clock. Every wait is
bounded; a nemesis that cannot get the cluster back raises AssertionError.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Awaitable, Callable

from drill_config import LEASE_TTL_S, POOLS, STALL_BUDGET_S
from drill_gateway import Gateway
from drill_harness import DrillCluster
from drill_ledger import GrantRecord
from drill_replica import Replica, wait_serving

from fairshare.client import ClientGrant
from harness.etcd_cluster import CLUSTER_ELECTION_MS

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
    """A gateway dies holding grants, and the owner dies too: its phantoms must end when
    its holder session lapses at the new owner (one session TTL after the restore)."""
    at = time.monotonic()
    await cluster.live_gateway().kill()
    victim = cluster.replica(await owner_of(cluster, "gpu-a"))
    victim.signal(signal.SIGKILL)
    await cluster.wait_owned(exclude=victim.node)
    end = time.monotonic()
    await restart(victim)
    return at, end


async def restart(replica: Replica, *, attempts: int = 3) -> None:
    """A supervisor brings a killed replica back, and starts it again if it exits at
    start-up (no etcd member answered in time, as during an etcd election)."""
    replica.wait(5.0)
    for attempt in range(1, attempts + 1):
        replica.start()
        try:
            await wait_serving(replica.address, exits=replica)
            return
        except RuntimeError:
            if attempt == attempts:
                raise
            await asyncio.sleep(0.5)


async def etcd_stall_within_budget(cluster: DrillCluster) -> tuple[float, float]:
    """Every etcd member paused for half the stall budget (an fsync spike, a VM pause)."""
    at = time.monotonic()
    cluster.etcd.pause()
    await asyncio.sleep(STALL_BUDGET_S / 2)
    cluster.etcd.resume()
    end = time.monotonic()
    await asyncio.sleep(1.0)
    return at, end


ETCD_ELECTION_S = CLUSTER_ELECTION_MS / 1000
OWNER_FOUND_BOUND_S = LEASE_TTL_S + 5 * ETCD_ELECTION_S + 1.0
"""How long a pool may stay without an owner when its owner dies just as the etcd member
its survivors watch through is partitioned: the partitioned member needs up to two
election timeouts to notice it has no leader and etcd then waits three more before it
ends require-leader watches; the lease TTL runs meanwhile."""


async def isolated_watch_member(cluster: DrillCluster) -> tuple[float, float]:
    """The etcd member holding the most watch streams is cut off from its peers (its
    client URL still serving) and at once every pool owner is killed: the survivors
    learn of it only if their watches leave the partitioned member."""
    names = [m.name for m in cluster.etcd.members]
    streams = {n: await asyncio.to_thread(cluster.etcd.watch_streams, n) for n in names}
    member = max(names, key=lambda n: (streams[n], -names.index(n)))
    if await asyncio.to_thread(cluster.etcd.leader) == member:
        # Keep the majority's leader: the drill is about a partitioned follower.
        target = next(n for n in names if n != member)
        await asyncio.to_thread(cluster.etcd.move_leader, target)
    owners = await cluster.owners()
    victims = [cluster.replica(node) for node in sorted({node for node, _ in owners.values()})]
    at = time.monotonic()
    cluster.etcd.isolate(member)
    try:
        for victim in victims:
            victim.signal(signal.SIGKILL)
        excluded = frozenset(v.node for v in victims)
        await cluster.wait_owned(OWNER_FOUND_BOUND_S, exclude=excluded)
        end = time.monotonic()
    finally:
        cluster.etcd.heal()
    await asyncio.to_thread(cluster.etcd.leader)  # the member is back in the cluster
    for victim in victims:
        await restart(victim)
    return at, end


async def kill_etcd_leader(cluster: DrillCluster) -> tuple[float, float]:
    """SIGKILL of the etcd leader; it comes back on its data dir a moment later."""
    leader = await asyncio.to_thread(cluster.etcd.leader)
    at = time.monotonic()
    cluster.etcd.kill(leader)
    await asyncio.to_thread(cluster.etcd.leader)  # the two others elect one
    await cluster.wait_owned()
    end = time.monotonic()
    await asyncio.sleep(0.5)
    await asyncio.to_thread(cluster.etcd.restart_member, leader)
    return at, end


async def move_etcd_leader(cluster: DrillCluster) -> tuple[float, float]:
    """`etcdctl move-leader` to each other member in turn (a planned etcd maintenance)."""
    at = time.monotonic()
    for _ in range(2):
        current = await asyncio.to_thread(cluster.etcd.leader)
        target = next(m.name for m in cluster.etcd.members if m.name != current)
        await asyncio.to_thread(cluster.etcd.move_leader, target)
        await asyncio.sleep(0.5)
    await cluster.wait_owned()
    return at, time.monotonic()


CUT_S = 1.0
HELD_PER_CUT = 2
HELD_CONSUMED = 40.0  # large enough that an uncharged release shows in the usage error,
# and below the replicas' charge bound (max_charge_per_s 8 x max_request_s 6)
COUNTED_WITHIN_S = 1.5


async def restarted_gateway(cluster: DrillCluster) -> tuple[float, float]:
    """A gateway cut off from every replica (the owners stay in place) decides fail_open;
    after the partition heals its degraded grants must count at the owner. Then, cut off
    again, it dies holding degraded grants and restarts with the same holder id: the new
    process's degraded grants too must count, and its releases be charged."""
    holder = f"gw-restarted-{len(cluster.gateways)}"  # unique per run of this nemesis
    first = cluster.add_gateway(holder=holder, relayed=True)
    await asyncio.sleep(1.0)  # it has seen every pool's owner and epoch
    at = time.monotonic()
    cluster.cut_relays()
    await asyncio.sleep(0.3)
    held = [await first.hold("gpu-a", team) for team in list(POOLS["gpu-a"])[:HELD_PER_CUT]]
    await asyncio.sleep(CUT_S)
    cluster.heal_relays()
    await _check_counted(cluster, first, held)
    for grant, record in held:
        await Gateway.release_held(grant, record, HELD_CONSUMED)
    cluster.cut_relays()
    await asyncio.sleep(0.5)
    dying = [await first.hold("gpu-b", team) for team in list(POOLS["gpu-b"])[:HELD_PER_CUT]]
    await first.kill()
    for _, record in dying:
        record.abandoned = True
    second = cluster.add_gateway(holder=holder, relayed=True)
    held = [await second.hold("gpu-a", team) for team in list(POOLS["gpu-a"])[:HELD_PER_CUT]]
    await asyncio.sleep(CUT_S)
    cluster.heal_relays()
    await _check_counted(cluster, second, held)
    for grant, record in held:
        await Gateway.release_held(grant, record, HELD_CONSUMED)
    end = time.monotonic()
    await cluster.wait_owned()
    return at, end


async def _check_counted(
    cluster: DrillCluster, gateway: Gateway, held: list[tuple[ClientGrant, GrantRecord]]
) -> None:
    """Within ``COUNTED_WITHIN_S`` of the heal, the owner counts every grant that has been
    live that long: its in-flight count per team is at least the ledger's (a lower bound
    that holds whatever is in transit). The workers leave the held grants' pool alone
    meanwhile, so that their short grants cannot make up for an uncounted one."""
    if not all(r.degraded for _, r in held):
        cluster.ledger.violations.append(
            f"{gateway.holder}: a grant acquired during the partition was not degraded"
        )
    pools = {r.pool for _, r in held}
    cluster.quiet.update(pools)
    try:
        await asyncio.sleep(0.6)  # the workers' grants there end (holds are <= 0.4 s)
        deadline = time.monotonic() + COUNTED_WITHIN_S
        short: list[str] = []
        for _ in range(100):
            short = await _uncounted(cluster, pools)
            if not short or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
    finally:
        cluster.quiet.difference_update(pools)
    if short:
        cluster.ledger.violations.append(
            f"{gateway.holder}: degraded grants not counted by the owner "
            f"{COUNTED_WITHIN_S}s after the partition healed: " + "; ".join(short)
        )


async def _uncounted(cluster: DrillCluster, pools: set[str]) -> list[str]:
    settle_s = 0.5
    now = time.monotonic()

    def live() -> dict[tuple[str, str], set[str]]:
        out: dict[tuple[str, str], set[str]] = {}
        for g in cluster.ledger.grants:
            if g.released_at is None and not g.abandoned and g.issued_at < now - settle_s:
                out.setdefault((g.pool, g.team), set()).add(g.grant_id)
        return out

    before = live()
    counted: dict[tuple[str, str], int] = {}
    for pool in sorted(pools):
        stats = await cluster.snapshot(pool)
        if stats is None:
            return [f"no replica answers Snapshot({pool})"]
        for t in stats.teams:
            counted[(pool, t.team)] = t.in_flight
    after = live()
    short = []
    for key, ids in before.items():
        if key[0] not in pools:
            continue
        n = len(ids & after.get(key, set()))
        if counted.get(key, 0) < n:
            short.append(f"{key[0]}/{key[1]} in flight {counted.get(key, 0)} < {n} live")
    return short


WALL_STEP_S = 600.0


async def wall_clock_step(cluster: DrillCluster) -> tuple[float, float]:
    """Every pool owner's wall clock steps +10 minutes, then -10 minutes, then back
    (through the replicas' injected-clock hook; the machine's clock is untouched)."""
    nodes = sorted({node for node, _ in (await cluster.owners()).values()})
    owners = [cluster.replica(node) for node in nodes]
    at = time.monotonic()
    for offset in (WALL_STEP_S, -WALL_STEP_S, 0.0):
        for owner in owners:
            owner.step_wall_clock(offset)
        await asyncio.sleep(1.0)  # several max holds of the workers at each offset
    await cluster.wait_owned()
    return at, time.monotonic()


NEMESES: dict[str, Nemesis] = {
    "sigkill-owner": sigkill_owner,
    "sigstop-owner": sigstop_owner,
    "sigstop-etcd": sigstop_etcd,
    "rolling-restart": rolling_restart,
    "switchover": switchover,
    "empty-state-dir": empty_state_dir,
    "killed-gateway": killed_gateway,
    "etcd-stall-within-budget": etcd_stall_within_budget,
    "isolated-watch-member": isolated_watch_member,
    "kill-etcd-leader": kill_etcd_leader,
    "move-etcd-leader": move_etcd_leader,
    "restarted-gateway": restarted_gateway,
    "wall-clock-step": wall_clock_step,
}
