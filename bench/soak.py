"""Soak: a three-replica cluster at half its measured maximum rate, and etcd's history.

Run with ``make soak MINUTES=10`` (or ``python -m bench.soak --minutes 10`` from the
repository root); not part of ``make bench`` or CI. One real etcd member (the harness's
``EtcdProcess``, so with the auto-compaction every test etcd runs with) and three
``fairshare serve`` replicas, set up as bench/replicated.py's (its timings and pools).

In one run:

1. the maximum: Acquire + Release pairs of bench/workload.py's workload, 32 in flight,
   direct to the pool's owner, for ``--max-s`` seconds (closed loop);
2. the soak: the same pairs paced (open loop) at ``--fraction`` (half) of that maximum for
   ``--minutes``, while etcd's /metrics is sampled every ``--sample-s``: the db size
   (``etcd_mvcc_db_total_size_in_bytes``, and the part in use), the current and the compacted
   revision, and the client bytes etcd received.

The check: etcd's db size grows less than 10 % over the last half of the soak (the largest
size seen in the last half against the size at half time). A table goes to stdout, a plot
(when matplotlib is installed) to ``build/soak.png``, and the section to docs/benchmarks.md
unless ``--no-write``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import shutil
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from grpc import aio

from bench._common import (
    ROOT,
    Samples,
    closed_loop,
    machine,
    machine_lines,
    met,
    ms,
    paced_loop,
    percentile,
    workdir,
    write_section,
)
from bench.replicated import Cluster
from bench.workload import CALL_TIMEOUT_S, POOL, Gateway
from harness.etcd import AUTO_COMPACTION

SECTION = "## Soak: etcd's history under steady load"
GROWTH_LIMIT = 0.10
"""Target: the db size grows less than this fraction over the last half of the soak."""
PLOT = ROOT / "build" / "soak.png"
METRICS = {
    "etcd_mvcc_db_total_size_in_bytes": "db",
    "etcd_mvcc_db_total_size_in_use_in_bytes": "in_use",
    "etcd_debugging_mvcc_current_revision": "revision",
    "etcd_debugging_mvcc_compact_revision": "compacted",
    "etcd_network_client_grpc_received_bytes_total": "received",
}


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the soak started
    db: int
    in_use: int
    revision: int
    compacted: int
    received: int


def read_metrics(url: str) -> dict[str, int]:
    """The gauges and counters of ``METRICS`` from etcd's /metrics at ``url``."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode("utf-8", "replace")
    found: dict[str, int] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in METRICS:
            found[METRICS[name]] = int(float(value))
    missing = set(METRICS.values()) - found.keys()
    if missing:
        raise RuntimeError(f"etcd's /metrics lacks {sorted(missing)}")
    return found


async def sample_until(url: str, every_s: float, stop: asyncio.Event) -> list[Sample]:
    """Samples etcd's metrics every ``every_s`` (from a thread: the load shares this loop)
    until ``stop`` is set, and once more then."""
    samples: list[Sample] = []
    start = time.monotonic()
    while True:
        values = await asyncio.to_thread(read_metrics, url)
        samples.append(Sample(t=time.monotonic() - start, **values))
        if stop.is_set():
            return samples
        # Sleeps until the next sample or the stop, whichever comes first.
        with_stop = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({with_stop}, timeout=every_s)
        if not done:
            with_stop.cancel()


async def steady_pair(gw: Gateway, samples: Samples) -> None:
    """An Acquire + Release pair that, unlike ``Gateway.pair``, survives what a long run on
    a shared machine meets: a degraded or refused answer and a failed call are counted
    (``degraded``, ``refused``, ``failed``) instead of ending the run."""
    t0 = time.perf_counter()
    try:
        r = await gw.stub.Acquire(gw.request(), timeout=CALL_TIMEOUT_S)
    except aio.AioRpcError:
        samples.add("failed", 0.0)
        return
    elapsed = time.perf_counter() - t0
    if r.degraded:
        samples.add("degraded", elapsed)
    elif not r.granted:
        samples.add("refused", elapsed)
    else:
        samples.add("borrow" if r.borrowing else "within", elapsed)
    if r.granted:
        try:
            await gw.release(samples, r.grant_id)
        except aio.AioRpcError:
            samples.add("failed", 0.0)
            return
    samples.add("pair", time.perf_counter() - t0)


