"""One trace of each shipped scenario, for ``make fidelity``: what the first vLLM instance of
the scenario's first run received in its first ``WINDOW_S`` seconds.

A scenario's floods send a request when one ends, so its workload depends on how the
instance served the ones before: a recorded trace is a fixed workload cut from it, the
same for both sides of the comparison, not the scenario itself. The scenario runs at
``SCALE`` of its length (its figures are not used), and every request the instance
receives for the first time in the window is kept with its priority and lengths; its
arrival is rounded up to the instance's next step, and the requests are numbered in
arrival order. A scenario without a KV budget gets one that never binds.

Guaranteed: the same traces for the same code (the scenarios are seeded). Not guaranteed:
that a window holds every rule a whole run exercises.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from fairshare.sim.engine import Simulator
from fairshare.sim.fidelity.trace import Trace, TraceRequest
from fairshare.sim.instance import Instance
from fairshare.sim.model import Request
from fairshare.sim.scenarios import SCENARIOS

WINDOW_S = 60.0
"""Seconds of each scenario recorded (3,000 of its 20 ms steps)."""
SCALE = 0.05
"""The part of each scenario's length that runs (its horizon is longer than the window)."""
SEED = 1


class _Recorder:
    """The first instance of the first simulator seen: its shape and its first arrivals."""

    def __init__(self) -> None:
        self.sim: Simulator | None = None
        self.arrivals: dict[int, tuple[float, int, int, int]] = {}
        self.slots = 0
        self.kv_blocks: int | None = None
        self.step_s = 0.0
        self.block_tokens = 16

    def saw(self, instance: Instance, sim: Simulator, req: Request) -> None:
        if self.sim is None:
            self.sim = sim
        if sim is not self.sim or instance.index != 0 or req.rid in self.arrivals:
            return
        if sim.now > WINDOW_S:
            return
        if not self.arrivals:
            self.slots, self.kv_blocks = instance.slots, instance.kv_blocks
            self.step_s = sim.hardware.step_s
            self.block_tokens = sim.hardware.block_tokens
        self.arrivals[req.rid] = (sim.now, req.priority, req.prompt_tokens, req.output_tokens)

    def trace(self, name: str) -> Trace:
        ordered = sorted(self.arrivals.items(), key=lambda item: (item[1][0], item[0]))
        requests = tuple(
            TraceRequest(
                rid=i,
                arrival_step=math.ceil(arrival_s / self.step_s - 1e-9),
                priority=priority,
                prompt_tokens=prompt,
                output_tokens=output,
            )
            for i, (_, (arrival_s, priority, prompt, output)) in enumerate(ordered)
        )
        per_slot = None if self.kv_blocks is None else self.kv_blocks // self.slots
        if per_slot is None:  # no budget: one that holds every request at once
            longest = max(r.prompt_tokens + r.output_tokens for r in requests)
            per_slot = math.ceil(longest / self.block_tokens)
        return Trace(
            name=name,
            max_num_seqs=self.slots,
            kv_blocks=per_slot * self.slots,
            requests=requests,
            block_tokens=self.block_tokens,
        )


def record(name: str, run: Callable[..., Any]) -> Trace:
    """The trace of scenario ``name`` (``run``: its function)."""
    recorder = _Recorder()
    original = Instance.enqueue

    def enqueue(instance: Instance, req: Request) -> None:
        recorder.saw(instance, instance._sim, req)
        original(instance, req)

    Instance.enqueue = enqueue  # type: ignore[method-assign]
    try:
        run(seed=SEED, scale=SCALE)
    finally:
        Instance.enqueue = original  # type: ignore[method-assign]
    return recorder.trace(name)


def scenario_traces() -> list[Trace]:
    """One trace of each shipped scenario, in ``SCENARIOS`` order."""
    return [record(name, run) for name, run in SCENARIOS.items()]
