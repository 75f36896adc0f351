"""Per-client fairness: another client's latency while one client floods the server.

One embedded ``fairshare serve`` process on loopback. A quiet client (holder ``quiet``,
one call at a time, Acquire then Release) is timed alone, then again while a flooding
client in a process of its own (holder ``flood``, ``--flood-in-flight`` calls at once,
back to back) hammers the same server. Target (the per-client fairness item of the
hostile-inputs issue): the quiet client's p99 during the flood is at most 3x its p99
without it, in the same run.

Not part of ``make test`` or ``make bench``; run by hand:

    .venv/bin/python -m bench.fairness [--seconds 5] [--flood-in-flight 256]
        [--server-root DIR]   # serve from another checkout (to compare with an older one)

It prints its figures; it writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import shutil
import sys
import time
from pathlib import Path

from grpc import aio

from bench._common import percentile, pool_yaml, workdir
from fairshare.wire.pb.fairshare.v1 import allocator_pb2 as pb
from fairshare.wire.pb.fairshare.v1 import allocator_pb2_grpc as pb_grpc
from harness.serve import Allocator, wait_serving

POOL = {"name": "gpu", "capacity": 64, "shares": {"quiet": 0.5, "flood": 0.5}}


async def _pair(stub: pb_grpc.AllocatorStub, holder: str) -> None:
    r = await stub.Acquire(pb.AcquireRequest(pool="gpu", team=holder, holder=holder), timeout=10)
    await stub.Release(pb.ReleaseRequest(grant_id=r.grant_id, consumed=1.0), timeout=10)


async def quiet(address: str, seconds: float, max_ops: int = 100_000) -> list[float]:
    """Latencies of the quiet client's Acquire+Release pairs, one at a time."""
    latencies: list[float] = []
    async with aio.insecure_channel(address) as channel:
        stub = pb_grpc.AllocatorStub(channel)
        for _ in range(20):  # warm-up
            await _pair(stub, "quiet")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and len(latencies) < max_ops:
            started = time.perf_counter()
            await _pair(stub, "quiet")
            latencies.append(time.perf_counter() - started)
    return latencies


async def _flood(address: str, seconds: float, in_flight: int) -> tuple[int, int]:
    done = refused = 0
    deadline = time.monotonic() + seconds
    async with aio.insecure_channel(address) as channel:
        stub = pb_grpc.AllocatorStub(channel)

        async def worker() -> None:
            nonlocal done, refused
            while time.monotonic() < deadline:
                try:
                    await _pair(stub, "flood")
                    done += 1
                except aio.AioRpcError:
                    refused += 1

        await asyncio.gather(*(worker() for _ in range(in_flight)))
    return done, refused


def _flood_process(
    address: str, seconds: float, in_flight: int, out: multiprocessing.Queue
) -> None:  # type: ignore[type-arg]
    out.put(asyncio.run(_flood(address, seconds, in_flight)))


def _summary(name: str, latencies: list[float]) -> str:
    return (
        f"{name}: {len(latencies)} pairs, p50 {percentile(latencies, 50) * 1e3:.2f} ms, "
        f"p99 {percentile(latencies, 99) * 1e3:.2f} ms"
    )


TARGET_P99_RATIO = 3.0
"""Target: the quiet team's p99 during the flood, as a multiple of its p99 alone."""


async def run(args: argparse.Namespace) -> bool:
    work = workdir("fairshare-bench-fairness-")
    config = work / "pools.yaml"
    config.write_text(pool_yaml([POOL]), encoding="utf-8")
    server = Allocator(work, config)
    if args.server_root is not None:
        # ``python -m fairshare.cli`` imports the packages (``fairshare``, ``server``...) of
        # its working directory.
        server.cwd = Path(args.server_root)
    try:
        server.start()
        await wait_serving(server.address, process=server)
        alone = await quiet(server.address, args.seconds)
        out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
        flooder = multiprocessing.Process(
            target=_flood_process,
            args=(server.address, args.seconds + 2.0, args.flood_in_flight, out),
        )
        flooder.start()
        await asyncio.sleep(1.0)  # the flood is under way
        during = await quiet(server.address, args.seconds)
        flooder.join(timeout=args.seconds + 30)
        done, refused = out.get(timeout=5) if not out.empty() else (-1, -1)
    finally:
        with contextlib.suppress(Exception):
            server.stop(timeout_s=10)
        server.kill()
        shutil.rmtree(work, ignore_errors=True)
    ratio = percentile(during, 99) / percentile(alone, 99)
    print(_summary("quiet alone      ", alone))
    print(_summary("quiet during flood", during))
    print(f"flood: {done} pairs served, {refused} calls refused, {args.flood_in_flight} in flight")
    print(f"p99 during / p99 alone = {ratio:.2f} (target <= {TARGET_P99_RATIO:g})")
    return ratio <= TARGET_P99_RATIO


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--flood-in-flight", type=int, default=256)
    parser.add_argument("--server-root", default=None)
    args = parser.parse_args(argv)
    return 0 if asyncio.run(run(args)) else 1


if __name__ == "__main__":
    sys.exit(main())
