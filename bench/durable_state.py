"""Benchmark of the persisted state: what a decision costs etcd, and a failover, at size.

Run with ``python -m bench.durable_state`` from the repository root (part of ``make
bench``). One real etcd member (the harness's, with its auto-compaction) and two ``fairshare
serve`` replicas (bench/replicated.py's timings: T = ``lease_ttl_s`` 2.0 s). One pool,
C = 40,000: team ``bulk`` (share 0.9) holds N requests, never released, from one holder;
team ``probe`` (share 0.1, reservation 4,000) runs within-share Acquire + Release pairs.

For N = 0, 3,000 and 25,000 held, in one run:

1. pairs one at a time over one whole checkpoint cycle (from just after a checkpoint to
   just after the next, watched through the head's position), so the checkpoint's share
   counts as it falls (``ha.owned.journal.LOG_RATIO``): the bytes etcd received per pair
   (``etcd_network_client_grpc_received_bytes_total`` before and after, from etcd's
   /metrics), a record per commit;
2. the same at 32 in flight: pairs/s, and bytes per pair, now with the group commit
   coalescing decisions.

Then, with 25,000 held: SIGKILL of the pool's owner, the time until a non-degraded Acquire
(try_only, probes every 10 ms) succeeds through the survivor, and the survivor's count of
``bulk``'s requests (in flight + phantoms), which must be all 25,000.

Targets (issue "durable state that scales"): bytes per pair with 3,000 held ≤ 3× and with
25,000 held ≤ 5× the same with none held; the pool's pair rate with 25,000 held ≥ 50 % of
its rate with none; after the kill, a new owner decides within T + 2 s with every held
request counted.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import functools
import json
import shutil
import signal
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from grpc import aio

from bench._common import (
    Samples,
    closed_loop,
    machine,
    machine_lines,
    met,
    workdir,
    write_section,
)
from bench.replicated import LEASE_TTL_S, Cluster
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from harness.serve import wait_serving

SECTION = "## Durable state: bytes per decision and failover at 25,000 in flight"
POOL = "held"
CAPACITY = 40_000
LEVELS = (0, 3_000, 25_000)
FILL_IN_FLIGHT = 64
CALL_TIMEOUT_S = 10.0
PROBE_EVERY_S = 0.010
FAILOVER_LIMIT_S = 15.0
RECEIVED = "etcd_network_client_grpc_received_bytes_total"


def held_pool() -> dict[str, object]:
    return {
        "name": POOL,
        "capacity": CAPACITY,
        "shares": {"probe": 0.1, "bulk": 0.9},
        "half_life_s": 7 * 24 * 3600.0,
        "max_request_s": 3600.0,
        "degraded_mode": "fail_open",
    }


def received_bytes(url: str) -> int:
    """etcd's count of the bytes its gRPC clients sent it."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        for line in resp.read().decode("utf-8", "replace").splitlines():
            name, _, value = line.partition(" ")
            if name == RECEIVED:
                return int(float(value))
    raise RuntimeError(f"etcd's /metrics lacks {RECEIVED}")


@dataclass
class Level:
    held: int
    sequential_pairs: int = 0
    sequential_bytes: int = 0
    loaded_pairs: int = 0
    loaded_bytes: int = 0
    rate_measured: float = 0.0

    @property
    def per_pair(self) -> float:
        return self.sequential_bytes / max(1, self.sequential_pairs)

    @property
    def per_pair_loaded(self) -> float:
        return self.loaded_bytes / max(1, self.loaded_pairs)

    @property
    def rate(self) -> float:
        return self.rate_measured


@dataclass
class Result:
    levels: list[Level] = field(default_factory=list)
    failover_s: float = 0.0
    counted_after: int = 0
    held_before: int = 0


class Prober:
    """Within-share pairs of team ``probe`` on one channel."""

    def __init__(self, channel: aio.Channel, name: str) -> None:
        self.stub = pb_grpc.AllocatorStub(channel)
        self.name = name
        self.seq = 0
        self.pairs = 0  # pairs completed, whenever

    def request(self, team: str, *, try_only: bool = False) -> pb.AcquireRequest:
        self.seq += 1
        return pb.AcquireRequest(
            pool=POOL,
            team=team,
            service_class=pb.INTERACTIVE,
            est_tokens=100,
            holder=self.name,
            request_id=f"{self.name}-{self.seq}",
            try_only=try_only,
        )

    async def pair(self, samples: Samples) -> None:
        r = await self.stub.Acquire(self.request("probe"), timeout=CALL_TIMEOUT_S)
        if not r.granted or r.degraded or r.borrowing:
            raise RuntimeError(f"a probe was not granted within share: {r}")
        await self.stub.Release(
            pb.ReleaseRequest(grant_id=r.grant_id, consumed=1.0), timeout=CALL_TIMEOUT_S
        )
        self.pairs += 1

    async def hold(self, n: int) -> None:
        """Acquires ``n`` more ``bulk`` requests, never released."""

        async def one() -> None:
            r = await self.stub.Acquire(self.request("bulk"), timeout=CALL_TIMEOUT_S)
            if not r.granted or r.degraded:
                raise RuntimeError(f"a bulk request was refused: {r}")

        left = n
        while left:
            batch = min(left, FILL_IN_FLIGHT)
            await asyncio.gather(*(one() for _ in range(batch)))
            left -= batch


