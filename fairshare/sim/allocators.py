"""The allocator side of a run: what the simulated gateway asks before and after vLLM.

- ``Allocator``: the protocol the scheduler calls (``admit``, ``release``,
  ``set_capacity``).
- ``FcfsAllocator``: no allocator, every priority equal (the FCFS comparison).
- ``PoolAllocator`` and ``in_process``: priorities from a ``fairshare.Pool`` whose clock
  is the simulated time (the default fairshare side).
- ``LendingAllocator`` and ``lending``: the same pool with a lending limit; a borrower
  that no team lends a slot to is held at the gateway (``fairshare.holding.HeldQueue``)
  and sent on when a slot is lent, or when its wait ends.
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

from fairshare import Grant, Pool, borrowing_priority, within_share_priority
from fairshare.holding import HeldQueue
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
        _granted(req, self.pool.acquire(req.team, req.cls, req.est_tokens))

    def release(self, req: Request, cost: float) -> None:
        if req.grant is not None:
            req.grant.release(cost)

    def set_capacity(self, capacity: int) -> None:
        self.pool.set_capacity(capacity)


def _granted(req: Request, grant: Grant) -> None:
    """The request carries ``grant``'s standing and priority."""
    req.grant = grant
    req.priority = grant.priority
    req.borrowing = grant.borrowing


HOLD_WAIT_S = 600.0
"""How long a held borrower waits for a lent slot before it borrows anyway, in simulated
seconds: long beside the runs of the scenarios' requests, so a wait ends only when no
slot is lent for minutes."""
HOLD_LIMIT = 100_000
"""The most borrowers held at once: more than any scenario's clients keep outstanding."""


class LendingAllocator(PoolAllocator):
    """The pool's lending limit, applied at the gateway as the service applies it.

    Each request is decided by ``Pool.acquire_lent``. A within-share request is always
    granted and sent at once. A borrower that no team lends a slot to (refused) is held
    in a ``fairshare.holding.HeldQueue`` instead of going to vLLM, where it would take a
    slot a team keeps back: ``Request.held`` is set, with the priority it would have now
    (its place in the queue). Whenever a request ends (a slot may be lent again) or the
    capacity changes, the queue admits what the pool now lets in, each with the grant
    decided then, and the simulator sends it on (``Simulator.dispatch``). A borrower
    still held ``wait_s`` after it arrived borrows anyway (``on_wait_end: borrow``):
    ``acquire`` grants it and it is sent on; so does one that finds the queue full.

    The queue admits at the release, before the request a closed-loop client sends in
    place of the one that ended at the same instant (the service hears the Release
    before that request's Acquire), so a borrower of another team may take the slot a
    team's within-share request just left, and the team's next within-share request
    takes another free slot or waits in vLLM (a held request of the team itself is
    within share again when admitted, and takes the slot). With every team lending 1.0
    a borrower is held exactly while the pool has C or more in flight: otherwise what
    vLLM's own queue would do with it, except that its priority is decided when it is
    sent, not when it arrived.
    """

    def __init__(
        self,
        pool: Pool,
        sim: Simulator,
        *,
        wait_s: float = HOLD_WAIT_S,
        limit: int = HOLD_LIMIT,
    ) -> None:
        super().__init__(pool)
        self._sim = sim
        self.wait_s = wait_s
        self.held: HeldQueue[Request] = HeldQueue(limit)
        self.waits_ended = 0
        """Held borrowers whose wait ended: they borrowed anyway."""

    def admit(self, req: Request) -> None:
        grant = self.pool.acquire_lent(req.team, req.cls, req.est_tokens)
        if grant is not None:
            _granted(req, grant)
            return
        priority = self.pool.priority_next(req.team, req.cls)
        deadline = self._sim.now + self.wait_s
        if not self.held.push(
            req,
            req.team,
            cls=req.cls,
            est_tokens=req.est_tokens,
            priority=priority,
            deadline=deadline,
        ):
            self.waits_ended += 1  # no room to hold it: its wait ends now
            _granted(req, self.pool.acquire(req.team, req.cls, req.est_tokens))
            return
        req.held = True
        req.priority = priority
        req.borrowing = True
        self._sim.at(deadline, self._end_waits)

    def release(self, req: Request, cost: float) -> None:
        super().release(req, cost)
        self._send_admitted()

    def set_capacity(self, capacity: int) -> None:
        super().set_capacity(capacity)
        self._send_admitted()

    def _send_admitted(self) -> None:
        for req, grant in self.held.admit(self.pool):
            _granted(req, grant)
            self._sim.dispatch(req)

    def _end_waits(self) -> None:
        for req in self.held.expired(self._sim.now):
            self.waits_ended += 1
            _granted(req, self.pool.acquire(req.team, req.cls, req.est_tokens))
            self._sim.dispatch(req)


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


def lending(
    lend: Mapping[str, float], *, wait_s: float = HOLD_WAIT_S
) -> Callable[[PoolSpec, Simulator], LendingAllocator]:
    """``in_process``'s pool with the lending limit ``lend`` (team -> fraction of its idle
    reserved slots it lends, ``Pool(lend=...)``), its refused borrowers held at the
    gateway for up to ``wait_s`` (``LendingAllocator``)."""

    def make(spec: PoolSpec, sim: Simulator) -> LendingAllocator:
        pool = in_process(spec, sim).pool
        pool.set_lend(lend)
        return LendingAllocator(pool, sim, wait_s=wait_s)

    return make


def in_flight_rule(spec: PoolSpec, sim: Simulator) -> InFlightRuleAllocator:
    """``in_process``'s pool with the standing rule it had before (``InFlightRuleAllocator``)."""
    return InFlightRuleAllocator(in_process(spec, sim).pool)
