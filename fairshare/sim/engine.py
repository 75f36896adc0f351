"""A discrete-event model of a pool of vLLM instances behind gateways, fed by an allocator.

A request is sent by one of the pool's gateways: the allocator decides its priority
(``allocators``) or holds it back at the gateway and sends it on later (``dispatch``: a
borrower under a lending limit), the gateway's router (``fairshare.routing``) chooses the
instance, and the instance's scheduler (``instance.Instance``: vLLM v1's rules, and where
they were read) queues it. A pool of C slots on k instances gives each instance C / k of
them (``max_num_seqs``) and ``kv_blocks_per_slot`` KV blocks per slot. With one instance
(the default) there is nothing to route and the model is one vLLM scheduler with C slots.

Each gateway routes with what it knows (``Routing``): the requests it sent itself that have
not ended, by priority, or with ``allocator_view`` the same tally over every gateway (what
the allocator could tell a gateway if each ``Acquire`` named its instance). Which gateway
sends a request is drawn at random, as a load balancer in front of the gateways would.

A request's service time is its prefill plus one decode step per output token; the
decode step does not depend on the batch (C is the sustainable concurrency, so the batch
is what the pool is sized for). Time is simulated: the allocator's clock is ``now``.
FCFS mode is vLLM's ``fcfs`` policy: every priority is 0.

Not modelled: network latency between gateways, instances and the allocator (a gateway's
view is exact and current), instances that fail, and what ``instance`` lists.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass

from fairshare import Class
from fairshare.routing import Outstanding, Router, make_router
from fairshare.sim.allocators import Allocator
from fairshare.sim.instance import Instance
from fairshare.sim.model import Hardware, Policy, Request
from fairshare.sim.results import Run, SimResult

# Event kinds, in the order they are processed at equal times (then by sequence number):
# everything sent at an instant is queued before an instance's step at that instant runs.
_CALL = 0
_STEP = 1


@dataclass(frozen=True, slots=True)
class Routing:
    """How the gateways in front of a pool's instances choose one.

    Attributes:
        router: a name of ``fairshare.routing.ROUTERS``.
        gateways: gateway replicas, each with its own router and its own view.
        allocator_view: every gateway sees the requests all gateways sent (the allocator's
            tally) instead of its own.
        seed: seeds the routers' and the gateway draw's randomness.
    """

    router: str = "round-robin"
    gateways: int = 1
    allocator_view: bool = False
    seed: int = 0


class _Gateway:
    def __init__(self, router: Router, view: Outstanding) -> None:
        self.router = router
        self.view = view


class Simulator:
    """A pool of vLLM instances with C slots in all and their KV budgets, in simulated time.

    Sources of requests call ``send``; ``at`` schedules a callback (workload arrivals,
    capacity changes, failovers). ``run`` processes events until the horizon.
    """

    def __init__(
        self,
        *,
        capacity: int,
        hardware: Hardware,
        allocator: Allocator,
        policy: Policy = Policy.PRIORITY,
        horizon_s: float,
        instances: int = 1,
        routing: Routing | None = None,
    ) -> None:
        if instances < 1:
            raise ValueError(f"a pool needs at least one instance, got {instances}")
        if routing is not None and routing.gateways < 1:
            raise ValueError(f"a pool needs at least one gateway, got {routing.gateways}")
        self.now = 0.0
        self.capacity = capacity
        self.hardware = hardware
        self.allocator = allocator
        self.policy = policy
        self.horizon_s = horizon_s
        self.instances = [
            Instance(i, slots, self) for i, slots in enumerate(_split(capacity, instances))
        ]
        routing = routing or Routing()
        self.routing = routing
        shared = Outstanding(instances)
        self._gateways = [
            _Gateway(
                make_router(
                    routing.router,
                    rng=random.Random(f"{routing.seed}:router:{g}"),
                    start=g * instances // routing.gateways,
                ),
                shared if routing.allocator_view else Outstanding(instances),
            )
            for g in range(routing.gateways)
        ]
        self._everyone = shared  # the allocator's tally, kept in every mode
        self._pick_gateway = random.Random(f"{routing.seed}:gateways")
        self._events: list[tuple[float, int, int, object, int]] = []  # time, kind, seq
        self._seq = itertools.count()
        self._rid = itertools.count()
        self._requests: list[Request] = []
        self._runs: list[Run] = []
        self._preemptions: dict[str, int] = {}
        self._within_preemptions: dict[str, int] = {}
        self._within_beside_borrower: dict[str, int] = {}
        self._capacity_log: list[tuple[float, int]] = [(0.0, capacity)]

    # -- what sources and scenarios call ------------------------------------------

    @property
    def kv_blocks(self) -> int | None:
        """The pool's KV budget in blocks, all instances together (None: unlimited)."""
        per_slot = self.hardware.kv_blocks_per_slot
        return None if per_slot is None else per_slot * self.capacity

    def at(self, time_s: float, fn: Callable[[], None]) -> None:
        """Calls ``fn`` at simulated time ``time_s`` (ignored past the horizon)."""
        if time_s <= self.horizon_s:
            heapq.heappush(self._events, (time_s, _CALL, next(self._seq), fn, 0))

    def send(
        self,
        team: str,
        cls: Class,
        prompt_tokens: int,
        output_tokens: int,
        on_done: Callable[[Request], None] | None = None,
    ) -> Request:
        """A gateway sends a request now: the allocator decides, the router picks, vLLM
        queues it."""
        req = Request(
            rid=next(self._rid),
            team=team,
            cls=cls,
            arrival_s=self.now,
            queued_s=self.now,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            service_s=self.hardware.service_s(prompt_tokens, output_tokens),
            on_done=on_done,
        )
        req.gateway = self._pick_gateway.randrange(len(self._gateways))
        self._requests.append(req)
        self._decide_and_route(req)
        return req

    def dispatch(self, req: Request) -> None:
        """The allocator sends on a request it held (``Request.held``), with the priority
        it has just set: the gateway routes it now and vLLM queues it as a new arrival.
        Its wait counts from ``arrival_s``, the time spent held included.

        Raises:
            ValueError: ``req`` is not held.
        """
        if not req.held:
            raise ValueError(f"request {req.rid} is not held: it was sent already")
        req.held = False
        req.held_s = self.now - req.queued_s
        req.queued_s = self.now
        self._route(req)

    def resend(self, req: Request) -> bool:
        """The gateway aborts a request still waiting in vLLM and sends it again now.

        The allocator decides it afresh, the gateway routes it afresh, and vLLM queues it as
        a new arrival. The request's ``arrival_s`` (when the client sent it) is kept, so its
        wait counts from there.

        Returns:
            False if the request is not waiting (running or finished): nothing done.
        """
        if not self.instances[req.instance].withdraw(req):
            return False
        self._untrack(req)
        if req.grant is not None:  # nothing ran: the old grant ends with no cost
            req.grant.release(0.0)
            req.grant = None
        req.degraded = False
        req.queued_s = self.now
        self._decide_and_route(req)
        return True

    def set_capacity(self, capacity: int) -> None:
        """The pool grows or shrinks now (slots added or drained on its instances).

        Requests over an instance's new slots or KV budget are preempted, largest
        ``(priority, arrival)`` first, as vLLM would when an instance drains.
        """
        split = _split(capacity, len(self.instances))  # refused before anything changes
        self.capacity = capacity
        self.allocator.set_capacity(capacity)
        self._capacity_log.append((self.now, capacity))
        for inst, slots in zip(self.instances, split, strict=True):
            inst.resize(slots)

    def in_flight(self) -> list[Request]:
        """Requests sent and not finished (waiting or running), in arrival order."""
        reqs = [r for inst in self.instances for r in (*inst.waiting(), *inst.running.values())]
        return sorted(reqs, key=lambda r: r.rid)

    def running(self) -> list[Request]:
        """Requests holding a slot."""
        return [r for inst in self.instances for r in inst.running.values()]

    def run(self) -> SimResult:
        """Processes events up to the horizon and returns what was recorded."""
        events = self._events
        while events:
            time_s, kind, _, obj, token = heapq.heappop(events)
            if time_s > self.horizon_s:
                break
            self.now = time_s
            if kind == _CALL:
                obj()  # type: ignore[operator]
            else:
                inst: Instance = obj  # type: ignore[assignment]
                inst.step(token)
        self.now = self.horizon_s
        for req in self.running():  # cut the runs in progress at the horizon
            assert req.start_s is not None
            self._runs.append(Run(req.team, req.start_s, self.horizon_s, completed=True))
        return SimResult(
            horizon_s=self.horizon_s,
            requests=self._requests,
            runs=self._runs,
            capacity_log=self._capacity_log,
            preemptions=dict(self._preemptions),
            within_preemptions=dict(self._within_preemptions),
            within_beside_borrower=dict(self._within_beside_borrower),
        )

    # -- what the instances call ----------------------------------------------------

    def schedule_step(self, time_s: float, inst: Instance, token: int) -> None:
        """``inst`` runs a step at ``time_s`` unless it schedules another one first
        (``token`` tells which)."""
        heapq.heappush(self._events, (time_s, _STEP, next(self._seq), inst, token))

    def started(self, req: Request) -> None:
        """``req`` was admitted now (first start or resume); nothing is recorded here (a
        replay that logs every step overrides it)."""

    def preempted(self, req: Request) -> None:
        """Records that ``req``'s run (started at ``req.start_s``) was preempted now.

        Called once ``req`` has left its instance's running requests; counted by standing
        (``SimResult``): a within-share victim, and whether a borrower still runs beside
        it on that instance.
        """
        assert req.start_s is not None
        team = req.team
        self._preemptions[team] = self._preemptions.get(team, 0) + 1
        if not req.borrowing:
            self._within_preemptions[team] = self._within_preemptions.get(team, 0) + 1
            if any(r.borrowing for r in self.instances[req.instance].running.values()):
                beside = self._within_beside_borrower
                beside[team] = beside.get(team, 0) + 1
        self._runs.append(Run(team, req.start_s, self.now, completed=False))

    def refused(self, req: Request) -> None:
        """``req`` can never fit its instance's KV cache: vLLM refuses it now. The gateway
        and the allocator hear of it (no cost); its client sends nothing in its place."""
        req.refused = True
        self._untrack(req)
        self.allocator.release(req, 0.0)

    def finished(self, req: Request) -> None:
        """``req`` finished now: the allocator and the gateway hear of it."""
        assert req.start_s is not None
        req.finish_s = self.now
        self._runs.append(Run(req.team, req.start_s, self.now, completed=True))
        self._untrack(req)
        # Cost charged at release: the GPU-seconds (slot-seconds) of an unpreempted run.
        self.allocator.release(req, req.service_s)
        if req.on_done is not None:
            req.on_done(req)

    # -- the gateways -----------------------------------------------------------------

    def _decide_and_route(self, req: Request) -> None:
        self.allocator.admit(req)
        if not req.held:  # else the allocator sends it on later (``dispatch``)
            self._route(req)

    def _route(self, req: Request) -> None:
        if self.policy is Policy.FCFS:
            req.priority = 0
        gateway = self._gateways[req.gateway]
        instance = gateway.router.choose(req.priority, gateway.view)
        assert instance is not None  # nothing is excluded
        req.routed_priority = req.priority
        gateway.view.sent(instance, req.priority)
        if gateway.view is not self._everyone:
            self._everyone.sent(instance, req.priority)
        self.instances[instance].enqueue(req)

    def _untrack(self, req: Request) -> None:
        gateway = self._gateways[req.gateway]
        gateway.view.ended(req.instance, req.routed_priority)
        if gateway.view is not self._everyone:
            self._everyone.ended(req.instance, req.routed_priority)


def _split(capacity: int, instances: int) -> list[int]:
    """C slots over the instances, as evenly as possible (the first get the remainder).

    Raises:
        ValueError: several instances and fewer slots than instances: one would have none
            and the requests routed to it would wait for ever.
    """
    if instances > 1 and capacity < instances:
        raise ValueError(f"{capacity} slots cannot be split over {instances} instances")
    base, extra = divmod(capacity, instances)
    return [base + (1 if i < extra else 0) for i in range(instances)]
