"""The markdown report of scenarios: a section per scenario, and the whole document.

``section`` writes one scenario's targets (with whether each was met), the comparison
beside it, every figure and links to its plots (drawn by ``fairshare.sim.plots``);
``document`` puts the sections between the report's fixed text: how the model works,
where the scheduler's rules come from, and how to take priorities from a running
allocator.

Guaranteed: the same results and command give the same text; numbers are printed by
``fmt`` everywhere. Not guaranteed: that the fixed text describes a model changed
since it was written (it is prose, kept by hand beside ``fairshare.sim.instance`` and
``fairshare.sim.engine``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from pathlib import Path

from fairshare.sim.scenarios.result import ScenarioResult

_THREE_DECIMALS_BELOW = 10
"""A table shows a value under this magnitude with three decimals, a larger one with one."""


def fmt(value: float) -> str:
    """A figure as the tables print it: an integer bare, NaN as a dash, a small value with
    three decimals, a larger one with one."""
    if isinstance(value, int) or (math.isfinite(value) and value == int(value)):
        return f"{int(value)}"
    if math.isnan(value):
        return "—"
    if abs(value) < _THREE_DECIMALS_BELOW:
        return f"{value:.3f}"
    return f"{value:.1f}"


def _unit(unit: str, value: float = 0.0) -> str:
    """The unit after a table's number, none after a missing one (NaN)."""
    return f" {unit}" if unit and not math.isnan(value) else ""


def section(result: ScenarioResult, images: Sequence[Path], base: Path) -> str:
    """The markdown section of one scenario; image links are relative to ``base``."""
    lines = [f"## {result.title} (`{result.name}`)", "", result.description, ""]
    lines += ["| target | value | bound | met |", "| --- | ---: | ---: | :---: |"]
    for t in result.targets:
        op = "≤" if t.at_most else "≥"
        unit = _unit(t.unit)
        mark = "yes" if t.met else "**no**"
        lines.append(f"| {t.text} | {fmt(t.value)}{unit} | {op} {fmt(t.bound)}{unit} | {mark} |")
    if result.comparisons:
        first = next(iter(result.runs))
        lines += [
            "",
            f"Compared (printed, not checked): *{first}* beside *{result.compared}*.",
            "",
            f"| figure | {first} | {result.compared} |",
            "| --- | ---: | ---: |",
        ]
        for c in result.comparisons:
            value = f"{fmt(c.value)}{_unit(c.unit, c.value)}"
            lines.append(f"| {c.text} | {value} | {fmt(c.other)}{_unit(c.unit, c.other)} |")
    lines += ["", "<details><summary>All figures</summary>", ""]
    lines += ["| figure | value |", "| --- | ---: |"]
    lines += [f"| `{k}` | {fmt(v)} |" for k, v in result.figures.items()]
    lines += ["", "</details>", ""]
    if result.notes:
        lines += [result.notes, ""]
    for image in images:
        rel = os.path.relpath(image, base)
        lines += [f"![{image.stem}]({Path(rel).as_posix()})", ""]
    return "\n".join(lines)


LIVE_ALLOCATOR = """\
## Priorities from a running allocator

`fairshare simulate --scenario NAME --out DIR --allocator HOST:PORT [--pool POOL] \
[--token-file FILE]` runs the fairshare side of one scenario against a running allocator \
over gRPC instead of an in-process `fairshare.Pool`, through the gateway client library \
(`SyncAllocatorClient`, holder `simulator`): every request sent is an `Acquire`, every \
request that ends a `Release` with its cost (`fairshare/sim/remote.py`). The FCFS comparison \
stays in-process.

- The allocator's pools come from its own configuration: the pool named like the scenario \
(or `--pool`) must exist there with the scenario's capacity and the same teams and shares. \
The simulator checks this with `ListPools` and `Snapshot` before the run and otherwise \
refuses, naming what is missing and the YAML to configure.
- `elastic` changes the capacity mid-run with the admin `SetCapacity`: it needs \
`--token-file` (refused without it); the capacity found at the start is restored at the \
end.
- `failover` crashes and rebuilds the owner on simulated time: in-process only, refused \
under `--allocator` (so is `--scenario all`).
- Requests still in flight at the end of the run are released at no cost, so the run \
leaves nothing in flight on the allocator.
- The figures are **not comparable** with the in-process ones: the allocator decays usage \
on wall time with the half-life of its configuration while the simulation runs on \
simulated time (a 30-minute scenario takes seconds, so usage barely decays); usage left by \
earlier runs counts; every decision includes a network round trip. The report of such a \
run says so under each scenario and adds `live_*` figures (grants, degraded grants, grants \
released at the end, usage found at the start).
"""
"""The report's last section: how to take priorities from a running allocator."""