@dataclass
class Soak:
    max_rate: float  # pairs/s at 32 in flight
    rate: float  # paced pairs/s
    samples: list[Sample]
    pairs: int
    skipped: int
    unexpected: dict[str, int]  # degraded, refused, failed calls
    within_p99: float
    pair_p99: float
    seconds: float


async def soak(cluster: Cluster, args: argparse.Namespace) -> Soak:
    owner = await cluster.settled(POOL)
    async with aio.insecure_channel(cluster.replicas[owner].address) as channel:
        gw = Gateway(None, channel, seed=1, name="gw-soak")
        await gw.fill()
        peak = await closed_loop(
            gw.pair, in_flight=32, warmup_s=1.0, duration_s=args.max_s, max_ops=1_000_000
        )
        rate = args.fraction * peak.rate
        print(f"  maximum {peak.rate:,.0f} pairs/s; soaking at {rate:,.0f} pairs/s", flush=True)
        stop = asyncio.Event()
        sampler = asyncio.create_task(
            sample_until(f"{cluster.etcd.client_url}/metrics", args.sample_s, stop)
        )
        seconds = args.minutes * 60
        try:
            load = await paced_loop(
                functools.partial(steady_pair, gw), rate=rate, count=int(rate * seconds), warmup=0
            )
        finally:
            stop.set()
            samples = await sampler
    return Soak(
        max_rate=peak.rate,
        rate=rate,
        samples=samples,
        pairs=load.ops,
        skipped=len(load.samples.get("skipped")),
        unexpected={k: len(load.samples.get(k)) for k in ("degraded", "refused", "failed")},
        within_p99=percentile(load.samples.get("within"), 99),
        pair_p99=percentile(load.samples.get("pair"), 99),
        seconds=load.seconds,
    )


# -- the report ---------------------------------------------------------------------------------


def growth(samples: list[Sample]) -> tuple[float, Sample]:
    """The db size's growth over the last half: the largest size from half time on against
    the size at half time; and the sample at half time."""
    half = samples[-1].t / 2
    mid = min(samples, key=lambda s: abs(s.t - half))
    later = [s.db for s in samples if s.t >= mid.t]
    return max(later) / mid.db - 1, mid


def bytes_per_revision(samples: list[Sample]) -> float:
    """Client bytes etcd received per new revision over the soak (each write transaction
    makes one revision; the bytes include reads and lease keep-alives, so this bounds what
    a revision stores from above)."""
    first, last = samples[0], samples[-1]
    revisions = last.revision - first.revision
    return (last.received - first.received) / revisions if revisions else 0.0


