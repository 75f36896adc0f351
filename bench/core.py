"""Benchmark of the decision core: the cost of one acquire + release pair.

Run with ``make bench`` (or ``python -m bench.core`` from the repository root). For 10,
100, 1,000 and 10,000 teams it times many acquire + release pairs on one pool under a
mixed workload, prints a table with the median cost per pair and its ratio to the 10-team
cost, and rewrites the "## Decision core" section of docs/benchmarks.md (other sections
are left as they are).

Workload, per pool size T:
- shares drawn at random (weights 1..10, normalised), C = 2T, so reservations are 0 to a
  few slots;
- every team starts with a different decayed usage, so there are T distinct ranks;
- 90 % of the teams already hold their whole reservation in flight, so their requests
  borrow (and need a rank); the other 10 % (at least one team) hold nothing, so theirs
  are within share;
- each pair picks a team at random, acquires (interactive or batch at random) and releases
  at once with a random consumption, which re-ranks the team: the LF order keeps changing;
- the pool uses its default wall clock (time.time) and a one-week half-life, as in
  production; the garbage collector stays on.

Targets (issue 2): <= 10 us per pair at 10 teams; 10,000 teams <= 3x the 10-team cost.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import sys
import time
from dataclasses import dataclass

from bench._common import machine, machine_lines, write_section
from fairshare import Class, Grant, Pool

SIZES = (10, 100, 1_000, 10_000)
WITHIN_SHARE_FRACTION = 0.1
SECTION = "## Decision core"


@dataclass(frozen=True)
class Result:
    teams: int
    median_us: float
    min_us: float
    max_us: float
    borrowing_fraction: float


def build(teams: int, seed: int) -> tuple[Pool, list[Grant], list[str]]:
    """A pool of ``teams`` teams in the benchmark's starting state (see module docstring)."""
    rng = random.Random(seed)
    names = [f"team-{i:05d}" for i in range(teams)]
    weights = [rng.randint(1, 10) for _ in names]
    total = sum(weights)
    pool = Pool("bench", 2 * teams, {n: w / total for n, w in zip(names, weights, strict=True)})
    for name in names:
        pool.set_usage(name, rng.uniform(1.0, 1_000.0))
    reserved = pool.reserved()
    with_slots = [n for n in names if reserved[n] > 0]
    within = set(rng.sample(with_slots, max(1, round(WITHIN_SHARE_FRACTION * teams))))
    held = [pool.acquire(n) for n in names if n not in within for _ in range(reserved[n])]
    return pool, held, names


def workload(names: list[str], pairs: int, seed: int) -> list[tuple[str, Class, float]]:
    rng = random.Random(seed)
    classes = (Class.INTERACTIVE, Class.BATCH)
    return [(rng.choice(names), rng.choice(classes), rng.uniform(0.1, 20.0)) for _ in range(pairs)]


def run_pairs(pool: Pool, ops: list[tuple[str, Class, float]]) -> int:
    """Runs the pairs; returns how many of them borrowed."""
    borrowed = 0
    for team, cls, consumed in ops:
        grant = pool.acquire(team, cls)
        borrowed += grant.borrowing
        grant.release(consumed)
    return borrowed


def time_pairs(pool: Pool, ops: list[tuple[str, Class, float]]) -> float:
    """Nanoseconds per acquire + release pair over ``ops`` (loop overhead included)."""
    acquire = pool.acquire
    start = time.perf_counter_ns()
    for team, cls, consumed in ops:
        acquire(team, cls).release(consumed)
    return (time.perf_counter_ns() - start) / len(ops)


def measure(teams: int, pairs: int, repeats: int) -> Result:
    pool, _held, names = build(teams, seed=teams)
    ops = workload(names, pairs, seed=teams + 1)
    borrowed = run_pairs(pool, ops)  # warm-up, and the mix actually measured
    costs = [time_pairs(pool, ops) / 1_000.0 for _ in range(repeats)]
    return Result(
        teams=teams,
        median_us=statistics.median(costs),
        min_us=min(costs),
        max_us=max(costs),
        borrowing_fraction=borrowed / len(ops),
    )


def table(results: list[Result]) -> str:
    base = results[0].median_us
    lines = [
        "| teams | median µs / pair | min | max | × 10-team cost | borrowing |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {r.teams:,} | {r.median_us:.2f} | {r.min_us:.2f} | {r.max_us:.2f} "
            f"| {r.median_us / base:.2f} | {r.borrowing_fraction:.0%} |"
        )
    return "\n".join(lines)


TARGET_SMALL_US = 10.0
"""Target: the median decision with the fewest teams, in microseconds."""
TARGET_GROWTH = 3.0
"""Target: the median decision with the most teams, as a multiple of the fewest's."""


def verdict(results: list[Result]) -> str:
    small, large = results[0], results[-1]
    ratio = large.median_us / small.median_us
    ok_small = small.median_us <= TARGET_SMALL_US
    ok_ratio = ratio <= TARGET_GROWTH
    return (
        f"Targets: {small.teams} teams {small.median_us:.2f} µs ≤ {TARGET_SMALL_US:g} µs: "
        f"{'met' if ok_small else 'MISSED'}; {large.teams:,} teams at {ratio:.2f}× the "
        f"{small.teams}-team cost ≤ {TARGET_GROWTH:g}×: {'met' if ok_ratio else 'MISSED'}."
    )


def section(results: list[Result], pairs: int, repeats: int, info: dict[str, str]) -> str:
    return f"""{SECTION}

Cost of one `Pool.acquire` + `Grant.release` pair, the hot path of every request.

Command: `make bench` (runs `python -m bench.core`; `--profile` adds a cProfile listing).

Workload per pool size T: shares drawn at random, C = 2T; every team starts with a
different decayed usage (T distinct ranks); 90 % of the teams already hold their whole
reservation, so their requests borrow, the other 10 % hold nothing and stay within share;
each pair acquires for a random team (random class) and releases at once with a random
consumption, which re-ranks that team, so the LF order keeps changing. Default wall clock
and one-week half-life, garbage collector on. {pairs:,} pairs per repeat, {repeats}
repeats; the figure is the median of the repeats, Python loop overhead included.

Machine:
{machine_lines(info)}

{table(results)}

{verdict(results)}
"""


def profile(teams: int, pairs: int) -> None:
    pool, _held, names = build(teams, seed=teams)
    ops = workload(names, pairs, seed=teams + 1)
    profiler = cProfile.Profile()
    profiler.enable()
    run_pairs(pool, ops)
    profiler.disable()
    print(f"\ncProfile, {teams:,} teams, {pairs:,} pairs (tottime order):")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(14)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=200_000, help="pairs per repeat")
    parser.add_argument("--repeats", type=int, default=7, help="repeats per size")
    parser.add_argument("--no-write", action="store_true", help="do not touch docs/")
    parser.add_argument("--profile", action="store_true", help="also print a cProfile listing")
    args = parser.parse_args(argv)

    info = machine()
    for key, value in info.items():
        print(f"{key}: {value}")
    results = []
    for teams in SIZES:
        results.append(measure(teams, args.pairs, args.repeats))
        print(f"  {teams:>6,} teams: {results[-1].median_us:.2f} µs / pair", flush=True)
    print()
    print(table(results))
    print()
    print(verdict(results))
    if args.profile:
        for teams in (SIZES[0], SIZES[-1]):
            profile(teams, min(args.pairs, 100_000))
    if not args.no_write:
        write_section(SECTION, section(results, args.pairs, args.repeats, info))
        print(f"\nwrote the {SECTION!r} section of docs/benchmarks.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
