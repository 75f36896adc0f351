"""The drills' ledger of every grant the simulated gateways obtain, the invariants checked
on it (docs/design.md §19), and the report of each drill.

The invariants:

1. one epoch decides at a time: no grant of epoch e is decided after the first grant of a
   later epoch was received (a grant's request must have been sent after that moment);
2. within-share grants in flight per team never exceed the team's reservation, counting
   every live grant of every epoch (the old owner's included);
3. every grant is released exactly once, and the usage the last owner holds matches the
   released consumption (decayed) within 1 %;
4. no replica logs a line containing ``BUG`` (checked by ``DrillCluster.finish``, which
   reads the replicas' logs).

The ledger records violations as text in ``Ledger.violations``; it raises nothing. It also
measures the longest gap with no non-degraded decision (``unavailability``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from drill_config import HALF_LIFE_S, POOLS, RESERVED


@dataclass
class GrantRecord:
    holder: str
    pool: str
    team: str
    grant_id: str
    epoch: int
    priority: int
    borrowing: bool
    degraded: bool
    sent_at: float
    issued_at: float
    released_at: float | None = None
    consumed: float = 0.0
    released_wall: float = 0.0
    abandoned: bool = False  # its gateway was killed while holding it
    release_lost: bool = False  # released, but its gateway died before sending it


@dataclass
class Ledger:
    grants: list[GrantRecord] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def live_within(self) -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for g in self.grants:
            if g.released_at is None and not g.borrowing and not g.degraded and not g.abandoned:
                key = (g.pool, g.team)
                counts[key] = counts.get(key, 0) + 1
        return counts

    def check_reservations(self) -> None:
        """Invariant 2 at this moment."""
        for (pool, team), n in self.live_within().items():
            self._check_reservation(pool, team, n)

    def enter(self, record: GrantRecord) -> None:
        """Adds a grant just answered; a within-share one is checked against its team's
        reservation at once (invariant 2 at the moment it can first break, which a poll
        may miss)."""
        self.grants.append(record)
        if record.borrowing or record.degraded:
            return
        n = sum(
            1
            for g in self.grants
            if g.pool == record.pool
            and g.team == record.team
            and g.released_at is None
            and not g.borrowing
            and not g.degraded
            and not g.abandoned
        )
        self._check_reservation(record.pool, record.team, n)

    def _check_reservation(self, pool: str, team: str, n: int) -> None:
        if n > RESERVED[pool].get(team, 0):
            self.violations.append(
                f"over-admission: {pool}/{team} has {n} within-share grants in flight, "
                f"reservation {RESERVED[pool].get(team, 0)}"
            )

    def check_epochs(self) -> None:
        """Invariant 1 over the whole ledger."""
        for pool in POOLS:
            grants = [g for g in self.grants if g.pool == pool and g.epoch > 0]
            first: dict[int, float] = {}
            for g in grants:
                first[g.epoch] = min(first.get(g.epoch, math.inf), g.issued_at)
            for g in grants:
                for epoch, at in first.items():
                    if epoch > g.epoch and g.sent_at > at:
                        self.violations.append(
                            f"two epochs decided: {pool} grant of epoch {g.epoch} requested "
                            f"{g.sent_at - at:.3f}s after the first grant of epoch {epoch}"
                        )
                        break

    def check_released_once(self) -> None:
        ids = [g.grant_id for g in self.grants]
        if len(ids) != len(set(ids)):
            self.violations.append("a grant id was issued twice")
        for g in self.grants:
            if g.released_at is None and not g.abandoned:
                self.violations.append(f"grant {g.grant_id} was never released")

    def expected_usage(self, now_wall: float) -> dict[tuple[str, str], float]:
        lam = math.log(2) / HALF_LIFE_S
        usage: dict[tuple[str, str], float] = {}
        for g in self.grants:
            if g.released_at is not None and g.consumed > 0 and not g.release_lost:
                key = (g.pool, g.team)
                decayed = g.consumed * math.exp(-lam * max(0.0, now_wall - g.released_wall))
                usage[key] = usage.get(key, 0.0) + decayed
        return usage

    def unavailability(self, start: float, end: float) -> float:
        """The longest gap in [start, end] with no non-degraded decision in some pool."""
        worst = 0.0
        for pool in POOLS:
            times = sorted(
                g.issued_at
                for g in self.grants
                if g.pool == pool and not g.degraded and start <= g.issued_at <= end
            )
            edges = [start, *times, end]
            worst = max(worst, *(b - a for a, b in itertools.pairwise(edges)))
        return worst


@dataclass
class DrillResult:
    name: str
    unavailability_s: float
    degraded: int
    phantoms_zero_s: float | None
    over_admissions: int
    usage_error: float
    grants: int
    violations: list[str]
    transitions: int = 0

    def row(self) -> str:
        phantoms = "n/a" if self.phantoms_zero_s is None else f"{self.phantoms_zero_s:.2f}"
        return (
            f"| {self.name} | {self.grants} | {self.unavailability_s:.2f} | {self.degraded} | "
            f"{phantoms} | {self.transitions} | {self.over_admissions} | "
            f"{self.usage_error * 100:.2f} % | "
            f"{'none' if not self.violations else len(self.violations)} |"
        )


REPORT_HEADER = (
    "| drill | grants | unavailability (s) | degraded | phantoms to 0 (s) | transitions "
    "| over-admissions | usage error | violations |\n|---|---|---|---|---|---|---|---|---|"
)


def iter_rows(results: list[DrillResult]) -> Iterator[str]:
    yield REPORT_HEADER
    for r in results:
        yield r.row()


def write_report(results: list[DrillResult], path: Path) -> str:
    text = "# Failover drills\n\n" + "\n".join(iter_rows(results)) + "\n"
    for r in results:
        for v in r.violations:
            text += f"\n- {r.name}: {v}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n", encoding="utf-8")
    return text
