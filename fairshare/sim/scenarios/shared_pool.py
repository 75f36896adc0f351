"""Steady sharing of one pool: two institutions (a flood and bursts) and three teams (two
floods and an almost idle team), each against FCFS on the same workload."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping

from fairshare.sim.allocators import AllocatorFactory
from fairshare.sim.model import Policy
from fairshare.sim.results import SimResult
from fairshare.sim.scenarios import before
from fairshare.sim.scenarios.result import ScenarioResult, Target, percentile
from fairshare.sim.scenarios.runs import (
    Setup,
    kv_holds,
    never_beside_a_borrower,
    preemption_figures,
    run,
    served_fractions,
)
from fairshare.sim.workloads import BATCH, INTERACTIVE, Bursts, Flood, Poisson, Source

# -- 1. two institutions --------------------------------------------------------------


def _institutions(result: SimResult, shares: Mapping[str, float]) -> dict[str, float]:
    """The figures read alike from the fairshare run and the run under the rule before."""
    within = result.waits("small", within_share=True)
    return {
        "small_within_p99_wait_s": percentile(within, 99),
        "small_all_p99_wait_s": percentile(result.waits("small"), 99),
        "large_p50_wait_s": percentile(result.waits("large"), 50),
        "small_served_fraction": served_fractions(result, list(shares), 0.0)["small"],
        "small_within_requests": len(within),
        "kv_holds_large_requests": kv_holds(result, "large"),
        **preemption_figures(result, shares),
    }


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
    figures = {"mean_service_s": mean_s, **_institutions(fair, shares)}
    p99_fair = figures["small_within_p99_wait_s"]
    p99_fcfs = percentile(fcfs.waits("small", within_share=True), 99)
    figures |= {
        "small_within_p99_wait_fcfs_s": p99_fcfs,
        "fcfs_over_fairshare_p99": p99_fcfs / p99_fair if p99_fair > 0 else math.inf,
        "small_all_p99_wait_fcfs_s": percentile(fcfs.waits("small"), 99),
        "large_p50_wait_fcfs_s": percentile(fcfs.waits("large"), 50),
    }
    figures |= before.suffixed(_institutions(before.run_before(setup), shares))
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
        never_beside_a_borrower(figures),
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
        compared=before.LABEL,
        comparisons=before.beside(
            figures,
            [
                ("small's within-share p99 wait", "small_within_p99_wait_s", "s"),
                ("small's p99 wait, every request", "small_all_p99_wait_s", "s"),
                ("large's median wait", "large_p50_wait_s", "s"),
                ("small's requests granted within share", "small_within_requests", ""),
                ("small's part of the service", "small_served_fraction", ""),
                ("small's requests preempted", "preemptions_small", ""),
                ("of them within share", "preemptions_small_within", ""),
                ("large's requests preempted", "preemptions_large", ""),
                ("of them within share", "preemptions_large_within", ""),
            ],
        ),
        notes=_institutions_notes(figures),
    )


def _institutions_notes(figures: dict[str, float]) -> str:
    """What the within-share count moved, in words, from the figures."""
    return (
        "**What the within-share count moved** (docs/spec.md §4; the rule before is printed "
        "beside it). Under the rule before, large's reservation eroded under its flood: "
        "every request of large borrowed, ranked behind small's, so small's borrowers took "
        "large's reserved slots and large's borrowers were the victims whenever the KV cache "
        f"filled ({figures['preemptions_large_before']:.0f} preemptions of large's, "
        f"{figures['preemptions_small_before']:.0f} of small's). Now large keeps its 13 "
        "reserved requests, replaced as they end (its median wait "
        f"{figures['large_p50_wait_s']:.2f} s, {figures['large_p50_wait_s_before']:.1f} s "
        "before). Small sends 6 at a time for a reservation of 3: the 3 borrowers of a "
        "burst now wait for room beside large's reserved requests, and the KV cache holds "
        f"{figures['kv_holds_large_requests']:.1f} of large's batch requests at once, about "
        "its 13, so small's borrowers are the victims when it fills "
        f"({figures['preemptions_small']:.0f} preemptions, "
        f"{figures['preemptions_small_within']:.0f} within share) and small's p99 wait over "
        f"all its requests is {figures['small_all_p99_wait_s']:.0f} s "
        f"({figures['small_all_p99_wait_s_before']:.1f} s before): the room they had was "
        "large's reservation. Large's within-share requests are preempted only when its "
        "reserved requests alone overflow the cache "
        f"({figures['preemptions_large_within']:.0f} times), never while a borrower runs. "
        f"Small's within-share p99 wait rose from {figures['small_within_p99_wait_s_before']:.2f} "
        f"s to {figures['small_within_p99_wait_s']:.2f} s, still within the target: "
        "borrowers no longer use up small's reservation, so its within-share requests also "
        "arrive while its borrowers hold the slots beside large's "
        f"({figures['small_within_requests']:.0f} granted within share, "
        f"{figures['small_within_requests_before']:.0f} before) and then wait for the next "
        "request to end; and large's reserved requests hold most of the KV cache, so one "
        "sometimes waits for blocks with a slot free. Small's part of the service is the same "
        f"({figures['small_served_fraction']:.3f}, {figures['small_served_fraction_before']:.3f} "
        "before)."
    )


# -- 2. three teams -------------------------------------------------------------------


def _teams(result: SimResult, shares: Mapping[str, float], warmup: float) -> dict[str, float]:
    """The figures read alike from the fairshare run and the run under the rule before."""
    a, b = result.served_s("a", warmup), result.served_s("b", warmup)
    mids, series = result.served_series(["a", "b"], max(10.0, result.horizon_s / 60))
    parts = [
        100 * x / (x + y)
        for t, x, y in zip(mids, series["a"], series["b"], strict=True)
        if t >= warmup and x + y > 0
    ]
    return {
        "a_of_a_plus_b": a / (a + b),
        "a_of_a_plus_b_per_bin_sd": statistics.pstdev(parts) if parts else math.nan,
        "c_within_p99_wait_s": percentile(result.waits("c", within_share=True), 99),
        "mean_service_s": result.mean_service_s(),
        "kv_holds_requests": kv_holds(result),
        **preemption_figures(result, shares),
    }


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
    figures = _teams(fair, shares, warmup)
    fa, fb = fcfs.served_s("a", warmup), fcfs.served_s("b", warmup)
    figures |= {
        "a_of_a_plus_b_fcfs": fa / (fa + fb),
        "c_within_p99_wait_fcfs_s": percentile(fcfs.waits("c", within_share=True), 99),
    }
    figures |= before.suffixed(_teams(before.run_before(setup), shares, warmup))
    targets = [
        Target(
            "a's part of the service a and b received, after the warm-up, within 2 points of "
            "66.7 % (distance)",
            abs(figures["a_of_a_plus_b"] - 2 / 3) * 100,
            2.0,
            at_most=True,
            unit="points",
        ),
        never_beside_a_borrower(figures),
    ]
    description = (
        f"C = {capacity}, shares a 0.5 / b 0.25 / c 0.25 (reservations 10, 5 and 5). *a* "
        f"and *b* each run a batch job with {3 * capacity} requests outstanding; *c* sends "
        f"a few interactive requests (0.05/s). Half-life {300 * scale:.0f} s, "
        f"{horizon:.0f} s simulated, service counted after a {warmup:.0f} s warm-up. a and "
        "b each keep their reservation within share; the slots c leaves idle are borrowed "
        "and go to the team with the highest level fairshare, so a and b should be served "
        "2 : 1."
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
        compared=before.LABEL,
        comparisons=before.beside(
            figures,
            [
                (
                    "a's part of the service a and b received, after the warm-up",
                    "a_of_a_plus_b",
                    "",
                ),
                ("its standard deviation over time bins", "a_of_a_plus_b_per_bin_sd", "points"),
                ("c's within-share p99 wait", "c_within_p99_wait_s", "s"),
                ("a's requests preempted", "preemptions_a", ""),
                ("of them within share", "preemptions_a_within", ""),
                ("b's requests preempted", "preemptions_b", ""),
                ("of them within share", "preemptions_b_within", ""),
            ],
        ),
        notes=_teams_notes(figures),
    )


def _teams_notes(figures: dict[str, float]) -> str:
    """What the figures show, in words."""
    return "\n".join(
        [
            "Each of a and b holds its reservation within share; only the slots c leaves "
            "idle are borrowed, and every borrowed slot goes to the team with the highest "
            "level fairshare, so per time bin the service swings between a and b (faint "
            "lines) by those slots: the allocator is a bang-bang controller over them whose "
            "lag is the time a request spends queued. The decayed usage averages the swings, "
            "and the cumulative split settles at 2 : 1. FCFS splits by the number of "
            "requests outstanding (1 : 1 here).",
            "",
            "**What the within-share count moved** (docs/spec.md §4; the rule before is "
            "printed beside it). Under the rule before, a's and b's reservations eroded under "
            "their floods: every request of theirs borrowed, so all the slots swung between "
            "them, not only c's: a's part of a + b per time bin had a standard deviation of "
            f"{figures['a_of_a_plus_b_per_bin_sd_before']:.1f} points, "
            f"{figures['a_of_a_plus_b_per_bin_sd']:.1f} now. The cumulative split is the "
            f"same ({figures['a_of_a_plus_b']:.3f} now, "
            f"{figures['a_of_a_plus_b_before']:.3f} before). The KV cache holds "
            f"{figures['kv_holds_requests']:.1f} of these batch requests at once, about the "
            "15 reserved for a and b, so when only reserved requests run and the cache fills, "
            "one of them is preempted: "
            f"{figures['preemptions_a_within']:.0f} of a's {figures['preemptions_a']:.0f} "
            f"preemptions and {figures['preemptions_b_within']:.0f} of b's "
            f"{figures['preemptions_b']:.0f} were within-share requests, none while a "
            "borrower ran (before: "
            f"{figures['preemptions_a_within_before'] + figures['preemptions_b_within_before']:.0f}"
            " of "
            f"{figures['preemptions_a_before'] + figures['preemptions_b_before']:.0f}). "
            "c's within-share p99 wait: "
            f"{figures['c_within_p99_wait_s']:.2f} s "
            f"({figures['c_within_p99_wait_s_before']:.2f} s before).",
        ]
    )
