"""What each team holds over a run: its requests in flight, of them the ones granted within
share, and of those the ones running, sampled at fixed simulated times.

``sample_holdings`` schedules the sampling on a simulator before it runs and returns the
``Holdings`` it fills as the run goes. A request is in flight from the moment it is sent
until it ends (waiting, running or preempted and waiting again); its standing is the one
the allocator gave it when it was sent.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from fairshare.sim.engine import Simulator


@dataclass
class Holdings:
    """Each team's requests in flight at the sampled times (one list entry per time).

    Attributes:
        every_s: simulated seconds between two samples.
        times: the sampled times.
        in_flight: team -> its requests in flight.
        within: team -> of those, the ones granted within share.
        within_running: team -> of those, the ones holding a slot.
        running: team -> its requests holding a slot, whatever their standing.
    """

    every_s: float
    times: list[float] = field(default_factory=list)
    in_flight: dict[str, list[int]] = field(default_factory=dict)
    within: dict[str, list[int]] = field(default_factory=dict)
    within_running: dict[str, list[int]] = field(default_factory=dict)
    running: dict[str, list[int]] = field(default_factory=dict)

    def _after(self, after_s: float) -> int:
        """The index of the first sample at or after ``after_s``."""
        return next((i for i, t in enumerate(self.times) if t >= after_s), len(self.times))

    def held_fraction(self, team: str, reserved: int, after_s: float = 0.0) -> float:
        """The fraction of the samples from ``after_s`` on at which ``team`` held exactly
        ``min(reserved, in flight)`` requests within share (NaN without samples)."""
        return self._fraction(self.within[team], team, reserved, after_s, exact=True)

    def running_fraction(self, team: str, reserved: int, after_s: float = 0.0) -> float:
        """The fraction of the samples from ``after_s`` on at which ``team`` had at least
        ``min(reserved, in flight)`` requests running, whatever their standing: its
        reservation's worth of slots in use (NaN without samples)."""
        return self._fraction(self.running[team], team, reserved, after_s, exact=False)

    def _fraction(
        self, series: list[int], team: str, reserved: int, after_s: float, *, exact: bool
    ) -> float:
        start = self._after(after_s)
        pairs = list(zip(series[start:], self.in_flight[team][start:], strict=True))
        if not pairs:
            return float("nan")
        due = [(x, min(reserved, n)) for x, n in pairs]
        met = sum(1 for x, m in due if (x == m if exact else x >= m))
        return met / len(pairs)

    def mean(self, series: dict[str, list[int]], team: str, after_s: float = 0.0) -> float:
        """The mean of one of the series above for ``team``, from ``after_s`` on (NaN
        without samples)."""
        values = series[team][self._after(after_s) :]
        return sum(values) / len(values) if values else float("nan")


def sample_holdings(
    sim: Simulator, teams: Iterable[str], every_s: float, start_s: float = 0.0
) -> Holdings:
    """Samples ``teams``' holdings on ``sim`` every ``every_s`` from ``start_s`` to the
    horizon; call it before ``sim.run``.

    A sample is taken between events, so it never sees a request that ended without the
    one its closed-loop source sends in its place (both happen in one event).

    Raises:
        ValueError: ``every_s`` is not > 0.
    """
    if not every_s > 0:
        raise ValueError(f"every_s must be > 0, got {every_s!r}")
    names = list(teams)
    holdings = Holdings(
        every_s,
        in_flight={team: [] for team in names},
        within={team: [] for team in names},
        within_running={team: [] for team in names},
        running={team: [] for team in names},
    )

    def sample() -> None:
        counts = {team: [0, 0, 0, 0] for team in names}
        for req in sim.in_flight():
            row = counts.get(req.team)
            if row is None:
                continue
            row[0] += 1
            running = 1 if req.start_s is not None else 0
            row[3] += running
            if not req.borrowing:
                row[1] += 1
                row[2] += running
        holdings.times.append(sim.now)
        for team, (n, within, within_running, running) in counts.items():
            holdings.in_flight[team].append(n)
            holdings.within[team].append(within)
            holdings.within_running[team].append(within_running)
            holdings.running[team].append(running)
        sim.at(sim.now + every_s, sample)

    sim.at(start_s, sample)
    return holdings
