"""The standing rule the pool had before the within-share count, run beside a scenario's
checked run to show what the change moved.

Before, a request was within share iff its team's requests in flight (borrowers included)
were fewer than its reservation; now only its within-share requests count (docs/spec.md
§4). ``allocators.in_flight_rule`` keeps the rule before in the simulator only. A scenario
runs its workload under it (``run_before``), names that run's figures with ``SUFFIX``
(``suffixed``) and prints them beside its own as ``Comparison`` rows (``beside``), not
checked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fairshare.sim.allocators import in_flight_rule
from fairshare.sim.results import SimResult
from fairshare.sim.scenarios.result import Comparison
from fairshare.sim.scenarios.runs import Setup, run

LABEL = "fairshare, rule before (every request in flight counts)"
"""How reports and plots name a run under the rule before."""
SUFFIX = "_before"
"""Ends the name of every figure of the run under the rule before."""


def run_before(setup: Setup) -> SimResult:
    """The scenario's workload under the rule before, in-process."""
    return run(setup, fairshare=in_flight_rule)


def suffixed(figures: Mapping[str, float], suffix: str = SUFFIX) -> dict[str, float]:
    """``figures`` with ``suffix`` appended to every name."""
    return {f"{name}{suffix}": value for name, value in figures.items()}


def beside(figures: Mapping[str, float], rows: Sequence[tuple[str, str, str]]) -> list[Comparison]:
    """One comparison per ``(text, figure name, unit)`` row: the figure of the checked run
    beside the same figure of the run under the rule before (its name plus ``SUFFIX``)."""
    return [
        Comparison(text, figures[name], figures[f"{name}{SUFFIX}"], unit)
        for text, name, unit in rows
    ]
