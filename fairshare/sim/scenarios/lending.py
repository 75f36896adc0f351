"""Instant start: a team's lending limit swept from 1.0 to 0 while another team floods.

vLLM never preempts a running request to start a waiting one, so when every slot runs a
borrower, a within-share request that arrives waits until one of them ends: seconds with
C long answers running, longer with fewer slots or longer answers. A team that lends
less than all of its idle reserved slots (``Pool(lend=...)``) keeps the rest free, and
the gateway holds the borrowers that would take them (``allocators.LendingAllocator``):
its next arrival starts at the next scheduler step. The scenario sweeps the arriving
team's lend fraction and shows what it buys (its within-share wait) and what it costs
(the pool's utilization and the flooding team's throughput), beside the same workload
without any lending limit (plain ``acquire``, nothing held). The noise of each figure is
measured over several seeds of that run, so that the run at lend 1.0 can be checked to
equal it within noise.
"""

from __future__ import annotations

import math
import statistics

from fairshare import Class, apportion
from fairshare.sim.allocators import (
    HOLD_WAIT_S,
    AllocatorFactory,
    LendingAllocator,
    PoolSpec,
    SetupError,
    lending,
)
from fairshare.sim.engine import Simulator
from fairshare.sim.results import SimResult
from fairshare.sim.scenarios.result import ScenarioResult, Target, percentile
from fairshare.sim.scenarios.runs import HARDWARE, Setup, run
from fairshare.sim.workloads import Flood, Poisson, Shape, Tokens

NAME = "instant-start"
CAPACITY = 16
ARRIVING = "chat"
FLOODING = "batch"
SHARES = {ARRIVING: 0.5, FLOODING: 0.25}
"""Reservations 8 and 4; the 4 slots reserved for no team are always lent, so the flood
borrows even when chat keeps all of its idle slots back."""
CHAT = Shape(Class.INTERACTIVE, Tokens(300, 0.5, 16, 2048), Tokens(600, 0.5, 100, 2000))
"""Chat's requests: long answers (12 s on average, up to 40 s)."""
BATCH = Shape(Class.BATCH, Tokens(300, 0.5, 16, 2048), Tokens(1000, 0.5, 200, 3000))
"""The flood's requests: longer answers (20 s on average, up to 60 s)."""
CHAT_RATE_PER_S = 0.2
"""Chat's Poisson arrivals: about 2.4 requests in flight on average, far below its 8."""
CHAT_SERVICE_S = HARDWARE.service_s(300, 600)
"""The run of chat's average request."""
FLOOD_OUTSTANDING = 48
"""Requests the flood keeps outstanding: 12 times its reservation."""
LENDS = (1.0, 0.75, 0.5, 0.25, 0.0)
"""Chat's lend fractions, swept; the flood lends 1.0 throughout."""
UNLIMITED = "unlimited_"
"""The prefix of the figures of the run without any lending limit."""
HORIZON_S = 7200.0
WARMUP_S = 120.0
"""Figures count what arrived (waits) or was served after it: the flood's first requests,
all sent at 0 s, have ended by then."""
NOISE_SEEDS = 8
"""Seeds of the run without a lending limit (the scenario's and the next ones) whose
spread is the noise of a figure."""
NOISE_Z = 1.96 * math.sqrt(2)
"""Noise bound in standard deviations over the seeds: the difference of two independent
draws of a figure has sigma sqrt(2) times the figure's, and 1.96 of those hold 95 % of it."""
COMPARED = (
    ("within_p99_wait_s", f"{ARRIVING}'s within-share p99 wait", "s"),
    ("utilization_pct", "the pool's utilization", "points"),
    ("flood_per_min", f"{FLOODING}'s throughput", "requests/min"),
)
"""(figure, words, unit) of the figures that lend 1.0 must leave as they are without a
lending limit."""


def _shown(lend: float) -> str:
    """A lend fraction as the report prints it: 1.0, 0.75, 0."""
    return "1.0" if lend == 1 else f"{lend:g}"


def prefix(lend: float) -> str:
    """The prefix of the figures of the run at ``lend``: ``lend75_`` for 0.75."""
    return f"lend{round(100 * lend)}_"


