"""Seeded request traces for one vLLM instance, and the per-step event logs of a replay.

A trace is what one instance receives: its ``max_num_seqs``, its KV cache in blocks, and
requests that each arrive before a numbered step with a priority (0, 1: within share; 10,
20, 30: borrowing), a prompt and an output length. A replay (the simulated instance, or
vLLM's scheduler) produces an ``EventLog``: for each step where something happened, the
requests admitted (in admission order), preempted and finished (their last token
was produced in that step). Two replays agree when their logs are equal.

Guarantees: ``generate`` gives the same trace for the same seed on any machine; logs and
traces round-trip through JSON. Not guaranteed: that a trace exercises any given rule.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

PRIORITIES = (0, 1, 10, 20, 30)
"""Priorities a trace draws from: 0 and 1 within share, 10 and above borrowing."""
WITHIN_SHARE_MAX = 1
"""The largest within-share priority."""
BLOCK_TOKENS = 16
"""Tokens per KV block, as vLLM's default block size."""
_SPREAD = 0.6
"""Part of a trace's requests spread evenly over its span; the rest arrive in three bursts."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request: queued before step ``arrival_step`` with ``priority``."""

    rid: int
    arrival_step: int
    priority: int
    prompt_tokens: int
    output_tokens: int

    @property
    def within_share(self) -> bool:
        return self.priority <= WITHIN_SHARE_MAX


@dataclass(frozen=True, slots=True)
class Trace:
    """What one instance receives.

    Attributes:
        name: identifies the trace in reports (``seed-17``, a scenario's name).
        max_num_seqs: running requests at most.
        kv_blocks: usable KV blocks (vLLM's null block not counted).
        requests: in arrival order (``rid`` ascending).
        block_tokens: tokens per block.
    """

    name: str
    max_num_seqs: int
    kv_blocks: int
    requests: tuple[TraceRequest, ...]
    block_tokens: int = BLOCK_TOKENS

    def fits(self, req: TraceRequest) -> bool:
        """Whether ``req``'s prompt and output fit the whole cache (else it is refused when
        it arrives, as vLLM refuses a request longer than ``max_model_len``)."""
        return req.prompt_tokens + req.output_tokens <= self.kv_blocks * self.block_tokens

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "max_num_seqs": self.max_num_seqs,
            "kv_blocks": self.kv_blocks,
            "block_tokens": self.block_tokens,
            "requests": [
                [r.rid, r.arrival_step, r.priority, r.prompt_tokens, r.output_tokens]
                for r in self.requests
            ],
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Trace:
        return cls(
            name=str(doc["name"]),
            max_num_seqs=int(doc["max_num_seqs"]),
            kv_blocks=int(doc["kv_blocks"]),
            block_tokens=int(doc["block_tokens"]),
            requests=tuple(TraceRequest(*(int(v) for v in row)) for row in doc["requests"]),
        )


