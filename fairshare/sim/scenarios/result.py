"""What a scenario returns: its runs, its figures and the targets checked against them.

``ScenarioResult.figures`` is a flat name -> value dict that the tests and the report read;
``Target`` pairs one figure with the bound it must meet; ``Comparison`` sets a figure of
the shipped run beside the same figure of a variant it replaced, which is printed and not
checked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from fairshare.sim.holdings import Holdings
from fairshare.sim.results import SimResult


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(frozen=True)
class Target:
    """A figure and the bound it must meet."""

    text: str
    """What is promised, in words."""
    value: float
    bound: float
    at_most: bool
    """True: ``value <= bound``; False: ``value >= bound``."""
    unit: str = ""

    @property
    def met(self) -> bool:
        """Whether the figure meets the bound (NaN never does)."""
        if math.isnan(self.value):
            return False
        return self.value <= self.bound if self.at_most else self.value >= self.bound


@dataclass(frozen=True)
class Comparison:
    """A figure of the run the scenario checks beside the same figure of another variant.

    Printed with the targets (report and command line) so the reason for the shipped
    behaviour stays visible; never checked: the other variant is known to miss.
    """

    text: str
    """What the figure is, in words."""
    value: float
    """The shipped variant's figure (the one the targets check)."""
    other: float
    """The same figure for the variant compared."""
    unit: str = ""


@dataclass
class ScenarioResult:
    """What a scenario produced.

    Attributes:
        name: the scenario's command-line name.
        title: a heading.
        description: markdown: the set-up, in words.
        shares: team -> share.
        runs: label -> run; the first is the fairshare run, the second the comparison.
        figures: name -> value; what the targets and the tests check.
        targets: the promises and whether they are met.
        marks: (time, label) events drawn on time axes.
        window: an interval shaded on time axes (the failover window), if any.
        wait_series: plot within-share waits against arrival time (failover).
        series: waits drawn as distributions, one per label (see the field).
        compared: the label of the variant that ``comparisons`` set beside the checked run.
        comparisons: figures of the checked run beside the same of ``compared``.
        holdings: label -> each team's requests in flight and within share over time
            (see the field).
        sweep: the runs of a parameter swept (see the field).
    """

    name: str
    title: str
    description: str
    shares: dict[str, float]
    runs: dict[str, SimResult]
    figures: dict[str, float]
    targets: list[Target]
    marks: list[tuple[float, str]] = field(default_factory=list)
    window: tuple[float, float] | None = None
    wait_series: bool = False
    notes: str = ""
    """markdown: what the figures show, beyond the targets."""
    series: dict[str, list[float]] = field(default_factory=dict)
    """label -> waits (seconds) drawn as one distribution each (multi-instance: small's
    within-share waits under each router); empty for the other scenarios."""
    compared: str = ""
    comparisons: list[Comparison] = field(default_factory=list)
    holdings: dict[str, Holdings] = field(default_factory=dict)
    """label -> the samples of what each team held (sustained-overload: the current rule
    and the rule before); drawn per team, with its reservation when the figures hold
    ``reserved_<team>``; empty for the other scenarios."""
    sweep: list[tuple[float, str]] = field(default_factory=list)
    """(value, prefix) of each run of a swept parameter, whose figures are named with the
    prefix (instant-start: the arriving team's lend fraction, ``lend75_``, beside the run
    without a lending limit, ``unlimited_``); empty for the other scenarios."""

    @property
    def ok(self) -> bool:
        """Every target met."""
        return all(t.met for t in self.targets)