def _setup(seed: int, horizon_s: float) -> Setup:
    return Setup(
        capacity=CAPACITY,
        shares=SHARES,
        sources=[
            Poisson(ARRIVING, CHAT_RATE_PER_S, CHAT),
            Flood(FLOODING, outstanding=FLOOD_OUTSTANDING, shape=BATCH),
        ],
        horizon_s=horizon_s,
        seed=seed,
        half_life_s=600.0,
        pool=NAME,
    )


def _holding(lend: float, built: list[LendingAllocator]) -> AllocatorFactory:
    """``allocators.lending`` for chat's ``lend``, keeping each allocator it builds."""
    make = lending({ARRIVING: lend})

    def keep(spec: PoolSpec, sim: Simulator) -> LendingAllocator:
        allocator = make(spec, sim)
        built.append(allocator)
        return allocator

    return keep


def _figures(result: SimResult, allocator: LendingAllocator | None) -> dict[str, float]:
    """The figures of one run, after the warm-up (without prefix)."""
    window = result.horizon_s - WARMUP_S
    waits = result.waits(ARRIVING, within_share=True, arrived=(WARMUP_S, math.inf))
    busy = math.fsum(result.served_s(team, WARMUP_S) for team in SHARES)
    flood_done = [
        r
        for r in result.completed()
        if r.team == FLOODING and r.finish_s is not None and r.finish_s >= WARMUP_S
    ]
    held_s = [r.held_s for r in result.requests if r.held_s > 0 or r.held]
    return {
        "within_requests": len(waits),
        "within_p99_wait_s": percentile(waits, 99),
        "within_max_wait_s": max(waits, default=math.nan),
        "within_waited_pct": 100 * sum(w > HARDWARE.step_s for w in waits) / max(1, len(waits)),
        "utilization_pct": 100 * busy / (CAPACITY * window),
        "flood_per_min": 60 * len(flood_done) / window,
        "flood_slots_mean": result.served_s(FLOODING, WARMUP_S) / window,
        "arriving_slots_mean": result.served_s(ARRIVING, WARMUP_S) / window,
        "held": len(held_s),
        "held_max_s": max(held_s, default=0.0),
        "waits_ended": allocator.waits_ended if allocator is not None else 0,
        "preemptions": sum(result.preemptions.values()),
    }


def _one(seed: int, horizon_s: float, lend: float | None) -> tuple[SimResult, dict[str, float]]:
    """One run: without a lending limit (None) or with chat lending ``lend``."""
    built: list[LendingAllocator] = []
    factory = None if lend is None else _holding(lend, built)
    result = run(_setup(seed, horizon_s), fairshare=factory)
    return result, _figures(result, built[0] if built else None)


