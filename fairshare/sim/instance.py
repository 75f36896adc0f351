"""One vLLM instance: its waiting queue, its running requests and its KV cache.

The rules are vLLM v1's (``vllm/v1/core/sched/scheduler.py``, ``Scheduler.schedule`` and
``_preempt_request``; ``vllm/v1/core/sched/request_queue.py``), read for
``--scheduling-policy priority`` and ``fcfs``:

- Waiting requests: under ``priority`` a min-heap on ``(priority, arrival time, id)``
  (``PriorityRequestQueue``); under ``fcfs`` a queue in arrival order where a preempted
  request goes back to the front (``FCFSRequestQueue.prepend_request``).
- Admission walks the queue from its head while fewer than ``slots`` requests run
  (``max_num_seqs``) and the head's blocks fit above the watermark; it stops at the first
  request that cannot start (no skipping). A waiting request never preempts a running one.
- A running request needs one more KV block every ``block_tokens`` tokens. When none is
  free, a running request is preempted: under ``priority`` the one with the largest
  ``(priority, arrival time)``, under ``fcfs`` the one admitted last; possibly the request
  that needs the block. Its blocks are freed, it keeps the tokens it generated and goes back
  to the queue; when it starts again its prompt and those tokens are prefilled anew
  (``num_computed_tokens = 0``), then it decodes the rest.
- No request is admitted in a step that preempted one: admission resumes one scheduler
  step (``Hardware.step_s``) later.

Not modelled: chunked prefill and the per-step token budget (a request's prefill is one
piece), prefix caching (a resumed request recomputes everything), swapping, the batch's
effect on the decode speed. The instance's owner (``engine.Simulator``) keeps the clock,
the events and what a run records; the instance calls back into it.
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
"""Slack when turning elapsed simulated time into a count of decode steps."""


class Instance:
    """One vLLM scheduler with ``slots`` running requests at most and its KV budget."""

    def __init__(self, index: int, slots: int, sim: Simulator) -> None:
        self.index = index
        self.slots = slots
        self._sim = sim
        self._waiting: list[tuple[int, float, int, Request]] = []
        self.running: dict[int, Request] = {}  # in admission order (fcfs victims: last)
        self.blocks_used = 0
        self.admit_pending = False
        self._front = itertools.count(1)  # fcfs: requests put back at the front

    @property
    def kv_blocks(self) -> int | None:
        """The KV budget in blocks (None: unlimited)."""
        per_slot = self._sim.hardware.kv_blocks_per_slot
        return None if per_slot is None else per_slot * self.slots

    def waiting(self) -> list[Request]:
        """Requests in the queue, in no particular order."""
        return [entry[3] for entry in self._waiting]

    def enqueue(self, req: Request) -> None:
        """``req`` arrives (or is sent again): it joins the queue, then admission runs."""
        req.instance = self.index
        self._push_waiting(req, front=False)
        self.admit()

    def withdraw(self, req: Request) -> bool:
        """Removes ``req`` from the queue; False if it is not waiting here."""
        if not any(entry[3] is req for entry in self._waiting):
            return False
        self._waiting = [entry for entry in self._waiting if entry[3] is not req]
        heapq.heapify(self._waiting)
        return True

    def resize(self, slots: int) -> None:
        """``max_num_seqs`` (and the KV budget with it) changes now.

        Requests over the new limits are preempted, victims chosen as under KV pressure.
        """
        self.slots = slots
        budget = self.kv_blocks
        while self.running and (
            len(self.running) > slots or (budget is not None and self.blocks_used > budget)
        ):
            self.preempt(self.victim())
        self.admit()

    def _push_waiting(self, req: Request, *, front: bool) -> None:
        if self._sim.policy is Policy.FCFS:
            # A deque in arrival order; a preempted request goes to the very front.
            key = -float(next(self._front)) if front else req.queued_s
            heapq.heappush(self._waiting, (0, key, req.rid, req))
        else:
            heapq.heappush(self._waiting, (req.priority, req.queued_s, req.rid, req))

    def _prompt_blocks(self, req: Request) -> int:
        tokens = req.prompt_tokens + req.generated
        return max(1, -(-tokens // self._sim.hardware.block_tokens))

    def admit(self) -> None:
        """Starts queued requests from the head while a slot and their blocks are free."""
        if self.admit_pending:
            return  # a preemption happened this step: vLLM admits at the next one
        budget = self.kv_blocks
        waiting = self._waiting
        while waiting and len(self.running) < self.slots:
            req = waiting[0][3]
            need = self._prompt_blocks(req)
            if budget is not None:
                free = budget - self.blocks_used
                reserve = int(self._sim.hardware.watermark * budget)
                # The head blocks everyone behind it, unless nothing runs (it could
                # never fit otherwise).
                if free - need < reserve and self.running:
                    break
            heapq.heappop(waiting)
            self._start(req, need)

    def _start(self, req: Request, blocks: int) -> None:
        hw = self._sim.hardware
        req.run += 1
        req.start_s = self._sim.now
        if req.first_start_s is None:
            req.first_start_s = self._sim.now
        req.blocks = blocks
        self.blocks_used += blocks
        self.running[req.rid] = req
        left = hw.service_s(req.prompt_tokens + req.generated, req.output_tokens - req.generated)
        self._sim.schedule_finish(self._sim.now + left, req)
        if self.kv_blocks is not None:
            # The output token at which the context outgrows its blocks.
            req.next_token = blocks * hw.block_tokens - req.prompt_tokens + 1
            self._schedule_grow(req)

    def _schedule_grow(self, req: Request) -> None:
        if req.next_token <= req.output_tokens:
            hw = self._sim.hardware
            assert req.start_s is not None
            t = (
                req.start_s
                + (req.prompt_tokens + req.generated) * hw.prefill_s_per_token
                + (req.next_token - req.generated) * hw.decode_s_per_token
            )
            self._sim.schedule_grow(t, req)

    def grow(self, req: Request) -> None:
        """``req`` needs one more KV block; preempt a running request if none is free."""
        budget = self.kv_blocks
        assert budget is not None
        while self.blocks_used >= budget:
            victim = self.victim()
            self.preempt(victim)
            if victim is req:
                return
        req.blocks += 1
        self.blocks_used += 1
        req.next_token += self._sim.hardware.block_tokens
        self._schedule_grow(req)

    def victim(self) -> Request:
        """priority: the largest (priority, arrival time); fcfs: the last admitted."""
        if self._sim.policy is Policy.FCFS:
            return next(reversed(self.running.values()))
        return max(self.running.values(), key=lambda r: (r.priority, r.queued_s, r.rid))

    def _generated_now(self, req: Request) -> int:
        """Output tokens ``req`` holds now: those it resumed with and this run's."""
        hw = self._sim.hardware
        assert req.start_s is not None
        decoding_s = (
            self._sim.now
            - req.start_s
            - (req.prompt_tokens + req.generated) * hw.prefill_s_per_token
        )
        steps = math.floor(decoding_s / hw.decode_s_per_token + _EPSILON) if decoding_s > 0 else 0
        # At least one token stays to decode: a request with none left has finished.
        return req.generated + max(0, min(steps, req.output_tokens - req.generated - 1))

    def preempt(self, victim: Request) -> None:
        """Frees ``victim``'s blocks and puts it back in the queue, with its tokens."""
        assert victim.start_s is not None
        del self.running[victim.rid]
        self.blocks_used -= victim.blocks
        victim.blocks = 0
        victim.generated = self._generated_now(victim)
        victim.run += 1
        victim.preemptions += 1
        self._sim.preempted(victim)
        victim.start_s = None
        self._push_waiting(victim, front=True)
        if not self.admit_pending:
            self.admit_pending = True
            self._sim.schedule_admit(self._sim.now + self._sim.hardware.step_s, self)

    def finish(self, req: Request) -> None:
        """``req`` produced its last token: its blocks and slot free up."""
        del self.running[req.rid]
        self.blocks_used -= req.blocks
        req.blocks = 0
        req.run += 1  # a block it would have needed at this very time is stale
        self._sim.finished(req)
        self.admit()
