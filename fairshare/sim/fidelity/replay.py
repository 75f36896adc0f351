"""A trace through one simulated instance (``instance.Instance``), step by step.

The instance gets the trace's ``max_num_seqs`` as its slots and its KV blocks; steps last
1 s and prefill takes no time (``prefill_s_per_token=0``), so step k starts at k seconds
and a request admitted in step k produces its first token in step k, as in vLLM, where
the step that admits a request prefills it and samples its first token. A request is sent
at its arrival step's start, before the step runs (the engine queues calls before steps
at one instant). Priorities are the trace's (``FixedPriorities``).
"""

from __future__ import annotations

from collections.abc import Callable

from fairshare import Class
from fairshare.sim.engine import Simulator
from fairshare.sim.fidelity.trace import EventLog, LogBuilder, Trace, TraceRequest
from fairshare.sim.model import Hardware, Request

STEP_S = 1.0
"""Seconds per step: step k starts at k seconds."""


class FixedPriorities:
    """The allocator of a replay: each request's priority is the trace's."""

    def __init__(self, trace: Trace) -> None:
        self._priority = {r.rid: r.priority for r in trace.requests}

    def admit(self, req: Request) -> None:
        req.priority = self._priority[req.rid]
        req.borrowing = req.priority > 1

    def release(self, req: Request, cost: float) -> None:
        pass

    def set_capacity(self, capacity: int) -> None:
        pass


class _LoggingSimulator(Simulator):
    def __init__(self, trace: Trace, builder: LogBuilder, horizon_s: float) -> None:
        super().__init__(
            capacity=trace.max_num_seqs,
            hardware=Hardware(
                prefill_s_per_token=0.0,
                decode_s_per_token=STEP_S,
                block_tokens=trace.block_tokens,
                kv_blocks_per_slot=trace.kv_blocks // trace.max_num_seqs,
            ),
            allocator=FixedPriorities(trace),
            horizon_s=horizon_s,
        )
        self._log = builder

    def _step(self) -> int:
        return round(self.now / STEP_S)

    def started(self, req: Request) -> None:
        self._log.admitted(self._step(), req.rid)

    def preempted(self, req: Request) -> None:
        super().preempted(req)
        self._log.preempted(self._step(), req.rid)

    def finished(self, req: Request) -> None:
        super().finished(req)
        # Freed at the start of the step after the one that produced its last token.
        self._log.finished(self._step() - 1, req.rid)

    def refused(self, req: Request) -> None:
        super().refused(req)
        self._log.refused(req.rid)


def replay(trace: Trace, *, max_steps: int = 100_000) -> EventLog:
    """The event log of ``trace`` through one simulated instance (until every request has
    finished or been refused, or ``max_steps``).

    Raises:
        ValueError: the trace's KV blocks are not a whole number per slot.
    """
    if trace.kv_blocks % trace.max_num_seqs:
        raise ValueError(f"{trace.kv_blocks} KV blocks are not a whole number per slot")
    builder = LogBuilder()
    sim = _LoggingSimulator(trace, builder, horizon_s=max_steps * STEP_S)

    def sender(req: TraceRequest) -> Callable[[], None]:
        def send() -> None:
            sent = sim.send("trace", Class.INTERACTIVE, req.prompt_tokens, req.output_tokens)
            assert sent.rid == req.rid, "requests are sent in rid order"

        return send

    for req in trace.requests:
        sim.at(req.arrival_step * STEP_S, sender(req))
    sim.run()
    return builder.log()
