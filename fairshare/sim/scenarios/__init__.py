"""The scenarios of the simulation report, each with its figures and targets.

Every scenario runs the same workload (same seed, same open-loop arrivals and request
sizes) under fairshare priorities and under a comparison (FCFS, or the same run without
a failover), and returns a ``ScenarioResult``: the runs, a flat ``figures`` dict that
tests and the report read, and the targets checked against those figures.

``scale`` shortens the horizon (tests use 0.2-0.3); the report uses 1.0.

``fairshare`` builds the allocator of the fairshare run (``allocators.AllocatorFactory``);
None, the default, is the in-process ``fairshare.Pool`` on simulated time. ``runs.run`` is
the one place that applies it; the comparison runs (FCFS) always stay in-process. The
failover scenario builds its own owners and refuses any other fairshare side.

- ``result``: ``ScenarioResult``, ``Target``, ``Comparison`` and ``percentile``.
- ``runs``: the shared hardware model, a scenario's set-up and one run of it.
- ``shared_pool``: two institutions, three teams (steady sharing against FCFS).
- ``resize``: an elastic pool (shrink, then grow).
- ``owner_crash``: an owner failover mid-run (in-process only).
- ``many_instances``: pools of k vLLM instances behind three gateways, every router
  (in-process only).
- ``overload``: three teams above their reservations for a long run, under the current
  standing rule and the rule before it.
- ``lending``: a team's lending limit swept under another team's flood (in-process only).

This module is the registry: ``SCENARIOS`` maps each command-line name to its function.
"""

from __future__ import annotations

from collections.abc import Callable

from fairshare.sim.scenarios.lending import instant_start
from fairshare.sim.scenarios.many_instances import multi_instance
from fairshare.sim.scenarios.overload import sustained_overload
from fairshare.sim.scenarios.owner_crash import failover
from fairshare.sim.scenarios.resize import elastic
from fairshare.sim.scenarios.result import Comparison, ScenarioResult, Target
from fairshare.sim.scenarios.shared_pool import three_teams, two_institutions

__all__ = [
    "SCENARIOS",
    "Comparison",
    "ScenarioResult",
    "Target",
    "elastic",
    "failover",
    "instant_start",
    "multi_instance",
    "sustained_overload",
    "three_teams",
    "two_institutions",
]

SCENARIOS: dict[str, Callable[..., ScenarioResult]] = {
    "two-institutions": two_institutions,
    "three-teams": three_teams,
    "elastic": elastic,
    "failover": failover,
    "multi-instance": multi_instance,
    "sustained-overload": sustained_overload,
    "instant-start": instant_start,
}
"""Command-line name -> scenario function (keyword arguments ``seed``, ``scale`` and
``fairshare``)."""
