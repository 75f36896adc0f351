"""Sustained overload: three teams keep 1.5 and 3 times their reservations in flight for a
long run, under the current standing rule and under the rule before it.

The current rule (docs/spec.md §4) counts only a team's within-share requests against its
reservation, so a team above its reservation keeps exactly its reservation within share at
every moment; the rule before counted every request in flight, so each within-share request
that ended was replaced by a borrower and the reservation eroded to nothing. The scenario
checks the first and draws both (``fairshare.sim.holdings``; the rule before is
``allocators.in_flight_rule``, printed as the comparison, not checked). A third run, the
current rule with many more long requests (``LONG_MIX``), shows where the wait target stops
holding: when the reserved requests alone overflow the KV cache.
"""

from __future__ import annotations

import math

from fairshare import apportion
from fairshare.sim.allocators import AllocatorFactory, in_flight_rule
from fairshare.sim.holdings import Holdings, sample_holdings
from fairshare.sim.results import SimResult
from fairshare.sim.scenarios import before
from fairshare.sim.scenarios.result import Comparison, ScenarioResult, Target, percentile
from fairshare.sim.scenarios.runs import (
    Setup,
    kv_holds,
    never_beside_a_borrower,
    preemption_figures,
    run,
    served_fractions,
)
from fairshare.sim.workloads import BATCH, INTERACTIVE, LONG, Flood, Mix, Source

NAME = "sustained-overload"
CAPACITY = 20
SHARES = {"a": 0.4, "b": 0.3, "c": 0.1}
"""Reservations 8, 6 and 2; the 20 % of C reserved for no team only borrowers use, so
borrowers run beside the reserved requests and KV pressure has to choose between them."""
LOADS = {"a": (1.5, 3.0), "b": (3.0, 1.5), "c": (1.5, 3.0)}
"""Requests each team keeps in flight in the first and the second half of the run, in
multiples of its reservation."""
MIX = Mix(((INTERACTIVE, 0.6), (BATCH, 0.4)))
"""The requests every team sends: two kinds, with log-normal prompt and answer lengths. The
KV cache holds about C of them on average; the spread of their contexts makes preemptions."""
LONG_MIX = Mix(((INTERACTIVE, 0.5), (BATCH, 0.3), (LONG, 0.2)))
"""The mix of the third run: with one request in five long, the average context no longer
fits a slot's KV blocks (the KV cache holds fewer than C such requests)."""
WARMUP_S = 120.0
"""Long enough for the borrowers admitted at the start, before any request ended, to end."""
SAMPLE_S = 1.0
"""Simulated seconds between two samples of what each team holds."""
HELD_BOUND = 99.9
"""Percent of the samples after the warm-up at which a team must hold its reserved
requests within share."""
SHIPPED = "fairshare"
"""The label of the checked run: the pool's current rule."""
BEFORE = before.LABEL
"""The label of the comparison run: ``allocators.in_flight_rule``."""


def _sources(reserved: dict[str, int], horizon_s: float, mix: Mix) -> list[Source]:
    """Each team's closed loop: its first-half load until half-time, then its second-half
    load (the workers over the lower load start or stop at half-time)."""
    half = horizon_s / 2
    sources: list[Source] = []
    for team, (first, second) in LOADS.items():
        low, high = sorted((first, second))
        sources.append(Flood(team, outstanding=round(low * reserved[team]), shape=mix))
        extra = round(high * reserved[team]) - round(low * reserved[team])
        start, stop = (0.0, half) if first > second else (half, math.inf)
        sources.append(Flood(team, outstanding=extra, shape=mix, start_s=start, stop_s=stop))
    return sources


def _one(
    seed: int, horizon_s: float, mix: Mix, fairshare: AllocatorFactory | None
) -> tuple[SimResult, Holdings]:
    """One run of the workload with ``mix``, and what each team held in it."""
    sampled: list[Holdings] = []
    setup = Setup(
        capacity=CAPACITY,
        shares=SHARES,
        sources=_sources(apportion(CAPACITY, SHARES, SHARES), horizon_s, mix),
        horizon_s=horizon_s,
        seed=seed,
        half_life_s=600.0,
        pool=NAME,
        controls=lambda sim: sampled.append(sample_holdings(sim, SHARES, SAMPLE_S)),
    )
    result = run(setup, fairshare=fairshare)
    return result, sampled[0]


