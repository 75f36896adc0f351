"""How a scenario runs its workload: the shared hardware, the set-up, one run.

``run`` is the one place that applies a scenario's ``fairshare`` allocator factory
(``allocators.AllocatorFactory``): None, the default, is the in-process
``fairshare.Pool`` on simulated time; the comparison runs (FCFS) always stay in-process.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from fairshare.sim.allocators import (
    Allocator,
    AllocatorFactory,
    FcfsAllocator,
    PoolSpec,
    in_process,
)
from fairshare.sim.engine import Routing, Simulator
from fairshare.sim.model import Hardware, Policy
from fairshare.sim.results import SimResult
from fairshare.sim.scenarios.result import Target
from fairshare.sim.workloads import Source, start_all

HARDWARE = Hardware(kv_blocks_per_slot=72)
"""One slot of C has 72 KV blocks of 16 tokens: enough for the average request, not for
every request at full length, so long answers under load cause preemptions."""


@dataclass(frozen=True)
class Setup:
    """What the runs of a scenario share."""

    capacity: int
    shares: Mapping[str, float]
    sources: list[Source]
    horizon_s: float
    seed: int
    half_life_s: float
    pool: str
    """The pool's name: a running allocator must have a pool of that name."""
    controls: Callable[[Simulator], None] | None = None
    """Schedules capacity changes and the like on a new simulator."""
    resizes: bool = False
    """``controls`` changes the pool's capacity (``set_capacity``)."""
    instances: int = 1
    """vLLM instances the capacity is split over."""
    routing: Routing | None = None
    """How the gateways choose an instance (``engine.Routing``; one gateway, round-robin,
    if None)."""

    def spec(self) -> PoolSpec:
        """The pool the fairshare run decides on."""
        return PoolSpec(
            name=self.pool,
            capacity=self.capacity,
            shares=self.shares,
            half_life_s=self.half_life_s,
            resizes=self.resizes,
        )


def run(
    setup: Setup,
    *,
    policy: Policy = Policy.PRIORITY,
    allocator: Callable[[Simulator], Allocator] | None = None,
    fairshare: AllocatorFactory | None = None,
) -> SimResult:
    """One run; ``allocator`` builds a custom allocator, else ``fairshare`` (the pool's).

    ``fairshare`` applies to PRIORITY runs only: the FCFS run keeps an in-process pool,
    only to know which requests would have been within share; vLLM ignores it.
    """
    sim = Simulator(
        capacity=setup.capacity,
        hardware=HARDWARE,
        allocator=FcfsAllocator(),
        policy=policy,
        horizon_s=setup.horizon_s,
        instances=setup.instances,
        routing=setup.routing,
    )
    if allocator is not None:
        sim.allocator = allocator(sim)
    else:
        make = fairshare if fairshare is not None and policy is Policy.PRIORITY else in_process
        sim.allocator = make(setup.spec(), sim)
    if setup.controls is not None:
        setup.controls(sim)
    start_all(sim, setup.sources, setup.seed)
    return sim.run()


def served_fractions(
    result: SimResult, teams: list[str], start_s: float, end_s: float = math.inf
) -> dict[str, float]:
    """Each team's part of the useful slot-seconds served in ``[start_s, end_s)``.

    The parts sum to 1, or are all 0 when nothing was served in the interval.
    """
    served = {team: result.served_s(team, start_s, end_s) for team in teams}
    total = math.fsum(served.values())
    return {team: (v / total if total > 0 else 0.0) for team, v in served.items()}


def preemption_figures(result: SimResult, teams: Iterable[str]) -> dict[str, float]:
    """Each team's preemptions, by standing (see ``SimResult``).

    Returns:
        ``preemptions_<team>`` (every victim), ``preemptions_<team>_within`` (victims
        granted within share) and ``within_preempted_beside_borrower`` (within-share
        victims while a borrower ran on their instance, every team together).
    """
    figures: dict[str, float] = {}
    for team in teams:
        figures[f"preemptions_{team}"] = result.preemptions.get(team, 0)
        figures[f"preemptions_{team}_within"] = result.within_preemptions.get(team, 0)
    figures["within_preempted_beside_borrower"] = sum(result.within_beside_borrower.values())
    return figures


BESIDE_BORROWER = "within-share requests preempted while a borrower ran on their instance"
"""The target every scenario on one pool checks (``never_beside_a_borrower``)."""


def never_beside_a_borrower(figures: Mapping[str, float]) -> Target:
    """No within-share request preempted while a borrower ran on its instance: the figure
    ``within_preempted_beside_borrower`` of ``preemption_figures`` is 0.

    A within-share request may still be preempted when only reserved requests run and
    they overflow the KV cache; no priority can prevent that.
    """
    return Target(BESIDE_BORROWER, figures["within_preempted_beside_borrower"], 0.0, at_most=True)


def kv_holds(result: SimResult, team: str | None = None) -> float:
    """How many requests like the run's (``team``'s only, if given) the pool's KV cache
    holds at once, at the capacity the run started with.

    A request's context grows from its prompt to prompt plus answer while it runs, so over
    its run it holds the blocks of its prompt and half its answer on average; weighted by
    service time (what the cache holds at a random moment), over the completed requests.
    NaN without completed requests or with an unlimited cache.
    """
    done = [r for r in result.completed() if team is None or r.team == team]
    busy = math.fsum(r.service_s for r in done)
    per_slot = HARDWARE.kv_blocks_per_slot
    if busy <= 0 or per_slot is None:
        return math.nan
    tokens = math.fsum(r.service_s * (r.prompt_tokens + r.output_tokens / 2) for r in done)
    return per_slot * result.capacity_log[0][1] * busy / (tokens / HARDWARE.block_tokens)
