"""Benchmark of the gRPC service against an empty-echo gRPC service measured in the same run.

Run with ``make bench`` (or ``python -m bench.grpc_service`` from the repository root).
Two server processes on loopback, started the same way (``python -m ...``, one grpc.aio
server each, health service on, log level WARNING):

- echo: a grpc.aio server with one proto-free unary method (bytes in, the same bytes out,
  identity serializers through ``grpc.method_handlers_generic_handler``; bench/echo.py);
  called with an empty payload;
- fairshare: ``python -m fairshare.cli serve`` in embedded mode (no etcd) on a temporary
  config and state dir; within-share grants and releases wait for the group-committed
  fdatasync'd append to the local state log.

The load generator is this process (a single asyncio event loop, raw stubs on one channel
per server), so client and server each have their own GIL; on a 2-core machine each has
about one core. Every Allocator call carries a holder session in its metadata, as the
client library sends it, and a KeepAlive renews it every third of the session TTL
(``--no-session``: neither, the calls as before sessions). Rounds alternate echo and
fairshare so that noise hits both alike; each figure is the median over the rounds.

Workload: one pool, C = 100, ten teams with share 0.1 each (reservation 10). Before the
run, eight teams get their whole reservation held (80 grants, never released), so their
requests borrow; a request picks one of the two free teams with probability 0.2 (within
share) or a full team otherwise (borrowing); random class; ``est_tokens`` 500; each pair
releases at once with a random consumption.

Paced rate: after the closed loops, the pairs are paced at a fraction (``--fraction``, 40 %)
of the echo ceiling measured in this run (the median echo calls/s at 32 in flight), counted in
calls (a pair is two calls), and the echo baseline is paced at the same call rate; ``--rate``
sets an absolute pair rate instead. So the load is the same share of what the machine can serve
on a fast machine and on a slow or busy one.

Targets, each a ratio against this run's echo baseline: Acquire throughput at 32 in
flight >= 70 % of echo; p99 of a within-share Acquire (with its durable write) <= 3x the echo
call's p99 at the same paced call rate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import shutil
import statistics
import sys

from grpc import aio

from bench._common import (
    LoadResult,
    closed_loop,
    machine,
    ms,
    paced_loop,
    percentile,
    pool_yaml,
    workdir,
    write_section,
)
from bench.echo import echo_server
from bench.grpc_report import (
    DEFAULT_FRACTION,
    SECTION,
    Results,
    paced_table,
    pair_table,
    row,
    section,
    service_table,
    verdicts,
)
from bench.workload import Gateway, bench_pool
from harness.serve import Allocator, wait_serving


async def measure(args: argparse.Namespace, echo_address: str, fs_address: str) -> Results:
    async with (
        aio.insecure_channel(echo_address) as echo_channel,
        aio.insecure_channel(fs_address) as fs_channel,
    ):
        gw = Gateway(echo_channel, fs_channel, seed=1, session=not args.no_session)
        await gw.fill()
        keeper = asyncio.create_task(gw.keep_alive())
        # What exists now lives through the run: keep it out of this process's full
        # collections, whose pauses would show up in every latency measured (echo too).
        gc.freeze()
        runs: dict[tuple[str, int], list[LoadResult]] = {}
        plan = [("echo", 1), ("pair", 1), ("echo", 32), ("pair", 32), ("acquire", 32)]
        for round_no in range(args.rounds):
            for kind, n in plan:
                op = {"echo": gw.echo_call, "pair": gw.pair, "acquire": gw.acquire_only}[kind]
                result = await closed_loop(
                    op,
                    in_flight=n,
                    warmup_s=args.warmup,
                    duration_s=args.duration,
                    max_ops=200_000,
                )
                runs.setdefault((kind, n), []).append(result)
                await gw.release_held()
                print(
                    f"  round {round_no + 1} {kind:>7} x{n:<2}: {result.rate:8.0f} ops/s",
                    flush=True,
                )
        rows = [
            row("empty echo", 1, runs[("echo", 1)], "echo"),
            row("Acquire + Release pairs", 1, runs[("pair", 1)], "pair"),
            row("empty echo", 32, runs[("echo", 32)], "echo"),
            row("Acquire + Release pairs", 32, runs[("pair", 32)], "pair"),
            row("Acquire only", 32, runs[("acquire", 32)], "acquire"),
        ]
        pair_latency = {}
        for n in (1, 32):
            rs = runs[("pair", n)]
            pair_latency[n] = (
                statistics.median(percentile(r.samples.get("release"), 50) for r in rs),
                statistics.median(percentile(r.samples.get("release"), 99) for r in rs),
                statistics.median(percentile(r.samples.get("pair"), 50) for r in rs),
                statistics.median(percentile(r.samples.get("pair"), 99) for r in rs),
            )
        ceiling = statistics.median(r.rate for r in runs[("echo", 32)])
        rate = paced_rate(args, ceiling)
        print(
            f"  paced rate: {rate:,.0f} pairs/s (echo ceiling {ceiling:,.0f} calls/s)", flush=True
        )
        count = int(rate * args.paced_s)
        warm = int(rate * 0.5)
        paced: list[LoadResult] = []
        paced_echo: list[LoadResult] = []
        for round_no in range(args.paced_rounds):
            paced_echo.append(
                await paced_loop(gw.echo_call, rate=2 * rate, count=2 * count, warmup=2 * warm)
            )
            paced.append(await paced_loop(gw.pair, rate=rate, count=count, warmup=warm))
            print(
                f"  paced round {round_no + 1}: echo p99 "
                f"{ms(percentile(paced_echo[-1].samples.get('call'), 99))} ms, within-share "
                f"Acquire p99 {ms(percentile(paced[-1].samples.get('within'), 99))} ms",
                flush=True,
            )
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        return Results(
            rows,
            pair_latency,
            paced,
            paced_echo,
            rate,
            args.rounds,
            args.duration,
            echo_ceiling=ceiling,
            fraction=None if args.rate is not None else args.fraction,
            session=not args.no_session,
            keepalives=gw.keepalives,
        )


def paced_rate(args: argparse.Namespace, echo_ceiling: float) -> float:
    """Pairs per second for the paced rounds: ``--rate`` if given, else ``--fraction`` of
    the echo ceiling (calls/s at 32 in flight) in calls, i.e. half that in pairs."""
    if args.rate is not None:
        return float(args.rate)
    return float(args.fraction) * echo_ceiling / 2


# -- main --------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> Results:
    work = workdir("fairshare-bench-grpc-")
    config = work / "pools.yaml"
    timing = (
        {} if args.commit_window_ms is None else {"commit_window_s": args.commit_window_ms / 1e3}
    )
    config.write_text(pool_yaml([bench_pool()], timing), encoding="utf-8")
    echo = echo_server(work)
    fs = Allocator(work, config)
    try:
        echo.start()
        fs.start()
        await asyncio.gather(*(wait_serving(p.address, process=p) for p in (echo, fs)))
        return await measure(args, echo.address, fs.address)
    finally:
        for process in (echo, fs):
            with contextlib.suppress(Exception):
                process.stop(timeout_s=10)
            process.kill()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every closed loop")
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per closed loop")
    parser.add_argument("--warmup", type=float, default=0.3, help="warm-up seconds per loop")
    parser.add_argument(
        "--fraction",
        type=float,
        default=DEFAULT_FRACTION,
        help="paced calls/s as a fraction of the echo ceiling measured in the run",
    )
    parser.add_argument(
        "--rate", type=float, help="paced pairs per second (absolute; overrides --fraction)"
    )
    parser.add_argument("--paced-s", type=float, default=6.0, help="seconds per paced round")
    parser.add_argument("--paced-rounds", type=int, default=3, help="paced rounds")
    parser.add_argument("--no-write", action="store_true", help="do not touch docs/")
    parser.add_argument(
        "--no-session",
        action="store_true",
        help="send no holder session (the calls as before sessions; no KeepAlive)",
    )
    parser.add_argument(
        "--commit-window-ms", type=float, help="the server's group-commit window (default: its own)"
    )
    args = parser.parse_args(argv)
    info = machine()
    for key, value in info.items():
        print(f"{key}: {value}")
    res = asyncio.run(run(args))
    print()
    print(service_table(res))
    print()
    print(pair_table(res))
    print()
    print(paced_table(res))
    print()
    text, _, _ = verdicts(res)
    print(text)
    if not args.no_write:
        write_section(SECTION, section(res, info, args))
        print(f"\nwrote the {SECTION!r} section of docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
