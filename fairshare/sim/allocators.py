"""The allocator side of a run: what the simulated gateway asks before and after vLLM.

- ``Allocator``: the protocol the scheduler calls (``admit``, ``release``,
  ``set_capacity``).
- ``FcfsAllocator``: no allocator, every priority equal (the FCFS comparison).
- ``PoolAllocator`` and ``in_process``: priorities from a ``fairshare.Pool`` whose clock
  is the simulated time (the default fairshare side).
- ``InFlightRuleAllocator`` and ``in_flight_rule``: the same pool with the standing rule
  it had before (every request in flight used up the reservation), simulator-only, kept
  to show what that rule did under sustained load.
- ``PoolSpec`` and ``AllocatorFactory``: how a scenario describes its pool and builds
  the fairshare side for a new simulator (``remote`` builds one over gRPC instead).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from fairshare import Pool, borrowing_priority, within_share_priority
from fairshare.sim.model import Request

if TYPE_CHECKING:
    from fairshare.sim.engine import Simulator


class Allocator(Protocol):
    """What the gateway asks when it sends a request to vLLM and when the request ends."""

    def admit(self, req: Request) -> None:
        """Decides the request's priority (and standing) when it is sent."""

    def release(self, req: Request, cost: float) -> None:
        """Reports the end of the request and its cost."""

    def set_capacity(self, capacity: int) -> None:
        """The pool's concurrency changed."""


class FcfsAllocator:
    """No allocator: every request has priority 0, so vLLM serves them in arrival order."""

    def admit(self, req: Request) -> None:
        req.priority = 0

    def release(self, req: Request, cost: float) -> None:
        pass

    def set_capacity(self, capacity: int) -> None:
        pass


class PoolAllocator:
    """Priorities from one ``fairshare.Pool`` whose clock is the simulated time."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool

    def admit(self, req: Request) -> None:
        grant = self.pool.acquire(req.team, req.cls, req.est_tokens)
        req.grant = grant
        req.priority = grant.priority
        req.borrowing = grant.borrowing

    def release(self, req: Request, cost: float) -> None:
        if req.grant is not None:
            req.grant.release(cost)

    def set_capacity(self, capacity: int) -> None:
        self.pool.set_capacity(capacity)


class InFlightRuleAllocator(PoolAllocator):
    """The standing rule the pool had before the within-share count (docs/spec.md §4).

    A request was within share iff the team's in-flight count before it (its grants and
    live phantoms, borrowers included) was below its reservation. Under sustained load
    that rule erodes a busy team's reservation to nothing: each within-share request that
    ends is replaced by a borrower, since the team still has its reservation or more in
    flight. Kept in the simulator only, to show that (``sustained-overload`` and the
    comparisons of the other scenarios); ``fairshare`` has only the current rule.

    The standing and priority come from the pool's snapshot (the team's reservation,
    in-flight count, phantoms and rank, as the pool's own decision reads them); the
    request is then counted with ``Pool.adopt``, so releases, usage and ranks are the
    pool's. A team the pool does not know has no reservation: both rules borrow, and the
    pool decides.
    """

    def admit(self, req: Request) -> None:
        stat = next((s for s in self.pool.snapshot() if s.team == req.team), None)
        if stat is None:
            super().admit(req)
            return
        borrowing = stat.in_flight + stat.phantoms >= stat.reserved
        if borrowing:
            priority = borrowing_priority(stat.rank, req.cls)
        else:
            priority = within_share_priority(req.cls)
        req.grant = self.pool.adopt(req.team, priority, borrowing, req.est_tokens)
        req.priority = priority
        req.borrowing = borrowing


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """The pool a scenario's fairshare run decides on.

    Attributes:
        name: the pool's name (a running allocator must have a pool of that name).
        capacity: C at the start of the run.
        shares: team -> share.
        half_life_s: the usage half-life, in simulated seconds (in-process only: a
            running allocator uses the half-life of its own configuration).
        resizes: the scenario changes the pool's capacity mid-run (``set_capacity``).
        lend: team -> the fraction of its idle reserved slots it lends (docs/spec.md
            §17); teams missing here lend 1.0. The gateway the simulator models does not
            wait for a lent slot, so the lending limit changes no decision of its pool.
    """

    name: str
    capacity: int
    shares: Mapping[str, float]
    half_life_s: float
    resizes: bool = False
    lend: Mapping[str, float] = field(default_factory=dict)


AllocatorFactory = Callable[[PoolSpec, "Simulator"], Allocator]
"""Builds the allocator of a scenario's fairshare run for a new simulator."""


class SetupError(Exception):
    """A scenario cannot run with the allocator it was given; the message says why."""


def in_process(spec: PoolSpec, sim: Simulator) -> PoolAllocator:
    """The default fairshare side: a ``fairshare.Pool`` whose clock is the simulated time."""
    pool = Pool(
        spec.name,
        spec.capacity,
        spec.shares,
        half_life_s=spec.half_life_s,
        clock=lambda: sim.now,
        lend=spec.lend,
    )
    return PoolAllocator(pool)


def in_flight_rule(spec: PoolSpec, sim: Simulator) -> InFlightRuleAllocator:
    """``in_process``'s pool with the standing rule it had before (``InFlightRuleAllocator``)."""
    return InFlightRuleAllocator(in_process(spec, sim).pool)