def _figures(result: SimResult, held: Holdings, suffix: str) -> dict[str, float]:
    """The figures of one run; ``suffix`` ends every name ('' for the checked run)."""
    reserved = apportion(CAPACITY, SHARES, SHARES)
    figures: dict[str, float] = {}
    served = served_fractions(result, list(SHARES), WARMUP_S)
    for team, r in reserved.items():
        waits = result.waits(team, within_share=True, arrived=(WARMUP_S, math.inf))
        figures[f"{team}_held_pct"] = 100 * held.held_fraction(team, r, WARMUP_S)
        figures[f"{team}_running_pct"] = 100 * held.running_fraction(team, r, WARMUP_S)
        figures[f"{team}_within_mean"] = held.mean(held.within, team, WARMUP_S)
        figures[f"{team}_within_running_mean"] = held.mean(held.within_running, team, WARMUP_S)
        figures[f"{team}_in_flight_mean"] = held.mean(held.in_flight, team, WARMUP_S)
        figures[f"{team}_within_requests"] = len(waits)
        figures[f"{team}_within_p99_wait_s"] = percentile(waits, 99)
        figures[f"{team}_all_p99_wait_s"] = percentile(
            result.waits(team, arrived=(WARMUP_S, math.inf)), 99
        )
        figures[f"{team}_served_pct"] = 100 * served[team]
    figures.update(preemption_figures(result, SHARES))
    figures["mean_service_s"] = result.mean_service_s()
    figures["kv_holds_requests"] = kv_holds(result)
    return before.suffixed(figures, suffix)


def _checks(figures: dict[str, float]) -> tuple[list[Target], list[Comparison]]:
    """The targets of the checked run, and its figures beside the rule before's."""
    targets: list[Target] = []
    comparisons: list[Comparison] = []
    for team, share in SHARES.items():
        held = (
            f"{team} held min(reservation {figures[f'reserved_{team}']:.0f}, in flight) "
            f"within share, after the warm-up (samples every {SAMPLE_S:.0f} s)"
        )
        p99 = f"{team}'s within-share p99 wait after the warm-up"
        targets += [
            Target(held, figures[f"{team}_held_pct"], HELD_BOUND, at_most=False, unit="%"),
            Target(
                f"{p99} ≤ one mean service time",
                figures[f"{team}_within_p99_wait_s"],
                figures["mean_service_s"],
                at_most=True,
                unit="s",
            ),
        ]
        running = (
            f"{team} had min(reservation, in flight) requests running, whatever their "
            "standing, after the warm-up"
        )
        comparisons += before.beside(
            figures,
            [
                (held, f"{team}_held_pct", "%"),
                (running, f"{team}_running_pct", "%"),
                (p99, f"{team}_within_p99_wait_s", "s"),
                (
                    f"{team}'s p99 wait, every request, after the warm-up",
                    f"{team}_all_p99_wait_s",
                    "s",
                ),
                (
                    f"{team}'s part of the service after the warm-up (share {share:.0%})",
                    f"{team}_served_pct",
                    "%",
                ),
            ],
        )
    targets.append(never_beside_a_borrower(figures))
    return targets, comparisons


def sustained_overload(
    *, seed: int = 1, scale: float = 1.0, fairshare: AllocatorFactory | None = None
) -> ScenarioResult:
    """Three teams above their reservations for the whole run; the rule before beside it,
    and the same under a mix of many long requests."""
    horizon = 3600.0 * scale
    reserved = apportion(CAPACITY, SHARES, SHARES)
    figures: dict[str, float] = {f"reserved_{team}": r for team, r in reserved.items()}
    runs: dict[str, SimResult] = {}
    holdings: dict[str, Holdings] = {}
    for label, mix, factory, suffix in (
        (SHIPPED, MIX, fairshare, ""),
        (BEFORE, MIX, in_flight_rule, before.SUFFIX),
        ("long mix", LONG_MIX, fairshare, "_long_mix"),
    ):
        result, held = _one(seed, horizon, mix, factory)
        figures.update(_figures(result, held, suffix))
        if mix is MIX:
            runs[label], holdings[label] = result, held
    targets, comparisons = _checks(figures)
    loads = ", ".join(
        f"*{team}* {first:g} × then {second:g} × ({round(first * reserved[team])} then "
        f"{round(second * reserved[team])} requests)"
        for team, (first, second) in LOADS.items()
    )
    description = (
        f"C = {CAPACITY} (one vLLM instance, 72 KV blocks per slot), shares a 0.4 / b 0.3 / "
        f"c 0.1: reservations {reserved['a']}, {reserved['b']} and {reserved['c']}; the "
        "other 20 % of C is reserved for no team, so borrowers run beside the reserved "
        "requests and KV pressure must choose between them. Each team is a closed loop "
        "that keeps a fixed number of requests in flight (it sends the next as one ends), "
        "in multiples of its reservation, for the first and then the second half of the "
        f"run: {loads}. Every request is drawn from one mix of lengths: interactive (600 + "
        "200 tokens on average) 60 %, batch (1200 + 300) 40 %. Half-life 600 s, "
        f"{horizon:.0f} s simulated, figures after a "
        f"{WARMUP_S:.0f} s warm-up; what each team holds is sampled every {SAMPLE_S:.0f} s. "
        f"The comparison (*{BEFORE}*) is the same workload under the standing rule the pool "
        "had before (a request was within share iff the team's requests in flight, "
        "borrowers included, were fewer than its reservation), kept in the simulator only. "
        "A third run, not plotted, has the current rule and a mix with one long request in "
        "five (interactive 50 %, batch 30 %, long 20 %: 2400 + 900 tokens on average, up to "
        "8192 + 2048): its figures end in `_long_mix`."
    )
    return ScenarioResult(
        name=NAME,
        title="Sustained overload: three busy teams",
        description=description,
        shares=dict(SHARES),
        runs=runs,
        figures=figures,
        targets=targets,
        marks=[(WARMUP_S, "end of warm-up"), (horizon / 2, "loads swap")],
        compared=BEFORE,
        comparisons=comparisons,
        holdings=holdings,
        notes=_notes(figures),
    )


