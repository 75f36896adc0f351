"""An elastic pool: the capacity shrinks, then grows, mid-run, against FCFS."""

from __future__ import annotations

from sim.allocators import AllocatorFactory
from sim.engine import Simulator
from sim.model import Policy
from sim.scenarios.result import ScenarioResult, Target, percentile
from sim.scenarios.runs import Setup, preemption_figures, run, served_fractions
from sim.workloads import BATCH, INTERACTIVE, Bursts, Flood, Poisson, Source


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
    figures: dict[str, float] = {"mean_service_s": mean_s}
    targets = []
    for i, (start, end, c) in enumerate(phases, start=1):
        served = served_fractions(fair, list(shares), start, end)
        for team in shares:
            figures[f"phase{i}_served_{team}"] = served[team]
        for team in ("b", "c"):
            p99 = percentile(fair.waits(team, within_share=True, arrived=(start, end)), 99)
            figures[f"phase{i}_{team}_within_p99_wait_s"] = p99
            figures[f"phase{i}_{team}_within_p99_wait_fcfs_s"] = percentile(
                fcfs.waits(team, within_share=True, arrived=(start, end)), 99
            )
            targets.append(
                Target(
                    f"C = {c}: {team}'s within-share p99 wait ≤ one mean service time",
                    p99,
                    mean_s,
                    at_most=True,
                    unit="s",
                )
            )
    figures.update(preemption_figures(fair, shares))
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
    )