SCHEDULER_RULES = """\
## Where the scheduler's rules come from, and what the model leaves out

Read from vLLM v1's source (`vllm/v1/core/sched/scheduler.py` and \
`vllm/v1/core/sched/request_queue.py`); `fairshare/sim/instance.py` models one instance with them:

- **Waiting queue** (`request_queue.py`): under `--scheduling-policy priority` a heap on \
(priority, arrival time, request id) (`PriorityRequestQueue`), where a preempted request \
goes back by that key; under `fcfs` a deque in arrival order where a preempted request goes \
back to the front (`FCFSRequestQueue.prepend_request`).
- **Admission** (`Scheduler.schedule`, waiting loop): from the head of the queue while \
fewer than `max_num_seqs` requests run; it stops (`break`) at the first request whose KV \
blocks cannot be allocated, so nothing behind it is skipped ahead. While a request runs, \
the blocks of the watermark stay free (`SchedulerConfig.watermark`, `allocate_slots`): \
vLLM v1's default, 0, is the model's.
- **A request longer than `max_model_len`** (which the KV cache must hold) is refused when \
it arrives; the model refuses a request whose prompt and answer exceed its instance's \
whole KV cache.
- **One step, in vLLM's order** (`update_from_output`, then `schedule`): the requests that \
produced their last token leave and free their blocks; the running requests, in admission \
order, get the blocks their next token needs (preempting, below); then, **only in a step \
that preempted nothing** (`if not preempted_reqs`), waiting requests are admitted. \
Everything that arrived before a step is in the queue when it admits, so a step admits by \
(priority, arrival), not in the order of arrival.
- **KV pressure** (`Scheduler.schedule`, running loop): when a running request cannot get \
its next block, the victim is `max(running, key=(priority, arrival_time))` under \
`priority`, the request admitted last (`running.pop()`) under `fcfs`; it may be the request \
that needed the block. A waiting request never preempts a running one.
- **A preempted request keeps its tokens** (`_preempt_request`): its blocks are freed, \
`num_computed_tokens = 0`, its generated tokens stay; when it is admitted again it \
prefills prompt and generated tokens (`num_new_tokens = request.num_tokens - \
num_computed_tokens`), so it needs the blocks for both at once, then decodes the rest.

**Step-synchronous instances.** Each instance runs in steps of one decode step (20 ms): \
a request that reaches a busy instance waits for its next step, one that reaches an idle \
instance starts a step at once (time is continuous between steps), and a new request \
spends its prefill time, rounded to whole steps, before its first token, without slowing \
the others. The model admitted a request the moment it arrived, in the order of arrival, \
ran the events of one instant in the order they were scheduled (so it could admit and \
then preempt at one instant, or preempt a request as it finished), kept 1 % of the blocks \
free (vLLM v0's watermark) and admitted a request larger than the whole cache when \
nothing else ran. What moved: preemptions about doubled in every scenario (two \
institutions: large's 291 → 533, small's 202 → 341), almost all from the watermark: \
admission now fills the cache to its last block, as vLLM v1 does, and the requests that \
then outgrow it are preempted (with the 1 % watermark the step-synchronous model gives \
279 and 180); within-share waits moved by a few tenths of a second either way (small's \
within-share p99 in `two-institutions` 2.38 s → 1.74 s; the floods' median waits fell by \
about 0.1 s), and every target is still met. No within-share request was preempted \
while a borrower ran on its instance, before or after.

What the model leaves out: the per-step token budget (`max_num_batched_tokens`) and the \
batch's effect on the step time (a prefill spread over steps, as chunked prefill does, \
slows no one; the decode step does not depend on the batch), prefix caching (a resumed \
request recomputes all its tokens), requests the scheduler skips for other reasons (LoRA \
limits, structured output, remote KV). Pools of several \
instances: gateways see their own requests exactly and at once (no latency, no \
instance failures), and each request goes through one of three gateways drawn at random.
"""
"""The report's section on the scheduler model: which rule comes from which file."""


