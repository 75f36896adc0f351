"""What a run recorded (``SimResult``) and the questions the scenarios ask of it.

Times are simulated seconds. A ``Run`` is one interval a request held a slot; a request
preempted and restarted has several, and only the last can be ``completed``. A preempted
run's work is kept (vLLM keeps the tokens generated; the request re-prefills them when it
resumes), so every run counts as service.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from fairshare.sim.model import Request


@dataclass(frozen=True, slots=True)
class Run:
    """One interval during which a request held a slot."""

    team: str
    start_s: float
    end_s: float
    completed: bool
    """False when the run ended in a preemption (its tokens are kept for the resume)."""


@dataclass
class SimResult:
    """Everything a run recorded.

    Preemptions are counted per team: ``preemptions`` every one; ``within_preemptions``
    those whose victim had been granted within share; ``within_beside_borrower`` those
    whose within-share victim was preempted while a borrower ran on the same instance.
    Under vLLM's priority policy the last is 0 whenever every borrower's priority is
    above every within-share one (the victim is the largest priority); a within-share
    request is preempted only when the requests of reservations alone overflow the
    instance's KV cache. In FCFS runs the standing is the pool's record, which vLLM
    ignores.
    """

    horizon_s: float
    requests: list[Request]
    runs: list[Run]
    capacity_log: list[tuple[float, int]]
    preemptions: dict[str, int] = field(default_factory=dict)
    within_preemptions: dict[str, int] = field(default_factory=dict)
    within_beside_borrower: dict[str, int] = field(default_factory=dict)

    def completed(self) -> list[Request]:
        """Requests that finished before the horizon."""
        return [r for r in self.requests if r.finish_s is not None]

    def mean_service_s(self) -> float:
        """Mean service time of the completed requests, in seconds."""
        done = self.completed()
        return math.fsum(r.service_s for r in done) / len(done) if done else 0.0

    def waits(
        self,
        team: str | None = None,
        *,
        within_share: bool | None = None,
        arrived: tuple[float, float] = (0.0, math.inf),
        exclude: tuple[float, float] | None = None,
    ) -> list[float]:
        """Queueing delays (arrival to first start, seconds) of the selected requests.

        Requests still waiting at the horizon count with their wait so far.

        Args:
            team: only this team's requests (all teams if None).
            within_share: only within-share (True) or only borrowing or degraded (False).
            arrived: only requests that arrived in ``[from, to)``.
            exclude: leave out requests that arrived in ``[from, to)``.
        """
        out = []
        for r in self.requests:
            if team is not None and r.team != team:
                continue
            if within_share is not None and within_share != (not r.borrowing):
                continue
            if not arrived[0] <= r.arrival_s < arrived[1]:
                continue
            if exclude is not None and exclude[0] <= r.arrival_s < exclude[1]:
                continue
            out.append(r.wait_s(self.horizon_s))
        return out

    def served_s(self, team: str, start_s: float = 0.0, end_s: float = math.inf) -> float:
        """Slot-seconds of ``team``'s runs inside ``[start, end)`` (the re-prefill of a
        resumed request included)."""
        total = 0.0
        for run in self.runs:
            if run.team == team:
                total += max(0.0, min(run.end_s, end_s) - max(run.start_s, start_s))
        return total

    def served_series(
        self, teams: Sequence[str], bin_s: float
    ) -> tuple[list[float], dict[str, list[float]]]:
        """Slot-seconds served per team in consecutive bins of ``bin_s`` seconds.

        Returns:
            the bins' middle times and, per team, the slot-seconds served in each bin.
        """
        n = max(1, math.ceil(self.horizon_s / bin_s))
        series = {team: [0.0] * n for team in teams}
        for run in self.runs:
            if run.team not in series:
                continue
            row = series[run.team]
            t = run.start_s
            while t < run.end_s:
                i = min(n - 1, int(t // bin_s))
                edge = min(run.end_s, (i + 1) * bin_s)
                if edge <= t:  # the last bin, past the horizon
                    row[i] += run.end_s - t
                    break
                row[i] += edge - t
                t = edge
        mids = [(i + 0.5) * bin_s for i in range(n)]
        return mids, series
