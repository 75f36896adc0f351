"""A discrete-event model of vLLM's priority scheduler, fed by an allocator.

What is modelled (vLLM's scheduler with ``--scheduling-policy priority``):

- Waiting requests sit in a min-heap on ``(priority, arrival time)``; at most C run.
- The KV cache is a budget of blocks of ``block_tokens`` tokens. A request is admitted
  only if its prompt's blocks fit (above a small watermark); the head of the heap that
  does not fit blocks the others (no skipping), and a waiting request never preempts a
  running one.
- A running request needs one more block every ``block_tokens`` generated tokens. When
  none is free, the running request with the largest ``(priority, arrival time)`` is
  preempted (possibly the one that needs the block): its blocks are freed, its progress
  is lost (recompute preemption) and it goes back to the waiting heap with its original
  priority and arrival time. After a preemption, admission waits one scheduler step.
- FCFS mode is the same scheduler with every priority equal.

A request's service time is its prefill plus one decode step per output token; the
decode step does not depend on the batch (C is the sustainable concurrency, so the batch
is what the pool is sized for). Time is simulated: the allocator's clock is ``now``.

Not modelled: chunked prefill, prefix caching, swapping, and routing between instances
(a pool of several vLLM instances is modelled as one scheduler with C slots).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from fairshare import Class, Grant, Pool


class Policy(Enum):
    """How the simulated vLLM orders its queue."""

    PRIORITY = "priority"
    """Priorities come from the allocator (fairshare)."""
    FCFS = "fcfs"
    """Every request has the same priority: first come, first served."""


@dataclass(frozen=True, slots=True)
class Hardware:
    """Timing and KV-cache model of the pool.

    Attributes:
        prefill_s_per_token: prefill time per prompt token, in seconds.
        decode_s_per_token: time per generated token (one decode step), in seconds.
        block_tokens: tokens per KV-cache block (vLLM's block size).
        kv_blocks_per_slot: KV blocks per unit of C; None means an unlimited cache (no
            preemption). The pool's budget is ``kv_blocks_per_slot * C`` blocks.
        watermark: fraction of the budget kept free when admitting (vLLM's watermark).
        step_s: one scheduler step, in seconds: admission retried after a preemption.
    """

    prefill_s_per_token: float = 0.0001
    decode_s_per_token: float = 0.02
    block_tokens: int = 16
    kv_blocks_per_slot: int | None = None
    watermark: float = 0.01
    step_s: float = 0.02

    def service_s(self, prompt_tokens: int, output_tokens: int) -> float:
        """Seconds a request runs when nothing preempts it."""
        return prompt_tokens * self.prefill_s_per_token + output_tokens * self.decode_s_per_token


@dataclass(slots=True, eq=False)
class Request:
    """One request and what happened to it.

    The allocator sets ``priority``, ``borrowing``, ``degraded``, ``grant`` and ``epoch``
    when the request is sent; the scheduler fills in the rest.
    """

    rid: int
    team: str
    cls: Class
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    service_s: float
    queued_s: float = 0.0  # vLLM's arrival time: the heap's tie-breaker
    priority: int = 0
    borrowing: bool = False
    degraded: bool = False
    grant: Grant | None = None
    epoch: int = 0
    first_start_s: float | None = None
    start_s: float | None = None
    finish_s: float | None = None
    preemptions: int = 0
    blocks: int = 0
    next_token: int = 0  # output token at which the next KV block is needed
    run: int = 0  # bumped on every start and preemption: stale events are ignored
    on_done: Callable[[Request], None] | None = None

    @property
    def est_tokens(self) -> int:
        """The tokens a gateway would estimate for the request."""
        return self.prompt_tokens + self.output_tokens

    def wait_s(self, horizon_s: float) -> float:
        """Seconds from arrival to first start (to the horizon if it never started)."""
        start = self.first_start_s if self.first_start_s is not None else horizon_s
        return start - self.arrival_s


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
    """

    name: str
    capacity: int
    shares: Mapping[str, float]
    half_life_s: float
    resizes: bool = False


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
    )
    return PoolAllocator(pool)


@dataclass(frozen=True, slots=True)
class Run:
    """One interval during which a request held a slot."""

    team: str
    start_s: float
    end_s: float
    completed: bool
    """False when the run ended in a preemption (its work is lost)."""


@dataclass
class SimResult:
    """Everything a run recorded."""

    horizon_s: float
    requests: list[Request]
    runs: list[Run]
    capacity_log: list[tuple[float, int]]
    preemptions: dict[str, int] = field(default_factory=dict)

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
        """Slot-seconds of completed (useful) runs of ``team`` inside ``[start, end)``."""
        total = 0.0
        for run in self.runs:
            if run.team == team and run.completed:
                total += max(0.0, min(run.end_s, end_s) - max(run.start_s, start_s))
        return total

    def served_series(
        self, teams: Sequence[str], bin_s: float
    ) -> tuple[list[float], dict[str, list[float]]]:
        """Useful slot-seconds per team in consecutive bins of ``bin_s`` seconds.

        Returns:
            the bins' middle times and, per team, the slot-seconds served in each bin.
        """
        n = max(1, math.ceil(self.horizon_s / bin_s))
        series = {team: [0.0] * n for team in teams}
        for run in self.runs:
            if not run.completed or run.team not in series:
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


# Event kinds, in the order they are processed at equal times (by sequence number).
_CALL = 0
_FINISH = 1
_GROW = 2
_ADMIT = 3


class Simulator:
    """vLLM's scheduler with C slots and a KV budget, in simulated time.

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
    ) -> None:
        self.now = 0.0
        self.capacity = capacity
        self.hardware = hardware
        self.allocator = allocator
        self.policy = policy
        self.horizon_s = horizon_s
        self._events: list[tuple[float, int, int, object, int]] = []
        self._seq = itertools.count()
        self._rid = itertools.count()
        self._waiting: list[tuple[int, float, int, Request]] = []
        self._running: dict[int, Request] = {}
        self._blocks_used = 0
        self._admit_pending = False
        self._requests: list[Request] = []
        self._runs: list[Run] = []
        self._preemptions: dict[str, int] = {}
        self._capacity_log: list[tuple[float, int]] = [(0.0, capacity)]

    # -- what sources and scenarios call ------------------------------------------

    @property
    def kv_blocks(self) -> int | None:
        """The KV budget in blocks (None: unlimited)."""
        per_slot = self.hardware.kv_blocks_per_slot
        return None if per_slot is None else per_slot * self.capacity

    def at(self, time_s: float, fn: Callable[[], None]) -> None:
        """Calls ``fn`` at simulated time ``time_s`` (ignored past the horizon)."""
        if time_s <= self.horizon_s:
            heapq.heappush(self._events, (time_s, next(self._seq), _CALL, fn, 0))

    def send(
        self,
        team: str,
        cls: Class,
        prompt_tokens: int,
        output_tokens: int,
        on_done: Callable[[Request], None] | None = None,
    ) -> Request:
        """A gateway sends a request now: the allocator decides, vLLM queues it."""
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
        self.allocator.admit(req)
        if self.policy is Policy.FCFS:
            req.priority = 0
        self._requests.append(req)
        heapq.heappush(self._waiting, (req.priority, req.queued_s, req.rid, req))
        self._admit()
        return req

    def resend(self, req: Request) -> bool:
        """The gateway aborts a request still waiting in vLLM and sends it again now.

        The allocator decides it afresh; vLLM queues it as a new arrival. The request's
        ``arrival_s`` (when the client sent it) is kept, so its wait counts from there.

        Returns:
            False if the request is not waiting (running or finished): nothing done.
        """
        if not any(entry[3] is req for entry in self._waiting):
            return False
        self._waiting = [entry for entry in self._waiting if entry[3] is not req]
        heapq.heapify(self._waiting)
        if req.grant is not None:  # nothing ran: the old grant ends with no cost
            req.grant.release(0.0)
            req.grant = None
        req.degraded = False
        self.allocator.admit(req)
        if self.policy is Policy.FCFS:
            req.priority = 0
        req.queued_s = self.now
        heapq.heappush(self._waiting, (req.priority, req.queued_s, req.rid, req))
        self._admit()
        return True

    def set_capacity(self, capacity: int) -> None:
        """The pool grows or shrinks now (instances added or drained).

        Requests over the new C or the new KV budget are preempted, largest
        ``(priority, arrival)`` first, as vLLM would when an instance drains.
        """
        self.capacity = capacity
        self.allocator.set_capacity(capacity)
        self._capacity_log.append((self.now, capacity))
        budget = self.kv_blocks
        while self._running and (
            len(self._running) > capacity or (budget is not None and self._blocks_used > budget)
        ):
            self._preempt(self._victim())
        self._admit()

    def in_flight(self) -> list[Request]:
        """Requests sent and not finished (waiting or running), in arrival order."""
        reqs = [entry[3] for entry in self._waiting] + list(self._running.values())
        return sorted(reqs, key=lambda r: r.rid)

    def running(self) -> list[Request]:
        """Requests holding a slot."""
        return list(self._running.values())

    def run(self) -> SimResult:
        """Processes events up to the horizon and returns what was recorded."""
        events = self._events
        while events:
            time_s, _, kind, obj, run = heapq.heappop(events)
            if time_s > self.horizon_s:
                break
            self.now = time_s
            if kind == _CALL:
                obj()  # type: ignore[operator]
            elif kind == _FINISH:
                self._finish(obj, run)  # type: ignore[arg-type]
            elif kind == _GROW:
                self._grow(obj, run)  # type: ignore[arg-type]
            else:
                self._admit_pending = False
                self._admit()
        self.now = self.horizon_s
        for req in self._running.values():  # cut the runs in progress at the horizon
            assert req.start_s is not None
            self._runs.append(Run(req.team, req.start_s, self.horizon_s, completed=True))
        return SimResult(
            horizon_s=self.horizon_s,
            requests=self._requests,
            runs=self._runs,
            capacity_log=self._capacity_log,
            preemptions=dict(self._preemptions),
        )

    # -- the scheduler ------------------------------------------------------------

    def _push(self, time_s: float, kind: int, req: Request) -> None:
        heapq.heappush(self._events, (time_s, next(self._seq), kind, req, req.run))

    def _prompt_blocks(self, req: Request) -> int:
        return max(1, -(-req.prompt_tokens // self.hardware.block_tokens))

    def _admit(self) -> None:
        """Starts waiting requests in heap order while a slot and their blocks are free."""
        if self._admit_pending:
            return  # a preemption happened this step: vLLM admits at the next one
        budget = self.kv_blocks
        waiting = self._waiting
        while waiting and len(self._running) < self.capacity:
            req = waiting[0][3]
            need = self._prompt_blocks(req)
            if budget is not None:
                free = budget - self._blocks_used
                reserve = int(self.hardware.watermark * budget)
                # The head blocks everyone behind it, unless nothing runs (it could
                # never fit otherwise).
                if free - need < reserve and self._running:
                    break
            heapq.heappop(waiting)
            self._start(req, need)

    def _start(self, req: Request, blocks: int) -> None:
        hw = self.hardware
        req.run += 1
        req.start_s = self.now
        if req.first_start_s is None:
            req.first_start_s = self.now
        req.blocks = blocks
        self._blocks_used += blocks
        self._running[req.rid] = req
        self._push(self.now + req.service_s, _FINISH, req)
        if self.kv_blocks is not None:
            req.next_token = blocks * hw.block_tokens - req.prompt_tokens + 1
            self._schedule_grow(req)

    def _schedule_grow(self, req: Request) -> None:
        if req.next_token <= req.output_tokens:
            hw = self.hardware
            assert req.start_s is not None
            t = (
                req.start_s
                + req.prompt_tokens * hw.prefill_s_per_token
                + req.next_token * hw.decode_s_per_token
            )
            self._push(t, _GROW, req)

    def _grow(self, req: Request, run: int) -> None:
        """``req`` needs one more KV block; preempt the lowest-priority runner if none."""
        if run != req.run or req.rid not in self._running:
            return
        budget = self.kv_blocks
        assert budget is not None
        while self._blocks_used >= budget:
            victim = self._victim()
            self._preempt(victim)
            if victim is req:
                return
        req.blocks += 1
        self._blocks_used += 1
        req.next_token += self.hardware.block_tokens
        self._schedule_grow(req)

    def _victim(self) -> Request:
        """The running request with the largest (priority, arrival time)."""
        return max(self._running.values(), key=lambda r: (r.priority, r.queued_s, r.rid))

    def _preempt(self, victim: Request) -> None:
        assert victim.start_s is not None
        del self._running[victim.rid]
        self._blocks_used -= victim.blocks
        victim.blocks = 0
        victim.run += 1
        victim.preemptions += 1
        self._preemptions[victim.team] = self._preemptions.get(victim.team, 0) + 1
        self._runs.append(Run(victim.team, victim.start_s, self.now, completed=False))
        victim.start_s = None
        heapq.heappush(self._waiting, (victim.priority, victim.queued_s, victim.rid, victim))
        if not self._admit_pending:
            self._admit_pending = True
            heapq.heappush(
                self._events, (self.now + self.hardware.step_s, next(self._seq), _ADMIT, None, 0)
            )

    def _finish(self, req: Request, run: int) -> None:
        if run != req.run or req.rid not in self._running:
            return
        assert req.start_s is not None
        del self._running[req.rid]
        self._blocks_used -= req.blocks
        req.blocks = 0
        req.finish_s = self.now
        self._runs.append(Run(req.team, req.start_s, self.now, completed=True))
        # Cost charged at release: the GPU-seconds (slot-seconds) of the run that finished.
        self.allocator.release(req, req.service_s)
        if req.on_done is not None:
            req.on_done(req)
        self._admit()
