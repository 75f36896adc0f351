"""Replays traces through vLLM's own v1 ``Scheduler`` on CPU; run by the fidelity
virtualenv's python (build/fidelity/venv, bench/fidelity-requirements.txt), never the
project's.

Reads traces as JSON (``fairshare.sim.fidelity.trace.Trace.to_json``, a list) from the
file named first, writes one result per trace to the file named second: the event log
(``EventLog.to_json``) and the invariant checks. It imports nothing of the project, so that
the two sides share only the JSON.

Each step: the trace's requests that arrive before it are added (a request whose prompt and
output exceed the cache is refused first, vLLM's up-front ``max_model_len`` check), then
``schedule()``; a fake model output gives every scheduled request that completes its prompt
one token (the recipe of vLLM's ``tests/v1/core/utils.py``), and ``update_from_output``
frees the requests that reached their ``max_tokens``. A request's arrival time is its step
plus its id in millionths: distinct, as vLLM's wall-clock arrival times are, and ordered as
the trace.

``--features off``: no chunked prefill (a token budget larger than any prompt), no prefix
caching, the synchronous scheduler; the simulator models exactly this. ``--features on``:
chunked prefill (a budget of 64 tokens a step), prefix caching and the asynchronous
scheduler, to check only the invariants.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch
import vllm
from transformers import LlamaConfig
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

CHUNK_TOKENS = 64
"""The token budget a step with chunked prefill on."""
WITHIN_SHARE_MAX = 1
BORROWING_MIN = 10


def _model_dir() -> str:
    """A tiny local Llama config (no weights: the scheduler reads the config only)."""
    path = tempfile.mkdtemp(prefix="fidelity-model-")
    LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=1 << 16,
        architectures=["LlamaForCausalLM"],
    ).save_pretrained(path)
    return path


def make_scheduler(model: str, trace: dict[str, Any], *, features: bool) -> Scheduler:
    block = int(trace["block_tokens"])
    blocks = int(trace["kv_blocks"])
    max_len = blocks * block
    scheduler_config = SchedulerConfig(
        max_num_seqs=int(trace["max_num_seqs"]),
        max_num_batched_tokens=CHUNK_TOKENS if features else max_len,
        max_model_len=max_len,
        enable_chunked_prefill=features,
        async_scheduling=features,
        policy="priority",
        is_encoder_decoder=False,
    )
    model_config = ModelConfig(
        model=model, dtype="float32", seed=0, skip_tokenizer_init=True, max_model_len=max_len
    )
    cache_config = CacheConfig(block_size=block, enable_prefix_caching=features)
    vllm_config = VllmConfig(
        scheduler_config=scheduler_config,
        model_config=model_config,
        cache_config=cache_config,
        device_config=DeviceConfig(device="cpu"),
    )
    kv_cache_config = KVCacheConfig(
        num_blocks=blocks + 1,  # block 0 is the block pool's null block
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=block, num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            )
        ],
    )
    cache_config.num_gpu_blocks = blocks + 1
    cls: type[Scheduler] = Scheduler
    if features:
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler

        cls = AsyncScheduler
    return cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block,
        log_stats=False,
    )


def _request(rid: int, step: int, priority: int, prompt: int, output: int) -> Request:
    params = SamplingParams(ignore_eos=True, max_tokens=output)
    return Request(
        request_id=f"{rid:06d}",
        prompt_token_ids=[rid % 997 + 1] * prompt,
        sampling_params=params,
        pooling_params=None,
        arrival_time=step + rid * 1e-6,
        priority=priority,
    )


def _model_output(out: SchedulerOutput, scheduler: Scheduler) -> ModelRunnerOutput:
    """One token for every scheduled request whose prompt is then computed."""
    ids: list[str] = []
    tokens: list[list[int]] = []
    for rid in out.num_scheduled_tokens:
        req = scheduler.requests[rid]
        ids.append(rid)
        done = req.num_computed_tokens >= req.num_tokens  # computed after this step
        tokens.append([7] if done else [])
    return ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=tokens
    )


def replay(model: str, trace: dict[str, Any], *, features: bool, max_steps: int) -> dict[str, Any]:
    scheduler = make_scheduler(model, trace, features=features)
    cache_tokens = int(trace["kv_blocks"]) * int(trace["block_tokens"])
    pending = sorted(trace["requests"], key=lambda r: (r[1], r[0]))
    priority = {int(r[0]): int(r[2]) for r in pending}
    arrival = {int(r[0]): int(r[1]) + int(r[0]) * 1e-6 for r in pending}
    events: dict[int, list[list[int]]] = {}
    refused: list[int] = []
    violations: list[str] = []
    admitted_ever: set[int] = set()
    live = 0
    step = 0
    nxt = 0
    while step < max_steps and (nxt < len(pending) or live):
        while nxt < len(pending) and pending[nxt][1] <= step:
            rid, at, prio, prompt, output = (int(v) for v in pending[nxt])
            nxt += 1
            if prompt + output > cache_tokens:
                refused.append(rid)
                continue
            scheduler.add_request(_request(rid, at, prio, prompt, output))
            live += 1
        running_before = [int(r.request_id) for r in scheduler.running]
        out = scheduler.schedule()
        row = events.setdefault(step, [[], [], []])
        new_ids = [int(r.req_id) for r in out.scheduled_new_reqs]
        resumed = [
            int(r) for r in out.scheduled_cached_reqs.req_ids if int(r) not in running_before
        ]
        # In admission order: the scheduler's running list ends with this step's admissions.
        order = [int(r.request_id) for r in scheduler.running]
        row[0].extend(sorted(new_ids + resumed, key=order.index))
        admitted_ever.update(new_ids)
        victims = sorted(int(r) for r in out.preempted_req_ids)
        row[1].extend(victims)
        if victims:
            kept = [r for r in running_before if r not in victims]
            key = lambda r: (priority[r], arrival[r])  # noqa: E731
            for v in victims:
                if kept and key(v) < max(key(r) for r in kept):
                    violations.append(f"{trace['name']} step {step}: victim {v} not the largest")
                if priority[v] <= WITHIN_SHARE_MAX and any(
                    priority[r] >= BORROWING_MIN for r in kept
                ):
                    violations.append(
                        f"{trace['name']} step {step}: within-share {v} preempted beside a borrower"
                    )
        result = scheduler.update_from_output(out, _model_output(out, scheduler))
        for outputs in result.values():
            for o in outputs.outputs:
                if o.finish_reason is not None:
                    row[2].append(int(o.request_id))
                    live -= 1
        step += 1
    steps = [[s, a, p, sorted(f)] for s, (a, p, f) in sorted(events.items()) if a or p or f]
    return {
        "name": trace["name"],
        "log": {"refused": sorted(refused), "steps": steps},
        "violations": violations,
        "complete": live == 0 and nxt == len(pending),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces")
    parser.add_argument("results")
    parser.add_argument("--features", choices=("off", "on"), default="off")
    parser.add_argument("--max-steps", type=int, default=100_000)
    args = parser.parse_args(argv)
    with open(args.traces, encoding="utf-8") as f:
        traces = json.load(f)
    model = _model_dir()
    results = [
        replay(model, t, features=args.features == "on", max_steps=args.max_steps) for t in traces
    ]
    with open(args.results, "w", encoding="utf-8") as f:
        json.dump({"vllm": vllm.__version__, "results": results}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
