"""SIGKILL to the gateway with streams open: their grants stop counting at the allocator
within one holder session TTL, not after the pool's ``max_request_s`` (issue 31,
finding 2)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from harness.standin import Standin

from .conftest import MODEL, Stack, eventually, start_stack

pytestmark = pytest.mark.timeout(90)

TTL_S = 1.5
SNAPSHOT_S = 0.1  # the allocator's tick, where lapsed sessions are found
MESSAGES = [{"role": "user", "content": "hello"}]


def models(s: dict[str, Standin]) -> list[dict[str, object]]:
    return [{"name": MODEL, "pool": "gpu-a", "upstreams": [s["a"].url]}]


async def _nothing_in_flight(stack: Stack) -> bool:
    return await stack.in_flight("gpu-a") == {}


async def test_a_killed_gateway_frees_its_slots_within_one_session_ttl(tmp_path: Path) -> None:
    async with start_stack(
        tmp_path,
        pools={"gpu-a": {"capacity": 8}},  # max_request_s 60
        standins={"a": {"max_running": 8, "tokens_per_s": 5.0}},
        models=models,
        timing={
            "session_ttl_s": TTL_S,
            "snapshot_interval_s": SNAPSHOT_S,
            "forward_deadline_s": TTL_S / 3,  # the least TTL a config may have is 3 x it
        },
    ) as stack:
        client = stack.client("team-a")
        streams = [
            await client.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_tokens=100_000, stream=True
            )
            for _ in range(3)
        ]
        for stream in streams:  # every request has started
            async for _ in stream:
                break
        assert await stack.in_flight("gpu-a") == {"team-a": 3}
        # While the gateway lives its keepalives keep them counted, however long they run.
        await asyncio.sleep(3 * TTL_S)
        assert await stack.in_flight("gpu-a") == {"team-a": 3}

        stack.gateway.kill()
        killed = time.monotonic()
        await eventually(lambda: _nothing_in_flight(stack), timeout_s=10)
        took = time.monotonic() - killed
        assert took <= TTL_S + SNAPSHOT_S + 1.0, f"freed {took:.2f}s after SIGKILL"
        for stream in streams:
            await stream.close()  # cut by the kill