def _notes(figures: dict[str, float]) -> str:
    """What the figures show, in words."""
    teams = list(SHARES)

    def each(key: str, fmt: str = ".0f") -> str:
        return ", ".join(f"{t} {figures[f'{t}_{key}']:{fmt}}" for t in teams)

    def total(key: str) -> float:
        return sum(figures[f"preemptions_{t}{key}"] for t in teams)

    return "\n".join(
        [
            "**What the rule changes.** Under the current rule each team holds exactly its "
            "reservation within share at every sampled instant after the warm-up (mean "
            f"within-share requests in flight: {each('within_mean', '.2f')}); the rule "
            "before let it erode within seconds of the start, as each within-share request "
            "that ended was replaced by a borrower (mean after the warm-up: "
            f"{each('within_mean_before', '.2f')}; the plot of requests held shows the "
            "first minute beside the whole run). With every request a borrower, vLLM "
            "ordered a team's requests by its rank alone, so a team's running requests "
            "fell below its reservation whenever its rank dropped: it had its "
            "reservation's worth running in "
            f"{each('running_pct_before', '.0f')} % of the samples, against "
            f"{each('running_pct', '.0f')} % now. The split of the service after the "
            "warm-up is the same under both rules, in proportion to the shares (the decayed "
            f"usage ranks the borrowers either way: {each('served_pct', '.1f')} % now, "
            f"{each('served_pct_before', '.1f')} % before), and so is the mean service "
            "time; what moves is who waits: the borrowers, now behind every reserved "
            f"request (p99 wait of all of a team's requests: {each('all_p99_wait_s')} s, "
            f"against {each('all_p99_wait_s_before')} s before).",
            "",
            f"**Preemptions.** {total(''):.0f} under the current rule (the rule before: "
            f"{total('_before'):.0f}), {total('_within'):.0f} of them within-share "
            "requests, every one while no "
            "borrower ran on the instance (vLLM preempts the largest priority, and every "
            "borrower's is larger than every within-share one's): a within-share request "
            "is preempted only when the reserved requests running alone overflow the KV "
            "cache, which no priority can prevent.",
            "",
            "**Where the wait target stops holding.** The reservations are counted in slots; "
            "a within-share request also needs the KV blocks of its context to start, and "
            "vLLM never preempts a running request to free them for a waiting one. Over "
            "its run a request holds the blocks of its prompt and half its answer on "
            "average; weighted by service time, the KV cache (72 blocks per slot) holds "
            f"{figures['kv_holds_requests']:.1f} requests of the mix above at once, more "
            f"than the {sum(figures[f'reserved_{t}'] for t in teams):.0f} reserved: the "
            "preemptions come from the spread of the contexts, most victims are borrowers "
            "(above), and the within-share p99 wait after the warm-up is "
            f"{each('within_p99_wait_s', '.2f')} s against a mean service time of "
            f"{figures['mean_service_s']:.2f} s. With one request in five long "
            f"(`_long_mix`), it holds {figures['kv_holds_requests_long_mix']:.1f}, fewer "
            "than the reserved requests: they overflow it alone, are preempted by one another "
            f"({total('_within_long_mix'):.0f} within-share preemptions of "
            f"{total('_long_mix'):.0f}) and wait for blocks (mean within-share requests "
            f"running {each('within_running_mean_long_mix', '.1f')}, p99 wait "
            f"{each('within_p99_wait_s_long_mix', '.1f')} s against a mean service time of "
            f"{figures['mean_service_s_long_mix']:.2f} s). The standing still holds there "
            f"(held {each('held_pct_long_mix', '.1f')} % of the samples); the pool's C is "
            "more than its KV cache sustains. Size C to what the KV cache holds for the "
            "traffic's contexts.",
        ]
    )