def head_position(client_url: str, key: str) -> int:
    """The position of the pool's checkpoint head (``ha.owned.poolstate``), read through etcd's
    JSON gateway; it changes only when a checkpoint is written."""
    body = json.dumps({"key": base64.b64encode(key.encode()).decode()}).encode()
    request = urllib.request.Request(
        client_url + "/v3/kv/range", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as resp:
        found = json.loads(resp.read())
    kvs = found.get("kvs") or []
    if not kvs:
        raise RuntimeError(f"no checkpoint head at {key}")
    return int(json.loads(base64.b64decode(kvs[0]["value"]))["position"])


async def until_checkpoint(
    prober: Prober, position: Callable[[], int], limit_s: float, in_flight: int
) -> int:
    """Runs pairs, ``in_flight`` at a time, a second at a time, until a new checkpoint is
    written; returns its position."""
    start, deadline = position(), time.monotonic() + limit_s
    while time.monotonic() < deadline:
        await closed_loop(
            prober.pair, in_flight=in_flight, warmup_s=0.0, duration_s=1.0, max_ops=10**9
        )
        now = position()
        if now != start:
            return now
    raise RuntimeError(f"no checkpoint within {limit_s:g}s of pairs")


async def measure_level(
    prober: Prober, cluster: Cluster, held: int, args: argparse.Namespace
) -> Level:
    level = Level(held)
    metrics = cluster.etcd.client_url + "/metrics"
    head = f"{cluster.prefix}/pools/{POOL}/head"
    position = functools.partial(head_position, cluster.etcd.client_url, head)
    # Whole cycles of records and checkpoint: from just after one checkpoint to just after
    # the next, so the checkpoint's share is counted as it falls.
    for in_flight in (1, 32):
        await until_checkpoint(prober, position, args.max_seconds, in_flight)
        before, pairs, started = received_bytes(metrics), prober.pairs, time.perf_counter()
        await until_checkpoint(prober, position, args.max_seconds, in_flight)
        sent, done = received_bytes(metrics) - before, prober.pairs - pairs
        if in_flight == 1:
            level.sequential_bytes, level.sequential_pairs = sent, done
        else:
            level.loaded_bytes, level.loaded_pairs = sent, done
            level.rate_measured = done / (time.perf_counter() - started)
    print(
        f"  {held:>6,} held: {level.per_pair:,.0f} B/pair over a cycle of "
        f"{level.sequential_pairs:,} pairs one at a time, "
        f"{level.per_pair_loaded:,.0f} B/pair over a checkpoint cycle of "
        f"{level.loaded_pairs:,} pairs, {level.rate:,.0f} pairs/s at 32 in flight",
        flush=True,
    )
    return level


async def bulk_counted(channel: aio.Channel) -> int:
    """``bulk``'s requests as the pool's owner counts them: in flight + phantoms."""
    snap = await pb_grpc.AllocatorStub(channel).Snapshot(
        pb.SnapshotRequest(pool=POOL), timeout=CALL_TIMEOUT_S
    )
    return sum(t.in_flight + t.phantoms for t in snap.teams if t.team == "bulk")


async def failover(cluster: Cluster, owner: str, survivor: str) -> float:
    """SIGKILLs ``owner``; seconds until a non-degraded try_only Acquire succeeds through
    ``survivor``."""
    async with aio.insecure_channel(cluster.replicas[survivor].address) as channel:
        prober = Prober(channel, "bench-failover")
        signalled = time.perf_counter()
        cluster.replicas[owner].signal(signal.SIGKILL)
        while time.perf_counter() - signalled < FAILOVER_LIMIT_S:
            sent = time.perf_counter()
            with contextlib.suppress(aio.AioRpcError):
                r = await prober.stub.Acquire(prober.request("probe", try_only=True), timeout=1.0)
                if not r.degraded:
                    if r.granted:
                        await prober.stub.Release(pb.ReleaseRequest(grant_id=r.grant_id))
                    return time.perf_counter() - signalled
            await asyncio.sleep(max(0.0, PROBE_EVERY_S - (time.perf_counter() - sent)))
    raise RuntimeError(f"no decision within {FAILOVER_LIMIT_S}s after SIGKILL")


async def run(args: argparse.Namespace) -> Result:
    work = workdir("fairshare-bench-state-")
    cluster = Cluster(work, pools=[held_pool()], replicas=2)
    if args.log_level:
        text = cluster.config.read_text("utf-8")
        cluster.config.write_text(
            text.replace("log_level: WARNING", f"log_level: {args.log_level}"), "utf-8"
        )
    result = Result()
    try:
        await cluster.start()
        owner = await cluster.settled(POOL)
        survivor = next(n for n in cluster.replicas if n != owner)
        async with aio.insecure_channel(cluster.replicas[owner].address) as channel:
            prober = Prober(channel, "bench-probe")
            held = 0
            for level in LEVELS:
                await prober.hold(level - held)
                held = level
                result.levels.append(await measure_level(prober, cluster, held, args))
            result.held_before = await bulk_counted(channel)
        result.failover_s = await failover(cluster, owner, survivor)
        async with aio.insecure_channel(cluster.replicas[survivor].address) as channel:
            await wait_serving(cluster.replicas[survivor].address)
            result.counted_after = await bulk_counted(channel)
        print(
            f"  failover with {held:,} held: {result.failover_s * 1e3:,.0f} ms; "
            f"{result.counted_after:,} of {result.held_before:,} counted after",
            flush=True,
        )
    except BaseException:
        cluster.close()
        print(f"kept the replicas' logs in {work}", file=sys.stderr)
        raise
    cluster.close()
    shutil.rmtree(work, ignore_errors=True)
    return result


def report(result: Result, args: argparse.Namespace) -> tuple[str, bool]:
    base = result.levels[0]
    lines = [
        "| held | B/pair, 1 in flight | × none held | B/pair, 32 in flight "
        "| × none held | pairs in the 32 cycle | pairs/s, 32 in flight | × none held |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for level in result.levels:
        lines.append(
            f"| {level.held:,} | {level.per_pair:,.0f} | {level.per_pair / base.per_pair:.2f} "
            f"| {level.per_pair_loaded:,.0f} "
            f"| {level.per_pair_loaded / base.per_pair_loaded:.2f} "
            f"| {level.loaded_pairs:,} | {level.rate:,.0f} | {level.rate / base.rate:.2f} |"
        )
    by_held = {level.held: level for level in result.levels}
    limit = {3_000: 3.0, 25_000: 5.0}
    checks = []
    for held, most in limit.items():
        level = by_held[held]
        worst = max(level.per_pair / base.per_pair, level.per_pair_loaded / base.per_pair_loaded)
        checks.append(
            (
                f"bytes per pair with {held:,} held ≤ {most:g}× none held",
                worst <= most,
                f"{worst:.2f}×",
            )
        )
    big = by_held[25_000]
    checks.append(
        (
            "pair rate with 25,000 held ≥ 50 % of none held",
            big.rate >= 0.5 * base.rate,
            f"{big.rate / base.rate:.0%}",
        )
    )
    checks.append(
        (
            f"a new owner decides within T + 2 s = {LEASE_TTL_S + 2:g} s after SIGKILL",
            result.failover_s <= LEASE_TTL_S + 2.0,
            f"{result.failover_s:.2f} s",
        )
    )
    checks.append(
        (
            "every held request counted after the failover",
            result.counted_after >= result.held_before,
            f"{result.counted_after:,} of {result.held_before:,}",
        )
    )
    table = ["| target | result | met |", "| --- | --- | --- |"]
    table += [
        f"| {name} | {value} | {met(ok)} |" for name, value, ok in ((n, v, o) for n, o, v in checks)
    ]
    ok = all(o for _, o, _ in checks)
    text = "\n".join(
        [
            SECTION,
            "",
            'What the persisted state (docs/ha.md, "The persisted state") costs etcd per '
            "decision as the requests in flight grow, and a failover at 25,000 in flight. "
            "Bytes are etcd's own count of what its clients sent it, over whole checkpoint "
            "cycles (from just after one checkpoint to just after the next), so the "
            "checkpoints' share is in the figure. Before this layout every write held the "
            "whole state: a within-share Acquire + Release sent etcd 835 B with nothing in "
            "flight and 264,000 B with 3,000 held (316×).",
            "",
            "Command: `python -m bench.durable_state`. One etcd "
            "member and two replicas on loopback; "
            f"pool C = {CAPACITY:,}; team `bulk` holds N requests; team `probe` runs "
            "within-share Acquire + Release pairs (bytes: etcd's "
            f"`{RECEIVED}` over the run).",
            "",
            machine_lines(machine()),
            "",
            *lines,
            "",
            *table,
        ]
    )
    return text, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--max-seconds", type=float, default=300.0, help="longest wait for a checkpoint"
    )
    parser.add_argument("--log-level", default="", help="the replicas' log level (WARNING)")
    parser.add_argument("--no-write", action="store_true", help="do not touch docs/")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args))
    text, ok = report(result, args)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
