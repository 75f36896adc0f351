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

The pieces the scheduler works with live beside it: requests, the hardware model and the
policy in ``model``, the allocators in ``allocators``, what a run records in ``results``.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from fairshare import Class
from sim.allocators import Allocator
from sim.model import Hardware, Policy, Request
from sim.results import Run, SimResult

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
