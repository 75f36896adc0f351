"""An elastic pool: the capacity shrinks, then grows, mid-run, against FCFS."""

from __future__ import annotations

from collections.abc import Mapping

from fairshare.sim.allocators import AllocatorFactory
from fairshare.sim.engine import Simulator
from fairshare.sim.model import Policy
from fairshare.sim.results import SimResult
from fairshare.sim.scenarios import before
from fairshare.sim.scenarios.result import ScenarioResult, Target, percentile
from fairshare.sim.scenarios.runs import (
    Setup,
    never_beside_a_borrower,
    preemption_figures,
    run,
    served_fractions,
)
from fairshare.sim.workloads import BATCH, INTERACTIVE, Bursts, Flood, Poisson, Source


def elastic(
    *, seed: int = 1, scale: float = 1.0, fairshare: AllocatorFactory | None = None
) -> ScenarioResult:
    """C = 16, shrinks to 8 a third of the way, grows to 24 at two thirds."""
    shares = {"a": 0.5, "b": 0.3, "c": 0.2}
    horizon = 1800.0 * scale
    t1, t2 = horizon / 3, 2 * horizon / 3
    phases = [(0.0, t1, 16), (t1, t2, 8), (t2, horizon, 24)]
    sources: list[Source] = [
        Flood("a", outstanding=64, shape=BATCH),
        Poisson("b", rate_per_s=0.4, shape=INTERACTIVE),
        Bursts("c", every_s=30.0, size=4, shape=INTERACTIVE),
    ]

    def controls(sim: Simulator) -> None:
        sim.at(t1, lambda: sim.set_capacity(8))
        sim.at(t2, lambda: sim.set_capacity(24))

    setup = Setup(
        capacity=16,
        shares=shares,
        sources=sources,
        horizon_s=horizon,
        seed=seed,
        half_life_s=600.0,
        pool="elastic",
        controls=controls,
        resizes=True,
    )
    fair = run(setup, fairshare=fairshare)
    fcfs = run(setup, policy=Policy.FCFS)
    mean_s = fair.mean_service_s()
    figures: dict[str, float] = {"mean_service_s": mean_s, **_phases(fair, shares, phases)}
    figures |= before.suffixed(_phases(before.run_before(setup), shares, phases))
    targets = []
    rows = []
    for i, (start, end, c) in enumerate(phases, start=1):
        for team in ("b", "c"):
            p99 = f"phase{i}_{team}_within_p99_wait_s"
            figures[f"phase{i}_{team}_within_p99_wait_fcfs_s"] = percentile(
                fcfs.waits(team, within_share=True, arrived=(start, end)), 99
            )
            text = f"C = {c}: {team}'s within-share p99 wait"
            targets.append(
                Target(
                    f"{text} ≤ one mean service time", figures[p99], mean_s, at_most=True, unit="s"
                )
            )
            rows.append((text, p99, "s"))
    targets.append(never_beside_a_borrower(figures))
    for team in shares:
        rows += [
            (f"{team}'s requests preempted", f"preemptions_{team}", ""),
            ("of them within share", f"preemptions_{team}_within", ""),
        ]
    description = (
        f"Shares a 0.5 / b 0.3 / c 0.2. C = 16, then `set_capacity(8)` at {t1:.0f} s "
        f"(instances drained: the requests over the new C or KV budget are preempted, "
        f"largest priority first), then `set_capacity(24)` at {t2:.0f} s. *a* floods with "
        "64 requests outstanding, *b* sends interactive requests (0.4/s), *c* bursts of 4 "
        "every 30 s on average. Reservations are recomputed at each change; requests in "
        "flight keep their standing."
    )
    return ScenarioResult(
        name="elastic",
        title="Elastic pool: shrink, then grow",
        description=description,
        shares=shares,
        runs={"fairshare": fair, "FCFS": fcfs},
        figures=figures,
        targets=targets,
        marks=[(t1, "C → 8"), (t2, "C → 24")],
        compared=before.LABEL,
        comparisons=before.beside(figures, rows),
        notes=_notes(figures),
    )


def _phases(
    result: SimResult, shares: Mapping[str, float], phases: list[tuple[float, float, int]]
) -> dict[str, float]:
    """The figures read alike from the fairshare run and the run under the rule before:
    per phase, each team's part of the service and b's and c's within-share p99 wait."""
    figures: dict[str, float] = {}
    for i, (start, end, _) in enumerate(phases, start=1):
        served = served_fractions(result, list(shares), start, end)
        for team in shares:
            figures[f"phase{i}_served_{team}"] = served[team]
        for team in ("b", "c"):
            figures[f"phase{i}_{team}_within_p99_wait_s"] = percentile(
                result.waits(team, within_share=True, arrived=(start, end)), 99
            )
    return figures | preemption_figures(result, shares)


def _notes(figures: dict[str, float]) -> str:
    """What the within-share count moved, in words, from the figures."""

    def p99s(suffix: str) -> str:
        waits = [
            figures[f"phase{i}_{team}_within_p99_wait_s{suffix}"]
            for i in (1, 2, 3)
            for team in ("b", "c")
        ]
        return f"{min(waits):.2f} to {max(waits):.2f} s"

    return (
        "**What the within-share count moved** (docs/spec.md §4; the rule before is printed "
        "beside it). Under the rule before, a's reservation eroded under its flood: all its "
        "requests borrowed, and they were the victims of the KV cache and of the shrink "
        f"({figures['preemptions_a_before']:.0f} preemptions of a's; of b's and c's, "
        f"{figures['preemptions_b_before']:.0f} and {figures['preemptions_c_before']:.0f}). "
        "Now a keeps its reservation within share through every change of C (after the "
        "shrink its new requests borrow until its within-share count is below the new "
        "reservation, docs/spec.md §9), so b's and c's borrowers, which ran in a's reserved "
        "slots before, are among the victims when the cache fills "
        f"({figures['preemptions_b']:.0f} and {figures['preemptions_c']:.0f}, of them "
        f"{figures['preemptions_b_within'] + figures['preemptions_c_within']:.0f} within "
        "share), and a's within-share requests when only reserved requests run "
        f"({figures['preemptions_a_within']:.0f} of a's {figures['preemptions_a']:.0f}), "
        "never while a borrower runs. b's and c's within-share p99 waits over the three "
        f"phases range from {p99s('')}, against {p99s(before.SUFFIX)} before: within the "
        "target either way."
    )
