"""What a simulated run is made of: the scheduling policy, the hardware model, a request.

``Request`` is mutable: the allocator sets its standing when it is sent, the gateway its
instance, and the instance's scheduler (``instance.Instance``) records its starts,
preemptions and end on it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from fairshare import Class, Grant


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
            preemption). An instance with C slots has ``kv_blocks_per_slot * C`` blocks.
        watermark: fraction of the budget kept free when admitting while a request runs
            (vLLM v1's ``SchedulerConfig.watermark``, 0.0 by default).
    """

    prefill_s_per_token: float = 0.0001
    decode_s_per_token: float = 0.02
    block_tokens: int = 16
    kv_blocks_per_slot: int | None = None
    watermark: float = 0.0

    @property
    def step_s(self) -> float:
        """Seconds of one scheduler step: one decode step, whatever the batch."""
        return self.decode_s_per_token

    def prefill_steps(self, tokens: int) -> int:
        """Steps a prefill of ``tokens`` takes before the first output token: its time
        rounded to whole steps (as chunked prefill spreads a long prompt over steps)."""
        return round(tokens * self.prefill_s_per_token / self.decode_s_per_token)

    def service_s(self, prompt_tokens: int, output_tokens: int) -> float:
        """Seconds a request runs when nothing preempts it."""
        return prompt_tokens * self.prefill_s_per_token + output_tokens * self.decode_s_per_token


@dataclass(slots=True, eq=False)
class Request:
    """One request and what happened to it.

    The allocator sets ``priority``, ``borrowing``, ``degraded``, ``grant`` and ``epoch``
    when the request is sent, or ``held`` when it holds the request back at the gateway
    (then it decides them when it sends the request on, ``Simulator.dispatch``); the
    simulator and the scheduler fill in the rest.
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
    held: bool = False  # held back by the allocator: not sent to vLLM yet
    held_s: float = 0.0  # seconds it spent held before it was sent to vLLM
    first_start_s: float | None = None
    start_s: float | None = None
    finish_s: float | None = None
    preemptions: int = 0
    generated: int = 0  # output tokens kept through preemptions (re-prefilled on resume)
    blocks: int = 0
    start_step: int = 0  # the instance's step that gives its current run's first token
    refused: bool = False  # longer than the instance's whole KV cache: never admitted
    run: int = 0  # bumped at every start, preemption and end: stale events are ignored
    gateway: int = 0  # the gateway replica that sent it
    instance: int = 0  # the vLLM instance its gateway routed it to
    routed_priority: int = 0  # the priority its gateway counted it with
    on_done: Callable[[Request], None] | None = None

    @property
    def est_tokens(self) -> int:
        """The tokens a gateway would estimate for the request."""
        return self.prompt_tokens + self.output_tokens

    def wait_s(self, horizon_s: float) -> float:
        """Seconds from arrival to first start (to the horizon if it never started)."""
        start = self.first_start_s if self.first_start_s is not None else horizon_s
        return start - self.arrival_s