def _noise(seed: int, horizon_s: float, first: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each compared figure's noise bound (``NOISE_Z`` standard deviations over
    ``NOISE_SEEDS`` seeds of the run without a lending limit), and the mean over those
    seeds of lend 1.0's figure minus the unlimited one's."""
    runs: dict[str, list[dict[str, float]]] = {UNLIMITED: [], prefix(1.0): []}
    for name, lend in ((UNLIMITED, None), (prefix(1.0), 1.0)):
        runs[name].append(first[name])
        for other in range(seed + 1, seed + NOISE_SEEDS):
            runs[name].append(_one(other, horizon_s, lend)[1])
    figures: dict[str, float] = {"noise_seeds": NOISE_SEEDS}
    for key, _, _ in COMPARED:
        values = [f[key] for f in runs[UNLIMITED]]
        differences = [
            f[key] - u[key] for f, u in zip(runs[prefix(1.0)], runs[UNLIMITED], strict=True)
        ]
        figures[f"{key}_seeds_sd"] = statistics.stdev(values)
        figures[f"{key}_noise"] = NOISE_Z * statistics.stdev(values)
        figures[f"{key}_mean_difference"] = statistics.mean(differences)
    return figures


def _targets(figures: dict[str, float]) -> list[Target]:
    """Lend 0 starts chat's within-share requests at the next scheduler step; lend 1.0
    changes none of the compared figures by more than their noise."""
    lent = prefix(1.0)
    targets = [
        Target(
            f"lend 0: {ARRIVING}'s within-share p99 wait after the warm-up ≤ one scheduler step",
            figures[f"{prefix(0.0)}within_p99_wait_s"],
            HARDWARE.step_s,
            at_most=True,
            unit="s",
        )
    ]
    for key, words, unit in COMPARED:
        difference = abs(figures[f"{lent}{key}"] - figures[f"{UNLIMITED}{key}"])
        targets.append(
            Target(
                f"lend 1.0: {words}, distance to the run without a lending limit ≤ its noise "
                f"({NOISE_Z:.2f} standard deviations over {NOISE_SEEDS} seeds of that run)",
                difference,
                figures[f"{key}_noise"],
                at_most=True,
                unit=unit,
            )
        )
    return targets


def instant_start(
    *, seed: int = 1, scale: float = 1.0, fairshare: AllocatorFactory | None = None
) -> ScenarioResult:
    """Chat's lend fraction swept from 1.0 to 0 under a flood, beside no lending limit."""
    if fairshare is not None:
        raise SetupError(
            "the instant-start scenario is in-process only: it holds borrowers at the "
            "gateway under a lending limit, which the allocator's Acquire does not do; run "
            "it without --allocator"
        )
    horizon = HORIZON_S * scale
    reserved = apportion(CAPACITY, SHARES, SHARES)
    figures: dict[str, float] = {f"reserved_{team}": r for team, r in reserved.items()}
    figures["step_s"] = HARDWARE.step_s
    results: dict[float | None, SimResult] = {}
    first: dict[str, dict[str, float]] = {}
    for name, lend in ((UNLIMITED, None), *((prefix(v), v) for v in LENDS)):
        results[lend], first[name] = _one(seed, horizon, lend)
        figures.update({f"{name}{key}": value for key, value in first[name].items()})
    figures.update(_noise(seed, horizon, first))
    figures["mean_service_s"] = results[None].mean_service_s()
    # The plots over time: the checked run first, then lend 1.0.
    runs = {f"{ARRIVING} lends {lend:g}": results[lend] for lend in (0.0, 1.0)}
    return ScenarioResult(
        name=NAME,
        title="Instant start: a lending limit under a flood",
        description=_description(reserved, horizon),
        shares=dict(SHARES),
        runs=runs,
        figures=figures,
        targets=_targets(figures),
        marks=[(WARMUP_S, "end of warm-up")],
        notes=_notes(figures),
        sweep=[(lend, prefix(lend)) for lend in LENDS],
    )


def _description(reserved: dict[str, int], horizon_s: float) -> str:
    return (
        f"C = {CAPACITY} (one vLLM instance, 72 KV blocks per slot), shares {ARRIVING} "
        f"{SHARES[ARRIVING]} / {FLOODING} {SHARES[FLOODING]}: reservations "
        f"{reserved[ARRIVING]} and {reserved[FLOODING]}; the other "
        f"{CAPACITY - sum(reserved.values())} slots are reserved for no team and always "
        f"lent. *{FLOODING}* keeps {FLOOD_OUTSTANDING} requests outstanding "
        f"({FLOOD_OUTSTANDING // reserved[FLOODING]} × its reservation) of 300 + 1000 "
        "tokens on average (answers 200 to 3000 tokens: 20 s on average, up to 60 s); "
        f"*{ARRIVING}* sends Poisson arrivals ({CHAT_RATE_PER_S:g}/s) of 300 + 600 tokens "
        "(12 s on average, up to 40 s), about "
        f"{CHAT_RATE_PER_S * CHAT_SERVICE_S:.1f} in flight, far below its reservation. "
        f"The lend fraction of *{ARRIVING}* is swept over "
        f"{', '.join(_shown(v) for v in LENDS)} (*{FLOODING}* lends 1.0); under a "
        "lending limit each request is decided by "
        "`Pool.acquire_lent` and a borrower it refuses is held at the gateway "
        "(`fairshare.holding.HeldQueue`, `fairshare/sim/allocators.py`) until a request "
        f"ends and a slot is lent, or its wait ends ({HOLD_WAIT_S:.0f} s, then it borrows "
        "anyway). The run *without "
        "a lending limit* is the same workload with `Pool.acquire` and nothing held, as "
        f"the other scenarios run. Half-life 600 s, {horizon_s:.0f} s simulated, figures "
        f"after a {WARMUP_S:.0f} s warm-up. The run without a lending limit and the run at "
        f"lend 1.0 are repeated over {NOISE_SEEDS} seeds to measure the noise of their "
        "figures."
    )