def table(samples: list[Sample]) -> str:
    lines = [
        "| t s | revision | compacted to | revisions kept | writes/s | db MB | in use MB |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    prev: Sample | None = None
    for s in samples:
        rate = "" if prev is None else f"{(s.revision - prev.revision) / (s.t - prev.t):,.0f}"
        kept = s.revision - max(s.compacted, 0)
        lines.append(
            f"| {s.t:,.0f} | {s.revision:,} | {max(s.compacted, 0):,} | {kept:,} | {rate} "
            f"| {s.db / 1e6:.2f} | {s.in_use / 1e6:.2f} |"
        )
        prev = s
    return "\n".join(lines)


def plot(samples: list[Sample], path: Path) -> bool:
    """Draws db size and revisions kept over time to ``path``; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 4.2), dpi=100)
    t = [s.t / 60 for s in samples]
    ax.plot(t, [s.db / 1e6 for s in samples], label="db size, MB")
    ax.plot(t, [s.in_use / 1e6 for s in samples], label="db in use, MB")
    ax.set_xlabel("minutes")
    ax.set_ylabel("MB")
    right = ax.twinx()
    right.plot(
        t,
        [s.revision - max(s.compacted, 0) for s in samples],
        color="grey",
        linestyle="--",
        label="revisions kept",
    )
    right.set_ylabel("revisions kept")
    fig.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def unexpected(res: Soak) -> str:
    return ", ".join(f"{n:,} {kind}" for kind, n in res.unexpected.items()) + " Acquires"


def verdict(res: Soak) -> tuple[str, bool]:
    grew, mid = growth(res.samples)
    ok = grew < GROWTH_LIMIT
    per_rev = bytes_per_revision(res.samples)
    span = res.samples[-1].t - res.samples[0].t
    writes = (res.samples[-1].revision - res.samples[0].revision) / span if span else 0.0
    text = (
        f"Check: etcd's db size at half time ({mid.t:,.0f} s) was {mid.db / 1e6:.2f} MB; the "
        f"largest after it {(1 + grew) * mid.db / 1e6:.2f} MB, {grew:+.1%}, target < "
        f"{GROWTH_LIMIT:.0%}: {met(ok)}. Over the soak etcd made {writes:,.0f} revisions/s "
        f"and received {per_rev:,.0f} client bytes per revision, "
        f"{writes * per_rev / 1e3:,.0f} KB/s."
    )
    return text, ok


def section(res: Soak, info: dict[str, str], args: argparse.Namespace, plotted: bool) -> str:
    text, _ = verdict(res)
    figure = (
        "The plot is in `build/soak.png` (not committed)."
        if plotted
        else "matplotlib was not installed: no plot."
    )
    return f"""{SECTION}

Whether etcd's history stays bounded under steady load: with auto-compaction the db size
must level off (compacted pages are reused; the file itself only shrinks on a defrag).

Command: `make soak MINUTES={args.minutes:g}` (runs `python -m bench.soak --minutes
{args.minutes:g}`; not in CI, not in `make bench`).

Setup: one etcd 3.4 member on loopback with the harness's flags (`{" ".join(AUTO_COMPACTION)}`,
data dir on a RAM-backed file system) and three `fairshare serve` replicas with
bench/replicated.py's timings and pools. The load: bench/workload.py's Acquire + Release
pairs direct to the pool's owner. Maximum measured first in the same run: 32 in flight for
{args.max_s:g} s, {res.max_rate:,.0f} pairs/s; the soak paced them at {args.fraction:.0%} of
that, {res.rate:,.0f} pairs/s, for {args.minutes:g} min (open loop; {res.pairs:,} pairs,
{res.skipped} starts skipped for more than 256 in flight; pair p99 {ms(res.pair_p99)} ms,
within-share Acquire p99 {ms(res.within_p99)} ms). etcd's /metrics sampled every
{args.sample_s:g} s.

Machine:
{machine_lines(info)}

{table(res.samples)}

{text} {figure}
"""


# -- main ---------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> Soak:
    work = workdir("fairshare-soak-")
    cluster = Cluster(work)
    try:
        await cluster.start()
        return await soak(cluster, args)
    finally:
        cluster.close()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="minutes of paced load")
    parser.add_argument("--fraction", type=float, default=0.5, help="share of the maximum rate")
    parser.add_argument("--max-s", type=float, default=5.0, help="seconds to measure the maximum")
    parser.add_argument("--sample-s", type=float, help="seconds between samples (default: 1/20)")
    parser.add_argument("--no-write", action="store_true", help="do not touch docs/")
    args = parser.parse_args(argv)
    if args.sample_s is None:
        args.sample_s = max(1.0, args.minutes * 60 / 20)
    info = machine()
    for key, value in info.items():
        print(f"{key}: {value}")
    res = asyncio.run(run(args))
    print()
    print(table(res.samples))
    print()
    text, ok = verdict(res)
    print(text)
    print(f"pairs {res.pairs:,}, skipped {res.skipped}, {unexpected(res)}")
    plotted = plot(res.samples, PLOT)
    if plotted:
        print(f"plot: {PLOT.relative_to(ROOT)}")
    if not args.no_write:
        write_section(SECTION, section(res, info, args, plotted))
        print(f"\nwrote the {SECTION!r} section of docs/benchmarks.md")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
