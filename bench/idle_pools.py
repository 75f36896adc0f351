"""Many idle pools on three replicas: how fast they are all owned, and what idling costs.

Starts a real etcd and three ``fairshare serve`` replicas (``harness``) with a generated
config of N pools (default 1,000; ``--pools``) and the default timings, then reports:
- the seconds from the replicas' start until a replica's ListPools names an owner for
  every pool;
- etcd's writes per second once every pool is owned and the replicas have settled
  (``etcd_mvcc_put_total`` and ``etcd_debugging_mvcc_current_revision`` from etcd's own
  metrics endpoint, over ``--window`` seconds: every write transaction moves the
  revision by one);
- each replica's CPU over the same window (utime + stime from /proc/<pid>/stat).

Targets: all owned within 30 s; at most 10 etcd writes/s in all once owned.
Run: ``python -m bench.idle_pools [--pools N] [--window S] [--no-write]``; it writes its
own section of docs/benchmarks.md. Not part of ``make bench`` nor of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from grpc import aio

from bench._common import (
    cpu_seconds,
    machine,
    machine_lines,
    met,
    pool_yaml,
    workdir,
    write_section,
)
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from ha.cluster.view import preferred_owner
from harness.etcd import EtcdProcess
from harness.serve import Allocator, wait_serving

SECTION = "## Idle pools: start-up and the cost of idling"
REPLICAS = 3
POOLS = 1000
OWNED_LIMIT_S = 30.0
WRITES_LIMIT = 10.0
GIVE_UP_S = 180.0
SETTLE_S = 5.0
"""Waited after every pool is on its preferred replica before measuring: the last
handovers' writes end."""
CPU_WINDOW_S = 10.0
GRANT_KEY = "idle-pools-benchmark-grant-key-shared-by-every-replica"


def pools(n: int) -> list[dict[str, object]]:
    return [
        {"name": f"pool-{i:05d}", "capacity": 10, "shares": {"a": 0.5, "b": 0.5}} for i in range(n)
    ]


def etcd_counters(endpoint: str) -> dict[str, float]:
    """etcd's write counters: puts and the current revision."""
    wanted = ("etcd_mvcc_put_total", "etcd_debugging_mvcc_current_revision")
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5) as r:
        text = r.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in wanted:
            found[name] = float(value)
    return found


async def owners(address: str, nodes: list[str]) -> tuple[int, int]:
    """How many pools the replica at ``address`` lists with an owner, and how many of
    them with their preferred owner among ``nodes`` ((-1, -1): no answer)."""
    try:
        async with aio.insecure_channel(address) as channel:
            r = await pb_grpc.AllocatorStub(channel).ListPools(pb.ListPoolsRequest(), timeout=5.0)
    except aio.AioRpcError:
        return -1, -1
    owned = [info for info in r.pools if info.owner]
    placed = sum(1 for info in owned if info.owner == preferred_owner(info.pool, nodes))
    return len(owned), placed


@dataclass
class Result:
    pools: int
    owned_after_s: float  # inf: not all owned within GIVE_UP_S
    placed_after_s: float  # every pool on its preferred replica; inf: not within GIVE_UP_S
    owned_at_limit: int  # owned OWNED_LIMIT_S after start
    window_s: float
    puts_per_s: float
    revisions_per_s: float
    cpu: list[float]  # per replica, fraction of one core
    load: float  # the machine's 1-minute load average when the replicas started