KEPT_TITLE = "## Fidelity"
"""Sections that start so are written by another command (``make fidelity``) and kept."""


def kept_sections(current: str) -> str:
    """The sections of ``current`` that another command wrote, to append after a rewrite."""
    found = re.findall(
        rf"^{re.escape(KEPT_TITLE)}.*?(?=^## |\Z)", current, flags=re.MULTILINE | re.DOTALL
    )
    return "".join("\n" + text.rstrip("\n") + "\n" for text in found)


def document(sections: Sequence[str], command: str) -> str:
    """The whole report."""
    head = [
        "# Simulation: what each team gets from vLLM's priority scheduler",
        "",
        f"Generated by `{command}` (`make simulate`); do not edit by hand.",
        "",
        "A discrete-event model of vLLM's priority scheduler (`fairshare/sim/instance.py`, "
        "`fairshare/sim/engine.py`): "
        "waiting requests in a min-heap on (priority, arrival time), at most C running, a "
        "KV-cache budget (72 blocks of 16 tokens per unit of C) where a running request that "
        "needs a block preempts the running request with the largest (priority, arrival "
        "time), which keeps the tokens it generated and prefills its prompt and them again "
        "when it resumes; waiting requests never preempt running ones, and nothing is "
        "admitted in a step that preempted. Each instance runs in vLLM's steps: it frees the "
        "requests that finished, gives the running ones their blocks, then admits everything "
        "that arrived before the step by (priority, arrival). Pools of several instances "
        "(`multi-instance`) "
        "give each instance its own scheduler, and gateways route between them. Priorities "
        "come from the real `fairshare.Pool`, whose clock is the simulated time; costs "
        "(GPU-seconds: the service time of an unpreempted run) are charged at release. FCFS "
        "is vLLM's `fcfs` policy: a queue in arrival order, a preempted request back at its "
        "front, the request admitted last preempted first. A request's service "
        "time is its prefill (0.1 ms per prompt token) plus 20 ms per output token; prompt "
        "and output lengths are log-normal (interactive: 600 + 200 tokens on average, "
        "batch: 1200 + 300). A *flood* is a client with a fixed number of requests "
        "outstanding: it sends the next one when one ends. Runs are deterministic for a "
        "seed.",
        "",
        "Queueing delay is the time from a request's arrival to its first start (requests "
        "never started count with their wait until the end of the run). *Within share* "
        "means the pool granted the request inside its team's reservation (priority 0 or "
        "1): the team had fewer within-share requests in flight than its reservation "
        "(docs/spec.md §4; borrowers do not use up the reservation); in FCFS runs the pool "
        "still records that standing, but vLLM ignores it. Before the within-share count, "
        "every request in flight counted, and a busy team's reservation eroded to nothing; "
        "`two-institutions`, `three-teams`, `elastic` and `sustained-overload` run that rule "
        "too (simulator-only, `fairshare/sim/allocators.py`) and print its figures beside their "
        "own, "
        "with what moved and why.",
        "",
        "A scheduler with the same ordering also runs as a real server, for the gateway's "
        "tests, the demo and its benchmark: the stand-in vLLM server `fairshare/sim/standin/` "
        "(`python -m fairshare.sim.standin "
        "--listen HOST:PORT`) speaks vLLM's OpenAI subset, streams tokens at a set pace, "
        "starts requests by (priority, arrival) or by arrival under a running limit, without "
        "KV cache or preemption, and records every request it received.",
        "",
    ]
    return (
        "\n".join(head)
        + "\n"
        + "\n".join(sections)
        + "\n"
        + SCHEDULER_RULES
        + "\n"
        + LIVE_ALLOCATOR
    )
