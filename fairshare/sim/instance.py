"""One vLLM instance: its waiting queue, its running requests and its KV cache, step by step.

The rules are vLLM v1's (``vllm/v1/core/sched/scheduler.py``, ``Scheduler.schedule``,
``update_from_output`` and ``_preempt_request``; ``vllm/v1/core/sched/request_queue.py``;
``vllm/v1/core/kv_cache_manager.py``, ``allocate_slots``), read for
``--scheduling-policy priority`` and ``fcfs``. The instance runs in steps, as vLLM's engine
does, and each step goes in vLLM's order:

1. The requests that produced their last token in the step before leave: their blocks and
   slots are free (``update_from_output``).
2. Running requests, in admission order, get the KV block their next token needs. When none
   is free, a running request is preempted: under ``priority`` the one with the largest
   ``(priority, arrival time)``, under ``fcfs`` the one admitted last; possibly the request
   that needs the block (then the next running request is served). Its blocks are freed, it
   keeps the tokens it generated and goes back to the queue; when it starts again its
   prompt and those tokens are prefilled anew (``num_computed_tokens = 0``).
3. Only in a step that preempted nothing, waiting requests are admitted from the head of
   the queue while fewer than ``slots`` requests run (``max_num_seqs``) and the head's
   prompt blocks fit, keeping ``watermark`` of the blocks free when a request already runs;
   admission stops at the first request that cannot start (no skipping). Under
   ``priority`` the queue is a min-heap on ``(priority, arrival time, id)``
   (``PriorityRequestQueue``), so everything that arrived before the step starts in that
   order; under ``fcfs`` it is in arrival order and a preempted request goes back to the
   front (``FCFSRequestQueue.prepend_request``). A waiting request never preempts a
   running one.
4. Every running request computes one token. A step lasts one decode step, whatever the
   batch; a newly admitted request first spends its prefill time, rounded to whole steps
   (``Hardware.prefill_steps``), on its prompt, without slowing the others (as chunked
   prefill spreads a long prompt over steps), holding its prompt's blocks from the start.

A request whose prompt and output together exceed the whole KV cache is refused when it
arrives (vLLM refuses a request longer than ``max_model_len``, which its cache must hold).
Between steps time is continuous: a request that reaches an idle instance starts a step at
once; one that reaches a busy instance waits for the next step. Steps in which nothing but
decoding happens are not run one by one: the instance wakes at the next step where a
request finishes, needs a block, or may be admitted.

Not modelled: the per-step token budget and the batch's effect on the step time (prefill
and decode cost the same in any batch), prefix caching (a resumed request recomputes
everything), swapping. The instance's owner (``engine.Simulator``) keeps the clock, the
events and what a run records; the instance calls back into it.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import TYPE_CHECKING

from fairshare.sim.model import Policy, Request

if TYPE_CHECKING:
    from fairshare.sim.engine import Simulator

_EPSILON = 1e-9
"""Slack when turning elapsed simulated time into a count of steps."""

# What is due at a step, in the order it is handled there (step 1, then step 2 above).
_FINISH = 0
_GROW = 1


class Instance:
    """One vLLM scheduler with ``slots`` running requests at most and its KV budget."""

    def __init__(self, index: int, slots: int, sim: Simulator) -> None:
        self.index = index
        self.slots = slots
        self._sim = sim
        self._waiting: list[tuple[int, float, int, Request]] = []
        self.running: dict[int, Request] = {}  # in admission order (fcfs victims: last)
        self.blocks_used = 0
        self._front = itertools.count(1)  # fcfs: requests put back at the front
        # (step, what, admission order, run, request): finishes and block needs ahead.
        self._due: list[tuple[int, int, int, int, Request]] = []
        self._admitted = itertools.count()
        self._order: dict[int, int] = {}  # rid -> admission order, for the running loop
        self._step = 0  # the next step to run
        self._step_s = 0.0  # when it starts; the steps after it decode only, until one runs
        self._wake: int | None = None  # the step a wake-up is scheduled for
        self._wakes = 0  # the current wake-up's token: earlier ones are stale
        self._in_step = False
        self._preempted = False  # the step running (or the last one run) preempted
        self._resized = False

    @property
    def kv_blocks(self) -> int | None:
        """The KV budget in blocks (None: unlimited)."""
        per_slot = self._sim.hardware.kv_blocks_per_slot
        return None if per_slot is None else per_slot * self.slots

    @property
    def steps(self) -> int:
        """Steps run or passed so far (the index of the next one)."""
        return self._step

    def waiting(self) -> list[Request]:
        """Requests in the queue, in no particular order."""
        return [entry[3] for entry in self._waiting]

    def enqueue(self, req: Request) -> None:
        """``req`` arrives (or is sent again): refused if it can never fit, else it joins
        the queue and the next step (now, if the instance is idle) may admit it."""
        req.instance = self.index
        if self._too_large(req):
            self._sim.refused(req)
            return
        self._push_waiting(req, front=False)
        self._wake_soon()

    def withdraw(self, req: Request) -> bool:
        """Removes ``req`` from the queue; False if it is not waiting here."""
        if not any(entry[3] is req for entry in self._waiting):
            return False
        self._waiting = [entry for entry in self._waiting if entry[3] is not req]
        heapq.heapify(self._waiting)
        return True

    def resize(self, slots: int) -> None:
        """``max_num_seqs`` (and the KV budget with it) changes now.

        At the next step, requests over the new limits are preempted, victims chosen as
        under KV pressure, and waiting requests that no longer fit are refused.
        """
        self.slots = slots
        self._resized = True
        if self.running or self._waiting:
            self._wake_soon()

    def victim(self) -> Request:
        """priority: the largest (priority, arrival time); fcfs: the last admitted."""
        if self._sim.policy is Policy.FCFS:
            return next(reversed(self.running.values()))
        return max(self.running.values(), key=lambda r: (r.priority, r.queued_s, r.rid))

    # -- one step -------------------------------------------------------------------------

    def step(self, token: int) -> None:
        """Runs the step a wake-up was scheduled for (``Simulator.schedule_step``)."""
        if token != self._wakes or self._wake is None:
            return  # superseded by an earlier wake-up
        step, self._wake = self._wake, None
        self._step = step
        self._in_step = True
        self._preempted = False
        due = self._due
        while due and due[0][0] == step and due[0][1] == _FINISH:
            _, _, _, run, req = heapq.heappop(due)
            if run == req.run:
                self._finish(req)
        if self._resized:
            self._resized = False
            self._shrink()
        while due and due[0][0] == step:
            _, _, _, run, req = heapq.heappop(due)
            if run == req.run:
                self._grow(req, step)
        if not self._preempted:
            self._admit(step)
        self._in_step = False
        self._step = step + 1
        # A step that ran no request takes no time (everything running was preempted).
        self._step_s = self._sim.now + (self._sim.hardware.step_s if self.running else 0.0)
        self._schedule_next()

    def _finish(self, req: Request) -> None:
        """``req`` produced its last token in the step before: its blocks and slot free."""
        del self.running[req.rid]
        del self._order[req.rid]
        self.blocks_used -= req.blocks
        req.blocks = 0
        req.run += 1
        self._sim.finished(req)

    def _shrink(self) -> None:
        budget = self.kv_blocks
        while self.running and (
            len(self.running) > self.slots or (budget is not None and self.blocks_used > budget)
        ):
            self._preempt(self.victim())

    def _grow(self, req: Request, step: int) -> None:
        """``req``'s token this step needs one more KV block; preempt while none is free."""
        budget = self.kv_blocks
        assert budget is not None
        while self.blocks_used >= budget:
            victim = self.victim()
            self._preempt(victim)
            if victim is req:
                return
        req.blocks += 1
        self.blocks_used += 1
        self._due_grow(req, step + self._sim.hardware.block_tokens)

    def _preempt(self, victim: Request) -> None:
        """Frees ``victim``'s blocks and puts it back in the queue, with its tokens."""
        assert victim.start_s is not None
        del self.running[victim.rid]
        del self._order[victim.rid]
        self.blocks_used -= victim.blocks
        victim.blocks = 0
        victim.generated += max(0, self._step - victim.start_step)  # one a step, after prefill
        victim.run += 1
        victim.preemptions += 1
        self._preempted = True
        self._sim.preempted(victim)
        victim.start_s = None
        self._push_waiting(victim, front=True)

    def _admit(self, step: int) -> None:
        """Starts queued requests from the head while a slot and their blocks are free."""
        budget = self.kv_blocks
        waiting = self._waiting
        while waiting and len(self.running) < self.slots:
            req = waiting[0][3]
            if self._too_large(req):  # the cache shrank under it
                heapq.heappop(waiting)
                self._sim.refused(req)
                continue
            tokens = req.prompt_tokens + req.generated
            need = self._blocks(tokens)
            if budget is not None:
                reserve = int(self._sim.hardware.watermark * budget) if self.running else 0
                if need + reserve > budget - self.blocks_used:
                    break
            heapq.heappop(waiting)
            self._start(req, need, step)

    def _start(self, req: Request, blocks: int, step: int) -> None:
        hw = self._sim.hardware
        tokens = req.prompt_tokens + req.generated
        req.run += 1
        req.start_s = self._sim.now
        req.start_step = step + hw.prefill_steps(tokens)
        if req.first_start_s is None:
            req.first_start_s = self._sim.now
        req.blocks = blocks
        self.blocks_used += blocks
        self.running[req.rid] = req
        self._order[req.rid] = next(self._admitted)
        self._sim.started(req)
        # One token a step from start_step on: the last at the end of start_step + left - 1.
        first, left = req.start_step, req.output_tokens - req.generated
        heapq.heappush(self._due, (first + left, _FINISH, self._order[req.rid], req.run, req))
        if self.kv_blocks is not None:
            # The step whose token outgrows the blocks of the prompt.
            self._due_grow(req, first + blocks * hw.block_tokens - tokens + 1)

    def _due_grow(self, req: Request, step: int) -> None:
        last = req.start_step + req.output_tokens - req.generated - 1  # its last step
        if step <= last:
            heapq.heappush(self._due, (step, _GROW, self._order[req.rid], req.run, req))

    # -- when the next step runs ----------------------------------------------------------

    def _schedule_next(self) -> None:
        """After a step: wake at the next step where something is due, or go idle."""
        due = self._due
        while due and due[0][3] != due[0][4].run:
            heapq.heappop(due)  # stale: its run was preempted
        if (self._preempted and self._waiting) or self._resized:
            self._wake_at(self._step)  # admission resumes at the next step
        elif due:
            self._wake_at(due[0][0])

    def _wake_soon(self) -> None:
        """Something may be admitted or must change: wake at the next step boundary."""
        if self._in_step:
            return  # the step running now will see it
        sim = self._sim
        if self._wake is None and not self.running:
            self._step_s = max(self._step_s, sim.now)  # idle: a step starts now
        elapsed = (sim.now - self._step_s) / sim.hardware.decode_s_per_token
        step = self._step + max(0, math.ceil(elapsed - _EPSILON))
        if self._wake is None or step < self._wake:
            self._wake_at(step)

    def _wake_at(self, step: int) -> None:
        self._wake = step
        self._wakes += 1
        at = self._step_s + (step - self._step) * self._sim.hardware.decode_s_per_token
        self._sim.schedule_step(at, self, self._wakes)

    # -- helpers --------------------------------------------------------------------------

    def _push_waiting(self, req: Request, *, front: bool) -> None:
        if self._sim.policy is Policy.FCFS:
            # A deque in arrival order; a preempted request goes to the very front.
            key = -float(next(self._front)) if front else req.queued_s
            heapq.heappush(self._waiting, (0, key, req.rid, req))
        else:
            heapq.heappush(self._waiting, (req.priority, req.queued_s, req.rid, req))

    def _blocks(self, tokens: int) -> int:
        return max(1, -(-tokens // self._sim.hardware.block_tokens))

    def _too_large(self, req: Request) -> bool:
        """Whether ``req`` could not fit even in an empty cache (longer than
        ``max_model_len``)."""
        budget = self.kv_blocks
        tokens = req.prompt_tokens + req.output_tokens
        return budget is not None and tokens > budget * self._sim.hardware.block_tokens