def _row(figures: dict[str, float], name: str, label: str) -> str:
    f = {key: figures[f"{name}{key}"] for key in _KEYS}
    return (
        f"| {label} | {f['within_p99_wait_s']:.2f} s | {f['within_max_wait_s']:.2f} s "
        f"| {f['within_waited_pct']:.1f} % | {f['utilization_pct']:.1f} % "
        f"| {f['flood_per_min']:.1f} | {f['flood_slots_mean']:.1f} "
        f"| {f['held']:.0f} | {f['held_max_s']:.0f} s | {f['waits_ended']:.0f} "
        f"| {f['preemptions']:.0f} |"
    )


_KEYS = (
    "within_p99_wait_s",
    "within_max_wait_s",
    "within_waited_pct",
    "utilization_pct",
    "flood_per_min",
    "flood_slots_mean",
    "held",
    "held_max_s",
    "waits_ended",
    "preemptions",
)


def _notes(figures: dict[str, float]) -> str:
    """The sweep as a table, and what it shows, in words."""
    step_ms = 1000 * figures["step_s"]

    def at(lend: float | None, key: str) -> float:
        return figures[f"{UNLIMITED if lend is None else prefix(lend)}{key}"]

    table = [
        f"| {ARRIVING}'s lend | {ARRIVING}'s within-share p99 wait | its longest "
        f"| waited > one step ({step_ms:.0f} ms) | utilization | {FLOODING}'s requests "
        f"per minute | {FLOODING}'s slots (mean) | held | longest held | waits ended "
        "| preemptions |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        _row(figures, UNLIMITED, "no lending limit"),
        *(_row(figures, prefix(v), _shown(v)) for v in LENDS),
    ]
    reserved = figures[f"reserved_{ARRIVING}"]
    lost = 100 * (1 - at(0.0, "flood_per_min") / at(None, "flood_per_min"))
    kept = LENDS[-2]
    sd = {key: figures[f"{key}_seeds_sd"] for key, _, _ in COMPARED}
    moved = {key: at(1.0, key) - at(None, key) for key, _, _ in COMPARED}
    mean = {key: figures[f"{key}_mean_difference"] for key, _, _ in COMPARED}
    text = [
        f"**What a lending limit buys.** Without one, every slot {ARRIVING} leaves idle "
        f"runs a borrower of {FLOODING}, so {at(None, 'within_waited_pct'):.1f} % of "
        f"{ARRIVING}'s requests arrive to find all {CAPACITY} slots running and wait at the "
        "head of vLLM's queue until one of them ends (vLLM never preempts a running "
        f"request to start a waiting one): p99 {at(None, 'within_p99_wait_s'):.2f} s, "
        f"longest {at(None, 'within_max_wait_s'):.2f} s: the time until the first of the "
        f"{CAPACITY} running requests ({figures['mean_service_s']:.0f} s long on average) "
        "ends. At "
        f"lend l, {ARRIVING} keeps back gap - floor(l × gap) of its gap = "
        f"{reserved:.0f} - (its within-share requests) idle reserved slots, and the "
        "gateway holds a borrower unless the requests in flight plus the slots kept back "
        "are fewer than C. Each of its arrivals takes one free slot but lowers what it "
        "keeps back by about 1 - l, and the slot comes back only when a borrower ends (no "
        "borrower is let in meanwhile), so an arrival waits when more of its requests "
        f"arrived since then than it kept back. At lend 0 {ARRIVING} keeps back every idle "
        "reserved slot, and that never happens below its reservation: none of its "
        f"within-share requests waited (p99 {at(0.0, 'within_p99_wait_s'):.3f} s, longest "
        f"{at(0.0, 'within_max_wait_s'):.3f} s; the target is one scheduler step, "
        f"{step_ms:.0f} ms). At lend {kept:g} it keeps back "
        f"{reserved - math.floor(kept * reserved):.0f} slots when all {reserved:.0f} are "
        f"idle, more than its arrivals need at once here: p99 "
        f"{at(kept, 'within_p99_wait_s'):.2f} s, "
        f"{at(kept, 'within_waited_pct'):.1f} % waited, longest "
        f"{at(kept, 'within_max_wait_s'):.2f} s.",
        "",
        "**What it costs.** The slots kept back stay idle: the pool's utilization falls "
        f"from {at(1.0, 'utilization_pct'):.1f} % at lend 1.0 to "
        f"{at(0.0, 'utilization_pct'):.1f} % at lend 0, and {FLOODING}'s throughput from "
        f"{at(1.0, 'flood_per_min'):.1f} to {at(0.0, 'flood_per_min'):.1f} requests per "
        f"minute ({lost:.0f} % less): at lend 0 it runs on "
        f"{at(0.0, 'flood_slots_mean'):.1f} slots on average, its reservation and the "
        f"slots reserved for no team, against {at(1.0, 'flood_slots_mean'):.1f}. What the "
        f"borrowers lose is about (1 - l) × the reserved slots {ARRIVING} leaves idle "
        f"({reserved:.0f} minus the {at(0.0, 'arriving_slots_mean'):.1f} it runs on "
        "average). They wait at the gateway instead of in vLLM's queue (longest held "
        f"{at(1.0, 'held_max_s'):.0f} s at lend 1.0, {at(0.0, 'held_max_s'):.0f} s at "
        f"lend 0), never the {HOLD_WAIT_S:.0f} s after which one borrows anyway (waits "
        "ended: "
        f"{sum(at(v, 'waits_ended') for v in LENDS):.0f}). Fewer borrowers running hold "
        f"less of the KV cache: {at(1.0, 'preemptions'):.0f} preemptions at lend 1.0, "
        f"{at(0.0, 'preemptions'):.0f} at lend 0.",
        "",
        "**Choosing lend.** An operator trades the borrowers' throughput for the team's "
        "start: lend 1.0 costs nothing and makes the team's requests that arrive while "
        "the pool is full wait for a borrower to end (here seconds: the time until the "
        "first of C running answers ends, longer with longer answers); lend 0 starts "
        "every one of them at the next scheduler step while the team is below its "
        "reservation, and gives the borrowers none of its idle reserved slots. In "
        "between, the team's requests start at once as long as it keeps back at least as "
        "many slots as it receives requests before the next borrower ends: here lend "
        f"{kept:g} started {100 - at(kept, 'within_waited_pct'):.1f} % of {ARRIVING}'s "
        "requests at once for "
        f"{at(kept, 'utilization_pct') - at(0.0, 'utilization_pct'):.1f} points of "
        "utilization more than lend 0.",
        "",
        "**Lend 1.0 is the pool without a lending limit.** The noise bound of each "
        f"compared figure is {NOISE_Z:.2f} standard deviations of it over {NOISE_SEEDS} "
        "seeds of the run without a lending limit (1.96 √2: the 95 % range of the "
        "difference of two independent draws of the same workload); those deviations are "
        f"{sd['within_p99_wait_s']:.2f} s for {ARRIVING}'s within-share p99 wait, "
        f"{sd['utilization_pct']:.2f} points for the utilization and "
        f"{sd['flood_per_min']:.2f} requests per minute for {FLOODING}'s throughput. At "
        f"this seed lend 1.0 moves them by {moved['within_p99_wait_s']:+.2f} s, "
        f"{moved['utilization_pct']:+.2f} points and {moved['flood_per_min']:+.2f} per "
        f"minute; over the {NOISE_SEEDS} seeds by {mean['within_p99_wait_s']:+.2f} s, "
        f"{mean['utilization_pct']:+.3f} points and {mean['flood_per_min']:+.3f} per "
        "minute on average. At lend 1.0 a borrower is held exactly while the pool is full "
        "and let in at the next end, where vLLM would have started it; what differs is "
        f"the order of {FLOODING}'s requests (a held one admitted when {FLOODING}'s "
        "within-share request ends is within share again, and the request sent in its "
        "place joins the back of the queue).",
    ]
    return "\n".join([*table, "", *text])