async def run(n: int, window_s: float, work: Path) -> Result:
    etcd = EtcdProcess(name="idle-etcd", base_dir=work / "etcd")
    key_file = work / "grant-keys"
    key_file.write_text(GRANT_KEY + "\n", encoding="utf-8")
    config = work / "pools.yaml"
    text = pool_yaml(pools(n))
    config.write_text(text + f"grants:\n  key_file: {key_file}\n", encoding="utf-8")
    replicas = [
        Allocator(work, config, node=f"allocator-{i}", etcd=etcd.endpoint, prefix="/idle")
        for i in range(REPLICAS)
    ]
    try:
        etcd.start()
        load = os.getloadavg()[0]
        start = time.monotonic()
        for p in replicas:
            p.start()
        await asyncio.gather(*(wait_serving(p.address, process=p, timeout_s=60) for p in replicas))
        owned_after = placed_after = float("inf")
        at_limit = -1
        nodes = [p.node for p in replicas]
        while time.monotonic() - start < GIVE_UP_S:
            count, placed = await owners(replicas[0].address, nodes)
            elapsed = time.monotonic() - start
            if elapsed <= OWNED_LIMIT_S:
                at_limit = count
            print(f"{elapsed:6.1f}s: {count} of {n} owned, {placed} placed", file=sys.stderr)
            if count == n:
                owned_after = min(owned_after, elapsed)
            if placed == n:
                placed_after = elapsed
                break
            await asyncio.sleep(0.5)
        await asyncio.sleep(SETTLE_S)
        before = etcd_counters(etcd.endpoint)
        cpu0 = [cpu_seconds(p.proc.pid) for p in replicas if p.proc is not None]
        t0 = time.monotonic()
        await asyncio.sleep(window_s)
        spent = time.monotonic() - t0
        cpu1 = [cpu_seconds(p.proc.pid) for p in replicas if p.proc is not None]
        after = etcd_counters(etcd.endpoint)
        put = "etcd_mvcc_put_total"
        rev = "etcd_debugging_mvcc_current_revision"
        return Result(
            pools=n,
            owned_after_s=owned_after,
            placed_after_s=placed_after,
            owned_at_limit=at_limit,
            window_s=spent,
            puts_per_s=(after.get(put, 0.0) - before.get(put, 0.0)) / spent,
            revisions_per_s=(after.get(rev, 0.0) - before.get(rev, 0.0)) / spent,
            cpu=[(b - a) / spent for a, b in zip(cpu0, cpu1, strict=True)],
            load=load,
        )
    finally:
        for p in replicas:
            p.kill()
        etcd.close()


def section(r: Result, command: str) -> str:
    owned_ok = r.owned_after_s <= OWNED_LIMIT_S
    writes_ok = r.revisions_per_s <= WRITES_LIMIT and r.puts_per_s <= WRITES_LIMIT
    owned = "not all" if r.owned_after_s == float("inf") else f"{r.owned_after_s:.1f} s"
    placed = "not all" if r.placed_after_s == float("inf") else f"{r.placed_after_s:.1f} s"
    cpu = ", ".join(f"{c * 100:.1f} %" for c in r.cpu)
    at_limit = f"{r.owned_at_limit} of {r.pools} at {OWNED_LIMIT_S:.0f} s"
    puts_ok = met(r.puts_per_s <= WRITES_LIMIT)
    return f"""{SECTION}

Command: `{command}`. Workload: one etcd 3.4 member and {REPLICAS} `fairshare serve`
replicas on loopback, started together with a generated config of {r.pools} pools
(capacity 10, two teams each) and the default timings; no traffic at all. Owned: a
replica's ListPools names an owner for every pool; placed: every pool's owner is its
preferred replica (no rebalancing handover left: a pool taken while its preferred replica
was not yet a member moves there once that replica has been one for `rebalance_settle_s`,
30 s by default). Writes: etcd's own metrics
(`etcd_mvcc_put_total`, and `etcd_debugging_mvcc_current_revision`, which every write
transaction moves by one) over {r.window_s:.0f} s, starting {SETTLE_S:.0f} s after every
pool was placed. CPU: utime + stime of each replica over the same window, as a share of
one core.

| measure | value | target |
|---|---|---|
| every pool owned after | {owned} ({at_limit}) | ≤ {OWNED_LIMIT_S:.0f} s: {met(owned_ok)} |
| every pool placed after | {placed} | — |
| etcd puts/s once owned | {r.puts_per_s:.1f} | ≤ {WRITES_LIMIT:.0f}: {puts_ok} |
| etcd revisions/s once owned | {r.revisions_per_s:.1f} | ≤ {WRITES_LIMIT:.0f}: {met(writes_ok)} |
| idle replica CPU | {cpu} | low |

Machine (1-minute load average {r.load:.1f} when the replicas started: other work shared
it):

{machine_lines(machine())}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", type=int, default=POOLS, help="pools in the config")
    parser.add_argument("--window", type=float, default=CPU_WINDOW_S, help="seconds measured")
    parser.add_argument("--no-write", action="store_true", help="do not update the doc")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    args = parser.parse_args(argv)
    work = workdir("fairshare-idle-pools-")
    try:
        result = asyncio.run(run(args.pools, args.window, work))
    finally:
        if args.keep:
            print(f"work dir kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    command = "python -m bench.idle_pools" + (
        f" --pools {args.pools}" if args.pools != POOLS else ""
    )
    text = section(result, command)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
    ok = result.owned_after_s <= OWNED_LIMIT_S and result.revisions_per_s <= WRITES_LIMIT
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