def generate(seed: int) -> Trace:
    """A random trace for ``seed``: 2 to 8 slots, 4 to 12 KV blocks per slot, 10 to 40
    requests arriving in bursts over the first 40 to 120 steps, log-uniform prompt (1 to
    400 tokens) and output (1 to 120 tokens) lengths, priorities drawn from
    ``PRIORITIES``. The KV budget is a whole number of blocks per slot, as the simulator
    sizes an instance."""
    rng = random.Random(f"fidelity:{seed}")
    slots = rng.randint(2, 8)
    per_slot = rng.randint(4, 12)
    span = rng.randint(40, 120)
    count = rng.randint(10, 40)
    steps = sorted(
        rng.randrange(span) if rng.random() < _SPREAD else rng.choice((0, span // 3, span // 2))
        for _ in range(count)
    )
    requests = tuple(
        TraceRequest(
            rid=rid,
            arrival_step=step,
            priority=rng.choice(PRIORITIES),
            prompt_tokens=round(10 ** rng.uniform(0.0, 2.6)),
            output_tokens=round(10 ** rng.uniform(0.0, 2.08)),
        )
        for rid, step in enumerate(steps)
    )
    return Trace(f"seed-{seed}", slots, per_slot * slots, requests)


@dataclass(frozen=True, slots=True)
class StepEvents:
    """What happened in one step."""

    step: int
    admitted: tuple[int, ...] = ()
    preempted: tuple[int, ...] = ()
    finished: tuple[int, ...] = ()


@dataclass(slots=True)
class EventLog:
    """Steps where something happened, in order; ``refused``: requests never queued."""

    steps: list[StepEvents] = field(default_factory=list)
    refused: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "refused": list(self.refused),
            "steps": [
                [s.step, list(s.admitted), list(s.preempted), list(s.finished)] for s in self.steps
            ],
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> EventLog:
        return cls(
            steps=[
                StepEvents(int(row[0]), tuple(row[1]), tuple(row[2]), tuple(row[3]))
                for row in doc["steps"]
            ],
            refused=tuple(int(r) for r in doc["refused"]),
        )


class LogBuilder:
    """Collects one replay's events step by step (either side of the comparison)."""

    def __init__(self) -> None:
        self._events: dict[int, tuple[list[int], list[int], list[int]]] = {}
        self._refused: list[int] = []

    def _at(self, step: int) -> tuple[list[int], list[int], list[int]]:
        return self._events.setdefault(step, ([], [], []))

    def admitted(self, step: int, rid: int) -> None:
        self._at(step)[0].append(rid)

    def preempted(self, step: int, rid: int) -> None:
        self._at(step)[1].append(rid)

    def finished(self, step: int, rid: int) -> None:
        self._at(step)[2].append(rid)

    def refused(self, rid: int) -> None:
        self._refused.append(rid)

    def log(self) -> EventLog:
        """The log; the preemptions and finishes of one step sorted (vLLM reports a step's
        preemptions as a set, and frees its finished requests in one batch)."""
        return EventLog(
            steps=[
                StepEvents(step, tuple(a), tuple(sorted(p)), tuple(sorted(f)))
                for step, (a, p, f) in sorted(self._events.items())
            ],
            refused=tuple(sorted(self._refused)),
        )


@dataclass(frozen=True, slots=True)
class Difference:
    """The first step at which two logs differ (``None`` where a log has no events)."""

    step: int
    left: StepEvents | None
    right: StepEvents | None


def compare(left: EventLog, right: EventLog) -> Difference | None:
    """None if the logs are equal, else their first differing step (refusals: step -1)."""
    if left.refused != right.refused:
        return Difference(
            -1, StepEvents(-1, finished=left.refused), StepEvents(-1, finished=right.refused)
        )
    by_left = {s.step: s for s in left.steps}
    by_right = {s.step: s for s in right.steps}
    for step in sorted(by_left.keys() | by_right.keys()):
        a, b = by_left.get(step), by_right.get(step)
        if a != b:
            return Difference(step, a, b)
    return None


@dataclass(frozen=True, slots=True)
class Figures:
    """Waits (steps from arrival to first admission) and preemptions, by standing."""

    within_waits: tuple[int, ...]
    borrowing_waits: tuple[int, ...]
    within_preemptions: int
    borrowing_preemptions: int
    steps: int


def figures(trace: Trace, log: EventLog) -> Figures:
    """The waits and preemptions of ``log``; a request never admitted waits until the log's
    last step; refused requests do not count."""
    last = log.steps[-1].step if log.steps else 0
    first: dict[int, int] = {}
    preempted: dict[int, int] = {}
    for s in log.steps:
        for rid in s.admitted:
            first.setdefault(rid, s.step)
        for rid in s.preempted:
            preempted[rid] = preempted.get(rid, 0) + 1
    within: list[int] = []
    borrowing: list[int] = []
    counts = [0, 0]
    refused = set(log.refused)
    for req in trace.requests:
        if req.rid in refused:
            continue
        wait = first.get(req.rid, last) - req.arrival_step
        (within if req.within_share else borrowing).append(wait)
        counts[0 if req.within_share else 1] += preempted.get(req.rid, 0)
    return Figures(tuple(within), tuple(borrowing), counts[0], counts[1], last)


def dumps(items: list[dict[str, Any]]) -> str:
    return json.dumps(items, separators=(",", ":"))
