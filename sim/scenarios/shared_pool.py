"""Steady sharing of one pool: two institutions (a flood and bursts) and three teams (two
floods and an almost idle team), each against FCFS on the same workload."""

from __future__ import annotations

import math

from sim.allocators import AllocatorFactory
from sim.model import Policy
from sim.scenarios.result import ScenarioResult, Target, percentile
from sim.scenarios.runs import Setup, preemption_figures, run, served_fractions
from sim.workloads import BATCH, INTERACTIVE, Bursts, Flood, Poisson, Source

# -- 1. two institutions --------------------------------------------------------------


def two_institutions(
    *, seed: int = 1, scale: float = 1.0, fairshare: AllocatorFactory | None = None
) -> ScenarioResult:
    """81.25 % / 18.75 % of C = 16: the larger floods, the smaller sends bursts."""
    capacity = 16
    shares = {"large": 0.8125, "small": 0.1875}
    horizon = 1800.0 * scale
    sources: list[Source] = [
        Flood("large", outstanding=8 * capacity, shape=BATCH),
        Bursts("small", every_s=20.0, size=6, shape=INTERACTIVE),
    ]
    setup = Setup(
        capacity=capacity,
        shares=shares,
        sources=sources,
        horizon_s=horizon,
        seed=seed,
        half_life_s=600.0,
        pool="two-institutions",
    )
    fair = run(setup, fairshare=fairshare)
    fcfs = run(setup, policy=Policy.FCFS)
    mean_s = fair.mean_service_s()
    p99_fair = percentile(fair.waits("small", within_share=True), 99)
    p99_fcfs = percentile(fcfs.waits("small", within_share=True), 99)
    figures = {
        "mean_service_s": mean_s,
        "small_within_p99_wait_s": p99_fair,
        "small_within_p99_wait_fcfs_s": p99_fcfs,
        "fcfs_over_fairshare_p99": p99_fcfs / p99_fair if p99_fair > 0 else math.inf,
        "small_all_p99_wait_s": percentile(fair.waits("small"), 99),
        "small_all_p99_wait_fcfs_s": percentile(fcfs.waits("small"), 99),
        "large_p50_wait_s": percentile(fair.waits("large"), 50),
        "large_p50_wait_fcfs_s": percentile(fcfs.waits("large"), 50),
        "small_served_fraction": served_fractions(fair, list(shares), 0.0)["small"],
        "small_within_requests": len(fair.waits("small", within_share=True)),
        **preemption_figures(fair, shares),
    }
    targets = [
        Target(
            "small's within-share p99 wait ≤ one mean service time (fairshare)",
            p99_fair,
            mean_s,
            at_most=True,
            unit="s",
        ),
        Target(
            "small's within-share p99 wait under FCFS ÷ under fairshare ≥ 10",
            figures["fcfs_over_fairshare_p99"],
            10.0,
            at_most=False,
            unit="×",
        ),
    ]
    description = (
        f"C = {capacity}, shares large 81.25 % / small 18.75 % (reservations 13 and 3). "
        f"*large* runs a batch job with {8 * capacity} requests outstanding for the whole "
        "run; *small* sends bursts of 6 interactive requests, on average every 20 s. "
        f"Half-life 600 s, {horizon:.0f} s simulated. FCFS is the same workload with every "
        "priority equal."
    )
    return ScenarioResult(
        name="two-institutions",
        title="Two institutions: a flood and bursts",
        description=description,
        shares=shares,
        runs={"fairshare": fair, "FCFS": fcfs},
        figures=figures,
        targets=targets,
    )


# -- 2. three teams -------------------------------------------------------------------


def three_teams(
    *, seed: int = 1, scale: float = 1.0, fairshare: AllocatorFactory | None = None
) -> ScenarioResult:
    """0.5 / 0.25 / 0.25 of C = 20; a and b flood, c is almost idle."""
    capacity = 20
    shares = {"a": 0.5, "b": 0.25, "c": 0.25}
    horizon = 3600.0 * scale
    warmup = 600.0 * scale
    sources: list[Source] = [
        Flood("a", outstanding=3 * capacity, shape=BATCH),
        Flood("b", outstanding=3 * capacity, shape=BATCH),
        Poisson("c", rate_per_s=0.05, shape=INTERACTIVE),
    ]
    setup = Setup(
        capacity=capacity,
        shares=shares,
        sources=sources,
        horizon_s=horizon,
        seed=seed,
        half_life_s=300.0 * scale,
        pool="three-teams",
    )
    fair = run(setup, fairshare=fairshare)
    fcfs = run(setup, policy=Policy.FCFS)
    a, b = fair.served_s("a", warmup), fair.served_s("b", warmup)
    fa, fb = fcfs.served_s("a", warmup), fcfs.served_s("b", warmup)
    a_of_ab = a / (a + b)
    figures = {
        "a_of_a_plus_b": a_of_ab,
        "a_of_a_plus_b_fcfs": fa / (fa + fb),
        "c_within_p99_wait_s": percentile(fair.waits("c", within_share=True), 99),
        "c_within_p99_wait_fcfs_s": percentile(fcfs.waits("c", within_share=True), 99),
        "mean_service_s": fair.mean_service_s(),
        **preemption_figures(fair, shares),
    }
    targets = [
        Target(
            "a's part of the service a and b received, after the warm-up, within 2 points of "
            "66.7 % (distance)",
            abs(a_of_ab - 2 / 3) * 100,
            2.0,
            at_most=True,
            unit="points",
        )
    ]
    description = (
        f"C = {capacity}, shares a 0.5 / b 0.25 / c 0.25. *a* and *b* each run a batch job "
        f"with {3 * capacity} requests outstanding; *c* sends a few interactive requests "
        f"(0.05/s). Half-life {300 * scale:.0f} s, {horizon:.0f} s simulated, service "
        f"counted after a {warmup:.0f} s warm-up. The borrowed capacity goes to the team "
        "with the highest level fairshare, so a and b should be served 2 : 1."
    )
    return ScenarioResult(
        name="three-teams",
        title="Three teams, two flooding",
        description=description,
        shares=shares,
        runs={"fairshare": fair, "FCFS": fcfs},
        figures=figures,
        targets=targets,
        marks=[(warmup, "end of warm-up")],
        notes=(
            "Every borrowed slot goes to the team with the highest level fairshare, so per "
            "time bin the service swings between a and b (faint lines): the allocator is a "
            "bang-bang controller whose lag is the time a request spends queued. The "
            "decayed usage averages the swings, and the cumulative split settles at 2 : 1. "
            "FCFS splits by the number of requests outstanding (1 : 1 here)."
        ),
    )
